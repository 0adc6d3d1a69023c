"""Cycles in "blocked by" graphs: found, and named so a person can break them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from ralph_dev.core.model import Issue, NewIssue


def format_cycle(path: Sequence[str]) -> str:
    """``["A", "B", "A"]`` → ``"A → B → A"`` (each is blocked by the next)."""
    return " → ".join(path)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle in ``edges`` (node → nodes it is blocked by) as a closed path, or None.

    Iterative DFS so a long chain of blockers cannot hit the recursion limit;
    nodes are visited in sorted order so the reported cycle is deterministic.
    """
    white, grey, black = 0, 1, 2
    colour: dict[str, int] = {}
    for start in sorted(edges):
        if colour.get(start, white) != white:
            continue
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges.get(start, ()))))]
        path = [start]
        colour[start] = grey
        while stack:
            node, children = stack[-1]
            advanced = False
            for child in children:
                state = colour.get(child, white)
                if state == grey:
                    return [*path[path.index(child):], child]
                if state == white:
                    colour[child] = grey
                    path.append(child)
                    stack.append((child, iter(sorted(edges.get(child, ())))))
                    advanced = True
                    break
            if not advanced:
                colour[node] = black
                path.pop()
                stack.pop()
    return None


WAITS_FOR = ("each waits for the next: it is blocked by it, or it is its parent, which "
             "finishes only when its sub-issues have")


def waits(issues: Iterable[Issue]) -> tuple[dict[str, set[str]], dict[str, str]]:
    """What waits for what among ``issues``: blockers by issue, and each sub-issue's
    parent (the two arguments of ``dependency_cycle`` and ``batch_cycle``)."""
    issues = list(issues)
    blocked_by = {issue.identifier: set(issue.blocked_by) for issue in issues}
    parent_of = {child: issue.identifier for issue in issues for child in issue.children}
    return blocked_by, parent_of


def dependency_cycle(blocked_by: Mapping[str, Iterable[str]],
                     parent_of: Mapping[str, str]) -> list[str] | None:
    """A cycle in what waits for what, or None.

    An issue waits for its blockers, and a parent (a phase) for its sub-issues.
    Blocker edges alone can be acyclic while the two together deadlock: a
    sub-issue blocked by its own parent, a task blocked by its phase.
    """
    edges = {node: set(blockers) for node, blockers in blocked_by.items()}
    for child, parent in parent_of.items():
        edges.setdefault(parent, set()).add(child)
    return find_cycle(edges)


def batch_cycle(entries: Sequence[NewIssue], blocked_by: Mapping[str, Iterable[str]],
                parent_of: Mapping[str, str]) -> str | None:
    """The cycle creating ``entries`` would close among existing issues (``blocked_by``,
    ``parent_of`` by identifier), named for a person (refs, titles), or None."""
    refs = {entry.ref for entry in entries if entry.ref}
    node = [f"ref:{e.ref}" if e.ref else f"new:{i}" for i, e in enumerate(entries)]
    names = {n: (n[4:] if n.startswith("ref:") else repr(entries[i].title))
             for i, n in enumerate(node)}

    def resolve(text: str) -> str:
        return f"ref:{text}" if text in refs else text

    edges = {name: set(blockers) for name, blockers in blocked_by.items()}
    parents = dict(parent_of)
    for i, entry in enumerate(entries):
        edges.setdefault(node[i], set()).update(resolve(b) for b in entry.blocked_by)
        if entry.parent:
            parents[node[i]] = resolve(entry.parent)
    cycle = dependency_cycle(edges, parents)
    return format_cycle([names.get(n, n) for n in cycle]) if cycle else None
