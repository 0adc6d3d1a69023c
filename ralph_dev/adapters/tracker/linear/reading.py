"""Reading Linear: the issue cache, kept fresh by full syncs and cheap polls.

A full sync reads every issue of the project (paged so one query stays under
the complexity cap) at start and every ``full_sync_interval``; between them a
poll costs one request, which brings along what little changed (the few issues
changed since, new comments) and downloads no other issue text. The last full
sync is also kept on disk, so short-lived processes (``status``, ``plan``,
``doctor``) reuse it instead of re-reading the project. A process that keeps
polling (the controller) answers ``get`` from what it holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog

from ralph_dev.adapters.tracker.linear.cache import IssueCache
from ralph_dev.adapters.tracker.linear.context import LinearContext
from ralph_dev.adapters.tracker.linear.errors import LinearNotFound
from ralph_dev.adapters.tracker.linear.parse import (
    Entry,
    blockers_from,
    children_from,
    comment_from_node,
    entry_from_node,
    linear_time,
    next_page,
    parse_time,
    parsing,
)
from ralph_dev.core.errors import UnknownIssue
from ralph_dev.core.model import Comment, Issue, check_identifier

log = structlog.get_logger(__name__)

PAGE_SIZE = 68
"""Issues per full-sync page: IssueFields is about 71 points, so about 4,800 per query
(under 5,000; Linear refuses anything over 10,000): the fewest pages under the cap."""
BY_ID_PAGE = 50
"""Issues per query when fetching known ids in full (what a poll found new)."""
RELATED_PAGE = 100
"""Issues per query when reading the state of blockers/children elsewhere (~7 points each)."""
CONNECTION_PAGE = 50
"""Blockers or children per follow-up query, for the rare issue with more than 10."""
POLL_WINDOW = 100
"""Issue changes one poll looks at; more means a full sync is cheaper and surer."""
POLL_FRESH = 3
"""Issues changed after everything the cache holds that one poll brings along in full
(about 71 points each): a person's edit costs no second request."""
POLL_COMMENTS = 20
"""New comments (with their text) one poll looks at; more are paged."""
POLL_RELATIONS = 25
"""Newest relation changes of the workspace one poll looks at; all of them new means
some may have been missed: then a full sync."""
POLL_OVERLAP = timedelta(minutes=2)
"""Changes Linear stamped this long before the newest one we hold are looked at again
(their ids and stamps only): a write that became visible late is not missed."""


def _comments(nodes: Iterable[Any]) -> list[tuple[str, str, Comment]]:
    """(issue id, comment id, comment) of a page of comments."""
    return [(str(node["issue"]["id"]), *comment_from_node(node)) for node in nodes]


class LinearReader:
    """Every read of one Linear project, into and out of the shared issue cache."""

    def __init__(self, context: LinearContext, *, poll_interval: float = 30.0,
                 page_size: int = PAGE_SIZE) -> None:
        self.context = context
        self.client = context.client
        self.directory = context.directory
        self.poll_interval = poll_interval
        self.page_size = page_size
        self._polled_at: datetime | None = None
        self._expect_changes = False
        self._labels_missing: set[str] = set()
        """Label ids still unknown after the last reload (not reloaded for again)."""
        self._unreadable: set[str] = set()
        """Blockers/children Linear did not return when asked (not asked again until the
        next full sync); they stay unfinished for a decision, which is the safe side."""
        self.full_syncs = 0
        self.polls = 0
        self.cached_reads = 0

    def usage(self) -> dict[str, Any]:
        """For ``status``: requests/complexity per hour, rate limit, sync counts."""
        out = self.client.usage()
        cache = self.context.cache
        out.update(full_syncs=self.full_syncs, polls=self.polls, cached_reads=self.cached_reads,
                   last_full_sync=cache.synced_at.isoformat() if cache and cache.synced_at
                   else None,
                   cached_issues=len(cache.members()) if cache else 0)
        return out

    def expect_changes(self) -> None:
        """Something changed in Linear (a webhook said so): the next ``list_issues``
        polls even if the last poll is younger than ``poll_interval``."""
        self._expect_changes = True

    def renamed(self) -> dict[str, str]:
        """Earlier identifiers of the project's issues (before a team move) → current."""
        cache = self.context.cache
        if cache is None:
            return {}
        return {old: e.identifier for e in cache.members() for old in e.previous_identifiers}

    async def complete(self, cache: IssueCache, entries: Iterable[Entry]) -> None:
        """Read what the entries' pages left out: the rest of long blocker/children lists,
        and the state of what they point at outside the project (or archived)."""
        for entry in entries:
            while entry.blockers_after is not None:
                data = await self.client.execute("IssueBlockers", {
                    "id": entry.id, "first": CONNECTION_PAGE, "after": entry.blockers_after})
                with parsing("IssueBlockers"):
                    more, entry.blockers_after = blockers_from(
                        data["issue"]["inverseRelations"])
                entry.blockers = (*entry.blockers, *more)
            while entry.children_after is not None:
                data = await self.client.execute("IssueChildren", {
                    "id": entry.id, "first": CONNECTION_PAGE, "after": entry.children_after})
                with parsing("IssueChildren"):
                    more, entry.children_after = children_from(data["issue"]["children"])
                entry.children = (*entry.children, *more)
        unknown = sorted(cache.unknown_references() - self._unreadable)
        self._unreadable.update(unknown)  # until Linear returns them (deleted, no access)
        short: list[str] = []
        for start in range(0, len(unknown), RELATED_PAGE):
            chunk = unknown[start:start + RELATED_PAGE]
            data = await self.client.execute("RelatedIssues", {"ids": chunk,
                                                               "first": len(chunk)})
            with parsing("RelatedIssues"):
                found = [entry_from_node(n) for n in data["issues"]["nodes"]]
            for entry in found:
                self._unreadable.discard(entry.id)
                if entry.project_id == cache.project.id and not entry.gone:
                    short.append(entry.id)  # one of ours after all: read it in full
                else:
                    cache.store(entry)
        if short:
            await self.complete(cache, await self._fetch_full(cache, short))
        missing = cache.unknown_label_ids()
        if missing - self._labels_missing:  # a label made since we read the list
            await self.directory.labels(reload=True)
            self._labels_missing = cache.unknown_label_ids()

    async def _fetch_full(self, cache: IssueCache, ids: Sequence[str]) -> list[Entry]:
        """These issues in full, stored; returns what Linear still has."""
        fetched: list[Entry] = []
        for start in range(0, len(ids), BY_ID_PAGE):
            chunk = list(ids[start:start + BY_ID_PAGE])
            data = await self.client.execute("IssuesByIds", {"ids": chunk, "first": len(chunk)})
            with parsing("IssuesByIds"):
                fetched += [entry_from_node(n) for n in data["issues"]["nodes"]]
        for entry in fetched:
            cache.store(entry)
        return fetched

    # --- reading --------------------------------------------------------------------

    async def _full_sync(self) -> IssueCache:
        started = self.context.clock()
        project = await self.directory.project()
        read_at = self.directory.project_read_at
        if read_at is None or started - read_at >= timedelta(minutes=1):
            project = await self.directory.read_project(project.id)
        fresh: list[Entry] = []
        mark = None
        after: str | None = None
        while True:
            data = await self.client.execute(
                "ProjectIssues",
                {"projectId": project.id, "first": self.page_size, "after": after})
            with parsing("ProjectIssues"):
                conn = data["issues"]
                fresh += [entry_from_node(n) for n in conn["nodes"]]
                if after is None:
                    marks = data["relationsMark"]["nodes"]
                    mark = parse_time(marks[0]["updatedAt"]) if marks else None
                more = bool(conn["pageInfo"]["hasNextPage"])
                after = conn["pageInfo"]["endCursor"]
            if not more:
                break
        old = self.context.cache
        self._unreadable.clear()
        cache = IssueCache(project, labels=old.labels if old else {})
        for entry in fresh:
            held = old.entries.get(entry.id) if old is not None else None
            if held is not None:
                newest_comments, entry.comments = entry.comments, dict(held.comments)
                entry.add_comments(newest_comments)
            cache.store(entry)
            cache.saw(entry.updated_at, *(c.created_at for c in entry.comments.values()))
        cache.relations_mark = mark
        self.context.cache = cache
        await self.complete(cache, fresh)
        cache.synced_at = cache.polled_at = self._polled_at = started
        self._expect_changes = False
        self.full_syncs += 1
        log.info("linear_full_sync", issues=len(cache.members()),
                 outside=len(cache.entries) - len(cache.members()))
        self.context.save(force=True)
        return cache

    def _poll_due(self, cache: IssueCache, now: datetime) -> bool:
        if self._polled_at is None or self._expect_changes:
            return True  # this process has not looked yet, or was told to
        if (now - self._polled_at).total_seconds() >= self.poll_interval:
            return True
        return self.client.writes_elsewhere_after(self._polled_at)

    async def _poll(self, cache: IssueCache) -> IssueCache:
        """One request, which brings what little is new along (the few issues changed
        after everything held, new comments with their text); a second only for more
        than that; a full sync when it overflows. Returns the cache it leaves (the full
        sync's, after an overflow)."""
        started = self.context.clock()
        since = (cache.newest or started) - POLL_OVERLAP
        newest_held = max((e.updated_at for e in cache.entries.values()), default=since)
        after_held = max(since, newest_held) + timedelta(milliseconds=1)  # stamps are in ms
        data = await self.client.execute("ProjectChanges", {
            "projectId": cache.project.id, "watch": sorted(cache.referenced()),
            "since": linear_time(since), "first": POLL_WINDOW,
            "freshSince": linear_time(after_held), "freshFirst": POLL_FRESH,
            "commentsFirst": POLL_COMMENTS, "relationsFirst": POLL_RELATIONS})
        with parsing("ProjectChanges"):
            changed = [(str(n["id"]), parse_time(n["updatedAt"]))
                       for n in data["issues"]["nodes"]]
            archived = {str(n["id"]) for n in data["issues"]["nodes"] if n["archivedAt"]}
            fresh = {e.id: e for e in map(entry_from_node, data["fresh"]["nodes"])}
            comments = _comments(data["comments"]["nodes"])
            comments_after = next_page(data["comments"])
            relations = [(parse_time(n["updatedAt"]), str(n["relatedIssue"]["id"]))
                         for n in data["issueRelations"]["nodes"]]
            overflow = ["issues"] if data["issues"]["pageInfo"]["hasNextPage"] else []
        while comments_after is not None:
            data = await self.client.execute("ProjectComments", {
                "projectId": cache.project.id, "since": linear_time(since),
                "first": POLL_COMMENTS, "after": comments_after})
            with parsing("ProjectComments"):
                comments += _comments(data["comments"]["nodes"])
                comments_after = next_page(data["comments"])
        mark = cache.relations_mark
        newer = [(stamp, target) for stamp, target in relations if mark is None or stamp > mark]
        if mark is not None and len(relations) == POLL_RELATIONS and len(newer) == len(relations):
            overflow.append("relations")
        if overflow:
            log.info("linear_poll_overflow", parts=overflow)
            return await self._full_sync()
        held, watched = cache.entries, cache.referenced()
        want = [i for i, stamp in changed  # archived and nothing of ours: nothing to read
                if (i not in held and (i not in archived or i in watched))
                or (i in held and held[i].updated_at != stamp)]
        members = {e.id for e in cache.members()}
        want += [target for _stamp, target in newer if target in members]  # relations moved
        want = list(dict.fromkeys(want))
        brought = [fresh[i] for i in want if i in fresh]
        for entry in brought:
            cache.store(entry)
        fetched = brought + await self._fetch_full(cache, [i for i in want if i not in fresh])
        new_comments = [(issue_id, cid, comment) for issue_id, cid, comment in comments
                        if issue_id not in held or cid not in held[issue_id].comments]
        for issue_id, cid, comment in new_comments:
            cache.add_comment(issue_id, cid, comment)
            cache.saw(comment.created_at)
        if fetched:
            await self.complete(cache, fetched)
        if relations:
            cache.relations_mark = max([*(s for s, _t in relations),
                                        *([mark] if mark else [])])
        cache.saw(*(stamp for _issue_id, stamp in changed))
        cache.polled_at = self._polled_at = started
        self._expect_changes = False
        self.polls += 1
        if want or new_comments:
            cache.prune(recent=(cache.newest or started) - POLL_OVERLAP)
            self.context.save()
        return cache

    async def _current(self) -> IssueCache:
        """The cache as current as this process keeps it: a full sync when one is due,
        else a poll when one is due, else as it is (a cached read)."""
        cache = await self.context.open_cache()
        if not self.context.fresh(cache):
            cache = await self._full_sync()
        elif self._poll_due(cache, self.context.clock()):
            cache = await self._poll(cache)
        else:
            self.cached_reads += 1
        if self.context.dirty:
            self.context.save()
        return cache

    async def list_issues(self) -> list[Issue]:
        """The project's issues, then the foreign blockers/children (``foreign=True``)."""
        return (await self._current()).issues()

    async def held(self, identifier: str) -> Issue | None:
        """The issue as this process holds it, with no request unless a poll is due: from
        the view it keeps (the controller: it polled since its last full sync; a due poll
        or full sync is made first, the one its next ``list_issues`` would make anyway),
        else from a cache that started from a fresh full sync (the disk cache). None when
        it holds no such issue."""
        check_identifier(identifier)
        cache = await self.context.open_cache()
        if not self.context.fresh(cache):
            return None
        if self._polled_at is not None:
            cache = await self._current()
        entry = cache.by_identifier(identifier)
        if entry is None or entry.identifier != identifier or not cache.member(entry):
            return None
        return next((i for i in cache.issues() if i.id == entry.id), None)

    async def get(self, identifier: str) -> Issue:
        """One issue of the project, as current as ``list_issues`` keeps the project: a
        process that keeps the view answers from it (a write-back's read costs nothing);
        any other (``issue show``) reads the issue now."""
        if self._polled_at is not None:
            issue = await self.held(identifier)
            if issue is not None:
                return issue
        return await self.read(identifier)

    async def read(self, identifier: str) -> Issue:
        """One issue of the project, read now (with its 20 newest comments)."""
        check_identifier(identifier)
        cache = await self.context.open_cache()
        held = cache.by_identifier(identifier)
        known = self.directory.known
        name = known.name if known else self.directory.project_ref
        try:
            data = await self.client.execute("Issue", {"id": held.id if held else identifier})
        except LinearNotFound:
            if held is not None:
                cache.forget(held.id)
            raise UnknownIssue(f"no issue {identifier} in Linear project {name!r}") from None
        with parsing("Issue"):
            entry = entry_from_node(data["issue"])
        cache.store(entry)
        await self.complete(cache, [entry])
        if not cache.member(entry):
            where = "is archived or in the trash" if entry.gone else "is not in it"
            raise UnknownIssue(f"{identifier} {where} (Linear project {name!r})")
        return next(i for i in cache.issues() if i.id == entry.id)

    async def ensure_full_view(self) -> IssueCache:
        """Everything (for checks over the whole project, such as blocker cycles)."""
        cache = await self.context.open_cache()
        return cache if self.context.fresh(cache) else await self._full_sync()

