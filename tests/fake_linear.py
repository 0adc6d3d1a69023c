"""An in-process fake of Linear's GraphQL API for tests.

aiohttp + graphql-core serve ``fake_linear.graphql`` (a subset of Linear's real
schema, proven so by ``test_linear_schema.py``) on 127.0.0.1, in a thread with
its own event loop, so the real gql client in ralph-dev talks HTTP to it
exactly as it would to api.linear.app. Data lives in plain dicts that a test
reads and changes directly. Switches inject what Linear does on a bad day:
``RATELIMITED`` (HTTP 400 + ``extensions.code``), 5xx, slow answers and
malformed or partial payloads.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web
from graphql import GraphQLError, build_schema, graphql

from ralph_dev.devtools.loopback import LoopbackServer

SDL_PATH = Path(__file__).with_name("fake_linear.graphql")

DEFAULT_STATES: tuple[tuple[str, str], ...] = (
    ("Backlog", "backlog"),
    ("Todo", "unstarted"),
    ("In Progress", "started"),
    ("In Review", "started"),
    ("Done", "completed"),
    ("Canceled", "canceled"),
)

ChangeCallback = Callable[[str, str, dict[str, Any]], None]


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _cursor(index: int) -> str:
    return base64.b64encode(f"i:{index}".encode()).decode()


def _uncursor(text: str | None) -> int:
    if not text:
        return 0
    try:
        return int(base64.b64decode(text).decode().split(":", 1)[1]) + 1
    except (ValueError, IndexError) as exc:
        raise GraphQLError(f"bad cursor {text!r}") from exc


def connection(items: list[Any], first: int | None = None, after: str | None = None,
               paged: bool = True) -> dict[str, Any]:
    start = _uncursor(after)
    size = 50 if first is None else first
    page = items[start:start + size]
    out: dict[str, Any] = {"nodes": page}
    if paged:
        end = start + len(page)
        out["pageInfo"] = {
            "hasNextPage": end < len(items),
            "endCursor": _cursor(end - 1) if page else after,
        }
    return out


def not_found(kind: str) -> GraphQLError:
    return GraphQLError(
        f"Entity not found: {kind}",
        extensions={"type": "invalid input", "code": "INPUT_ERROR",
                    "userPresentableMessage": f"Could not find referenced {kind}."},
    )


@dataclass
class Faults:
    """What the next requests should suffer. Each list is a queue consumed per request."""

    queue: list[str] = field(default_factory=list)
    """Entries: "ratelimited", "500", "502", "503", "internal" (500 + GraphQL error),
    "badinput", "slow", "malformed", "partial", "nodata"."""
    always: str | None = None
    """A fault applied to every request until cleared (an outage)."""
    slow_seconds: float = 3.0


class FakeLinear(LoopbackServer):
    """``with FakeLinear() as fake: … fake.url …``."""

    name = "fake-linear"

    def __init__(self, api_key: str = "lin_api_fake_0123456789", *, host: str = "127.0.0.1"):
        super().__init__(host)
        self.api_key = api_key
        self.schema = build_schema(SDL_PATH.read_text())
        self.viewer = {"id": str(uuid.uuid4()), "name": "Ralph Tester"}
        self.teams: dict[str, dict[str, Any]] = {}
        self.states: dict[str, dict[str, Any]] = {}
        self.projects: dict[str, dict[str, Any]] = {}
        self.labels: dict[str, dict[str, Any]] = {}
        self.issues: dict[str, dict[str, Any]] = {}
        self.relations: dict[str, dict[str, Any]] = {}
        self.comments: dict[str, dict[str, Any]] = {}
        self.faults = Faults()
        self.rate_headers: dict[str, str] = {}
        """Extra response headers, e.g. X-RateLimit-Requests-Remaining."""
        self.requests: list[dict[str, Any]] = []
        """Every request body (operationName, variables) in order."""
        self._last_stamp = datetime.now(UTC)
        self._base = self._last_stamp
        """Earliest time the fake stamps (kept for tests that move it forward)."""
        self._callbacks: list[ChangeCallback] = []
        self._lock = threading.RLock()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/graphql"

    # -- time: real time, but strictly increasing so updatedAt ordering is deterministic --

    def now(self) -> datetime:
        with self._lock:
            stamp = max(datetime.now(UTC), self._base,
                        self._last_stamp + timedelta(milliseconds=1))
            self._last_stamp = stamp
            return stamp

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

    def add_project(self, name: str, team_ids: Iterable[str], slug: str | None = None) -> str:
        pid = str(uuid.uuid4())
        self.projects[pid] = {"id": pid, "name": name,
                              "slugId": slug or uuid.uuid4().hex[:12], "team_ids": list(team_ids)}
        return pid

    def add_label(self, name: str, team_id: str | None = None, is_group: bool = False) -> str:
        lid = str(uuid.uuid4())
        self.labels[lid] = {"id": lid, "name": name, "team_id": team_id, "isGroup": is_group}
        return lid

    def team_by_key(self, key: str) -> dict[str, Any]:
        return next(t for t in self.teams.values() if t["key"] == key)

    def state_id(self, team_id: str, name: str) -> str:
        return next(s["id"] for s in self.states.values()
                    if s["team_id"] == team_id and s["name"] == name)

    def add_issue(self, team_id: str, title: str, *, project_id: str | None = None,
                  state: str = "Todo", labels: Iterable[str] = (), parent: str | None = None,
                  priority: int = 0, description: str = "") -> str:
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
                   description: str) -> dict[str, Any]:
        team = self.teams[team_id]
        team["counter"] += 1
        iid = str(uuid.uuid4())
        now = self.now()
        rec = {"id": iid, "identifier": f"{team['key']}-{team['counter']}", "team_id": team_id,
               "title": title, "description": description, "priority": float(priority),
               "sortOrder": float(len(self.issues)), "state_id": state_id,
               "label_ids": list(dict.fromkeys(label_ids)), "parent_id": parent_id,
               "project_id": project_id, "createdAt": now, "updatedAt": now,
               "archivedAt": None}
        self.issues[iid] = rec
        return rec

    def add_blocker(self, blocker: str, blocked: str) -> str:
        with self._lock:
            rid = str(uuid.uuid4())
            self.relations[rid] = {"id": rid, "issue_id": self._issue(blocker)["id"],
                                   "related_id": self._issue(blocked)["id"], "type": "blocks"}
            return rid

    def add_comment(self, identifier: str, body: str, *, user: dict[str, Any] | None = None,
                    bot: str | None = None, touch_issue: bool = False) -> str:
        """A comment by a person (default: another user than the viewer)."""
        with self._lock:
            issue = self._issue(identifier)
            cid = str(uuid.uuid4())
            author = None if bot else (user or {"id": "person-1", "name": "Pat Person"})
            self.comments[cid] = {"id": cid, "issue_id": issue["id"], "body": body,
                                  "createdAt": self.now(), "user": author,
                                  "botActor": {"name": bot} if bot else None}
            if touch_issue:
                issue["updatedAt"] = self.now()
            return cid

    def update_issue(self, identifier: str, **changes: Any) -> None:
        """Change an issue as a person in Linear's UI would (bumps updatedAt)."""
        with self._lock:
            issue = self._issue(identifier)
            if "state" in changes:
                issue["state_id"] = self.state_id(issue["team_id"], changes.pop("state"))
            issue.update(changes)
            issue["updatedAt"] = self.now()

    def issue_labels(self, identifier: str) -> set[str]:
        with self._lock:
            return {self.labels[x]["name"] for x in self._issue(identifier)["label_ids"]}

    def state_of(self, identifier: str) -> str:
        with self._lock:
            return self.states[self._issue(identifier)["state_id"]]["name"]

    def comments_on(self, identifier: str) -> list[str]:
        with self._lock:
            iid = self._issue(identifier)["id"]
            return [c["body"] for c in self.comments.values() if c["issue_id"] == iid]

    def _issue(self, ref: str) -> dict[str, Any]:
        found = self.issues.get(ref)
        if found is None:
            found = next((i for i in self.issues.values() if i["identifier"] == ref), None)
        if found is None:
            raise not_found("Issue")
        return found

    # -- views: what graphql-core's default resolver walks --------------------------------

    def _v_team(self, team_id: str) -> dict[str, Any]:
        team = self.teams[team_id]
        states = sorted((s for s in self.states.values() if s["team_id"] == team_id),
                        key=lambda s: s["position"])
        return {"id": team["id"], "key": team["key"], "name": team["name"],
                "states": lambda _info, first=None: connection(
                    [self._v_state(s) for s in states], first, paged=False)}

    def _v_state(self, state: dict[str, Any]) -> dict[str, Any]:
        return {k: state[k] for k in ("id", "name", "type", "position")}

    def _v_project(self, project: dict[str, Any]) -> dict[str, Any]:
        return {"id": project["id"], "name": project["name"], "slugId": project["slugId"],
                "teams": lambda _info, first=None: connection(
                    [self._v_team(t) for t in project["team_ids"]], first, paged=False)}

    def _v_label(self, label: dict[str, Any]) -> dict[str, Any]:
        return {"id": label["id"], "name": label["name"], "isGroup": label["isGroup"],
                "team": self._v_team(label["team_id"]) if label["team_id"] else None}

    def _v_comment(self, comment: dict[str, Any]) -> dict[str, Any]:
        return {"id": comment["id"], "body": comment["body"],
                "createdAt": _iso(comment["createdAt"]), "user": comment["user"],
                "botActor": comment["botActor"],
                "issue": lambda _info: self._v_issue(self.issues[comment["issue_id"]])}

    def _v_issue(self, issue: dict[str, Any]) -> dict[str, Any]:
        def labels(_info: Any, first: int | None = None) -> dict[str, Any]:
            return connection([self._v_label(self.labels[x]) for x in issue["label_ids"]], first)

        def inverse(_info: Any, first: int | None = None,
                    after: str | None = None) -> dict[str, Any]:
            rels = [r for r in self.relations.values() if r["related_id"] == issue["id"]]
            return connection([{"id": r["id"], "type": r["type"],
                                "issue": self._v_issue(self.issues[r["issue_id"]])}
                               for r in rels], first, after)

        def comments(_info: Any, first: int | None = None) -> dict[str, Any]:
            mine = [c for c in self.comments.values() if c["issue_id"] == issue["id"]]
            mine.sort(key=lambda c: c["createdAt"], reverse=True)  # newest first, like Linear
            return connection([self._v_comment(c) for c in mine], first)

        parent = issue["parent_id"]
        project = issue["project_id"]
        return {
            "id": issue["id"], "identifier": issue["identifier"], "title": issue["title"],
            "description": issue["description"], "priority": issue["priority"],
            "sortOrder": issue["sortOrder"], "createdAt": _iso(issue["createdAt"]),
            "updatedAt": _iso(issue["updatedAt"]),
            "archivedAt": _iso(issue["archivedAt"]) if issue["archivedAt"] else None,
            "trashed": None,
            "state": self._v_state(self.states[issue["state_id"]]),
            "team": lambda _info: self._v_team(issue["team_id"]),
            "project": (lambda _info: self._v_project(self.projects[project])) if project
            else None,
            "parent": (lambda _info: self._v_issue(self.issues[parent])) if parent else None,
            "labels": labels, "inverseRelations": inverse, "comments": comments,
        }

    # -- filters ---------------------------------------------------------------------------

    @staticmethod
    def _cmp(value: Any, comparator: dict[str, Any] | None) -> bool:
        if not comparator:
            return True
        if "eq" in comparator and value != comparator["eq"]:
            return False
        if "in" in comparator and value not in comparator["in"]:
            return False
        if "gte" in comparator:
            bound = comparator["gte"]
            if isinstance(value, datetime):
                bound = _parse(bound)
            if value < bound:
                return False
        return True

    def _issue_matches(self, issue: dict[str, Any], flt: dict[str, Any] | None) -> bool:
        if not flt:
            return True
        if not self._cmp(issue["id"], flt.get("id")):
            return False
        if "project" in flt:
            pid = issue["project_id"]
            if pid is None or not self._cmp(pid, (flt["project"] or {}).get("id")):
                return False
        return self._cmp(issue["updatedAt"], flt.get("updatedAt"))

    # -- root resolvers ---------------------------------------------------------------------

    def _root(self) -> dict[str, Any]:
        return {
            "viewer": lambda _info: self.viewer,
            "projects": self._r_projects,
            "project": self._r_project,
            "issues": self._r_issues,
            "issue": lambda _info, id: self._v_issue(self._issue(id)),
            "comments": self._r_comments,
            "issueLabels": lambda _info, first=None, after=None: connection(
                [self._v_label(x) for x in self.labels.values()], first, after),
            "issueUpdate": self._m_issue_update,
            "commentCreate": self._m_comment_create,
            "issueCreate": self._m_issue_create,
            "issueRelationCreate": self._m_relation_create,
            "issueRelationDelete": self._m_relation_delete,
            "issueLabelCreate": self._m_label_create,
        }

    def _r_projects(self, _info: Any, first: int | None = None,
                    after: str | None = None) -> dict[str, Any]:
        return connection([self._v_project(p) for p in self.projects.values()], first, after)

    def _r_project(self, _info: Any, id: str) -> dict[str, Any]:
        for project in self.projects.values():
            if id in (project["id"], project["slugId"]):
                return self._v_project(project)
        raise not_found("Project")

    def _r_issues(self, _info: Any, filter: dict[str, Any] | None = None,
                  first: int | None = None, after: str | None = None,
                  includeArchived: bool | None = None) -> dict[str, Any]:
        found = [i for i in self.issues.values()
                 if (includeArchived or i["archivedAt"] is None)
                 and self._issue_matches(i, filter)]
        found.sort(key=lambda i: i["createdAt"], reverse=True)
        return connection([self._v_issue(i) for i in found], first, after)

    def _r_comments(self, _info: Any, filter: dict[str, Any] | None = None,
                    first: int | None = None, after: str | None = None) -> dict[str, Any]:
        flt = filter or {}
        out = []
        for comment in self.comments.values():
            issue = self.issues[comment["issue_id"]]
            if "issue" in flt and not self._issue_matches(issue, flt["issue"]):
                continue
            if not self._cmp(comment["createdAt"], flt.get("createdAt")):
                continue
            out.append(comment)
        out.sort(key=lambda c: c["createdAt"], reverse=True)
        return connection([self._v_comment(c) for c in out], first, after)

    def _m_issue_update(self, _info: Any, id: str, input: dict[str, Any]) -> dict[str, Any]:
        issue = self._issue(id)
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
        issue["updatedAt"] = self.now()
        self._changed("Issue", "update", {"id": issue["id"], "stateId": issue["state_id"],
                                          "labelIds": list(issue["label_ids"])})
        return {"success": True, "issue": self._v_issue(issue)}

    def _m_comment_create(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        issue = self._issue(input.get("issueId") or "")
        cid = str(uuid.uuid4())
        self.comments[cid] = {"id": cid, "issue_id": issue["id"], "body": input.get("body") or "",
                              "createdAt": self.now(), "user": dict(self.viewer),
                              "botActor": None}
        self._changed("Comment", "create", {"id": cid, "issueId": issue["id"]})
        return {"success": True, "comment": self._v_comment(self.comments[cid])}

    def _m_issue_create(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        team_id = input["teamId"]
        if team_id not in self.teams:
            raise not_found("Team")
        state_id = input.get("stateId")
        if state_id is None:
            team_states = sorted((s for s in self.states.values() if s["team_id"] == team_id),
                                 key=lambda s: s["position"])
            state_id = next((s["id"] for s in team_states if s["type"] == "unstarted"),
                            team_states[0]["id"])
        parent = self._issue(input["parentId"])["id"] if input.get("parentId") else None
        for lid in input.get("labelIds") or ():
            if lid not in self.labels:
                raise not_found("IssueLabel")
        rec = self._new_issue(team_id, input.get("title") or "", project_id=input.get("projectId"),
                              state_id=state_id, label_ids=list(input.get("labelIds") or ()),
                              parent_id=parent, priority=input.get("priority") or 0,
                              description=input.get("description") or "")
        if parent:
            self.issues[parent]["updatedAt"] = self.now()
        self._changed("Issue", "create", {"id": rec["id"], "teamId": team_id})
        return {"success": True, "issue": self._v_issue(rec)}

    def _m_relation_create(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        source = self._issue(input["issueId"])
        target = self._issue(input["relatedIssueId"])
        rid = str(uuid.uuid4())
        kind = getattr(input["type"], "value", input["type"])
        self.relations[rid] = {"id": rid, "issue_id": source["id"], "related_id": target["id"],
                               "type": str(kind)}
        return {"success": True, "issueRelation": {"id": rid, "type": str(kind),
                                                   "issue": self._v_issue(source)}}

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

    # -- HTTP ---------------------------------------------------------------------------------

    def _next_fault(self) -> str | None:
        with self._lock:
            if self.faults.queue:
                return self.faults.queue.pop(0)
            return self.faults.always

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return web.json_response({"errors": [{"message": "body must be JSON"}]}, status=400)
        with self._lock:
            self.requests.append({"operationName": body.get("operationName"),
                                  "variables": body.get("variables")})
        if request.headers.get("Authorization") != self.api_key:
            return web.json_response(
                {"errors": [{"message": "Authentication required, not authenticated",
                             "extensions": {"type": "authentication error",
                                            "code": "AUTHENTICATION_ERROR"}}]}, status=400)
        fault = self._next_fault()
        if fault == "ratelimited":
            return web.json_response(
                {"errors": [{"message": "Rate limit exceeded",
                             "extensions": {"code": "RATELIMITED"}}]}, status=400,
                headers={"X-RateLimit-Requests-Remaining": "0", **self.rate_headers})
        if fault == "internal":  # a 500 with a GraphQL error body
            return web.json_response(
                {"errors": [{"message": "Internal server error",
                             "extensions": {"code": "INTERNAL_SERVER_ERROR"}}]}, status=500)
        if fault == "badinput":
            return web.json_response(
                {"errors": [{"message": "Argument Validation Error",
                             "extensions": {"code": "INVALID_INPUT"}}], "data": None},
                status=400)
        if fault in ("500", "502", "503"):
            return web.Response(status=int(fault), text="upstream trouble")
        if fault == "slow":
            await asyncio.sleep(self.faults.slow_seconds)
        if fault == "malformed":
            return web.Response(status=200, text="<html>not json", content_type="text/html")
        if fault == "nodata":
            return web.json_response({"data": None})
        with self._lock:
            result = await graphql(self.schema, body.get("query") or "",
                                   root_value=self._root(),
                                   variable_values=body.get("variables"),
                                   operation_name=body.get("operationName"))
        payload: dict[str, Any] = {"data": result.data}
        if result.errors:
            payload["errors"] = [e.formatted for e in result.errors]
        if fault == "partial" and isinstance(result.data, dict):
            payload["data"] = {k: {"nodes": [{"id": "x"}]} for k in result.data}
        headers = {"X-Complexity": str(max(1, len(json.dumps(payload)) // 100))}
        headers.update(self.rate_headers)
        return web.json_response(payload, headers=headers)

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/graphql", self._handle)
        return app


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

    def tracker(self, project: str = "Alpha", **kwargs: Any) -> Any:
        from ralph_dev.adapters.tracker.linear.client import ApiKey, LinearClient
        from ralph_dev.adapters.tracker.linear.tracker import LinearTracker

        async def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)

        client = LinearClient(ApiKey(self.fake.api_key, "the test"), self.fake.url,
                              timeout=2.0, clock=self.clock, sleep=sleep, rng=lambda: 0.5)
        return LinearTracker(client, project, **kwargs)
