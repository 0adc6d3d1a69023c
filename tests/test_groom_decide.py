"""When a groom run starts, and when not: worlds built by hand in, the plan out."""

from __future__ import annotations

from datetime import timedelta

import pytest
from test_decide import NOW, issue, rec, run, settings, steps, win, world

from ralph_dev.core.actions import OpenGroom, Plan, Spawn
from ralph_dev.core.config import Limits
from ralph_dev.core.groom import GroomSettings
from ralph_dev.core.model import Pause, Role

GROOM = "ralph:groom"
HOUR = 3600.0


def groom(**kw: object) -> GroomSettings:
    return GroomSettings(**kw)  # type: ignore[arg-type]


IDLE = settings(groom=groom(when_idle=True))


def opening(plan: Plan) -> str:
    """Why the plan opens a groom run ("" when it does not)."""
    return next((a.reason for a in plan.actions if isinstance(a, OpenGroom)), "")


@pytest.mark.parametrize(("why", "obs", "s", "due"), [
    ("idle, nothing ready, never groomed", world(issues=[issue(1, "done")]), IDLE, True),
    ("idle with no issues at all", world(), IDLE, True),
    ("grooming is off by default", world(issues=[issue(1, "done")]), settings(), False),
    ("an issue is ready", world(issues=[issue(1)]), IDLE, False),
    ("every slot is busy", world(issues=[issue(n, "started") for n in (1, 2, 3)],
                                 windows=[win(f"DEMO-{n}") for n in (1, 2, 3)],
                                 records=[rec(f"DEMO-{n}") for n in (1, 2, 3)]), IDLE, False),
    ("a slot is free and the running work is not ready work",
     world(issues=[issue(1, "started")], windows=[win("DEMO-1")], records=[rec("DEMO-1")]),
     IDLE, True),
    ("backlog issues are not ready", world(issues=[issue(1, "backlog")]), IDLE, True),
    ("a groom issue is open already (at most one)",
     world(issues=[issue(1, "backlog", labels={GROOM})]), IDLE, False),
    ("a groom worker is running (at most one)",
     world(issues=[issue(1, "started", labels={GROOM})], windows=[win("DEMO-1")],
           records=[rec("DEMO-1", role=Role.GROOM)]), IDLE, False),
    ("the last groom run began 10 minutes ago (min_interval 1 h)",
     world(issues=[issue(1, "done", labels={GROOM}, created_at=NOW - timedelta(minutes=10))]),
     IDLE, False),
    ("the last groom run began 2 hours ago",
     world(issues=[issue(1, "done", labels={GROOM}, created_at=NOW - timedelta(hours=2))]),
     IDLE, True),
    ("a groom record started 10 minutes ago counts too",
     world(issues=[issue(1, "done", labels={GROOM}, created_at=NOW - timedelta(days=3))],
           records=[rec("DEMO-1", role=Role.GROOM, done=True,
                        started_at=NOW - timedelta(minutes=10))]), IDLE, False),
    ("the interval passed though the swarm is busy",
     world(issues=[issue(1), issue(2, "done", labels={GROOM},
                                   created_at=NOW - timedelta(hours=7))]),
     settings(groom=groom(interval=6 * HOUR)), True),
    ("the interval has not passed yet",
     world(issues=[issue(1), issue(2, "done", labels={GROOM},
                                   created_at=NOW - timedelta(hours=5))]),
     settings(groom=groom(interval=6 * HOUR)), False),
    ("the interval passed but min_interval is longer",
     world(issues=[issue(2, "done", labels={GROOM}, created_at=NOW - timedelta(hours=7))]),
     settings(groom=groom(interval=6 * HOUR, min_interval=8 * HOUR)), False),
    ("the swarm is paused",
     world(pauses=(Pause(kind="usage", cause="limit"),)), IDLE, False),
    ("the tracker could not be read", world(tracker_ok=False), IDLE, False),
    ("groom workers are capped at 0", world(),
     settings(groom=groom(when_idle=True), limits=Limits(per_role={"groom": 0})), False),
])
def test_when_ralph_dev_opens_a_groom_run(why: str, obs, s, due: bool) -> None:
    plan = run(obs, s)
    assert bool(opening(plan)) is due, why
    if due:
        assert "groom" in opening(plan)


def test_the_reason_names_the_trigger() -> None:
    assert "groom.when_idle" in opening(run(world(), IDLE))
    assert "groom.interval" in opening(run(world(issues=[issue(1)]),
                                           settings(groom=groom(interval=HOUR))))


def test_a_person_labeled_issue_is_dispatched_as_a_groom_run() -> None:
    plan = run(world(issues=[issue(4, labels={GROOM})]))
    assert steps(plan) == [("spawn", "DEMO-4")]
    spawn = plan.actions[0]
    assert isinstance(spawn, Spawn) and spawn.role is Role.GROOM
    assert opening(plan) == ""


def test_a_person_labeled_issue_waits_only_for_a_running_groom_worker_not_the_spacing() -> None:
    just_groomed = issue(1, "done", labels={GROOM}, created_at=NOW - timedelta(minutes=1))
    plan = run(world(issues=[just_groomed, issue(4, labels={GROOM})]), IDLE)
    assert steps(plan) == [("spawn", "DEMO-4")]

    running = world(issues=[issue(1, "started", labels={GROOM}), issue(4, labels={GROOM})],
                    windows=[win("DEMO-1")], records=[rec("DEMO-1", role=Role.GROOM)])
    assert steps(run(running)) == []


def test_two_groom_requests_start_one_at_a_time() -> None:
    plan = run(world(issues=[issue(4, labels={GROOM}), issue(5, labels={GROOM})]))
    assert steps(plan) == [("spawn", "DEMO-4")]
