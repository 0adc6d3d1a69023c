"""The merge lane (issue 34): what batching buys, what bisection costs, and whether a
long verify deafens the controller.

Three runs of the real daemon, controller, tmux, jj and verify processes:

1. **makespan**: N changes done together with a V-second verify, from the last
   ``worker done`` to the last change in trunk, one at a time (``merge.max_batch = 1``)
   and batched (the default);
2. **bisection**: a batch of eight with one bad change (the lane's verify fails with it
   in trunk): the rounds and verifies the lane spends, and the seconds, from that
   batch's first verify to the bad change going back, and that the seven others land;
   one verify at a time, and with ``merge.parallel_verifies`` of each ``--parallel``;
3. **hearing**: the time from a person's ``ralph:hold`` on a running worker to that
   worker being stopped, while another change's 60-second verify runs.

    python benchmarks/merge_lane.py [--changes 6] [--verify 15] [--hold-verify 60]
                                    [--parallel 1 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from swarm_kit import Swarm, lane_only, wait_for


def events_of(swarm: Swarm, name: str, issue: str | None = None) -> list[dict[str, Any]]:
    return [e for e in swarm.events()
            if e["event"] == name and (issue is None or e.get("issue") == issue)]


def when(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["time"]).timestamp()


@contextmanager
def swarm_of(jj_bin: str, tasks: int, verify: str, *, batch: int | None = None,
             parallel: int = 1, script: dict[str, str] | None = None) -> Iterator[Swarm]:
    with tempfile.TemporaryDirectory(prefix="ralph-lane-") as tmp:
        socket = f"ralph-lane-{uuid.uuid4().hex[:8]}"
        swarm = Swarm.create(Path(tmp), jj_bin, socket, max_workers=tasks, verify=verify,
                             timing={"stall_timeout": 600, "restart_timeout": 600})
        merge = {**({"max_batch": batch} if batch is not None else {}),
                 "parallel_verifies": parallel}
        swarm.config_file.write_text(swarm.config_file.read_text()
                                     + f"\n[projects.{swarm.project}.merge]\n"
                                     + "".join(f"{k} = {v}\n" for k, v in merge.items()))
        swarm.script.update(script or {})
        swarm.write_script()
        swarm.import_plan("".join(f'[[task]]\ntitle = "T{n}"\n' for n in range(tasks)))
        try:
            swarm.start()
            yield swarm
        finally:
            swarm.teardown()
            subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def makespan(jj_bin: str, changes: int, verify: float, batch: int | None) -> tuple[float, int]:
    """Seconds from the last ``worker done`` to the last change in trunk; verifies run."""
    with swarm_of(jj_bin, changes, lane_only(f"sleep {verify}"), batch=batch) as swarm:
        wait_for(lambda: len(events_of(swarm, "worker_done")) == changes, 300,
                 f"{changes} workers done")
        wait_for(lambda: len(events_of(swarm, "merge_verified")) == changes,
                 changes * (verify + 10) + 60, f"{changes} changes in trunk")
        last_done = max(when(e) for e in events_of(swarm, "worker_done"))
        last_in = max(when(e) for e in events_of(swarm, "merge_verified"))
        return last_in - last_done, len(events_of(swarm, "merge_verify_started"))


@dataclass(frozen=True)
class Bisected:
    size: int
    """The batch the bad change was first verified in."""
    rounds: int
    """The lane's runs from that batch's first to the bad change going back."""
    verifies: int
    """Their verify processes (a run's own and those beside it)."""
    seconds: float
    """From that batch's first verify starting to the bad change going back."""
    sizes: list[list[int]]
    """Each round's prefixes verified."""


def bisection(jj_bin: str, parallel: int) -> Bisected:
    """A first change whose 20 s verify lets eight more finish behind it, one of which
    (the fifth) breaks the lane's verify (a 3 s one)."""
    bad = "DEMO-6"
    check = f"sleep 3; ! test -e changes/{bad}.txt"
    verify = lane_only(f"if test -e changes/DEMO-2.txt; then {check}; else sleep 20; fi")
    script = {"DEMO-1": "work:0.2", **{f"DEMO-{n}": "work:2" for n in range(2, 10)}}
    with swarm_of(jj_bin, 9, verify, script=script, parallel=parallel) as swarm:
        wait_for(lambda: events_of(swarm, "merge_sent_back", bad), 300, f"{bad} sent back")
        wait_for(lambda: len(events_of(swarm, "merge_verified")) == 8, 120,
                 "the eight good changes in trunk")
        runs = events_of(swarm, "merge_verify_started")
        first = next(e for e in runs if bad in e.get("batch", ()))
        back = when(events_of(swarm, "merge_sent_back", bad)[0])
        spent = [e for e in runs if when(first) <= when(e) <= back]
        sizes = [e.get("at_once") or [len(e.get("batch", ()))] for e in spent]
        return Bisected(len(first["batch"]), len(spent), sum(map(len, sizes)),
                        back - when(first), sizes)


def hearing(jj_bin: str, verify: float) -> float:
    """Seconds from ``ralph:hold`` on a running worker to its stop, while another
    change's ``verify``-second lane verify runs."""
    script = {"DEMO-1": "work:0.2", "DEMO-2": "hang"}
    with swarm_of(jj_bin, 2, lane_only(f"sleep {verify}"), script=script) as swarm:
        wait_for(lambda: events_of(swarm, "merge_verify_started", "DEMO-1"), 120,
                 "DEMO-1's verify to start")
        wait_for(lambda: events_of(swarm, "spawn", "DEMO-2"), 60, "DEMO-2 running")
        swarm.cli("issue", "label", "DEMO-2", "+ralph:hold")
        held = time.time()
        wait_for(lambda: events_of(swarm, "stop", "DEMO-2"), verify, "DEMO-2 stopped",
                 interval=0.05)
        assert not events_of(swarm, "merge_verified"), "the verify had ended: no measure"
        return when(events_of(swarm, "stop", "DEMO-2")[0]) - held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=6)
    parser.add_argument("--verify", type=float, default=15)
    parser.add_argument("--hold-verify", type=float, default=60)
    parser.add_argument("--only", choices=("makespan", "bisection", "hearing"))
    parser.add_argument("--parallel", type=int, nargs="+", default=[1, 3],
                        help="merge.parallel_verifies of each bisection run")
    args = parser.parse_args()
    from ralph_dev.adapters.jj_cli import find_jj

    jj_bin = find_jj()
    if jj_bin is None:
        raise SystemExit("jj not found: run scripts/setup.sh")
    runs: dict[str, Callable[[], None]] = {}

    def one_by_one() -> None:
        n, v = args.changes, args.verify
        alone, verifies_alone = makespan(jj_bin, n, v, batch=1)
        batched, verifies_batched = makespan(jj_bin, n, v, batch=None)
        print(f"makespan of {n} changes with a {v:g}s verify, last done → last in trunk: "
              f"one at a time {alone:.1f}s ({verifies_alone} verifies), batched "
              f"{batched:.1f}s ({verifies_batched} verifies)")

    def bisect() -> None:
        for parallel in args.parallel:
            found = bisection(jj_bin, parallel)
            print(f"one bad change in a batch of {found.size}, parallel_verifies = "
                  f"{parallel}: {found.rounds} rounds, {found.verifies} verifies, "
                  f"{found.seconds:.1f}s to send it back (prefixes verified each round: "
                  f"{found.sizes}; the others landed)")

    def hear() -> None:
        delay = hearing(jj_bin, args.hold_verify)
        print(f"ralph:hold → worker stopped while a {args.hold_verify:g}s verify ran: "
              f"{delay:.2f}s")

    runs.update(makespan=one_by_one, bisection=bisect, hearing=hear)
    for name, run in runs.items():
        if args.only in (None, name):
            run()


if __name__ == "__main__":
    main()
