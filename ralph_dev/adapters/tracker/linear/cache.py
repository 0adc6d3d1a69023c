"""What ralph-dev holds of a Linear project: issues by UUID, turned into ``Issue``s.

``IssueCache`` keeps every issue the project needs to see: its own, plus the
blockers and sub-issues that live in other projects or are archived/trashed,
because their state decides whether the project's issues are ready. It turns
them into the ``Issue`` list the controller reads:

- the project's live issues, ``blocked_by`` holding only "blocks" relations
  whose blocker is neither archived nor in the trash (such a blocker can never
  be worked on or block again, so it counts as finished and settled), and
  ``children`` from Linear's own ``children`` connection (other projects too);
- blockers and sub-issues outside the project as extra ``Issue(foreign=True)``
  entries, so a decision sees their state; they are never to be acted on;
- identifiers looked up by UUID at that moment, so a blocker that moved to
  another team (and was renumbered) is still named right.

The disk cache (``save``/``load``, 0600, atomic) lets short-lived processes
(``status``, ``plan``, ``doctor``, worker commands) start from the last full
sync instead of re-reading the whole project; ``linear-project.json`` beside it
holds the project's teams, whose keys ``team_keys`` gives the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.adapters.tracker.linear.parse import (
    Entry,
    LinearLabel,
    LinearProject,
    parse_time,
)
from ralph_dev.core.model import IDENTIFIER_RE, Comment, Issue

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings

log = structlog.get_logger(__name__)

CACHE_VERSION = 1
CACHE_FILE = "linear-cache.json"
PROJECT_FILE = "linear-project.json"
RATE_FILE = "linear-rate.json"


def _natural(identifier: str) -> tuple[str, int]:
    prefix, _, number = identifier.rpartition("-")
    return (prefix, int(number) if number.isdigit() else 0)


@dataclass
class IssueCache:
    """The issues of one project and the ones they point at, plus the poll cursors."""

    project: LinearProject
    entries: dict[str, Entry] = field(default_factory=dict)
    labels: dict[str, LinearLabel] = field(default_factory=dict)
    newest: datetime | None = None
    """The newest change Linear stamped that we hold (issue updatedAt, comment createdAt)."""
    relations_mark: datetime | None = None
    """The newest relation change (workspace-wide) already taken into account."""
    synced_at: datetime | None = None
    """When the last full sync started (our clock); None: only some issues are known."""
    polled_at: datetime | None = None
    _odd: set[str] = field(default_factory=set)

    # -- what is what -------------------------------------------------------------------

    def member(self, entry: Entry) -> bool:
        """A live issue of the project, read in full."""
        return entry.project_id == self.project.id and not entry.gone and entry.full

    def members(self) -> list[Entry]:
        return [e for e in self.entries.values() if self.member(e)]

    def referenced(self) -> set[str]:
        """UUIDs the project's issues point at (blockers, children) that are not
        live issues of the project themselves."""
        out: set[str] = set()
        for entry in self.members():
            for ref in (*entry.blockers, *entry.children):
                other = self.entries.get(ref.id)
                if other is None or not self.member(other):
                    out.add(ref.id)
        return out

    def unknown_references(self) -> set[str]:
        return {i for i in self.referenced() if i not in self.entries}

    def unknown_label_ids(self) -> set[str]:
        return {lid for e in self.members() for lid in e.label_ids if lid not in self.labels}

    def by_identifier(self, identifier: str) -> Entry | None:
        """The issue called ``identifier`` now, else the one that was called so before a
        team move (the project's own issues first)."""
        ranked = sorted(self.entries.values(), key=lambda e: not self.member(e))
        for entry in ranked:
            if entry.identifier == identifier:
                return entry
        return next((e for e in ranked if identifier in e.previous_identifiers), None)

    # -- changes ---------------------------------------------------------------------------

    def store(self, entry: Entry) -> None:
        """Put a freshly read issue in, keeping the comments we already had."""
        old = self.entries.get(entry.id)
        if old is not None:
            fresh, entry.comments = entry.comments, dict(old.comments)
            entry.add_comments(fresh)
            if not entry.full and old.full and old.updated_at == entry.updated_at:
                return  # the short form of an issue we hold in full: nothing new
        self.entries[entry.id] = entry

    def add_comment(self, issue_id: str, comment_id: str, comment: Comment) -> None:
        target = self.entries.get(issue_id)
        if target is not None:
            target.add_comments({comment_id: comment})

    def saw(self, *stamps: datetime) -> None:
        """A sync or poll saw changes Linear stamped so: the next poll looks from the
        newest on (our own writes do not move it: a poll may not have seen what
        others changed just before them)."""
        for stamp in stamps:
            if self.newest is None or stamp > self.newest:
                self.newest = stamp

    def forget(self, issue_id: str) -> None:
        self.entries.pop(issue_id, None)

    def prune(self, recent: datetime | None = None) -> None:
        """Drop what nothing needs any more: issues that left the project (archived,
        moved) and that no issue of the project points at. Those changed since
        ``recent`` stay a while, so the polls' overlap does not fetch them again."""
        keep = self.referenced()
        for issue_id in [i for i, e in self.entries.items()
                         if not self.member(e) and i not in keep
                         and (recent is None or e.updated_at < recent)]:
            del self.entries[issue_id]

    # -- the Issue list ---------------------------------------------------------------------

    def issues(self) -> list[Issue]:
        """The project's issues, then the foreign blockers and children they point at."""
        members = {e.id: e for e in self.members() if self._usable(e)}
        foreign: dict[str, Entry] = {}

        def name(ref_id: str, fallback: str) -> str:
            entry = self.entries.get(ref_id)
            return entry.identifier if entry is not None else fallback

        def live(refs: Iterable[Any]) -> list[str]:
            out = []
            for ref in refs:
                other = self.entries.get(ref.id)
                if other is not None and other.gone:
                    continue  # archived or trashed: finished for good
                if other is not None and other.id not in members and self._usable(other):
                    foreign[other.id] = other
                out.append(name(ref.id, ref.identifier))
            return out

        listed = []
        for entry in members.values():
            listed.append(replace(
                self._issue(entry),
                blocked_by=tuple(dict.fromkeys(live(entry.blockers))),
                children=tuple(sorted(set(live(entry.children)), key=_natural)),
                parent=name(entry.parent.id, entry.parent.identifier) if entry.parent else None))
        listed.sort(key=lambda i: _natural(i.identifier))
        outside = []
        for entry in foreign.values():
            parent = members.get(entry.parent.id) if entry.parent else None
            outside.append(replace(self._issue(entry), foreign=True,
                                   parent=parent.identifier if parent else None))
        outside.sort(key=lambda i: _natural(i.identifier))
        return listed + outside

    def _usable(self, entry: Entry) -> bool:
        """Identifiers name windows, workspaces and files: an odd one is left out (and
        said once)."""
        if IDENTIFIER_RE.fullmatch(entry.identifier):
            return True
        if entry.id not in self._odd:
            self._odd.add(entry.id)
            log.warning("linear_odd_identifier", identifier=entry.identifier[:40])
        return False

    def _issue(self, entry: Entry) -> Issue:
        labels = frozenset(self.labels[x].name for x in entry.label_ids if x in self.labels)
        comments = tuple(sorted(entry.comments.values(), key=lambda c: c.created_at))
        return Issue(
            identifier=entry.identifier, id=entry.id, title=entry.title,
            description=entry.description, state_name=entry.state_name,
            state_type=entry.state_type, priority=entry.priority, sort_order=entry.sort_order,
            labels=labels, comments=comments, created_at=entry.created_at,
            updated_at=entry.updated_at, team=entry.team_key,
        )

    # -- on disk ----------------------------------------------------------------------------

    def to_json(self, project_ref: str) -> dict[str, Any]:
        def stamp(moment: datetime | None) -> str | None:
            return moment.isoformat() if moment else None

        return {
            "version": CACHE_VERSION, "project_ref": project_ref, "project_id": self.project.id,
            "synced_at": stamp(self.synced_at), "polled_at": stamp(self.polled_at),
            "newest": stamp(self.newest), "relations_mark": stamp(self.relations_mark),
            "labels": [[x.id, x.name, x.team_id, x.is_group] for x in self.labels.values()],
            "entries": [e.to_json() for e in self.entries.values()],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], project: LinearProject) -> IssueCache:
        def stamp(text: Any) -> datetime | None:
            return parse_time(text) if text else None

        cache = cls(project)
        cache.labels = {row[0]: LinearLabel(*row) for row in data["labels"]}
        for raw in data["entries"]:
            entry = Entry.from_json(raw)
            cache.entries[entry.id] = entry
        cache.synced_at = stamp(data["synced_at"])
        cache.polled_at = stamp(data["polled_at"])
        cache.newest = stamp(data["newest"])
        cache.relations_mark = stamp(data["relations_mark"])
        return cache


def save_json(path: Path, data: Mapping[str, Any]) -> None:
    """Owner-only (issue text is private), atomic; a failure costs a re-read, no more."""
    try:
        atomic_write_text(path, json.dumps(data, separators=(",", ":")), mode=0o600)
    except OSError as exc:
        log.warning("linear_cache_unwritable", path=str(path), error=exc.strerror)


def load_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("linear_cache_unreadable", path=str(path), error=str(exc)[:120])
        return None
    return data if isinstance(data, dict) else None


def save_project(path: Path, project_ref: str, project: LinearProject) -> None:
    save_json(path, {"version": CACHE_VERSION, "project_ref": project_ref,
                     "project": project.to_json(), "team_keys": [t.key for t in project.teams]})


def load_project(path: Path, project_ref: str) -> LinearProject | None:
    data = load_json(path)
    if not data or data.get("version") != CACHE_VERSION or data.get("project_ref") != project_ref:
        return None
    try:
        return LinearProject.from_json(data["project"])
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("linear_cache_unreadable", path=str(path), error=repr(exc)[:120])
        return None


def load_cache(path: Path, project_ref: str, project: LinearProject) -> IssueCache | None:
    data = load_json(path)
    if (not data or data.get("version") != CACHE_VERSION
            or data.get("project_ref") != project_ref or data.get("project_id") != project.id):
        return None
    try:
        return IssueCache.from_json(data, project)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        log.warning("linear_cache_unreadable", path=str(path), error=repr(exc)[:120])
        return None


def team_keys(settings: ProjectSettings) -> frozenset[str]:
    """The team keys of a Linear project's issues (``ENG`` in ``ENG-12``), as recorded
    at ``init`` and at each full sync; empty when nothing was recorded yet."""
    data = load_json(settings.paths.state_dir / PROJECT_FILE)
    if not data or data.get("project_ref") != (settings.tracker.linear_project or "").strip():
        return frozenset()
    keys = data.get("team_keys")
    if not isinstance(keys, list):
        return frozenset()
    return frozenset(k for k in keys if isinstance(k, str))


class SharedState:
    """The backoff and the last rate-limit headers of every ralph-dev process of one
    project, in a small JSON file in its state dir (written atomically, read again only
    when it changed): a worker command does not hammer a Linear the controller is
    backing off from, and the controller learns that another process wrote to Linear."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._data: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            info = self.path.stat()
        except OSError:
            return {}
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp != self._seen:
            self._seen = stamp
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = {}
            self._data = data if isinstance(data, dict) else {}
        return self._data

    def update(self, **changes: Any) -> None:
        if self.path is None:
            return
        from ralph_dev.adapters.files import atomic_write_text

        data = {**self.read(), **changes}
        try:
            atomic_write_text(self.path, json.dumps(data, sort_keys=True), mode=0o600)
        except OSError as exc:  # a full disk must not turn into a Linear outage
            log.warning("linear_shared_state_unwritable", path=str(self.path),
                        error=exc.strerror)
            return
        self._data = data
        self._seen = None
