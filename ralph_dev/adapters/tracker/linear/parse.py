"""Linear's answers turned into plain records: cached issues, comments, teams, labels.

An ``Entry`` is what ralph-dev keeps of one Linear issue, keyed by its UUID
(identifiers change when an issue moves to another team). Entries of the
project and entries outside it (blockers and children in other projects,
archived ones) share the type; ``cache.IssueCache`` decides what each one is.
Every entry round-trips through JSON for the disk cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from ralph_dev.adapters.tracker.linear.errors import LinearUnavailable
from ralph_dev.core.model import Comment, StateType

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


def parse_time(text: str) -> datetime:
    if not isinstance(text, str):
        raise TypeError(f"expected a timestamp, got {text!r}")
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def linear_time(moment: datetime) -> str:
    """A time as Linear writes it (UTC, milliseconds, ``Z``)."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Ref:
    """Another issue as a connection names it: its UUID and identifier at that time."""

    id: str
    identifier: str


@dataclass
class Entry:
    """One Linear issue as ralph-dev keeps it."""

    id: str
    identifier: str
    title: str
    state_name: str
    state_type: StateType
    team_id: str
    team_key: str
    updated_at: datetime
    project_id: str | None = None
    description: str = ""
    priority: int = 0
    sort_order: float = 0.0
    created_at: datetime | None = None
    previous_identifiers: tuple[str, ...] = ()
    parent: Ref | None = None
    label_ids: tuple[str, ...] = ()
    blockers: tuple[Ref, ...] = ()
    """Issues with a "blocks" relation to this one (related/duplicate/similar ignored)."""
    children: tuple[Ref, ...] = ()
    archived: bool = False
    trashed: bool = False
    full: bool = True
    """False for an issue read with RelatedFields (no labels, relations, children)."""
    blockers_after: str | None = None
    """Cursor of the first inverse relation NOT read yet (the page was full)."""
    children_after: str | None = None
    comments: dict[str, Comment] = field(default_factory=dict)

    @property
    def gone(self) -> bool:
        """Archived or in the trash: never listed, never blocks anything."""
        return self.archived or self.trashed

    def add_comments(self, more: Mapping[str, Comment]) -> None:
        merged = {**self.comments, **more}
        if len(merged) > KEEP_COMMENTS:
            newest = sorted(merged.items(), key=lambda kv: kv[1].created_at)[-KEEP_COMMENTS:]
            merged = dict(newest)
        self.comments = merged

    # -- the disk cache's form -----------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["state_type"] = self.state_type.value
        out["updated_at"] = self.updated_at.isoformat()
        out["created_at"] = self.created_at.isoformat() if self.created_at else None
        out["comments"] = {cid: {**asdict(c), "created_at": c.created_at.isoformat()}
                           for cid, c in self.comments.items()}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        raw = dict(data)
        raw["state_type"] = StateType(raw["state_type"])
        raw["updated_at"] = parse_time(raw["updated_at"])
        raw["created_at"] = parse_time(raw["created_at"]) if raw.get("created_at") else None
        raw["parent"] = Ref(**raw["parent"]) if raw.get("parent") else None
        for key in ("previous_identifiers", "label_ids"):
            raw[key] = tuple(raw.get(key) or ())
        for key in ("blockers", "children"):
            raw[key] = tuple(Ref(**r) for r in raw.get(key) or ())
        raw["comments"] = {cid: Comment(**{**c, "created_at": parse_time(c["created_at"])})
                           for cid, c in (raw.get("comments") or {}).items()}
        return cls(**raw)


def comment_from_node(node: Mapping[str, Any]) -> tuple[str, Comment]:
    """A comment; ``by_bot`` when no person wrote it (an integration such as GitHub
    posting "Linked PR #42 opened", or an external user): never human feedback."""
    body = node["body"]
    if not isinstance(body, str):
        raise TypeError("comment body is not text")
    user = node.get("user") or {}
    bot = node.get("botActor") or {}
    external = node.get("externalUser") or {}
    author = user.get("name") or bot.get("name") or external.get("name") or "unknown"
    return str(node["id"]), Comment(
        author=str(author), body=body, created_at=parse_time(node["createdAt"]),
        by_ralph=body.startswith(RALPH_MARKER), by_bot=not user,
    )


def ref_from_node(node: Mapping[str, Any]) -> Ref:
    return Ref(str(node["id"]), str(node["identifier"]))


def blockers_from(connection: Mapping[str, Any]) -> tuple[tuple[Ref, ...], str | None]:
    """The "blocks" relations of an ``inverseRelations`` page and the cursor of the
    next page (None when this was the last)."""
    refs = tuple(ref_from_node(rel["issue"]) for rel in connection["nodes"]
                 if rel["type"] == "blocks")
    return refs, next_page(connection)


def children_from(connection: Mapping[str, Any]) -> tuple[tuple[Ref, ...], str | None]:
    return tuple(ref_from_node(n) for n in connection["nodes"]), next_page(connection)


def next_page(connection: Mapping[str, Any]) -> str | None:
    info = connection["pageInfo"]
    if not info["hasNextPage"]:
        return None
    cursor = info["endCursor"]
    if not isinstance(cursor, str) or not cursor:
        raise ValueError("a connection says it has more but gives no cursor")
    return cursor


def entry_from_node(node: Mapping[str, Any]) -> Entry:
    """An issue read with IssueFields (``full``) or RelatedFields."""
    state = node["state"]
    parent = node.get("parent")
    full = "labelIds" in node
    entry = Entry(
        id=str(node["id"]),
        identifier=str(node["identifier"]),
        title=str(node["title"]),
        state_name=str(state["name"]),
        state_type=StateType(state["type"]),
        team_id=str(node["team"]["id"]),
        team_key=str(node["team"]["key"]),
        updated_at=parse_time(node["updatedAt"]),
        project_id=(node.get("project") or {}).get("id"),
        parent=ref_from_node(parent) if parent else None,
        archived=bool(node.get("archivedAt")),
        trashed=bool(node.get("trashed")),
        full=full,
    )
    if not full:
        return entry
    entry.description = node.get("description") or ""
    entry.priority = int(node["priority"])
    entry.sort_order = float(node["sortOrder"])
    entry.created_at = parse_time(node["createdAt"])
    entry.previous_identifiers = tuple(str(x) for x in node["previousIdentifiers"])
    entry.label_ids = tuple(str(x) for x in node["labelIds"])
    entry.blockers, entry.blockers_after = blockers_from(node["inverseRelations"])
    entry.children, entry.children_after = children_from(node["children"])
    for key in ("comments", "recentComments"):
        for cnode in (node.get(key) or {"nodes": []})["nodes"]:
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

    def describe_states(self) -> str:
        return ", ".join(f"{s.name} ({s.type})" for s in self.states)


@dataclass(frozen=True)
class LinearProject:
    id: str
    name: str
    slug: str
    teams: tuple[LinearTeam, ...]

    def team(self, key_or_id: str) -> LinearTeam | None:
        return next((t for t in self.teams if key_or_id in (t.id, t.key)), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LinearProject:
        teams = tuple(
            LinearTeam(t["id"], t["key"], t["name"],
                       tuple(LinearState(**s) for s in t["states"]))
            for t in data["teams"])
        return cls(data["id"], data["name"], data["slug"], teams)


@dataclass(frozen=True)
class LinearLabel:
    id: str
    name: str
    team_id: str | None
    is_group: bool = False
