"""The pure decision core: what ralph-dev should do, given one look at the world.

The controller can be killed at any moment and started again, so every rule
is a function of what is observed *now* (level-triggered): the same world
always gives the same plan, and a world in which the plan was carried out
gives a plan that does not repeat it. Nothing here does I/O, reads a clock or
logs, so a test can build a world by hand and check every rule as data.

The rules rely on the executor leaving the world exactly as the executor
contract says: ``EXECUTOR_CONTRACT`` in tests/contract.py, a specification of the
actuator (``control.loop.act``) that no production code reads, played by the property
tests (tests/test_decide_properties.py) and checked against the real controller by
tests/test_executor_contract.py.

Text from issues (titles, descriptions, comments) never appears in an action:
reasons and nudges name issues only by their checked identifier.
"""

from __future__ import annotations

from datetime import datetime

from ralph_dev.core.actions import SWARM, Continue, OpenGroom, Plan, Waited
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.decide.issues import Decider
from ralph_dev.core.decide.lane import Lane
from ralph_dev.core.decide.orders import fill
from ralph_dev.core.decide.swarm import SHARED_RECHECK, SwarmRules, egress_flags, stops
from ralph_dev.core.decide.views import (
    COLUMNS,
    blocked_issues,
    issue_columns,
    ready_issues,
    route,
)
from ralph_dev.core.decide.world import (
    NUDGE_MESSAGE,
    World,
    aware,
    dispatch_key,
    id_key,
    model_for,
    nudge_message,
)
from ralph_dev.core.model import Observed

__all__ = [
    "COLUMNS",
    "NUDGE_MESSAGE",
    "blocked_issues",
    "decide",
    "dispatch_key",
    "issue_columns",
    "model_for",
    "nudge_message",
    "ready_issues",
    "route",
]


def decide(observed: Observed, settings: ProjectSettings, now: datetime) -> Plan:
    """The actions that bring the world to what it should be, each with its reason.

    Order: the swarm's own (pauses and their ends, agents that go on, trunk's own
    verify, tracker writes workers' reports owe, adoption), then workers a budget or a
    tripwire stops, then per-issue upkeep (kill, merge, forget, reap, nudge, restart,
    hold, feedback, complete) by identifier, then the verified merge lane's landing and
    sending back, then spawns — resolve workers, orphan respawns, new dispatches — within
    the global and per-role limits, then the start of the lane's next verify, and last a
    groom run's opening when one is due.
    """
    world = World.build(observed, settings)
    swarm = SwarmRules(world, now)
    actions = swarm.run()
    if observed.repository_error is not None:
        # jj cannot see the workspaces: act on nothing else
        return Plan(fill(actions, observed, settings))
    stopped = stops(world)
    waited = frozenset(a.issue for a in actions if isinstance(a, Continue | Waited))
    decider = Decider(world, now, pauses=tuple(swarm.pauses.values()), waited=waited)
    decider.emit(*stopped, *egress_flags(world))
    skip = {a.issue for a in stopped}
    idents = set(world.issues) | set(world.windows) | set(world.workspaces) | set(world.records)
    for ident in sorted(idents - skip, key=id_key):
        decider.issue_chain(ident)
    lane = Lane(decider, decider.ready)
    lane.decide()
    decider.spawns()
    if lane.start is not None:
        decider.emit(lane.start)
    why = decider.groom_due()
    if why:
        decider.emit(OpenGroom(SWARM, f"opening a groom run: {why}"))
    ends = [aware(t) for t in (*(p.until for p in swarm.pauses.values()),
                               *(w.until for w in decider.waits.values())) if t is not None]
    if any(p.shared_from and p.until is not None and aware(p.until) <= now
           for p in swarm.pauses.values()):
        ends.append(now + SHARED_RECHECK)  # over there once that project says so
    return Plan(fill((*actions, *decider.actions), observed, settings), waits=decider.waits,
                load=decider.load, slots_wanted=decider.slots_wanted,
                due=min((t for t in ends if t > now), default=None))
