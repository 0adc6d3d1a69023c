"""Cycles in "blocked by" graphs: found, and named so a person can break them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence


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
