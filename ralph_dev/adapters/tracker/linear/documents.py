"""The GraphQL documents ralph-dev sends Linear: one named operation per file in graphql/.

A test validates each against Linear's published schema, so a typo fails in CI,
not at 3 a.m.; fragments are shared through ``fragments.graphql``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

GRAPHQL_DIR = Path(__file__).with_name("graphql")


_FRAGMENT_RE = re.compile(r"^fragment (\w+) on ", re.MULTILINE)


_SPREAD_RE = re.compile(r"\.\.\.(\w+)")


@functools.cache
def _fragments() -> dict[str, str]:
    """The shared fragments by name (each with the comment lines above it)."""
    text = (GRAPHQL_DIR / "fragments.graphql").read_text()
    starts = [m.start() for m in _FRAGMENT_RE.finditer(text)]
    out = {}
    for begin, finish in zip(starts, [*starts[1:], len(text)], strict=True):
        body = text[begin:finish]
        out[_FRAGMENT_RE.match(body).group(1)] = body.strip() + "\n"  # type: ignore[union-attr]
    return out


@functools.cache
def document(operation: str) -> str:
    """The text of ``graphql/OPERATION.graphql`` with the fragments it uses, and only
    those (graphql rejects a document with an unused fragment)."""
    text = (GRAPHQL_DIR / f"{operation}.graphql").read_text()
    fragments = _fragments()
    wanted: list[str] = []
    pending = _SPREAD_RE.findall(text)
    while pending:
        name = pending.pop()
        if name not in wanted:
            wanted.append(name)
            pending += _SPREAD_RE.findall(fragments[name])
    return "\n".join([text, *(fragments[name] for name in sorted(wanted))])


def operations() -> list[str]:
    """Every operation the client may send (one file each)."""
    return sorted(p.stem for p in GRAPHQL_DIR.glob("*.graphql") if p.stem != "fragments")


_MUTATION_RE = re.compile(r"^\s*mutation\b", re.MULTILINE)


def is_mutation(operation: str) -> bool:
    return bool(_MUTATION_RE.search(document(operation)))
