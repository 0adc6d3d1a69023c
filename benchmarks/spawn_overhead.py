"""Spawn overhead: from the controller's decision to the agent process running.

Runs the controller's real Spawn action (workspace add, tracker update,
worker record, tmux window) for N issues with a trivial agent and waits until
the agent process itself runs (its pane's process has exec'd the agent).

    python benchmarks/spawn_overhead.py [--spawns 20]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tick_cost import make_repo, setup_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=20)
    args = parser.parse_args()
    from ralph_dev.adapters import logs
    from ralph_dev.adapters.config_file import write_project
    from ralph_dev.adapters.gh import Gh
    from ralph_dev.adapters.jj import JjRepository
    from ralph_dev.adapters.jj_cli import find_jj
    from ralph_dev.adapters.store import StateStore
    from ralph_dev.adapters.tmux import Tmux
    from ralph_dev.adapters.tracker import open_tracker
    from ralph_dev.agent.launch import build_launch
    from ralph_dev.control.loop.controller import Controller
    from ralph_dev.control.loop.wiring import host_for
    from ralph_dev.core.actions import Spawn
    from ralph_dev.core.config import build_project
    from ralph_dev.core.model import NewIssue, Role

    logs.configure("WARNING")
    jj_bin = find_jj()
    if jj_bin is None:
        raise SystemExit("jj not found: run scripts/setup.sh")
    marker = "ralph-bench-agent"
    with tempfile.TemporaryDirectory(prefix="ralph-spawn-") as tmp:
        root = Path(tmp)
        setup_env(root)
        repo = root / "repo"
        make_repo(repo, jj_bin)
        socket = f"ralph-spawn-{uuid.uuid4().hex[:8]}"
        agent = f"{sys.executable} -c 'import time,sys; sys.argv[0]=\"{marker}\"; time.sleep(60)'"
        settings = build_project("bench", {
            "repo": str(repo), "tmux_socket": socket,
            "agent": {"runner": "command", "command": agent},
        })
        write_project(settings)
        tmux = Tmux.from_settings(settings)
        jj = JjRepository.from_settings(settings)
        tracker = open_tracker(settings)
        tmux.ensure_session(repo, {"PATH": os.environ["PATH"]})
        ctl = Controller(settings, tracker=tracker, host=host_for(settings, jj), jj=jj,
                         launcher=build_launch,
                         pull_requests=Gh(settings.merge.gh_bin, settings.repo),
                         store=StateStore(settings.paths))

        opened: dict[str, int | None] = {}
        host = ctl.actuator.host
        open_window = host.open_window

        def opening(issue: str, *args, **kwargs):  # the pane's pid, as the spawn learns it
            window = open_window(issue, *args, **kwargs)
            opened[issue] = window.pid
            return window

        host.open_window = opening  # type: ignore[method-assign]

        async def run() -> list[float]:
            ids = await tracker.create_issues(
                [NewIssue(title=f"t{i}") for i in range(args.spawns)])
            issues = {i.identifier: i for i in await tracker.list_issues()}
            samples = []
            for ident in ids:
                t0 = time.perf_counter()
                await ctl.actuator.act(Spawn(ident, "bench", role=Role.EXECUTE, attempt=1),
                              issues[ident], None)  # type: ignore[arg-type]
                pid = opened[ident]
                while "-c" not in _cmdline(pid):  # exec'd into the agent (python -c …)
                    time.sleep(0.001)
                samples.append((time.perf_counter() - t0) * 1000)
            await tracker.close()
            return samples

        try:
            samples = asyncio.run(run())
        finally:
            tmux.kill_session()
            subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
    print(f"spawns {len(samples)}: median {statistics.median(samples):.0f} ms, "
          f"p90 {sorted(samples)[int(len(samples) * 0.9) - 1]:.0f} ms, "
          f"max {max(samples):.0f} ms")


def _cmdline(pid: int | None) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return []


if __name__ == "__main__":
    main()
