"""Carrying out a ``Merge``: into trunk here, or as a pull request, and keeping trunk green.

Local mode rebases the worker's change onto trunk and moves trunk to it
(``adapters.jj``); a conflict leaves trunk untouched and hands the workspace
to a resolve worker. With a verify command (``merge.verified``, the default) the
lane is verified: the rebased change is verified in its own workspace first, and
trunk moves only to a change that passed on top of it; a red change goes back to a
worker of its issue (same workspace, the output in its prompt), and a pass on a trunk
that moved meanwhile is re-run. Pull-request mode pushes ``ralph/ISSUE`` and opens a
pull request instead. With ``merge.verify_trunk`` the verify command also runs on
trunk after each merge; while it fails trunk is "red" (a marker file) and no further
merge happens until trunk moves and verifies green again.

The lane changes jj, trunk's red marker, the worker record and the events; what it has
to tell a person on the issue it hands back (:class:`MergeOutcome`) for the actuator,
the one place that writes to the tracker, to post.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.adapters.store import StateStore, utcnow
from ralph_dev.adapters.verify import VerifyOutcome, run_verify
from ralph_dev.agent.launch import verify_env
from ralph_dev.agent.sandbox import verify_wrapper
from ralph_dev.control.loop.heartbeat import while_beating
from ralph_dev.core.actions import Merge
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError, SentBack
from ralph_dev.core.model import Issue, MergeResult, Role
from ralph_dev.core.ports import PullRequests, Repository, work_bookmark
from ralph_dev.core.text import output_block

log = structlog.get_logger(__name__)


class MergeConflict(RalphError):
    retryable = True


class TrunkKeepsMoving(RalphError):
    """Trunk moved under every verify of a change: the next merge try starts over."""

    retryable = True


TRUNK_RACES = 3
"""Verifies of one change on a trunk that moved meanwhile, before the merge is retried
later (a person pushing in a loop must not hold the controller's tick forever)."""


@dataclass
class MergeOutcome:
    """What one merge came to: comments to post for the people on the issue, what the
    worker record now says (the actuator, its one writer, writes it), and the error
    that ends the action once they are posted (a conflict, a change sent back)."""

    comments: list[str] = field(default_factory=list)
    error: RalphError | None = None
    record: dict[str, Any] = field(default_factory=dict)


class MergeLane:
    """One project's merges, one at a time, and the state of trunk they leave."""

    def __init__(self, settings: ProjectSettings, *, jj: Repository,
                 store: StateStore, pull_requests: PullRequests,
                 beat: Callable[[str], None]) -> None:
        self.settings = settings
        self.jj = jj
        self.store = store
        self.pull_requests = pull_requests
        self.beat = beat
        """Called while a long verify runs, so the daemon sees a live controller."""

    # -- red trunk ------------------------------------------------------------

    def trunk_red(self) -> bool:
        return self.store.paths.trunk_red_file.exists()

    def red_at(self) -> str | None:
        """The trunk commit whose verify failed, while trunk is red."""
        try:
            commit = json.loads(self.store.paths.trunk_red_file.read_text()).get("commit")
        except (OSError, ValueError, AttributeError):
            return None
        return commit if isinstance(commit, str) else None

    async def verify_trunk_again(self, now_at: str) -> None:
        """Trunk was red and has moved (a person pushed a fix): verify it again; green
        again → merges resume."""
        marker = self.store.paths.trunk_red_file
        if not marker.exists() or not self.settings.verify_command:
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
        longer than the daemon's heartbeat patience). Trunk is no worker's: the worker
        variables (``RALPH_DEV_ISSUE``…) are unset."""
        cwd = await asyncio.to_thread(self.jj.trunk.trunk_checkout)
        return await self._verify_in(cwd, "verify_trunk", issue=None)

    async def _verify_in(self, checkout: Path, doing: str, *, issue: str | None
                         ) -> VerifyOutcome:
        """The verify command from the controller's own config, as ``worker done`` ran it
        for ``issue``: the same variables (``agent.launch.verify_env``) in the workers'
        sandbox (it runs code workers wrote), beating while it runs (it may take longer
        than the daemon's heartbeat patience)."""
        command = self.settings.verify_command
        assert command, "verify runs only when a verify command is configured"
        record = self.store.load_record(issue) if issue else None
        env = verify_env(self.settings, checkout, issue=issue,
                         role=record.role if record else Role.EXECUTE,
                         attempt=record.attempts if record else 0)
        wrapper = verify_wrapper(self.settings, checkout, home=Path(env["HOME"]))
        return await while_beating(self.beat, doing, run_verify, command, checkout,
                                   wrapper=wrapper, env=env)

    # -- a merge ----------------------------------------------------------------

    async def merge(self, action: Merge, issue: Issue | None) -> MergeOutcome:
        name = action.issue
        outcome = MergeOutcome()
        pr_mode = self.settings.merge.mode == "pr"
        result: MergeResult | MergeOutcome
        if pr_mode:
            result = await asyncio.to_thread(self.jj.publisher.publish, name,
                                             self.settings.merge.remote)
        elif self.settings.verifies_merges:
            result = await self._verified_merge(name)
        else:
            result = await asyncio.to_thread(self.jj.merger.merge, name)
        if isinstance(result, MergeOutcome):
            return result  # sent back: the change went back to a worker of its issue
        if result.conflicted:
            outcome.record = {"done": False, "role": Role.RESOLVE}
            self.store.append_event("merge_conflict", issue=name, detail=result.detail)
            outcome.comments.append(
                f"ralph-dev: merging {name} into {self.settings.trunk} conflicted; "
                "trunk is untouched and a resolve worker will take the workspace.")
            outcome.error = MergeConflict(f"{name}: merge into {self.settings.trunk} conflicted")
            return outcome
        if not result.merged:
            log.info("nothing_to_merge", issue=name, detail=result.detail)
            return outcome
        if pr_mode:
            outcome.comments += await self._open_pull_request(name, issue)
        elif self.settings.merge.verify_trunk and self.settings.verify_command:
            outcome.comments += await self._verify_trunk(name)
        return outcome

    async def _verified_merge(self, name: str) -> MergeResult | MergeOutcome:
        """Rebase, verify the rebased change in its workspace, and only then move trunk;
        again from the rebase when trunk moved during the verify."""
        for _ in range(TRUNK_RACES):
            head = await asyncio.to_thread(self.jj.merger.prepare_merge, name)
            if isinstance(head, MergeResult):
                return head
            outcome = await self._verify_in(self.jj.workspaces.workspace_path(name),
                                            "verify_merge", issue=name)
            if not outcome.ok:
                return self._send_back(name, head, outcome)
            result = await asyncio.to_thread(self.jj.merger.advance_trunk, name, head)
            if not result.moved:
                self.store.append_event("merge_verified", issue=name, commit=head,
                                        seconds=round(outcome.duration_s, 1))
                return result
            self.store.append_event("merge_reverify", issue=name, detail=result.detail)
        raise TrunkKeepsMoving(f"{name}: {self.settings.trunk} moved during each of "
                               f"{TRUNK_RACES} verifies of its change; the merge is tried "
                               "again after a wait")

    def _send_back(self, name: str, head: str, outcome: VerifyOutcome) -> MergeOutcome:
        """A red change never moves trunk: the issue goes back to a worker of its own,
        which finds the failure's output in its prompt; other merges go on."""
        record = {"done": False, "sent_back": outcome.output_tail[-8000:] or "(no output)",
                  "last_failure_at": utcnow(),
                  "last_failure": f"`{outcome.command}` failed (exit {outcome.exit_code}) on "
                                  f"its change rebased onto {self.settings.trunk}"}
        self.store.append_event("merge_sent_back", issue=name, commit=head,
                                exit_code=outcome.exit_code)
        comment = (f"ralph-dev: `{outcome.command}` failed (exit {outcome.exit_code}) on {name}'s "
                   f"change rebased onto {self.settings.trunk}; {self.settings.trunk} is "
                   f"untouched. A worker of {name} gets the workspace back with this output:"
                   f"\n\n{output_block(outcome.output_tail)}")
        return MergeOutcome([comment], SentBack(
            f"{name}: its change fails `{outcome.command}` on top of {self.settings.trunk} "
            f"(exit {outcome.exit_code}); sent back to a worker"), record)

    async def _open_pull_request(self, name: str, issue: Issue | None) -> list[str]:
        """The body is the worker's own summary, which ralph-dev recorded."""
        record = self.store.load_record(name)
        title = f"{name}: {issue.title if issue else name}"
        body = (record.summary if record and record.summary else "") + \
            f"\n\nOpened by ralph-dev for {name}."
        url, opened = await asyncio.to_thread(
            self.pull_requests.open_pull_request, head=work_bookmark(name),
            base=self.settings.trunk, title=title, body=body)
        self.store.append_event("pull_request", issue=name, url=url)
        if not opened:
            return []  # a retried tick: the pull request and its comment are already there
        return [f"ralph-dev: opened a pull request for {name}: {url}"]

    async def _verify_trunk(self, issue: str) -> list[str]:
        outcome = await self._run_trunk_verify()
        if outcome.ok:
            return []
        commit = await asyncio.to_thread(self.jj.trunk.trunk_commit)
        self._mark_red(outcome, commit)
        self.store.append_event("trunk_red", issue=issue, exit_code=outcome.exit_code)
        return [f"ralph-dev: after merging {issue}, `{outcome.command}` failed on "
                f"{self.settings.trunk} (exit {outcome.exit_code}). Merges are paused until "
                f"trunk is green: fix {self.settings.trunk} and ralph-dev verifies it again "
                f"as soon as it moves.\n\n{outcome.output_tail}"]
