"""Reaction: from a person's `ralph-dev issue add` returning to the spawn of its worker.

A person's write on the local tracker pokes the running controller, so a new ready
issue starts long before the next poll (60 s here, so a poll never explains it).
Runs the real daemon, controller, tmux and jj; prints each delay and the median.

    python benchmarks/reaction.py [--samples 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from swarm_kit import Swarm, wait_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=7)
    args = parser.parse_args()
    from ralph_dev.adapters.jj_cli import find_jj

    jj_bin = find_jj()
    if jj_bin is None:
        raise SystemExit("jj not found: run scripts/setup.sh")
    delays: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ralph-react-") as tmp:
        socket = f"ralph-react-{uuid.uuid4().hex[:8]}"
        swarm = Swarm.create(Path(tmp), jj_bin, socket, max_workers=args.samples + 1,
                             timing={"poll_interval": 60, "heartbeat_stale": 300})
        try:
            swarm.start()
            swarm.wait_first_tick(60)
            for n in range(args.samples):
                swarm.cli("issue", "add", swarm.project, f"Reaction sample {n}")
                returned = time.time()
                ident = f"DEMO-{n + 1}"
                wait_for(lambda i=ident: any(e["event"] == "spawn" and e["issue"] == i
                                             for e in swarm.events()), 30, f"{ident} spawned")
                spawned = next(datetime.fromisoformat(e["time"]) for e in swarm.events()
                               if e["event"] == "spawn" and e["issue"] == ident)
                delays.append(spawned.timestamp() - returned)
        finally:
            swarm.teardown()
            subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
    print("issue add returned → spawn event: " + ", ".join(f"{d:.2f}s" for d in delays))
    print(f"median {statistics.median(delays):.2f}s over {len(delays)} samples "
          "(target ≤ 1 s; the next poll was 60 s away)")


if __name__ == "__main__":
    main()
