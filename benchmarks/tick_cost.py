"""Controller tick cost: observe + decide (no actions) on real parts.

A local tracker with N issues, a private tmux server with W live worker
windows, a jj repo with W workspaces. Prints the median/p90 tick time and how
many tmux and jj subprocesses one tick runs.

    python benchmarks/tick_cost.py            # 1,000 and 5,000 issues × 10 and 50 windows
    python benchmarks/tick_cost.py --issues 1000 --windows 50 --ticks 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def setup_env(root: Path) -> None:
    """This process becomes a private ralph-dev instance under ``root``."""
    from ralph_dev.core.paths import sandbox_env

    os.environ.update(sandbox_env(root, os.environ))


def make_repo(repo: Path, jj_bin: str) -> None:
    repo.mkdir()
    env = {**os.environ, "JJ_USER": "bench", "JJ_EMAIL": "bench@example.com"}
    for args in (["git", "init", "--colocate"], ["commit", "-m", "init"],
                 ["bookmark", "create", "main", "-r", "@-"]):
        subprocess.run([jj_bin, *args], cwd=repo, env=env, check=True, capture_output=True)


async def populate(settings, n_issues: int) -> list[str]:
    from ralph_dev.adapters.tracker import open_tracker
    from ralph_dev.core.model import NewIssue

    tracker = open_tracker(settings)
    batch = []
    for i in range(n_issues):
        blocked = (f"r{i - 1}",) if i % 5 and i > 0 else ()
        batch.append(NewIssue(title=f"Issue {i}", ref=f"r{i}", priority=i % 5,
                              blocked_by=blocked))
    ids = await tracker.create_issues(batch)
    await tracker.close()
    return ids


def run_case(n_issues: int, n_windows: int, ticks: int) -> dict[str, float]:
    from ralph_dev.adapters.config_file import write_project
    from ralph_dev.adapters.jj import JjRepository
    from ralph_dev.adapters.jj_cli import find_jj
    from ralph_dev.adapters.store import StateStore, utcnow
    from ralph_dev.adapters.tmux import Tmux
    from ralph_dev.adapters.tracker import open_tracker
    from ralph_dev.control.loop.observe import observe
    from ralph_dev.core.config import build_project
    from ralph_dev.core.decide import decide

    jj_bin = find_jj()
    if jj_bin is None:
        raise SystemExit("jj not found: run scripts/setup.sh")
    with tempfile.TemporaryDirectory(prefix="ralph-bench-") as tmp:
        root = Path(tmp)
        setup_env(root)
        repo = root / "repo"
        make_repo(repo, jj_bin)
        socket = f"ralph-bench-{uuid.uuid4().hex[:8]}"
        settings = build_project("bench", {"repo": str(repo), "tmux_socket": socket,
                                           "limits": {"max_workers": n_windows}})
        write_project(settings)
        ids = asyncio.run(populate(settings, n_issues))
        tmux = Tmux.from_settings(settings)
        jj = JjRepository.from_settings(settings)
        env = {"PATH": os.environ["PATH"], "HOME": str(root)}
        try:
            tmux.ensure_session(repo, env)
            for ident in ids[:n_windows]:
                jj.workspaces.add_workspace(ident)
                tmux.open_window(ident, cwd=repo, command=["sleep", "3600"], environment=env)
            counts = {"tmux": 0, "jj": 0}
            real_tmux_run, real_jj_run = tmux.run, jj.cli.run

            def tmux_run(*a, **k):
                counts["tmux"] += 1
                return real_tmux_run(*a, **k)

            def jj_run(*a, **k):
                counts["jj"] += 1
                return real_jj_run(*a, **k)

            tmux.run, jj.cli.run = tmux_run, jj_run  # type: ignore[method-assign]
            real_many = tmux.run_many

            def many(*a, **k):
                counts["tmux"] += 1
                return real_many(*a, **k)

            tmux.run_many = many  # type: ignore[method-assign]
            tracker = open_tracker(settings)
            store = StateStore(settings.paths)

            async def measure() -> tuple[list[float], list[float], list[int], list[int]]:
                times, decide_times, tmux_calls, jj_calls = [], [], [], []
                for _ in range(ticks):
                    counts["tmux"] = counts["jj"] = 0
                    t0 = time.perf_counter()
                    observed, _ = await observe(tracker, tmux, jj.workspaces, store)
                    t1 = time.perf_counter()
                    decide(observed, settings, utcnow())
                    t2 = time.perf_counter()
                    times.append((t2 - t0) * 1000)
                    decide_times.append((t2 - t1) * 1000)
                    tmux_calls.append(counts["tmux"])
                    jj_calls.append(counts["jj"])
                await tracker.close()
                return times, decide_times, tmux_calls, jj_calls

            times, decide_times, tmux_calls, jj_calls = asyncio.run(measure())
        finally:
            tmux.kill_session()
            subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
    times.sort()
    return {
        "issues": n_issues,
        "windows": n_windows,
        "median_ms": statistics.median(times),
        "p90_ms": times[int(len(times) * 0.9) - 1],
        "decide_median_ms": statistics.median(decide_times),
        "tmux_calls": statistics.median(tmux_calls),
        "jj_calls": statistics.median(jj_calls),
        "jj_first": jj_calls[0],
    }


def main() -> None:
    from ralph_dev.adapters import logs

    logs.configure("WARNING")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--issues", type=int, action="append")
    parser.add_argument("--windows", type=int, action="append")
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()
    cases = [(i, w) for i in (args.issues or [1000, 5000]) for w in (args.windows or [10, 50])]
    print(f"{'issues':>7} {'windows':>7} {'median ms':>10} {'p90 ms':>8} {'decide ms':>10} "
          f"{'tmux/tick':>9} {'jj/tick':>8} {'jj 1st tick':>11}")
    for n_issues, n_windows in cases:
        r = run_case(n_issues, n_windows, args.ticks)
        print(f"{r['issues']:>7} {r['windows']:>7} {r['median_ms']:>10.1f} {r['p90_ms']:>8.1f} "
              f"{r['decide_median_ms']:>10.1f} {r['tmux_calls']:>9.0f} {r['jj_calls']:>8.0f} "
              f"{r['jj_first']:>11}",
              flush=True)


if __name__ == "__main__":
    main()
