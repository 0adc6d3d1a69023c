"""Linear's budget: what ralph-dev spends of Linear's hourly allowance in steady state.

Runs the real LinearTracker against the fake Linear (which executes Linear's real
schema and charges each query by Linear's documented cost model) on a simulated
clock, so an hour takes under a minute. The world: a realistic workspace
(``populate_workspace``: two teams, cross-project relations, archived/trashed
issues, bot comments) with ``--issues`` issues, ``--workers`` workers that each
finish an issue every ``--issue-minutes`` minutes, and people who comment, edit
and add blockers. One hour is simulated:

- the controller's tick, in the controller's order: the write-backs of the workers'
  reports first (the real write-back queue and writer: a ``done`` comments its evidence and moves
  the issue to Done), then ``list_issues`` (a tick every 10 s, ``timing.poll_interval``;
  a poll every ``tracker.linear_poll_interval``, a full sync every
  ``tracker.full_sync_interval``), then its spawns (each moves its issue to a started
  state). Workers and hooks never call Linear: every request is the controller's;
- a short-lived ``ralph-dev status`` with and without the disk cache.

Prints requests and complexity points per hour against Linear's allowance for an
API key (2,500 requests, 3,000,000 points) and the costliest single query, and
exits 1 when the controller goes over 10 % of either or a query over 5,000 points.

    python benchmarks/linear_budget.py                     # 1,000 issues, 10 workers
    python benchmarks/linear_budget.py --issues 371 --workers 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

REQUESTS_PER_HOUR = 2_500
POINTS_PER_HOUR = 3_000_000
TARGET = 0.10
QUERY_CAP = 5_000
TICK = 10.0


@dataclass
class Ledger:
    """Requests and points by who spent them (from the fake's own accounting)."""

    requests: Counter[str] = field(default_factory=Counter)
    points: Counter[str] = field(default_factory=Counter)
    operations: dict[str, Counter[str]] = field(default_factory=dict)
    costliest: tuple[int, str] = (0, "")

    def charge(self, who: str, fake: Any, since: int) -> None:
        for record in fake.requests[since:]:
            if record.get("status") != 200:
                continue
            points = int(record.get("complexity") or 0)
            self.requests[who] += 1
            self.points[who] += points
            self.operations.setdefault(who, Counter())[str(record["operationName"])] += 1
            self.costliest = max(self.costliest, (points, str(record["operationName"])))


async def spend(ledger: Ledger, who: str, fake: Any, work: Any) -> Any:
    start = len(fake.requests)
    try:
        return await work
    finally:
        ledger.charge(who, fake, start)


CONTROLLER = ("controller reads", "controller writes (spawns)",
              "controller write-backs (relay)")


def done_report(issue: str, started: datetime, finished: datetime) -> Any:
    """What the controller queues when a worker reports done (as ``control.intake``)."""
    from ralph_dev.adapters.store import to_iso
    from ralph_dev.adapters.writebacks import WriteBackItem

    verify = {"command": "make test", "exit_code": 0, "started_at": to_iso(finished),
              "duration_s": 42.0, "output_tail": "412 passed in 41.8s"}
    return WriteBackItem(uuid.uuid4().hex, "done", issue, {
        "role": "execute", "summary": "Implemented it; tests added.", "verify": verify,
        "since": to_iso(started), "finished": to_iso(finished), "spent": None})


async def simulate(args: argparse.Namespace) -> int:
    from fake_linear import Clock, FakeLinear, World, populate_workspace

    from ralph_dev.adapters.store import StateStore
    from ralph_dev.adapters.writebacks import WriteBackQueue
    from ralph_dev.control.loop.act import WriteBackWriter
    from ralph_dev.core.config import build_project
    from ralph_dev.core.decide import ready_issues
    from ralph_dev.core.decide.swarm import write_backs
    from ralph_dev.core.model import Observed, StateType

    rng = random.Random(args.seed)
    ledger = Ledger()
    with tempfile.TemporaryDirectory() as tmp, FakeLinear() as fake:
        for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_STATE_HOME", "state"),
                         ("XDG_DATA_HOME", "data")):
            os.environ[var] = str(Path(tmp) / sub)  # the relay queue and events stay here
        world = World(fake, "", "", Clock(), [], state_dir=Path(tmp) / "linear")
        fake.clock = world.clock
        ws = populate_workspace(fake, args.issues, seed=args.seed)
        world.team, world.project = ws.eng, ws.alpha
        repo = Path(tmp) / "repo"
        repo.mkdir()
        settings = build_project("alpha", {"repo": str(repo), "tracker": {
            "kind": "linear", "linear_project": "Alpha", "linear_team": "ENG"}})
        interval = args.full_sync_interval or settings.tracker.full_sync_interval

        def tracker() -> Any:
            return world.tracker(full_sync_interval=interval, default_team="ENG",
                                 poll_interval=settings.tracker.linear_poll_interval)

        controller = tracker()
        queue = WriteBackQueue(settings.paths.relay_dir)
        writer = WriteBackWriter(settings, tracker=controller, store=StateStore(settings.paths),
                                 writebacks=queue, clock=world.clock)

        async def write_back_due() -> list[str]:
            """The tick's WriteBack actions (``decide``'s rule), carried out."""
            owed = [item.owed() for item in queue.items()]
            errors = []
            for action in write_backs(owed, True, settings, world.clock()):
                if (error := await writer.write_back(action.report)) is not None:
                    errors.append(str(error))
            return errors

        issues = await spend(ledger, "cold start (once)", fake, controller.list_issues())
        print(f"workspace: {len(fake.issues)} issues ({len(ws.members)} in the project), "
              f"{len(fake.relations)} relations, {len(fake.comments)} comments")

        status_start = len(fake.requests)
        await tracker().list_issues()
        status_cached = fake.spent(status_start)

        working: dict[str, tuple[float, datetime]] = {}  # issue → (finishes at, started)
        minute = 60.0
        events = 0
        for tick in range(int(3600 / TICK)):
            now_s = tick * TICK
            world.clock.advance(TICK)
            # people at work in Linear
            if tick % int(args.comment_every * minute / TICK) == 0:
                fake.add_comment(rng.choice(ws.members), "A person asks a question.")
            if tick % int(args.edit_every * minute / TICK) == 0:
                fake.update_issue(rng.choice(ws.members), title=f"Edited at {now_s:.0f}")
            if tick % int(args.blocker_every * minute / TICK) == 0:
                a, b = rng.sample(ws.members, 2)
                fake.add_blocker(a, b)
            # the controller's tick: workers' reports first, then observe, then act
            for ident, (done_at, started) in list(working.items()):
                if now_s >= done_at:  # `ralph-dev worker done` in the worker's pane
                    queue.add(done_report(ident, started, world.clock()))
                    failed = await spend(ledger, "controller write-backs (relay)", fake,
                                         write_back_due())
                    if failed:
                        raise SystemExit(f"a write-back failed: {failed[0]}")
                    del working[ident]
                    events += 1
            issues = await spend(ledger, "controller reads", fake, controller.list_issues())
            own = [i for i in issues if not i.foreign]
            ready = [i for i in ready_issues(Observed(issues=tuple(own)), settings)
                     if i.identifier not in working]
            while len(working) < args.workers and ready:
                issue = ready.pop(0)
                await spend(ledger, "controller writes (spawns)", fake,
                            controller.set_state(issue.identifier, type=StateType.STARTED))
                finish = args.issue_minutes * minute * rng.uniform(0.5, 1.5)
                working[issue.identifier] = (now_s + finish, world.clock())
        await controller.close()

        print(f"simulated 1 hour: controller tick every {TICK:g} s, poll every "
              f"{settings.tracker.linear_poll_interval:g} s, full sync every {interval:g} s, "
              f"{args.workers} workers, {events} issues finished\n")
        width = max(len(k) for k in ledger.requests) + 2
        print(f"{'':{width}}{'requests':>10} {'% of 2,500':>11} {'points':>11} "
              f"{'% of 3M':>8}")
        for who in ledger.requests:
            req, pts = ledger.requests[who], ledger.points[who]
            print(f"{who:{width}}{req:>10} {100 * req / REQUESTS_PER_HOUR:>10.1f}% "
                  f"{pts:>11,} {100 * pts / POINTS_PER_HOUR:>7.2f}%")
        ctl_req = sum(ledger.requests[who] for who in CONTROLLER)
        ctl_pts = sum(ledger.points[who] for who in CONTROLLER)
        print(f"{'controller total':{width}}{ctl_req:>10} "
              f"{100 * ctl_req / REQUESTS_PER_HOUR:>10.1f}% {ctl_pts:>11,} "
              f"{100 * ctl_pts / POINTS_PER_HOUR:>7.2f}%")
        print("\nby operation:")
        for who, ops in ledger.operations.items():
            print(f"  {who}: " + ", ".join(f"{op} {n}" for op, n in ops.most_common()))
        print(f"\ncostliest single query: {ledger.costliest[0]:,} points "
              f"({ledger.costliest[1]}); Linear refuses over 10,000")
        print(f"a `ralph-dev status` with the disk cache: {status_cached[0]} request(s), "
              f"{status_cached[1]:,} points; without it (cold): "
              f"{ledger.requests['cold start (once)']} requests, "
              f"{ledger.points['cold start (once)']:,} points")
        over = []
        if ctl_req > TARGET * REQUESTS_PER_HOUR:
            over.append(f"controller requests {ctl_req} > {TARGET * REQUESTS_PER_HOUR:.0f}")
        if ctl_pts > TARGET * POINTS_PER_HOUR:
            over.append(f"controller points {ctl_pts} > {TARGET * POINTS_PER_HOUR:.0f}")
        if ledger.costliest[0] > QUERY_CAP:
            over.append(f"a query costs {ledger.costliest[0]} > {QUERY_CAP}")
        print("\nTARGET MISSED: " + "; ".join(over) if over
              else f"\nwithin target: controller under {TARGET:.0%} of both allowances, "
                   f"every query under {QUERY_CAP:,} points")
        return 1 if over else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--issues", type=int, default=1_000)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--issue-minutes", type=float, default=30.0,
                        help="average minutes a worker needs for one issue")
    parser.add_argument("--comment-every", type=float, default=5.0, help="minutes")
    parser.add_argument("--edit-every", type=float, default=4.0, help="minutes")
    parser.add_argument("--blocker-every", type=float, default=15.0, help="minutes")
    parser.add_argument("--full-sync-interval", type=float, default=None,
                        help="seconds (default: tracker.full_sync_interval's default)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("RALPH_DEV_LINEAR_SCHEMA",
                          str(ROOT.parent / "shared/linear/schema.graphql"))
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    return asyncio.run(simulate(args))


if __name__ == "__main__":
    sys.exit(main())
