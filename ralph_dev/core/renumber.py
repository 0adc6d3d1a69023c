"""A renumbered issue keeps its one worker: identity by the tracker's stable id.

Linear gives an issue a new identifier when it moves to another team (``ENG-7``
becomes ``OPS-3``; the old name still resolves). ralph-dev's own things for an
issue — its worker record, tmux window, jj workspace, run directory and bookmark
— carry the name the issue had when its worker started, and a running agent
cannot be renamed under its feet. So while any of them exists, the controller
keeps seeing the issue under that first name (:func:`keep_local_names`): decide
finds the one worker it has, never starts a second, and every tracker write by
the old name reaches the same issue. Once the worker's things are gone the
issue is seen by its current name again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from ralph_dev.core.model import Issue


def local_aliases(renamed: Mapping[str, str], local: Collection[str]) -> dict[str, str]:
    """Current identifier → the earlier one ralph-dev's own things still carry."""
    return {new: old for old, new in renamed.items() if old in local and new not in local}


def keep_local_names(issues: tuple[Issue, ...], renamed: Mapping[str, str],
                     local: Collection[str]) -> tuple[Issue, ...]:
    """``issues`` with every renumbered issue that has local things under an earlier name
    shown under that name again, in its relations too."""
    aliases = local_aliases(renamed, local)
    if not aliases:
        return issues

    def name(identifier: str | None) -> str | None:
        return aliases.get(identifier, identifier) if identifier else identifier

    return tuple(dataclasses.replace(
        issue, identifier=aliases.get(issue.identifier, issue.identifier),
        parent=name(issue.parent),
        children=tuple(aliases.get(c, c) for c in issue.children),
        blocked_by=tuple(aliases.get(b, b) for b in issue.blocked_by),
    ) for issue in issues)
