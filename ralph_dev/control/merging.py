"""Carrying out a ``Merge``: into trunk here, or as a pull request, and keeping trunk green.

Local mode rebases the worker's change onto trunk and moves trunk to it
(``adapters.jj``); a conflict leaves trunk untouched and hands the workspace
to a resolve worker. Pull-request mode pushes ``ralph/ISSUE`` and opens a pull
request instead. With ``merge.verify_trunk`` the verify command runs on trunk
after each merge; while it fails trunk is "red" (a marker file) and no further
merge happens until trunk moves and verifies green again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

import structlog

from ralph_dev.adapters.jj import JJ
from ralph_dev.adapters.verify import VerifyOutcome, run_verify
from ralph_dev.control.beating import while_beating
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError, TrackerError
from ralph_dev.core.fsutil import atomic_write_text
from ralph_dev.core.model import Issue, Merge, Role
from ralph_dev.core.ports import PullRequests, Repository, Tracker
from ralph_dev.core.state import StateStore

log = structlog.get_logger(__name__)


class MergeConflict(RalphError):
    retryable = True


class MergeLane:
    """One project's merges, one at a time, and the state of trunk they leave."""

    def __init__(self, settings: ProjectSettings, *, jj: Repository, tracker: Tracker,
                 store: StateStore, pull_requests: PullRequests,
                 beat: Callable[[str], None]) -> None:
        self.settings = settings
        self.jj = jj
        self.tracker = tracker
        self.store = store
        self.pull_requests = pull_requests
        self.beat = beat
        """Called while a long verify runs, so the daemon sees a live controller."""

    # -- red trunk ------------------------------------------------------------

    def trunk_red(self) -> bool:
        return self.store.paths.trunk_red_file.exists()

    async def recheck_red_trunk(self) -> None:
        """While trunk is red, verify it again once it has moved (a person pushed a
        fix); green again → merges resume. Costs one jj call per tick while red."""
        marker = self.store.paths.trunk_red_file
        if not marker.exists() or not self.settings.verify_command:
            return
        try:
            red_at = json.loads(marker.read_text()).get("commit")
        except (OSError, ValueError, AttributeError):
            red_at = None
        now_at = await asyncio.to_thread(self.jj.trunk_commit)
        if red_at is not None and now_at == red_at:
            return
        outcome = await self._run_trunk_verify()
        if not outcome.ok:
            self._mark_red(outcome, now_at)
            return
        marker.unlink(missing_ok=True)
        self.store.append_event("trunk_green", commit=now_at)

    def _mark_red(self, outcome: VerifyOutcome, commit: str | None) -> None:
        data = json.loads(outcome.to_json())
        atomic_write_text(self.store.paths.trunk_red_file,
                          json.dumps({**data, "commit": commit}) + "\n")

    async def _run_trunk_verify(self) -> VerifyOutcome:
        """The verify command on trunk's files, beating while it runs (it may take
        longer than the daemon's heartbeat patience)."""
        command = self.settings.verify_command
        assert command, "trunk is verified only when a verify command is configured"
        cwd = await asyncio.to_thread(self.jj.trunk_checkout)
        return await while_beating(self.beat, "verify_trunk", run_verify, command, cwd)

    # -- a merge ----------------------------------------------------------------

    async def merge(self, action: Merge, issue: Issue | None) -> None:
        name = action.issue
        pr_mode = self.settings.merge.mode == "pr"
        if pr_mode:
            result = await asyncio.to_thread(self.jj.publish, name, self.settings.merge.remote)
        else:
            result = await asyncio.to_thread(self.jj.merge, name)
        if result.conflicted:
            self.store.update_record(name, done=False, role=Role.RESOLVE)
            self.store.append_event("merge_conflict", issue=name, detail=result.detail)
            with contextlib.suppress(TrackerError):
                await self.tracker.comment(
                    name,
                    f"ralph-dev: merging {name} into {self.settings.trunk} conflicted; "
                    "trunk is untouched and a resolve worker will take the workspace.",
                )
            raise MergeConflict(f"{name}: merge into {self.settings.trunk} conflicted")
        if not result.merged:
            log.info("nothing_to_merge", issue=name, detail=result.detail)
            return
        if pr_mode:
            await self._open_pull_request(name, issue)
        elif self.settings.merge.verify_trunk and self.settings.verify_command:
            await self._verify_trunk(name)

    async def _open_pull_request(self, name: str, issue: Issue | None) -> None:
        """The body is the worker's own summary, which ralph-dev recorded."""
        record = self.store.load_record(name)
        title = f"{name}: {issue.title if issue else name}"
        body = (record.summary if record and record.summary else "") + \
            f"\n\nOpened by ralph-dev for {name}."
        url, opened = await asyncio.to_thread(
            self.pull_requests.open_pull_request, head=JJ.bookmark(name),
            base=self.settings.trunk, title=title, body=body)
        self.store.append_event("pull_request", issue=name, url=url)
        if not opened:
            return  # a retried tick: the pull request and its comment are already there
        with contextlib.suppress(TrackerError):
            await self.tracker.comment(name, f"ralph-dev: opened a pull request for {name}: {url}")

    async def _verify_trunk(self, issue: str) -> None:
        outcome = await self._run_trunk_verify()
        if outcome.ok:
            return
        commit = await asyncio.to_thread(self.jj.trunk_commit)
        self._mark_red(outcome, commit)
        self.store.append_event("trunk_red", issue=issue, exit_code=outcome.exit_code)
        with contextlib.suppress(TrackerError):
            await self.tracker.comment(
                issue,
                f"ralph-dev: after merging {issue}, `{outcome.command}` failed on "
                f"{self.settings.trunk} (exit {outcome.exit_code}). Merges are paused until "
                f"trunk is green: fix {self.settings.trunk} and ralph-dev verifies it again "
                f"as soon as it moves.\n\n{outcome.output_tail}",
            )
