#!/usr/bin/env python3
"""Write tests/expected_durations.json, the seconds each long test takes, from a measured run.

Every pytest run records each test's measured setup + call seconds in the pytest cache
(``tests/conftest.py``, key ``ralph-dev/durations``; the last run only). After a full run
(``scripts/test.sh``), refresh the table the suite's start order comes from with:

    .venv/bin/python scripts/durations.py

Or from a run's log with ``--durations=0`` in it (a CI run, say), instead of the cache:

    .venv/bin/python scripts/durations.py --from-log ci.log

Tests measured at ``--min-seconds`` or more are listed; a measured test below it is
dropped (taken for a short one); a test the run did not measure keeps its entry while it
still exists. Every key is checked against the suite's collection (``pytest
--collect-only``): a key that names no test is dropped. ``--check`` only does that check,
and fails naming any key that matches no test (``tests/test_durations.py`` runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tests" / "expected_durations.json"
CACHE_KEY = "ralph-dev/durations"
"""Where tests/conftest.py records each run's measurements in the pytest cache."""
COMMAND = ".venv/bin/python scripts/durations.py"

DURATION_LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*?)\s*$")
"""A line of pytest's ``--durations`` report: ``12.34s call     tests/x.py::test[a b]``."""
COLLECTION_SKIP = re.compile(r"^SKIPPED \[\d+\] (\S+?\.py):\d+: ")
"""A module skipped whole at collection (``-rs``), e.g. Ray's tests without Ray."""


def measured_in_cache(cache_dir: Path) -> tuple[dict[str, float], str]:
    """The last run's measurements recorded in the pytest cache, and when it ran."""
    path = cache_dir / "v" / CACHE_KEY
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"no measured run in {path} ({exc}): run the tests first "
                         "(scripts/test.sh)") from exc
    return {k: float(v) for k, v in record["seconds"].items()}, (
        f"{record['when']}, a run of {len(record['seconds'])} tests "
        f"({record.get('workers') or 'no'} xdist workers)")


def measured_in_log(text: str) -> dict[str, float]:
    """Setup + call seconds per test from pytest's ``--durations`` lines in ``text``."""
    seconds: dict[str, float] = {}
    for line in text.splitlines():
        found = DURATION_LINE.match(line)
        if found and found.group(2) != "teardown":
            nodeid = found.group(3)
            seconds[nodeid] = seconds.get(nodeid, 0.0) + float(found.group(1))
    return seconds


def collected() -> tuple[set[str], set[str]]:
    """Node ids of the whole suite, and the modules skipped whole at collection."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-rs",
                           "-p", "no:cacheprovider"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    lines = proc.stdout.splitlines()
    ids = {line for line in lines if "::" in line and not line.startswith(("SKIPPED", " "))}
    if proc.returncode != 0 or not ids:
        raise SystemExit(f"collecting the suite failed (exit {proc.returncode}):\n"
                         f"{proc.stdout}{proc.stderr}")
    skipped = {found.group(1) for line in lines if (found := COLLECTION_SKIP.match(line))}
    return ids, skipped


def dead_keys(seconds: dict[str, float], ids: set[str], skipped: set[str]) -> list[str]:
    """Keys that name no test (a module skipped whole here cannot tell: not counted)."""
    return [key for key in seconds if key not in ids and key.split("::")[0] not in skipped]


def load(path: Path) -> dict[str, float]:
    if not path.exists():
        return {}
    return {k: float(v) for k, v in json.loads(path.read_text())["seconds"].items()}


def write(path: Path, seconds: dict[str, float], measured: str) -> None:
    table = {
        "about": "Seconds (setup + call) each of the suite's long tests took, for the "
                 "order tests start in (tests/conftest.py); a test not named is taken for "
                 "a short one. Generated: do not edit, refresh it after a full run.",
        "generated_by": COMMAND,
        "last_measured": measured,
        "seconds": dict(sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))),
    }
    path.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=TABLE, help="the table (%(default)s)")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".pytest_cache",
                        help="the pytest cache the run recorded into (%(default)s)")
    parser.add_argument("--from-log", type=Path, metavar="LOG",
                        help="read pytest's --durations lines from LOG, not the cache")
    parser.add_argument("--min-seconds", type=float, default=5.0,
                        help="list tests that took this long or more (%(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="only check that every key of the table names a test")
    args = parser.parse_args(argv)

    old = load(args.table)
    ids, skipped = collected()
    if args.check:
        dead = dead_keys(old, ids, skipped)
        for key in dead:
            print(f"{args.table}: {key!r} matches no test", file=sys.stderr)
        if dead:
            print(f"refresh it: {COMMAND} (after a full run)", file=sys.stderr)
        return 1 if dead else 0

    if args.from_log:
        measured = measured_in_log(args.from_log.read_text(errors="replace"))
        when = f"the --durations lines of {args.from_log.name}"
    else:
        measured, when = measured_in_cache(args.cache_dir)
    table = {k: v for k, v in old.items() if k not in measured}
    table.update({k: round(v, 1) for k, v in measured.items() if v >= args.min_seconds})
    dead = dead_keys(table, ids, skipped)
    for key in dead:
        del table[key]
    write(args.table, table, when)
    print(f"{args.table}: {len(table)} tests; {len(measured)} measured ({when}); "
          f"{len(dead)} key(s) matching no test dropped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
