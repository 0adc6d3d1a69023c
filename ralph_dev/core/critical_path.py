"""How much unfinished work waits behind each issue: dispatch starts the critical path
first.

With a few slots and a dependency graph, starting an issue that many others wait on
(directly or through a chain) keeps the slots full later; starting a leaf first leaves
them idle at the end. Among issues of equal priority, dispatch takes the longest chain
of unfinished work waiting behind an issue first, then the most issues waiting.

Waiting means: blocked by it (``blocked_by``), or a child of an issue that waits
(children inherit their ancestors' blockers), transitively.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ralph_dev.core.model import Issue

Graph = tuple[tuple[str, tuple[str, ...], str | None], ...]
"""The unfinished issues as (identifier, blockers, parent): all the answer depends on."""

_last: list[tuple[Graph, dict[str, tuple[int, int]]]] = []
"""The last graph and its answer: every tick asks, and between two ticks the graph of
unfinished work rarely changes (building the key costs a tenth of the walk)."""


def work_behind(issues: Iterable[Issue]) -> dict[str, tuple[int, int]]:
    """identifier → (longest chain of unfinished issues waiting on it, how many wait).

    Cycles in the tracker's data (a person's mistake) are cut where they close, so
    every issue still gets a finite answer.
    """
    graph = tuple((i.identifier, i.blocked_by, i.parent) for i in issues
                  if not i.state_type.finished)
    if _last and _last[0][0] == graph:
        return dict(_last[0][1])
    answer = _walk(graph)
    _last[:] = [(graph, answer)]
    return dict(answer)


def _walk(graph: Graph) -> dict[str, tuple[int, int]]:
    unfinished = {ident for ident, _, _ in graph}
    waits_on: dict[str, set[str]] = defaultdict(set)  # issue → issues that wait on it
    for ident, blocked_by, parent in graph:
        for blocker in blocked_by:
            waits_on[blocker].add(ident)
        if parent:
            waits_on[parent].add(ident)
    depth: dict[str, int] = {}
    everyone: dict[str, frozenset[str]] = {}

    def visit(ident: str, path: frozenset[str]) -> tuple[int, frozenset[str]]:
        if ident in depth:
            return depth[ident], everyone[ident]
        longest, behind = 0, frozenset[str]()
        for waiting in waits_on.get(ident, ()):
            if waiting in path or waiting not in unfinished:
                continue
            chain, more = visit(waiting, path | {waiting})
            longest = max(longest, chain + 1)
            behind = behind | more | {waiting}
        depth[ident], everyone[ident] = longest, behind
        return longest, behind

    return {ident: (visit(ident, frozenset({ident}))[0], len(everyone[ident]))
            for ident in sorted(unfinished)}
