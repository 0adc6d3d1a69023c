"""Reading Linear: the issue cache, kept fresh by full syncs and cheap polls.

A full sync reads every issue of the project (paged so one query stays far
under the complexity cap) at start and every ``full_sync_interval``; between
them a poll costs one request that downloads no issue text unless something
changed. The last full sync is also kept on disk, so short-lived processes
(``status``, ``plan``, ``doctor``) reuse it instead of re-reading the project.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import structlog

from ralph_dev.adapters.tracker.linear.cache import (
    IssueCache,
    load_cache,
    save_json,
)
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
from ralph_dev.core.errors import (
    UnknownIssue,
)
from ralph_dev.core.model import (
    Comment,
    Issue,
    check_identifier,
)

if TYPE_CHECKING:
    pass

from ralph_dev.adapters.tracker.linear.base import (
    BY_ID_PAGE,
    CONNECTION_PAGE,
    POLL_COMMENTS,
    POLL_OVERLAP,
    POLL_RELATIONS,
    POLL_WINDOW,
    RELATED_PAGE,
    SAVE_EVERY,
    LinearBase,
)

log = structlog.get_logger(__name__)

class LinearReader(LinearBase):
    """The issue cache and every read of ``LinearTracker`` (tracker.py)."""

    # --- the cache ------------------------------------------------------------------

    async def _open_cache(self) -> IssueCache:
        """The cache: this process's, else the disk cache of the last full sync when it is
        fresh, else an empty one that knows only what is read into it."""
        if self._cache is not None:
            return self._cache
        project = await self.project()
        cache = None
        if self.cache_file is not None and not self._disk_checked:
            self._disk_checked = True
            cache = load_cache(self.cache_file, self.project_ref, project)
            if cache is not None and self._labels is None:
                self._labels = list(cache.labels.values())  # a stale list still names most
            if cache is not None and not self._fresh(cache):
                cache = None
            if cache is not None:
                log.info("linear_cache_loaded", issues=len(cache.members()),
                         synced_at=cache.synced_at.isoformat() if cache.synced_at else None)
                self._saved_at = self.clock()
        self._cache = cache or IssueCache(project)
        if self._labels is not None:
            self._cache.labels = {x.id: x for x in self._labels}
        return self._cache

    def _fresh(self, cache: IssueCache) -> bool:
        if cache.synced_at is None:
            return False
        age = (self.clock() - cache.synced_at).total_seconds()
        return 0 <= age < self.full_sync_interval

    def _save(self, *, force: bool = False) -> None:
        cache = self._cache
        if self.cache_file is None or cache is None or cache.synced_at is None:
            return  # only a cache that started from a full sync is worth sharing
        now = self.clock()
        if not force and self._saved_at is not None and now - self._saved_at < SAVE_EVERY:
            self._dirty = True
            return
        save_json(self.cache_file, cache.to_json(self.project_ref))
        self._saved_at = now
        self._dirty = False

    async def _complete(self, cache: IssueCache, entries: Iterable[Entry]) -> None:
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
            await self._complete(cache, await self._fetch_full(cache, short))
        missing = cache.unknown_label_ids()
        if missing - self._labels_missing:  # a label made since we read the list
            await self.labels(reload=True)
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
        started = self.clock()
        project = await self.project()
        read_recently = (self._project_read_at is not None
                         and started - self._project_read_at < timedelta(minutes=1))
        if not read_recently:
            project = await self._read_project(project.id)
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
        old = self._cache
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
        self._cache = cache
        await self._complete(cache, fresh)
        cache.synced_at = cache.polled_at = self._polled_at = started
        self._expect_changes = False
        self.full_syncs += 1
        log.info("linear_full_sync", issues=len(cache.members()),
                 outside=len(cache.entries) - len(cache.members()))
        self._save(force=True)
        return cache

    def _poll_due(self, cache: IssueCache, now: datetime) -> bool:
        if self._polled_at is None or self._expect_changes:
            return True  # this process has not looked yet, or was told to
        if (now - self._polled_at).total_seconds() >= self.poll_interval:
            return True
        return self.client.writes_elsewhere_after(self._polled_at)

    async def _poll(self, cache: IssueCache) -> None:
        """One request; a second only for what is new; a full sync when it overflows."""
        started = self.clock()
        since = (cache.newest or started) - POLL_OVERLAP
        data = await self.client.execute("ProjectChanges", {
            "projectId": cache.project.id, "watch": sorted(cache.referenced()),
            "since": linear_time(since), "first": POLL_WINDOW, "commentsFirst": POLL_COMMENTS,
            "relationsFirst": POLL_RELATIONS})
        with parsing("ProjectChanges"):
            changed = [(str(n["id"]), parse_time(n["updatedAt"]))
                       for n in data["issues"]["nodes"]]
            archived = {str(n["id"]) for n in data["issues"]["nodes"] if n["archivedAt"]}
            comments = [(str(n["id"]), str(n["issue"]["id"])) for n in data["comments"]["nodes"]]
            comments_after = next_page(data["comments"])
            relations = [(parse_time(n["updatedAt"]), str(n["relatedIssue"]["id"]))
                         for n in data["issueRelations"]["nodes"]]
            overflow = ["issues"] if data["issues"]["pageInfo"]["hasNextPage"] else []
        while comments_after is not None:
            data = await self.client.execute("ProjectComments", {
                "projectId": cache.project.id, "since": linear_time(since),
                "first": POLL_COMMENTS, "after": comments_after})
            with parsing("ProjectComments"):
                comments += [(str(n["id"]), str(n["issue"]["id"]))
                             for n in data["comments"]["nodes"]]
                comments_after = next_page(data["comments"])
        mark = cache.relations_mark
        newer = [(stamp, target) for stamp, target in relations if mark is None or stamp > mark]
        if mark is not None and len(relations) == POLL_RELATIONS and len(newer) == len(relations):
            overflow.append("relations")
        if overflow:
            log.info("linear_poll_overflow", parts=overflow)
            await self._full_sync()
            return
        held, watched = cache.entries, cache.referenced()
        want = [i for i, stamp in changed  # archived and nothing of ours: nothing to read
                if (i not in held and (i not in archived or i in watched))
                or (i in held and held[i].updated_at != stamp)]
        members = {e.id for e in cache.members()}
        want += [target for _stamp, target in newer if target in members]  # relations moved
        want = list(dict.fromkeys(want))
        new_comments = [cid for cid, issue_id in comments
                        if issue_id not in cache.entries
                        or cid not in cache.entries[issue_id].comments]
        if want or new_comments:
            await self._details(cache, want, new_comments)
        if relations:
            cache.relations_mark = max([*(s for s, _t in relations),
                                        *([mark] if mark else [])])
        cache.saw(*(stamp for _issue_id, stamp in changed))
        cache.polled_at = self._polled_at = started
        self._expect_changes = False
        self.polls += 1
        if want or new_comments:
            cache.prune(recent=(cache.newest or started) - POLL_OVERLAP)
            self._save()

    async def _details(self, cache: IssueCache, ids: Sequence[str],
                       comment_ids: Sequence[str]) -> None:
        """The issues and comments a poll found new, in as few requests as the pages allow."""
        fetched: list[Entry] = []
        found: list[tuple[str, str, Comment]] = []
        rounds = max(-(-len(ids) // BY_ID_PAGE), -(-len(comment_ids) // POLL_COMMENTS), 1)
        for n in range(rounds):
            chunk = list(ids[n * BY_ID_PAGE:(n + 1) * BY_ID_PAGE])
            cchunk = list(comment_ids[n * POLL_COMMENTS:(n + 1) * POLL_COMMENTS])
            data = await self.client.execute("PollDetails", {
                "ids": chunk, "first": max(1, len(chunk)),
                "commentIds": cchunk, "commentsFirst": max(1, len(cchunk))})
            with parsing("PollDetails"):
                fetched += [entry_from_node(node) for node in data["issues"]["nodes"]]
                found += [(str(node["issue"]["id"]), *comment_from_node(node))
                          for node in data["comments"]["nodes"]]
        for entry in fetched:
            cache.store(entry)
        for issue_id, cid, comment in found:
            cache.add_comment(issue_id, cid, comment)
            cache.saw(comment.created_at)
        await self._complete(cache, fetched)

    async def list_issues(self) -> list[Issue]:
        """The project's issues, then the foreign blockers/children (``foreign=True``)."""
        cache = await self._open_cache()
        now = self.clock()
        if not self._fresh(cache):
            cache = await self._full_sync()
        elif self._poll_due(cache, now):
            await self._poll(cache)
        else:
            self.cached_reads += 1
        if self._dirty:
            self._save()
        return cache.issues()

    async def refresh(self, identifiers: Sequence[str]) -> list[Issue]:
        """These issues read again (the project's, and blockers/children elsewhere that
        the project's issues point at); unknown ones are left out."""
        wanted = [check_identifier(i) for i in identifiers]
        if not wanted:
            return []
        cache = await self._open_cache()
        known = {e.id: ident for ident in wanted if (e := cache.by_identifier(ident))}
        fetched = await self._fetch_full(cache, sorted(known))
        for gone in set(known) - {e.id for e in fetched}:  # deleted in Linear
            cache.forget(gone)
        for identifier in wanted:
            if identifier in known.values():
                continue
            try:
                data = await self.client.execute("Issue", {"id": identifier})
            except LinearNotFound:
                continue
            with parsing("Issue"):
                entry = entry_from_node(data["issue"])
            cache.store(entry)
            fetched.append(entry)
        await self._complete(cache, fetched)
        by_ident = {i.identifier: i for i in cache.issues()}
        renamed = {old: e.identifier for e in fetched for old in e.previous_identifiers}
        result = [by_ident.get(renamed.get(i, i)) for i in dict.fromkeys(wanted)]
        return [i for i in result if i is not None]

    async def get(self, identifier: str) -> Issue:
        """One issue of the project, read now (with its 20 newest comments)."""
        check_identifier(identifier)
        cache = await self._open_cache()
        held = cache.by_identifier(identifier)
        name = self._project.name if self._project else self.project_ref
        try:
            data = await self.client.execute("Issue", {"id": held.id if held else identifier})
        except LinearNotFound:
            if held is not None:
                cache.forget(held.id)
            raise UnknownIssue(f"no issue {identifier} in Linear project {name!r}") from None
        with parsing("Issue"):
            entry = entry_from_node(data["issue"])
        cache.store(entry)
        await self._complete(cache, [entry])
        if not cache.member(entry):
            where = "is archived or in the trash" if entry.gone else "is not in it"
            raise UnknownIssue(f"{identifier} {where} (Linear project {name!r})")
        return next(i for i in cache.issues() if i.id == entry.id)

    async def _ensure_full_view(self) -> IssueCache:
        """Everything (for checks over the whole project, such as blocker cycles)."""
        cache = await self._open_cache()
        return cache if self._fresh(cache) else await self._full_sync()

