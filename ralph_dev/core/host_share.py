"""How the projects on one host share its workers (``[host] max_workers``).

Each project's controller admits its own workers, under its own ``limits``; the host's
limit holds across all of them. Every controller publishes its load each tick (its live
workers, how many of its issues want one, the most urgent of them, its share), and this
rule, the same in ``decide`` (which plans) and at the moment a worker is admitted (which
checks under the host's lock), says how many more workers one project may start now.

When projects compete for the host's free slots, the person's priorities come first
(work more urgent than anything the project itself waits with is left its slots), then
each project's share (``[projects.X] share``): a project below its part of the host may
take slots up to that part; above it, only what no one below theirs waits for. A project
alone with ready work takes every free slot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

NO_PRIORITY = 0
"""The tracker's priority 0 is "none": less urgent than low (4)."""


@dataclass(frozen=True)
class ProjectLoad:
    """One project's load on the host, as its controller last published it."""

    used: int = 0
    """Its workers alive on this host, and those being started."""
    wanting: int = 0
    """Its issues that want a worker and wait for one."""
    top_priority: int = NO_PRIORITY
    """The most urgent priority among them (1 urgent .. 4 low, 0 none)."""
    share: float = 1.0

    def as_json(self) -> dict[str, object]:
        return {"used": self.used, "wanting": self.wanting,
                "top_priority": self.top_priority, "share": self.share}


def urgency(priority: int) -> int:
    """Smaller is more urgent; "none" comes last."""
    return priority if priority > NO_PRIORITY else 5


def host_allowance(me: str, loads: Mapping[str, ProjectLoad], max_workers: int) -> int:
    """How many more workers project ``me`` may start on the host now (0 or more).

    ``loads`` has every project publishing on the host, ``me`` included with its own
    load as it stands now."""
    free = max_workers - sum(load.used for load in loads.values())
    mine = loads.get(me, ProjectLoad())
    if free <= 0 or mine.wanting <= 0:
        return 0
    others = {name: load for name, load in loads.items() if name != me and load.wanting > 0}
    if not others:
        return min(free, mine.wanting)
    more_urgent = sum(load.wanting for load in others.values()
                      if urgency(load.top_priority) < urgency(mine.top_priority))
    free -= more_urgent
    if free <= 0:
        return 0
    weights = sum(load.share for load in loads.values() if load.wanting > 0 or load.used > 0)

    def below_share(load: ProjectLoad) -> float:
        return max_workers * load.share / weights - load.used if weights > 0 else 0.0

    rivals_below = any(below_share(load) > 0 for load in others.values()
                       if urgency(load.top_priority) <= urgency(mine.top_priority))
    if rivals_below:
        free = min(free, max(0, math.ceil(below_share(mine))))
    return min(free, mine.wanting)


def host_said(loads: Mapping[str, ProjectLoad], max_workers: int) -> str:
    """The host's load in words, for a wait: "3/3 workers on this host (app: 2, web: 1)"."""
    used = sum(load.used for load in loads.values())
    parts = ", ".join(f"{name}: {load.used}" for name, load in sorted(loads.items())
                      if load.used)
    return f"{used}/{max_workers} workers on this host" + (f" ({parts})" if parts else "")
