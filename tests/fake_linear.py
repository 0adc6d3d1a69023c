"""An in-process fake of Linear's GraphQL API, executing Linear's REAL schema.

aiohttp + graphql-core serve the schema Linear publishes (``schema.graphql``,
1.25 MB, found through ``RALPH_DEV_LINEAR_SCHEMA`` or beside the clone; tests
skip without it) on 127.0.0.1, in a thread with its own event loop, so the
real gql client in ralph-dev talks HTTP to it exactly as it would to
api.linear.app. Every request is validated against the whole schema; the
resolvers implement the fields ralph-dev's documents use, and any other field
fails LOUDLY (a GraphQL error now, an AssertionError when the fake stops),
never a silent null.

It behaves as Linear does where ralph-dev has been bitten: an issue created
without ``stateId`` lands in its team's default (Backlog) state; moving an
issue to another team renumbers it and keeps ``previousIdentifiers``;
relations come in four types and connections page (cut at ``first``);
issues live in several projects and teams, and may be archived or trashed
(hidden unless ``includeArchived``); bot comments have a null ``user``;
descriptions may be null. Rate limiting is a leaky bucket per hour for
requests and for complexity points (Linear's cost model,
``linear_complexity``), with Linear's headers (resets in epoch ms),
``Retry-After``, HTTP 400 + ``RATELIMITED`` when empty, and queries over
10,000 points refused. Switches inject outages (5xx, slow answers,
malformed or partial payloads) and a revoked key.

``populate_workspace`` fills it like a real workspace (hundreds of issues,
two teams with different state names, cross-project relations, archived and
trashed issues, an issue with more relations than one page, bot comments).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import itertools
import json
import math
import os
import random
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web
from graphql import GraphQLError, GraphQLSchema, build_schema, graphql
from linear_complexity import SINGLE_QUERY_CAP, complexity

from ralph_dev.devtools.loopback import LoopbackServer

REPO = Path(__file__).resolve().parent.parent
SCHEMA_ENV = "RALPH_DEV_LINEAR_SCHEMA"
MISSING_SCHEMA = (
    "Linear's schema.graphql not found: set RALPH_DEV_LINEAR_SCHEMA or put "
    "shared/linear/schema.graphql beside the clone (the Linear tests need it)"
)

DEFAULT_STATES: tuple[tuple[str, str], ...] = (
    ("Backlog", "backlog"),
    ("Todo", "unstarted"),
    ("In Progress", "started"),
    ("In Review", "started"),
    ("Done", "completed"),
    ("Canceled", "canceled"),
    ("Duplicate", "duplicate"),
)
OPS_STATES: tuple[tuple[str, str], ...] = (
    ("Triage", "triage"),
    ("Icebox", "backlog"),
    ("Ready", "unstarted"),
    ("Doing", "started"),
    ("Shipped", "completed"),
    ("Won't do", "canceled"),
)
"""A second team's workflow with other names (and triage), as real workspaces have."""

HOUR = 3600.0
ChangeCallback = Callable[[str, str, dict[str, Any]], None]


def schema_path() -> Path | None:
    beside_the_clone = REPO.parent / "shared/linear/schema.graphql"
    for candidate in (os.environ.get(SCHEMA_ENV), str(beside_the_clone)):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@functools.cache
def real_schema() -> GraphQLSchema:
    """Linear's schema, built once per process (about 1.5 s)."""
    path = schema_path()
    if path is None:
        raise FileNotFoundError(MISSING_SCHEMA)
    return build_schema(path.read_text())


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


_DURATION = re.compile(r"(-)?P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?")


def _moment(text: str, now: datetime) -> datetime:
    """A ``DateTimeOrDuration``: an ISO-8601 time, or a duration such as ``-PT15M``."""
    match = _DURATION.fullmatch(text)
    if match and text not in ("P", "-P"):
        sign, days, hours, minutes, seconds = match.groups()
        delta = timedelta(days=int(days or 0), hours=int(hours or 0), minutes=int(minutes or 0),
                          seconds=int(seconds or 0))
        return now - delta if sign else now + delta
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise GraphQLError(f"invalid DateTimeOrDuration {text!r}") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _cursor(key: str) -> str:
    return base64.b64encode(f"c:{key}".encode()).decode()


def _uncursor(text: str) -> str:
    try:
        return base64.b64decode(text).decode().split(":", 1)[1]
    except (ValueError, IndexError) as exc:
        raise GraphQLError(f"bad cursor {text!r}") from exc


class NotImplementedByFake(GraphQLError):
    """A field, argument or filter of Linear's schema this fake does not serve."""


def not_found(kind: str) -> GraphQLError:
    return GraphQLError(
        f"Entity not found: {kind}",
        extensions={"type": "invalid input", "code": "INPUT_ERROR",
                    "userPresentableMessage": f"Could not find referenced {kind}."},
    )


def bad_input(message: str) -> GraphQLError:
    return GraphQLError(message, extensions={"type": "invalid input", "code": "INPUT_ERROR"})


@dataclass
class Faults:
    """What the next requests should suffer. Each list is a queue consumed per request."""

    queue: list[str] = field(default_factory=list)
    """Entries: "ratelimited", "500", "502", "503", "internal" (500 + GraphQL error),
    "badinput", "slow", "malformed", "partial", "nodata"."""
    always: str | None = None
    """A fault applied to every request until cleared (an outage)."""
    slow_seconds: float = 3.0


@dataclass
class Bucket:
    """Linear's leaky bucket: ``limit`` per hour, refilled continuously."""

    limit: float
    level: float
    at: float
    """When ``level`` was last brought up to date (epoch seconds)."""

    def refill(self, now: float) -> None:
        self.level = min(self.limit, self.level + max(0.0, now - self.at) * self.limit / HOUR)
        self.at = now

    def reset_ms(self, now: float) -> int:
        """When the bucket is full again, in epoch milliseconds (Linear's header)."""
        return int((now + (self.limit - self.level) * HOUR / self.limit) * 1000)

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` is available."""
        return max(0.0, (amount - self.level) * HOUR / self.limit)


# --- connections ---------------------------------------------------------------------


def connection(items: list[dict[str, Any]], *, first: int | None = None,
               after: str | None = None, last: int | None = None,
               before: str | None = None) -> dict[str, Any]:
    """A Relay connection over ``items`` (each with an ``id``), cut at ``first``."""
    if last is not None or before is not None:
        raise NotImplementedByFake("the fake Linear pages forward only (first/after)")
    start = 0
    if after:
        key = _uncursor(after)
        ids = [item["id"] for item in items]
        if key not in ids:
            raise GraphQLError(f"cursor {after!r} does not point into this list")
        start = ids.index(key) + 1
    size = 50 if first is None else first
    if size < 0 or size > 250:
        raise bad_input("first must be between 0 and 250")
    page = items[start:start + size]
    end = start + len(page)
    info = {
        "hasNextPage": end < len(items),
        "hasPreviousPage": start > 0,
        "endCursor": _cursor(page[-1]["id"]) if page else None,
        "startCursor": _cursor(page[0]["id"]) if page else None,
    }
    return {"nodes": page, "pageInfo": info}


def _order(records: list[dict[str, Any]], order_by: Any) -> list[dict[str, Any]]:
    """Newest first, by ``createdAt`` (the default) or ``updatedAt``, as Linear returns."""
    key = str(getattr(order_by, "value", order_by) or "createdAt")
    return sorted(records, key=lambda r: (r[key], r["id"]), reverse=True)


class FakeLinear(LoopbackServer):
    """``with FakeLinear() as fake: … fake.url …``."""

    name = "fake-linear"

    def __init__(self, api_key: str = "lin_api_fake_0123456789", *, host: str = "127.0.0.1",
                 clock: Callable[[], datetime] | None = None):
        super().__init__(host)
        self.api_key = api_key
        try:
            self.schema = real_schema()
        except FileNotFoundError:
            if "PYTEST_CURRENT_TEST" in os.environ:
                import pytest

                pytest.skip(MISSING_SCHEMA)
            raise
        self.clock: Callable[[], datetime] = clock or (lambda: datetime.now(UTC))
        """Linear's clock: stamps, rate-limit buckets. Tests may swap in a simulated one."""
        self.viewer = {"id": str(uuid.uuid4()), "name": "Ralph Tester"}
        self.teams: dict[str, dict[str, Any]] = {}
        self.states: dict[str, dict[str, Any]] = {}
        self.projects: dict[str, dict[str, Any]] = {}
        self.labels: dict[str, dict[str, Any]] = {}
        self.issues: dict[str, dict[str, Any]] = {}
        self.relations: dict[str, dict[str, Any]] = {}
        self.comments: dict[str, dict[str, Any]] = {}
        self.faults = Faults()
        self.revoked = False
        """True: the key is refused as Linear refuses a revoked key."""
        self.rate_headers: dict[str, str] = {}
        """Extra response headers that override the computed ones (tests force values)."""
        self.send_retry_after = True
        """Linear's page does not promise ``Retry-After``: tests turn it off too."""
        self.requests_limit = 2_500.0
        self.complexity_limit = 3_000_000.0
        self.buckets: dict[str, Bucket] = {}
        self.requests: list[dict[str, Any]] = []
        """Every request: operationName, variables, complexity, status, response bytes."""
        self.bodies: deque[str] = deque(maxlen=64)
        """The last response bodies (to check what was downloaded)."""
        self.unimplemented: list[str] = []
        """Fields/filters asked for that the fake does not serve: fails the test on stop."""
        self._last_stamp = self.clock()
        self._callbacks: list[ChangeCallback] = []
        self._lock = threading.RLock()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/graphql"

    def stop(self) -> None:
        super().stop()
        if self.unimplemented:
            raise AssertionError("ralph-dev asked the fake Linear for what it does not serve: "
                                 + "; ".join(dict.fromkeys(self.unimplemented)))

    # -- time: Linear's clock, strictly increasing so updatedAt ordering is deterministic --

    def now(self) -> datetime:
        with self._lock:
            stamp = max(self.clock(), self._last_stamp + timedelta(milliseconds=1))
            self._last_stamp = stamp
            return stamp

    @contextlib.contextmanager
    def history(self, days: float = 120, step: timedelta = timedelta(minutes=10)
                ) -> Iterator[None]:
        """Stamp what is made inside as if it happened over the past ``days`` days,
        ``step`` apart, as a workspace that grew over months (not in one second)."""
        present = self.clock
        start = present() - timedelta(days=days)
        calls = itertools.count()
        self.clock = lambda: start + next(calls) * step
        self._last_stamp = start
        try:
            yield
        finally:
            if self.clock() > present():
                raise AssertionError("history ran into the present: give it more days")
            self.clock = present

    # -- hooks -------------------------------------------------------------------------

    def on_change(self, callback: ChangeCallback) -> None:
        """Call ``callback(event_type, action, data)`` after each mutation (webhooks hook)."""
        self._callbacks.append(callback)

    def _changed(self, event_type: str, action: str, data: dict[str, Any]) -> None:
        for callback in list(self._callbacks):
            callback(event_type, action, dict(data))

    def operations(self) -> list[str]:
        with self._lock:
            return [str(r.get("operationName")) for r in self.requests]

    def spent(self, since: int = 0) -> tuple[int, int]:
        """(requests, complexity points) answered since request number ``since``."""
        with self._lock:
            done = [r for r in self.requests[since:] if r.get("status") == 200]
            return len(done), sum(int(r.get("complexity") or 0) for r in done)

    # -- seeding -------------------------------------------------------------------------

    def add_team(self, key: str, name: str | None = None,
                 states: Iterable[tuple[str, str]] = DEFAULT_STATES) -> str:
        team_id = str(uuid.uuid4())
        self.teams[team_id] = {"id": team_id, "key": key, "name": name or key.title(),
                               "counter": 0}
        for position, (state_name, state_type) in enumerate(states):
            sid = str(uuid.uuid4())
            self.states[sid] = {"id": sid, "name": state_name, "type": state_type,
                                "position": float(position), "team_id": team_id}
        return team_id

    def team_states(self, team_id: str) -> list[dict[str, Any]]:
        return sorted((s for s in self.states.values() if s["team_id"] == team_id),
                      key=lambda s: s["position"])

    def default_state(self, team_id: str) -> dict[str, Any]:
        """Where Linear puts a new issue without ``stateId``: the team's first Backlog
        state (the default of every new team), else its first state."""
        states = self.team_states(team_id)
        return next((s for s in states if s["type"] == "backlog"), states[0])

    def add_project(self, name: str, team_ids: Iterable[str], slug: str | None = None) -> str:
        pid = str(uuid.uuid4())
        self.projects[pid] = {"id": pid, "name": name, "createdAt": self.now(),
                              "slugId": slug or uuid.uuid4().hex[:12], "team_ids": list(team_ids)}
        return pid

    def add_label(self, name: str, team_id: str | None = None, is_group: bool = False) -> str:
        lid = str(uuid.uuid4())
        self.labels[lid] = {"id": lid, "name": name, "team_id": team_id, "isGroup": is_group,
                            "createdAt": self.now()}
        return lid

    def team_by_key(self, key: str) -> dict[str, Any]:
        return next(t for t in self.teams.values() if t["key"] == key)

    def state_id(self, team_id: str, name: str) -> str:
        return next(s["id"] for s in self.states.values()
                    if s["team_id"] == team_id and s["name"] == name)

    def add_issue(self, team_id: str, title: str, *, project_id: str | None = None,
                  state: str = "Todo", labels: Iterable[str] = (), parent: str | None = None,
                  priority: int = 0, description: str | None = "") -> str:
        """Create an issue directly (no webhook); returns its identifier."""
        with self._lock:
            rec = self._new_issue(team_id, title, project_id=project_id,
                                  state_id=self.state_id(team_id, state),
                                  label_ids=[self._label_named(x, team_id) for x in labels],
                                  parent_id=self._issue(parent)["id"] if parent else None,
                                  priority=priority, description=description)
            return rec["identifier"]

    def _label_named(self, name: str, team_id: str) -> str:
        for lab in self.labels.values():
            if lab["name"] == name and lab["team_id"] in (team_id, None):
                return lab["id"]
        return self.add_label(name, team_id)

    def _new_issue(self, team_id: str, title: str, *, project_id: str | None, state_id: str,
                   label_ids: list[str], parent_id: str | None, priority: int,
                   description: str | None) -> dict[str, Any]:
        team = self.teams[team_id]
        team["counter"] += 1
        iid = str(uuid.uuid4())
        now = self.now()
        rec = {"id": iid, "number": team["counter"],
               "identifier": f"{team['key']}-{team['counter']}", "team_id": team_id,
               "previousIdentifiers": [], "title": title, "description": description,
               "priority": float(priority), "sortOrder": float(len(self.issues)),
               "state_id": state_id, "label_ids": list(dict.fromkeys(label_ids)),
               "parent_id": parent_id, "project_id": project_id, "createdAt": now,
               "updatedAt": now, "archivedAt": None, "trashed": None}
        self.issues[iid] = rec
        return rec

    def add_relation(self, source: str, target: str, kind: str = "blocks") -> str:
        """``source`` blocks (duplicates, relates to, resembles) ``target``."""
        with self._lock:
            if kind not in ("blocks", "duplicate", "related", "similar"):
                raise ValueError(kind)
            rid = str(uuid.uuid4())
            now = self.now()
            self.relations[rid] = {"id": rid, "issue_id": self._issue(source)["id"],
                                   "related_id": self._issue(target)["id"], "type": kind,
                                   "createdAt": now, "updatedAt": now, "archivedAt": None}
            return rid

    def add_blocker(self, blocker: str, blocked: str) -> str:
        return self.add_relation(blocker, blocked, "blocks")

    def remove_relation(self, relation_id: str) -> None:
        """Delete a relation as Linear's UI does (it is archived, then gone from lists)."""
        with self._lock:
            rel = self.relations[relation_id]
            rel["archivedAt"] = rel["updatedAt"] = self.now()

    def add_comment(self, identifier: str, body: str, *, user: dict[str, Any] | None = None,
                    bot: str | None = None, external: str | None = None,
                    touch_issue: bool = False) -> str:
        """A comment by a person (default: another user than the viewer), an integration
        (``bot``: ``user`` is null, ``botActor`` names it) or an external user."""
        with self._lock:
            issue = self._issue(identifier)
            cid = str(uuid.uuid4())
            author = None if (bot or external) else (user or {"id": "person-1",
                                                             "name": "Pat Person"})
            now = self.now()
            self.comments[cid] = {
                "id": cid, "issue_id": issue["id"], "body": body, "createdAt": now,
                "updatedAt": now, "user": author,
                "botActor": {"id": str(uuid.uuid4()), "name": bot, "type": "github"}
                if bot else None,
                "externalUser": {"id": str(uuid.uuid4()), "name": external}
                if external else None,
            }
            if touch_issue:
                issue["updatedAt"] = self.now()
            return cid

    def update_issue(self, identifier: str, **changes: Any) -> None:
        """Change an issue as a person in Linear's UI would (bumps updatedAt)."""
        with self._lock:
            issue = self._issue(identifier)
            if "state" in changes:
                issue["state_id"] = self.state_id(issue["team_id"], changes.pop("state"))
            if "parent" in changes:
                parent = changes.pop("parent")
                issue["parent_id"] = self._issue(parent)["id"] if parent else None
            issue.update(changes)
            issue["updatedAt"] = self.now()

    def archive(self, identifier: str) -> None:
        with self._lock:
            issue = self._issue(identifier)
            issue["archivedAt"] = issue["updatedAt"] = self.now()

    def trash(self, identifier: str) -> None:
        """Delete an issue as Linear's UI does: into the trash (archived, ``trashed``)."""
        with self._lock:
            issue = self._issue(identifier)
            issue["trashed"] = True
            issue["archivedAt"] = issue["updatedAt"] = self.now()

    def move_issue(self, identifier: str, team_key: str) -> str:
        """Move an issue to another team as Linear does: a new number and identifier
        (the old one is kept in ``previousIdentifiers`` and still resolves), the state
        of the same type in the new team, that team's labels only. Returns the new
        identifier."""
        with self._lock:
            issue = self._issue(identifier)
            team = self.team_by_key(team_key)
            old_type = self.states[issue["state_id"]]["type"]
            states = self.team_states(team["id"])
            state = next((s for s in states if s["type"] == old_type), self.default_state(
                team["id"]))
            team["counter"] += 1
            issue["previousIdentifiers"].append(issue["identifier"])
            issue["number"] = team["counter"]
            issue["identifier"] = f"{team['key']}-{team['counter']}"
            issue["team_id"] = team["id"]
            issue["state_id"] = state["id"]
            issue["label_ids"] = [x for x in issue["label_ids"]
                                  if self.labels[x]["team_id"] in (None, team["id"])]
            issue["updatedAt"] = self.now()
            return issue["identifier"]

    def issue_labels(self, identifier: str) -> set[str]:
        with self._lock:
            return {self.labels[x]["name"] for x in self._issue(identifier)["label_ids"]}

    def state_of(self, identifier: str) -> str:
        with self._lock:
            return self.states[self._issue(identifier)["state_id"]]["name"]

    def comments_on(self, identifier: str) -> list[str]:
        with self._lock:
            iid = self._issue(identifier)["id"]
            mine = sorted((c for c in self.comments.values() if c["issue_id"] == iid),
                          key=lambda c: c["createdAt"])
            return [c["body"] for c in mine]

    def _issue(self, ref: str) -> dict[str, Any]:
        """By UUID, identifier, or an identifier it had before a team move."""
        found = self.issues.get(ref)
        if found is None:
            found = next((i for i in self.issues.values() if i["identifier"] == ref), None)
        if found is None:
            found = next((i for i in self.issues.values() if ref in i["previousIdentifiers"]),
                         None)
        if found is None:
            raise not_found("Issue")
        return found

    # -- views: dicts keyed by GraphQL field name, walked by the strict resolver ---------

    def _v_user(self, user: Mapping[str, Any]) -> dict[str, Any]:
        return {"id": user["id"], "name": user["name"],
                "displayName": user["name"].split()[0].lower()}

    def _v_team(self, team_id: str) -> dict[str, Any]:
        team = self.teams[team_id]
        return {"id": team["id"], "key": team["key"], "name": team["name"],
                "defaultIssueState": lambda _info: self._v_state(self.default_state(team_id)),
                "states": lambda _info, filter=None, includeArchived=None, orderBy=None, **page:
                self._conn([self._v_state(s) for s in self.team_states(team_id)], filter,
                           orderBy, page, ordered=False)}

    def _v_state(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"id": state["id"], "name": state["name"], "type": state["type"],
                "position": state["position"],
                "team": lambda _info: self._v_team(state["team_id"])}

    def _v_project(self, project: dict[str, Any]) -> dict[str, Any]:
        return {"id": project["id"], "name": project["name"], "slugId": project["slugId"],
                "teams": lambda _info, filter=None, includeArchived=None, orderBy=None, **page:
                self._conn([self._v_team(t) for t in project["team_ids"]], filter, orderBy,
                           page, ordered=False)}

    def _v_label(self, label: dict[str, Any]) -> dict[str, Any]:
        return {"id": label["id"], "name": label["name"], "isGroup": label["isGroup"],
                "team": (lambda _info: self._v_team(label["team_id"])) if label["team_id"]
                else None}

    def _v_comment(self, comment: dict[str, Any]) -> dict[str, Any]:
        return {"id": comment["id"], "body": comment["body"],
                "createdAt": _iso(comment["createdAt"]), "updatedAt": _iso(comment["updatedAt"]),
                "user": self._v_user(comment["user"]) if comment["user"] else None,
                "botActor": dict(comment["botActor"]) if comment["botActor"] else None,
                "externalUser": dict(comment["externalUser"]) if comment["externalUser"]
                else None,
                "issue": lambda _info: self._v_issue(self.issues[comment["issue_id"]])}

    def _v_relation(self, rel: dict[str, Any]) -> dict[str, Any]:
        return {"id": rel["id"], "type": rel["type"], "createdAt": _iso(rel["createdAt"]),
                "updatedAt": _iso(rel["updatedAt"]),
                "archivedAt": _iso(rel["archivedAt"]) if rel["archivedAt"] else None,
                "issue": lambda _info: self._v_issue(self.issues[rel["issue_id"]]),
                "relatedIssue": lambda _info: self._v_issue(self.issues[rel["related_id"]])}

    def _v_issue(self, issue: dict[str, Any]) -> dict[str, Any]:
        def relations(side: str, other: str) -> Callable[..., dict[str, Any]]:
            def resolve(_info: Any, includeArchived: bool | None = None, orderBy: Any = None,
                        **page: Any) -> dict[str, Any]:
                rels = [r for r in self.relations.values() if r[side] == issue["id"]
                        and (includeArchived or (r["archivedAt"] is None
                                                 and self.issues[r[other]]["archivedAt"] is None))]
                return self._conn([self._v_relation(r) for r in _order(rels, orderBy)], None,
                                  None, page, ordered=False)
            return resolve

        def children(_info: Any, filter: Any = None, includeArchived: bool | None = None,
                     orderBy: Any = None, **page: Any) -> dict[str, Any]:
            kids = [i for i in self.issues.values() if i["parent_id"] == issue["id"]
                    and (includeArchived or i["archivedAt"] is None)
                    and self._issue_matches(i, filter)]
            return self._conn([self._v_issue(i) for i in _order(kids, orderBy)], None, None,
                              page, ordered=False)

        def labels(_info: Any, filter: Any = None, includeArchived: bool | None = None,
                   orderBy: Any = None, **page: Any) -> dict[str, Any]:
            if filter:
                raise NotImplementedByFake("Issue.labels(filter:)")
            return self._conn([self._v_label(self.labels[x]) for x in issue["label_ids"]],
                              None, orderBy, page, ordered=False)

        def comments(_info: Any, filter: Any = None, includeArchived: bool | None = None,
                     orderBy: Any = None, **page: Any) -> dict[str, Any]:
            mine = [c for c in self.comments.values() if c["issue_id"] == issue["id"]
                    and self._comment_matches(c, filter)]
            return self._conn([self._v_comment(c) for c in _order(mine, orderBy)], None, None,
                              page, ordered=False)

        parent = issue["parent_id"]
        project = issue["project_id"]
        return {
            "id": issue["id"], "identifier": issue["identifier"], "number": issue["number"],
            "title": issue["title"], "description": issue["description"],
            "priority": issue["priority"], "sortOrder": issue["sortOrder"],
            "createdAt": _iso(issue["createdAt"]), "updatedAt": _iso(issue["updatedAt"]),
            "archivedAt": _iso(issue["archivedAt"]) if issue["archivedAt"] else None,
            "trashed": issue["trashed"],
            "previousIdentifiers": list(issue["previousIdentifiers"]),
            "labelIds": list(issue["label_ids"]),
            "state": lambda _info: self._v_state(self.states[issue["state_id"]]),
            "team": lambda _info: self._v_team(issue["team_id"]),
            "project": (lambda _info: self._v_project(self.projects[project])) if project
            else None,
            "parent": (lambda _info: self._v_issue(self.issues[parent])) if parent else None,
            "labels": labels, "comments": comments, "children": children,
            "relations": relations("issue_id", "related_id"),
            "inverseRelations": relations("related_id", "issue_id"),
        }

    def _conn(self, views: list[dict[str, Any]], filter: Any, order_by: Any,
              page: Mapping[str, Any], *, ordered: bool = True) -> dict[str, Any]:
        if filter:
            raise NotImplementedByFake("filter on this connection")
        if order_by and ordered:
            raise NotImplementedByFake("orderBy on this connection")
        return connection(views, **page)

    # -- filters (the parts of Linear's filter language ralph-dev uses) ------------------

    def _unsupported(self, what: str) -> NotImplementedByFake:
        return NotImplementedByFake(f"the fake Linear does not implement the filter {what}")

    def _cmp(self, value: Any, comparator: Mapping[str, Any] | None, where: str) -> bool:
        if comparator is None:
            return True
        for op, bound in comparator.items():
            if bound is None:
                continue
            if isinstance(value, datetime) and op in ("eq", "neq", "gt", "gte", "lt", "lte"):
                bound = _moment(bound, self.clock())
            if isinstance(value, datetime) and op in ("in", "nin"):
                bound = [_moment(b, self.clock()) for b in bound]
            match op:
                case "eq":
                    ok = value == bound
                case "neq":
                    ok = value != bound
                case "in":
                    ok = value in bound
                case "nin":
                    ok = value not in bound
                case "gt":
                    ok = value is not None and value > bound
                case "gte":
                    ok = value is not None and value >= bound
                case "lt":
                    ok = value is not None and value < bound
                case "lte":
                    ok = value is not None and value <= bound
                case "null":
                    ok = (value is None) == bool(bound)
                case _:
                    raise self._unsupported(f"{where}.{op}")
            if not ok:
                return False
        return True

    def _issue_matches(self, issue: dict[str, Any], flt: Mapping[str, Any] | None) -> bool:
        if not flt:
            return True
        for key, sub in flt.items():
            if sub is None:
                continue
            match key:
                case "and":
                    ok = all(self._issue_matches(issue, f) for f in sub)
                case "or":
                    ok = any(self._issue_matches(issue, f) for f in sub)
                case "id":  # an IssueIDComparator takes UUIDs or identifiers
                    ok = self._cmp(issue["id"], sub, "IssueFilter.id") or self._cmp(
                        issue["identifier"], sub, "IssueFilter.id")
                case "updatedAt" | "createdAt":
                    ok = self._cmp(issue[key], sub, f"IssueFilter.{key}")
                case "archivedAt":
                    ok = self._cmp(issue["archivedAt"], sub, "IssueFilter.archivedAt")
                case "project":
                    ok = self._project_matches(issue["project_id"], sub)
                case "team":
                    ok = self._team_matches(issue["team_id"], sub)
                case "state":
                    ok = self._state_matches(issue["state_id"], sub)
                case "parent":
                    parent = self.issues.get(issue["parent_id"] or "")
                    if "null" in sub:
                        ok = (parent is None) == bool(sub["null"])
                    else:
                        ok = parent is not None and self._issue_matches(parent, sub)
                case _:
                    raise self._unsupported(f"IssueFilter.{key}")
            if not ok:
                return False
        return True

    def _project_matches(self, project_id: str | None, flt: Mapping[str, Any]) -> bool:
        for key, sub in flt.items():
            if sub is None:
                continue
            if key == "null":
                ok = (project_id is None) == bool(sub)
            elif key == "id":
                ok = project_id is not None and self._cmp(project_id, sub, "ProjectFilter.id")
            else:
                raise self._unsupported(f"ProjectFilter.{key}")
            if not ok:
                return False
        return True

    def _team_matches(self, team_id: str, flt: Mapping[str, Any]) -> bool:
        team = self.teams[team_id]
        for key, sub in flt.items():
            if key not in ("id", "key"):
                raise self._unsupported(f"TeamFilter.{key}")
            if not self._cmp(team[key], sub, f"TeamFilter.{key}"):
                return False
        return True

    def _state_matches(self, state_id: str, flt: Mapping[str, Any]) -> bool:
        state = self.states[state_id]
        for key, sub in flt.items():
            if key not in ("id", "name", "type"):
                raise self._unsupported(f"WorkflowStateFilter.{key}")
            if not self._cmp(state[key], sub, f"WorkflowStateFilter.{key}"):
                return False
        return True

    def _comment_matches(self, comment: dict[str, Any], flt: Mapping[str, Any] | None) -> bool:
        if not flt:
            return True
        for key, sub in flt.items():
            if sub is None:
                continue
            match key:
                case "and":
                    ok = all(self._comment_matches(comment, f) for f in sub)
                case "or":
                    ok = any(self._comment_matches(comment, f) for f in sub)
                case "id":
                    ok = self._cmp(comment["id"], sub, "CommentFilter.id")
                case "createdAt" | "updatedAt":
                    ok = self._cmp(comment[key], sub, f"CommentFilter.{key}")
                case "issue":
                    issue = self.issues[comment["issue_id"]]
                    ok = self._issue_matches(issue, {k: v for k, v in sub.items() if k != "null"})
                case _:
                    raise self._unsupported(f"CommentFilter.{key}")
            if not ok:
                return False
        return True

    # -- root resolvers ---------------------------------------------------------------------

    def _root(self) -> dict[str, Any]:
        return {
            "viewer": lambda _info: self._v_user(self.viewer),
            "projects": self._r_projects,
            "project": self._r_project,
            "issues": self._r_issues,
            "issue": lambda _info, id: self._v_issue(self._issue(id)),
            "comments": self._r_comments,
            "issueLabels": self._r_labels,
            "issueRelations": self._r_relations,
            "issueUpdate": self._m_issue_update,
            "commentCreate": self._m_comment_create,
            "issueCreate": self._m_issue_create,
            "issueRelationCreate": self._m_relation_create,
            "issueRelationDelete": self._m_relation_delete,
            "issueLabelCreate": self._m_label_create,
        }

    def _r_projects(self, _info: Any, filter: Any = None, includeArchived: bool | None = None,
                    orderBy: Any = None, **page: Any) -> dict[str, Any]:
        if filter:
            raise NotImplementedByFake("projects(filter:)")
        found = _order(list(self.projects.values()), orderBy)
        return connection([self._v_project(p) for p in found], **page)

    def _r_project(self, _info: Any, id: str) -> dict[str, Any]:
        for project in self.projects.values():
            if id in (project["id"], project["slugId"]):
                return self._v_project(project)
        raise not_found("Project")

    def _r_labels(self, _info: Any, filter: Any = None, includeArchived: bool | None = None,
                  orderBy: Any = None, **page: Any) -> dict[str, Any]:
        if filter:
            raise NotImplementedByFake("issueLabels(filter:)")
        found = _order(list(self.labels.values()), orderBy)
        return connection([self._v_label(x) for x in found], **page)

    def _r_issues(self, _info: Any, filter: Any = None, includeArchived: bool | None = None,
                  orderBy: Any = None, sort: Any = None, **page: Any) -> dict[str, Any]:
        if sort:
            raise NotImplementedByFake("issues(sort:)")
        found = [i for i in self.issues.values()
                 if (includeArchived or i["archivedAt"] is None)
                 and self._issue_matches(i, filter)]
        return connection([self._v_issue(i) for i in _order(found, orderBy)], **page)

    def _r_comments(self, _info: Any, filter: Any = None, includeArchived: bool | None = None,
                    orderBy: Any = None, **page: Any) -> dict[str, Any]:
        found = [c for c in self.comments.values() if self._comment_matches(c, filter)]
        return connection([self._v_comment(c) for c in _order(found, orderBy)], **page)

    def _r_relations(self, _info: Any, includeArchived: bool | None = None,
                     orderBy: Any = None, **page: Any) -> dict[str, Any]:
        found = [r for r in self.relations.values()
                 if includeArchived or r["archivedAt"] is None]
        return connection([self._v_relation(r) for r in _order(found, orderBy)], **page)

    def _m_issue_update(self, _info: Any, id: str, input: dict[str, Any]) -> dict[str, Any]:
        issue = self._issue(id)
        known = {"stateId", "addedLabelIds", "removedLabelIds", "title", "description",
                 "priority", "parentId"}
        if set(input) - known:
            raise NotImplementedByFake(f"IssueUpdateInput.{sorted(set(input) - known)[0]}")
        if input.get("stateId"):
            state = self.states.get(input["stateId"])
            if state is None or state["team_id"] != issue["team_id"]:
                raise not_found("WorkflowState")
            issue["state_id"] = state["id"]
        for lid in input.get("addedLabelIds") or ():
            if lid not in self.labels:
                raise not_found("IssueLabel")
            if lid not in issue["label_ids"]:
                issue["label_ids"].append(lid)
        for lid in input.get("removedLabelIds") or ():
            if lid in issue["label_ids"]:
                issue["label_ids"].remove(lid)
        for key in ("title", "description", "priority"):
            if key in input:
                issue[key] = input[key]
        if "parentId" in input:
            issue["parent_id"] = self._issue(input["parentId"])["id"] if input["parentId"] \
                else None
        issue["updatedAt"] = self.now()
        self._changed("Issue", "update", {"id": issue["id"], "stateId": issue["state_id"],
                                          "labelIds": list(issue["label_ids"])})
        return {"success": True, "issue": self._v_issue(issue)}

    def _m_comment_create(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        issue = self._issue(input.get("issueId") or "")
        cid = str(uuid.uuid4())
        now = self.now()
        self.comments[cid] = {"id": cid, "issue_id": issue["id"], "body": input.get("body") or "",
                              "createdAt": now, "updatedAt": now, "user": dict(self.viewer),
                              "botActor": None, "externalUser": None}
        self._changed("Comment", "create", {"id": cid, "issueId": issue["id"]})
        return {"success": True, "comment": self._v_comment(self.comments[cid])}

    def _m_issue_create(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        team_id = input["teamId"]
        if team_id not in self.teams:
            raise not_found("Team")
        state_id = input.get("stateId")
        if state_id is None:
            state_id = self.default_state(team_id)["id"]  # Linear: the team's default state
        elif state_id not in self.states or self.states[state_id]["team_id"] != team_id:
            raise not_found("WorkflowState")
        parent = self._issue(input["parentId"])["id"] if input.get("parentId") else None
        for lid in input.get("labelIds") or ():
            if lid not in self.labels:
                raise not_found("IssueLabel")
            if self.labels[lid]["isGroup"]:
                raise bad_input("A label group cannot be assigned to an issue")
        project_id = input.get("projectId")
        if project_id is not None and project_id not in self.projects:
            raise not_found("Project")
        rec = self._new_issue(team_id, input.get("title") or "", project_id=project_id,
                              state_id=state_id, label_ids=list(input.get("labelIds") or ()),
                              parent_id=parent, priority=input.get("priority") or 0,
                              description=input.get("description"))
        self._changed("Issue", "create", {"id": rec["id"], "teamId": team_id})
        return {"success": True, "issue": self._v_issue(rec)}

    def _m_relation_create(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        kind = str(getattr(input["type"], "value", input["type"]))
        rid = self.add_relation(input["issueId"], input["relatedIssueId"], kind)
        return {"success": True, "issueRelation": self._v_relation(self.relations[rid])}

    def _m_relation_delete(self, _info: Any, id: str) -> dict[str, Any]:
        if self.relations.pop(id, None) is None:
            raise not_found("IssueRelation")
        return {"success": True}

    def _m_label_create(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        team_id = input.get("teamId")
        if team_id is not None and team_id not in self.teams:
            raise not_found("Team")
        lid = self.add_label(input["name"], team_id)
        self._changed("IssueLabel", "create", {"id": lid, "name": input["name"]})
        return {"success": True, "issueLabel": self._v_label(self.labels[lid])}

    # -- the strict resolver: a field the views do not carry is an error, never a null --

    def _resolve(self, source: Any, info: Any, **args: Any) -> Any:
        name = info.field_name
        if not isinstance(source, dict) or name not in source:
            where = f"{info.parent_type.name}.{name}"
            self.unimplemented.append(where)
            raise NotImplementedByFake(f"the fake Linear does not implement {where}",
                                       extensions={"code": "FAKE_NOT_IMPLEMENTED"})
        value = source[name]
        if callable(value):
            try:
                return value(info, **args)
            except NotImplementedByFake as exc:
                self.unimplemented.append(exc.message)
                raise
            except TypeError as exc:  # an argument the view does not take
                where = f"{info.parent_type.name}.{name}({', '.join(args)})"
                self.unimplemented.append(where)
                raise NotImplementedByFake(f"the fake Linear does not implement {where}: "
                                           f"{exc}") from exc
        return value

    # -- HTTP ---------------------------------------------------------------------------------

    def _next_fault(self) -> str | None:
        with self._lock:
            if self.faults.queue:
                return self.faults.queue.pop(0)
            return self.faults.always

    def drain(self, kind: str, left: float = 0.0) -> None:
        """Spend the hour's ``requests`` or ``complexity`` down to ``left``, now."""
        with self._lock:
            bucket = self._bucket(kind, self.clock().timestamp())
            bucket.level = left

    def _bucket(self, kind: str, now: float) -> Bucket:
        limit = self.requests_limit if kind == "requests" else self.complexity_limit
        bucket = self.buckets.get(kind)
        if bucket is None or bucket.limit != limit:
            bucket = self.buckets[kind] = Bucket(limit, limit, now)
        bucket.refill(now)
        return bucket

    def _rate_headers(self, requests: Bucket, points: Bucket, now: float) -> dict[str, str]:
        return {
            "X-RateLimit-Requests-Limit": str(int(requests.limit)),
            "X-RateLimit-Requests-Remaining": str(int(requests.level)),
            "X-RateLimit-Requests-Reset": str(requests.reset_ms(now)),
            "X-RateLimit-Complexity-Limit": str(int(points.limit)),
            "X-RateLimit-Complexity-Remaining": str(int(points.level)),
            "X-RateLimit-Complexity-Reset": str(points.reset_ms(now)),
        }

    def _answer(self, record: dict[str, Any], payload: Any, status: int = 200,
                headers: Mapping[str, str] | None = None) -> web.Response:
        text = json.dumps(payload)
        with self._lock:
            record.update(status=status, bytes=len(text))
            self.bodies.append(text)
        return web.Response(text=text, status=status, content_type="application/json",
                            headers=dict(headers or {}))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return web.json_response({"errors": [{"message": "body must be JSON"}]}, status=400)
        record: dict[str, Any] = {"operationName": body.get("operationName"),
                                  "variables": body.get("variables"), "status": None}
        with self._lock:
            self.requests.append(record)
        if request.headers.get("Authorization") != self.api_key or self.revoked:
            return self._answer(record, {"errors": [{
                "message": "Authentication required, not authenticated",
                "extensions": {"type": "authentication error", "code": "AUTHENTICATION_ERROR",
                               "userPresentableMessage": "You need to authenticate."}}]},
                status=400)
        fault = self._next_fault()
        if fault == "ratelimited":
            return self._answer(record, {"errors": [{
                "message": "Rate limit exceeded", "extensions": {"code": "RATELIMITED"}}]},
                status=400, headers={"X-RateLimit-Requests-Remaining": "0", **self.rate_headers})
        if fault == "internal":  # a 500 with a GraphQL error body
            return self._answer(record, {"errors": [{
                "message": "Internal server error",
                "extensions": {"code": "INTERNAL_SERVER_ERROR"}}]}, status=500)
        if fault == "badinput":
            return self._answer(record, {"errors": [{
                "message": "Argument Validation Error",
                "extensions": {"code": "INVALID_INPUT"}}], "data": None}, status=400)
        if fault in ("500", "502", "503"):
            record["status"] = int(fault)
            return web.Response(status=int(fault), text="upstream trouble")
        if fault == "slow":
            await asyncio.sleep(self.faults.slow_seconds)
        if fault == "malformed":
            record["status"] = 200
            return web.Response(status=200, text="<html>not json", content_type="text/html")
        if fault == "nodata":
            return self._answer(record, {"data": None})
        query = body.get("query") or ""
        variables = body.get("variables") or {}
        try:
            points = complexity(self.schema, query, variables, body.get("operationName"))
        except Exception as exc:  # an unparsable query: graphql() below says why
            points = 0
            record["complexity_error"] = repr(exc)
        record["complexity"] = points
        with self._lock:
            now = self.clock().timestamp()
            requests = self._bucket("requests", now)
            budget = self._bucket("complexity", now)
            headers = {**self._rate_headers(requests, budget, now), "X-Complexity": str(points)}
            if points > SINGLE_QUERY_CAP:
                return self._answer(record, {"errors": [{
                    "message": f"Query too complex: {points} points, the maximum is "
                               f"{SINGLE_QUERY_CAP}",
                    "extensions": {"code": "QUERY_TOO_COMPLEX", "type": "invalid input"}}]},
                    status=400, headers={**headers, **self.rate_headers})
            if requests.level < 1 or budget.level < points:
                if self.send_retry_after:
                    wait = max(requests.wait_for(1), budget.wait_for(points))
                    headers["Retry-After"] = str(max(1, math.ceil(wait)))
                return self._answer(record, {"errors": [{
                    "message": "Rate limit exceeded",
                    "extensions": {"code": "RATELIMITED", "type": "ratelimited"}}]},
                    status=400, headers={**headers, **self.rate_headers})
            requests.level -= 1
            budget.level -= points
            headers.update(self._rate_headers(requests, budget, now))
            result = await graphql(self.schema, query, root_value=self._root(),
                                   variable_values=variables,
                                   operation_name=body.get("operationName"),
                                   field_resolver=self._resolve)
        payload: dict[str, Any] = {"data": result.data}
        if result.errors:
            payload["errors"] = [e.formatted for e in result.errors]
        if fault == "partial" and isinstance(result.data, dict):
            payload["data"] = {k: {"nodes": [{"id": "x"}]} for k in result.data}
        headers.update(self.rate_headers)
        return self._answer(record, payload, headers=headers)

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=8 << 20)
        app.router.add_post("/graphql", self._handle)
        return app


# -- a realistic workspace ------------------------------------------------------------------


@dataclass
class Workspace:
    """What ``populate_workspace`` made, with the awkward cases named for tests."""

    alpha: str
    """The project ralph-dev works on (teams ENG and OPS)."""
    beta: str
    """Another project of the same workspace (team ENG)."""
    eng: str
    ops: str
    members: list[str] = field(default_factory=list)
    """Identifiers of Alpha's live issues (not archived, not trashed)."""
    many_relations: str = ""
    """An Alpha issue in Todo with 22 duplicates and ONE real blocker (in Backlog)."""
    real_blocker: str = ""
    foreign_blocked: str = ""
    """An Alpha issue in Todo blocked by a Beta issue (in Todo)."""
    foreign_blocker: str = ""
    archived_blocked: str = ""
    """An Alpha issue in Todo whose only blocker is archived (never completed)."""
    trashed_blocked: str = ""
    """An Alpha issue in Todo whose only blocker was deleted (in the trash)."""
    parent_with_foreign_child: str = ""
    """An Alpha parent whose children are Alpha (Done) and Beta (Todo)."""
    foreign_child: str = ""
    only_child_elsewhere: str = ""
    """An Alpha issue in Todo whose only child lives in Beta."""
    bot_commented: str = ""
    """An Alpha issue whose comments include GitHub's and an external user's."""
    many_labels: str = ""
    """An Alpha issue with 25 labels."""
    epic: str = ""
    """An Alpha parent with 12 children (more than one page of them)."""


def populate_workspace(fake: FakeLinear, issues: int = 371, *, seed: int = 7) -> Workspace:
    """Fill ``fake`` like a real workspace: ``issues`` Alpha issues over two teams with
    different state names, plus Beta issues, relations of all four types (many
    duplicates, cross-project blockers), parents with children across projects,
    archived and trashed issues, null descriptions, triage, bot and external comments."""
    with fake.history(days=max(120, issues / 8)):
        return _populate(fake, issues, random.Random(seed))


def _populate(fake: FakeLinear, issues: int, rng: random.Random) -> Workspace:
    eng = fake.add_team("ENG", "Engineering")
    ops = fake.add_team("OPS", "Operations", states=OPS_STATES)
    alpha = fake.add_project("Alpha", [eng, ops], slug="a1b2c3d4e5f6")
    beta = fake.add_project("Beta", [eng])
    ws = Workspace(alpha=alpha, beta=beta, eng=eng, ops=ops)
    for name in ("bug", "feature", "tech-debt", "ralph:plan", "docs"):
        fake.add_label(name, None)
    eng_names = [n for n, _ in DEFAULT_STATES]
    ops_names = [n for n, _ in OPS_STATES]
    beta_issues = [fake.add_issue(eng, f"Beta work {i}", project_id=beta,
                                  state=rng.choice(eng_names))
                   for i in range(max(10, issues // 10))]

    def alpha_issue(title: str, **kw: Any) -> str:
        ident = fake.add_issue(eng, title, project_id=alpha, **kw)
        ws.members.append(ident)
        return ident

    # the named cases first
    ws.many_relations = alpha_issue("Refactor the importer", state="Todo")
    ws.real_blocker = alpha_issue("Schema migration", state="Backlog")
    fake.add_blocker(ws.real_blocker, ws.many_relations)  # the oldest: last in Linear's order
    for n in range(22):
        dup = fake.add_issue(eng, f"Importer crash report {n}", project_id=beta, state="Duplicate")
        fake.add_relation(dup, ws.many_relations, "duplicate")
    ws.foreign_blocked = alpha_issue("Use the new auth API", state="Todo")
    ws.foreign_blocker = fake.add_issue(eng, "New auth API", project_id=beta, state="Todo")
    fake.add_blocker(ws.foreign_blocker, ws.foreign_blocked)
    ws.archived_blocked = alpha_issue("Tidy the settings page", state="Todo")
    shelved = fake.add_issue(eng, "Old settings redesign", project_id=alpha, state="Backlog")
    fake.add_blocker(shelved, ws.archived_blocked)
    fake.archive(shelved)
    ws.trashed_blocked = alpha_issue("Speed up search", state="Todo")
    deleted = fake.add_issue(eng, "Search spike (filed twice)", project_id=alpha, state="Todo")
    fake.add_blocker(deleted, ws.trashed_blocked)
    fake.trash(deleted)
    ws.parent_with_foreign_child = alpha_issue("Billing v2", state="In Progress")
    alpha_issue("Billing v2: invoices", state="Done", parent=ws.parent_with_foreign_child)
    ws.foreign_child = fake.add_issue(eng, "Billing v2: tax rules", project_id=beta, state="Todo",
                                      parent=ws.parent_with_foreign_child)
    ws.only_child_elsewhere = alpha_issue("Mobile release", state="Todo")
    fake.add_issue(eng, "Mobile release: store listing", project_id=beta, state="Todo",
                   parent=ws.only_child_elsewhere)
    ws.bot_commented = alpha_issue("Fix the flaky login test", state="Todo")
    fake.add_comment(ws.bot_commented, "GitHub: Linked PR #42 opened", bot="GitHub")
    fake.add_comment(ws.bot_commented, "From Slack: any news on this?", external="Sam (Slack)")
    fake.add_comment(ws.bot_commented, "Please keep the old fixture.")
    ws.many_labels = alpha_issue("Label soup", state="Todo",
                                 labels=[f"area-{n}" for n in range(25)])
    ws.epic = alpha_issue("Onboarding epic", state="In Progress")
    for n in range(12):
        alpha_issue(f"Onboarding step {n}", state="Todo", parent=ws.epic)

    # the bulk: a realistic mix, some parents with children, relations of every type
    made = len(ws.members) + 1  # +1: the Alpha issue that ends up in the trash
    parents: list[str] = []
    while made < issues:
        on_ops = rng.random() < 0.35
        team = ops if on_ops else eng
        names = ops_names if on_ops else eng_names
        state = rng.choices(names, weights=[3, 4, 5, 2, 6, 1, 1][:len(names)])[0]
        parent = rng.choice(parents) if parents and rng.random() < 0.25 else None
        if parent and fake._issue(parent)["team_id"] != team:
            parent = None
        ident = fake.add_issue(
            team, f"Task {made}: {rng.choice(['fix', 'add', 'remove', 'document'])} "
                  f"{rng.choice(['the API', 'the UI', 'a test', 'the docs'])}",
            project_id=alpha, state=state, priority=rng.randint(0, 4), parent=parent,
            labels=rng.sample(["bug", "feature", "tech-debt", "docs"], rng.randint(0, 2)),
            description=None if rng.random() < 0.2 else f"Details of task {made}.\n" * 3)
        ws.members.append(ident)
        if rng.random() < 0.1:
            parents.append(ident)
        made += 1
    for _ in range(issues // 3):
        a, b = rng.sample(ws.members, 2)
        kind = rng.choices(["blocks", "related", "duplicate", "similar"], [4, 3, 1, 1])[0]
        fake.add_relation(a, b, kind)
    for _ in range(issues // 20):
        fake.add_blocker(rng.choice(beta_issues), rng.choice(ws.members))
    for ident in rng.sample(ws.members, min(len(ws.members), issues // 2)):
        for _ in range(rng.randint(1, 3)):
            fake.add_comment(ident, rng.choice(["Looks good.", "Can we split this?",
                                                "Blocked on review."]))
    for ident in rng.sample(ws.members, issues // 25):
        fake.add_comment(ident, "GitHub: Linked PR opened", bot="GitHub")
    for ident in rng.sample(ws.members[10:], issues // 40):  # done long ago, tidied away
        fake.archive(ident)
        ws.members.remove(ident)
    return ws


# -- helpers for the tests that drive LinearTracker against the fake ---------------------


class Clock:
    """An injectable wall clock: tests move time instead of sleeping."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class World:
    """A running fake with team ENG and project "Alpha", plus a simulated clock."""

    fake: FakeLinear
    team: str
    project: str
    clock: Clock
    sleeps: list[float]
    state_dir: Path | None = None
    """Where the trackers keep their shared rate-limit file and disk cache (None: none)."""

    def client(self, **kwargs: Any) -> Any:
        from ralph_dev.adapters.tracker.linear.apikey import ApiKey
        from ralph_dev.adapters.tracker.linear.client import LinearClient

        async def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)

        # 10 s: the fake checks every document against the real schema, which is slow on
        # a loaded machine; tests of timeouts set their own
        options: dict[str, Any] = {"timeout": 10.0, "clock": self.clock, "sleep": sleep,
                                   "rng": lambda: 0.5}
        if self.state_dir is not None:
            options["shared_state"] = self.state_dir / "linear-rate.json"
        options.update(kwargs)
        return LinearClient(ApiKey(self.fake.api_key, "the test"), self.fake.url, **options)

    def tracker(self, project: str = "Alpha", **kwargs: Any) -> Any:
        from ralph_dev.adapters.tracker.linear.tracker import LinearTracker

        if self.state_dir is not None:
            kwargs.setdefault("cache_file", self.state_dir / "linear-cache.json")
        return LinearTracker(self.client(), project, **kwargs)
