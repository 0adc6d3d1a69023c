"""Linear's answers turned into ralph-dev's model: cached entries, teams, states, labels."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from ralph_dev.adapters.tracker.linear.client import LinearUnavailable
from ralph_dev.core.model import (
    Comment,
    Issue,
    StateType,
)

if TYPE_CHECKING:
    pass

log = structlog.get_logger(__name__)

RALPH_MARKER = "[ralph-dev] "
"""Prefix of every comment ralph-dev writes: such comments are never human feedback."""
KEEP_COMMENTS = 50
"""Newest comments kept per cached issue (feedback relay reads only the newest)."""


# --- parsing ---------------------------------------------------------------------------


@contextlib.contextmanager
def parsing(operation: str) -> Iterator[None]:
    """Turn a missing or mistyped field in Linear's answer into a typed, retryable error."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        log.warning("linear_malformed", operation=operation, problem=repr(exc)[:200])
        raise LinearUnavailable(
            f"Linear's answer to {operation} is incomplete or malformed ({type(exc).__name__}: "
            f"{str(exc)[:120]}); will retry"
        ) from None


def _time(text: str) -> datetime:
    if not isinstance(text, str):
        raise TypeError(f"expected a timestamp, got {text!r}")
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass
class Entry:
    """One cached issue: the Issue without children, its comments, its label ids."""

    issue: Issue
    team_id: str
    project_id: str | None
    label_ids: dict[str, str]
    comments: dict[str, Comment] = field(default_factory=dict)
    gone: bool = False

    def add_comments(self, more: Mapping[str, Comment]) -> None:
        merged = {**self.comments, **more}
        if len(merged) > KEEP_COMMENTS:
            newest = sorted(merged.items(), key=lambda kv: kv[1].created_at)[-KEEP_COMMENTS:]
            merged = dict(newest)
        self.comments = merged


def comment_from_node(node: Mapping[str, Any]) -> tuple[str, Comment]:
    body = node["body"]
    if not isinstance(body, str):
        raise TypeError("comment body is not text")
    user = node.get("user") or {}
    bot = node.get("botActor") or {}
    author = user.get("name") or bot.get("name") or "unknown"
    return str(node["id"]), Comment(
        author=str(author), body=body, created_at=_time(node["createdAt"]),
        by_ralph=body.startswith(RALPH_MARKER),
    )


def entry_from_node(node: Mapping[str, Any]) -> Entry:
    state = node["state"]
    parent = node.get("parent")
    blockers = tuple(
        rel["issue"]["identifier"]
        for rel in node["inverseRelations"]["nodes"]
        if rel["type"] == "blocks"
    )
    labels = {lab["id"]: lab["name"] for lab in node["labels"]["nodes"]}
    issue = Issue(
        identifier=str(node["identifier"]),
        id=str(node["id"]),
        title=str(node["title"]),
        description=node.get("description") or "",
        state_name=str(state["name"]),
        state_type=StateType(state["type"]),
        priority=int(node["priority"]),
        sort_order=float(node["sortOrder"]),
        labels=frozenset(labels.values()),
        parent=parent["identifier"] if parent else None,
        blocked_by=blockers,
        created_at=_time(node["createdAt"]),
        updated_at=_time(node["updatedAt"]),
        team=str(node["team"]["key"]),
    )
    entry = Entry(issue=issue, team_id=str(node["team"]["id"]),
                   project_id=(node.get("project") or {}).get("id"), label_ids=labels,
                   gone=bool(node.get("archivedAt") or node.get("trashed")))
    for cnode in node["comments"]["nodes"]:
        cid, comment = comment_from_node(cnode)
        entry.comments[cid] = comment
    return entry


@dataclass(frozen=True)
class LinearState:
    id: str
    name: str
    type: str
    position: float


@dataclass(frozen=True)
class LinearTeam:
    id: str
    key: str
    name: str
    states: tuple[LinearState, ...]

    def state(self, *, name: str | None, type: StateType | None) -> LinearState | None:
        """By name (case-insensitive), else the first state of ``type`` by position."""
        if name is not None:
            for state in self.states:
                if state.name.casefold() == name.casefold():
                    return state
            return None
        wanted = [s for s in self.states if type is not None and s.type == type.value]
        return min(wanted, key=lambda s: s.position) if wanted else None


@dataclass(frozen=True)
class LinearProject:
    id: str
    name: str
    slug: str
    teams: tuple[LinearTeam, ...]


@dataclass(frozen=True)
class LinearLabel:
    id: str
    name: str
    team_id: str | None
    is_group: bool = False


