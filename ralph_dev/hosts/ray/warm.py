"""Attempts' processes started before they are wanted, and the claim that makes one of
them an attempt once.

Ray starts a new Python process for every actor, and that start is most of a spawn
over Ray (about 1 s of it on a small host). So the plane keeps a few worker actors
started on free slots, each with the node's clone fetched (:class:`WarmPool`); a spawn
takes one and tells it which attempt it is (``NodeWorker.bind``).

Such an actor cannot carry its attempt in its name, which Ray fixes when it starts. The
promise the name kept ("one attempt never runs twice", Ray refusing a second actor of
one name) is kept by :class:`Claims` instead: a put-if-absent key per attempt in Ray's
own key-value store (the GCS), naming the actor that runs it. A restarted controller
finds its attempts there.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayError
from ray.experimental import internal_kv  # put-if-absent in the GCS: the attempts' fence

from ralph_dev.core.model import Placement

KV_NAMESPACE = "ralph-dev-attempts"
"""Where the claims are kept in Ray's key-value store."""

WARM_MARK = "~"
"""A kept actor's name is ``PROJECT:~ID``: never an attempt's ``PROJECT:ISSUE#N``."""

IDLE_EXIT = 600.0
"""Seconds a kept actor no attempt took waits before it ends by itself: one kept for a
controller that is gone holds its slot no longer (a live controller makes another)."""


def kept_name(project: str) -> str:
    return f"{project}:{WARM_MARK}{uuid.uuid4().hex[:12]}"


def is_kept_name(name: str, project: str) -> bool:
    return name.startswith(f"{project}:{WARM_MARK}")


class Claims:
    """Which actor runs each attempt (``PROJECT:ISSUE#N`` → actor name), written once."""

    def __init__(self, project: str) -> None:
        self.project = project

    def claim(self, target: str, actor: str) -> str | None:
        """Make ``actor`` the one that runs ``target``; the actor already named for it
        instead, when one is (nothing is written then)."""
        if not internal_kv._internal_kv_put(target, actor, overwrite=False,
                                            namespace=KV_NAMESPACE):
            return None
        return self.holder(target)

    def holder(self, target: str) -> str | None:
        found = internal_kv._internal_kv_get(target, namespace=KV_NAMESPACE)
        return None if found is None else bytes(found).decode()

    def release(self, target: str) -> None:
        """The attempt has ended (its actor killed, or gone with its host)."""
        internal_kv._internal_kv_del(target, namespace=KV_NAMESPACE)

    def all(self) -> dict[str, str]:
        """Every attempt of the project claimed and not released: after a restart."""
        keys = internal_kv._internal_kv_list(f"{self.project}:", namespace=KV_NAMESPACE)
        found = {bytes(key).decode(): self.holder(bytes(key).decode()) for key in keys}
        return {target: actor for target, actor in found.items() if actor is not None}


@dataclass
class Kept:
    """One actor kept started, not yet an attempt."""

    actor: Any
    placed: Any
    """Its ``where`` call: answered once it runs, on its node."""
    since: float
    node: str | None = None


class WarmPool:
    """Up to ``size`` worker actors kept started on free slots. ``make`` starts one by
    the name given (its ``warm`` call fetching the node's clone is the pool's to ask)."""

    def __init__(self, make: Callable[[str], Any], project: str, size: int,
                 place_timeout: float) -> None:
        self.make = make
        self.project = project
        self.size = size
        self.place_timeout = place_timeout
        self._kept: dict[str, Kept] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._kept

    def ready(self, lost: Iterable[str] = ()) -> dict[str, str]:
        """The kept actors running now, each with its node (none on a ``lost`` node)."""
        waiting = [k.placed for k in self._kept.values() if k.node is None]
        answered = set(ray.wait(waiting, num_returns=len(waiting), timeout=0)[0]) \
            if waiting else set()
        for name, kept in list(self._kept.items()):
            if kept.node is None and kept.placed in answered:
                try:
                    where: Placement = ray.get(kept.placed, timeout=0)
                except RayError:  # it died starting: its slot is free again
                    self._end(name)
                    continue
                kept.node = where.node
        gone = set(lost)
        return {name: kept.node for name, kept in self._kept.items()
                if kept.node is not None and kept.node not in gone}

    def refill(self, free: int, *, keep: bool = True) -> None:
        """Start kept actors on the ``free`` slots Ray counts free now (those it has
        placed hold theirs already), up to the pool's size; ``keep`` False: end them
        all (their hosts may then go idle). One not placed in time found no slot (it
        went elsewhere): it is ended, asking nothing of an autoscaler."""
        if not keep or self.size <= 0:
            self.close()
            return
        now = time.monotonic()
        self.ready()
        for name, kept in list(self._kept.items()):
            if kept.node is None and now - kept.since > self.place_timeout:
                self._end(name)
        starting = sum(1 for k in self._kept.values() if k.node is None)
        for _ in range(min(self.size - len(self._kept), free - starting)):
            self.add(kept_name(self.project))

    def add(self, name: str, actor: Any = None) -> None:
        """A kept actor: started now, or ``actor``, one found running (a controller
        before this one kept it)."""
        if actor is None:
            actor = self.make(name)
            actor.warm.remote()  # fetched while nothing waits for it
        self._kept[name] = Kept(actor=actor, placed=actor.where.remote(),
                                since=time.monotonic())

    def take(self, busy: Counter[str], lost: Iterable[str] = (), *, wait: float = 0.0
             ) -> tuple[str, Any] | None:
        """A running kept actor, from the node with the fewest of ``busy`` (spread, as
        Ray's SPREAD places a new one); while none runs but some start, the first up
        within ``wait`` seconds; None when none does."""
        ready = self.ready(lost)
        starting = [k.placed for k in self._kept.values() if k.node is None]
        if not ready and starting and wait > 0:
            ray.wait(starting, num_returns=1, timeout=wait)
            ready = self.ready(lost)
        if not ready:
            return None
        name = min(ready, key=lambda n: (busy[ready[n]], self._kept[n].since))
        return name, self._kept.pop(name).actor

    def forget(self, listed: Iterable[str]) -> None:
        """Only the kept actors Ray still lists stay (one that died went with its
        node, or ended idle)."""
        alive = set(listed)
        for name in [n for n in self._kept if n not in alive]:
            del self._kept[name]

    def _end(self, name: str) -> None:
        kept = self._kept.pop(name)
        with contextlib.suppress(RayError, ValueError):
            ray.kill(kept.actor, no_restart=True)

    def close(self) -> None:
        for name in list(self._kept):
            self._end(name)
