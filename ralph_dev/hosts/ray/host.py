"""Workers on a Ray cluster's hosts, as the one worker-host port.

A host shares nothing with the controller but the git remote. So each step of a
worker's life travels: its workspace is made on its host (from trunk as the
controller last pushed it for hosts to start from, or from an earlier attempt's
push), its launch files are shipped there, its reports come back through a carrier,
and its work comes back as the attempt's push, which the controller fetches into the
issue's workspace here, where the merge lane takes it as any other. Every jj write
here runs in the issue's workspace, never at the repository's root.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path

import structlog

from ralph_dev.adapters import mailbox
from ralph_dev.adapters.files import atomic_write_bytes
from ralph_dev.adapters.jj_cli import JjCli, JJError, quote_revset
from ralph_dev.agent.egress import LEDGER, READ_MARK
from ralph_dev.core import cluster
from ralph_dev.core.cluster import session_folder
from ralph_dev.core.errors import RalphError
from ralph_dev.core.host_share import ProjectLoad
from ralph_dev.core.model import Ended, HostSlots, Launch, NodeSlots, Placement, Window
from ralph_dev.core.ports import Hear, WorkerChanges, WorkerMailboxes, Workspaces
from ralph_dev.hosts import bundle as launch_bundle
from ralph_dev.hosts.bundle import SESSIONS, SHIPPED_ROOT
from ralph_dev.hosts.hooks import HookFailed, Hooks
from ralph_dev.hosts.ray.carrier import MailboxCarrier, carry_retry
from ralph_dev.hosts.ray.ledger import CARRIED, LedgerCopy
from ralph_dev.hosts.ray.plane import AttemptCalls, RayPlane
from ralph_dev.hosts.ray.work import PushedWork, remote_named

log = structlog.get_logger(__name__)

LOG_COPY_BYTES = 4 * 2**20
"""How much of a cluster worker's log its end keeps on the controller's host."""

Say = Callable[..., object]
"""Where the host says what it saw that a person reads (the events log)."""


class RayHost:
    """One project's workers on its Ray cluster, and their work back through git."""

    def __init__(self, plane: RayPlane, jj: JjCli, workspaces: Workspaces, *, trunk: str,
                 attempt_of: Callable[[str], int], hooks: Callable[[str], Hooks],
                 hook_failed: HookFailed, log_path: Callable[[str], Path],
                 kept_transcript: Callable[[str, str], Path], say: Say,
                 lease_renewed: Callable[[str, datetime], None] = lambda issue, at: None,
                 merge_remote: str = "origin", agent_bin: Path | None = None,
                 ledger_dir: Callable[[str], Path] | None = None) -> None:
        self.plane = plane
        self.jj = jj
        self.workspaces = workspaces
        """The issues' workspaces here: where their work comes back to be merged."""
        self.trunk = quote_revset(trunk)
        self.attempt_of = attempt_of
        """The issue's current attempt (its worker record's)."""
        self.hooks = hooks
        self.hook_failed = hook_failed
        self.log_path = log_path
        self.kept_transcript = kept_transcript
        self.say = say
        self.lease_renewed = lease_renewed
        """Told when the current attempt of an issue last answered a call sent when
        (the worker record's ``lease_renewed_at``)."""
        self.agent_bin = agent_bin
        """The directory of the ``ralph-dev`` link workers' PATH starts with
        (``agent.launch.agent_bin_dir``): its link travels, to the same program on each
        host."""
        self.ledgers = LedgerCopy(ledger_dir, self._read_ledger) if ledger_dir else None
        """Workers run behind an egress proxy on their host (``agent.network =
        "allowlist"``): its ledger is brought into the issue's ``ledger_dir`` here."""
        self._merge_remote = merge_remote
        self._remote: str | None = None
        self._base_pushed: str | None = None
        self._brought: dict[str, int] = {}
        """Issue → the attempt whose done work this controller brought into its
        workspace: a merge after the attempt's end need not fetch it again."""

    @property
    def remote(self) -> str:
        """The controller repository's name for the cluster's git remote."""
        if self._remote is None:
            self._remote = remote_named(self.jj, self.plane.remote, self._merge_remote)
        return self._remote

    def _attempt(self, issue: str, attempt: int | None = None) -> AttemptCalls:
        number = self.attempt_of(issue) if attempt is None else attempt
        return self.plane.attempt(cluster.actor_name(self.plane.project, issue, number))

    # -- the port: out ------------------------------------------------------------------

    @property
    def changes(self) -> WorkerChanges:
        return self

    def mailboxes(self, run_dir: Callable[[str], Path], hear: Hear,
                  attempt_of: Callable[[str], int]) -> WorkerMailboxes:
        def exchange(issue: str, attempt: int, files: dict[str, bytes],
                     answers: dict[str, bytes], taken: list[str], wait: float
                     ) -> dict[str, bytes]:
            return self._attempt(issue, attempt).exchange(files, answers, taken, wait)

        def renewed(issue: str, attempt: int, sent_at: datetime) -> None:
            if attempt == self.attempt_of(issue):  # the record's attempt, not a stale one
                self.lease_renewed(issue, sent_at)

        return MailboxCarrier(run_dir, hear, exchange, attempt_of, renewed=renewed,
                              ledger=self.ledgers, retry=carry_retry(self.plane.lease))

    def _read_ledger(self, issue: str, attempt: int, position: int, limit: int
                     ) -> tuple[bytes, int]:
        return self._attempt(issue, attempt).read_ledger(position, limit)

    def list_windows(self) -> list[Window]:
        return self.plane.list_windows()

    def make_workspace(self, issue: str, attempt: int, *, rebase: bool = False) -> Path:
        """The issue's workspace here (where its work comes back, and the merge lane
        verifies it: the project's ``after_create`` prepares it too), trunk pushed where
        hosts start from (when it moved), and the attempt placed: its workspace on its
        host, made there with the project's ``after_create`` run in it."""
        hooks = self.hooks(issue)
        here = self.workspaces.add_workspace(issue, after_create=hooks.after_create())
        trunk = self.jj.read("log", "--no-graph", "-r", self.trunk, "-T",
                             "commit_id").stdout.strip()
        if trunk != self._base_pushed:
            self.jj.push_bookmark(cluster.BASE_BOOKMARK, self.trunk, self.remote, here)
            self._base_pushed = trunk
        return self.plane.place(issue, attempt, rebase=rebase, hooks=hooks,
                                trunk_commit=trunk)

    def sessions_found_in(self, workspace: Path) -> bool:
        return session_folder(workspace) is not None

    def ship(self, issue: str, attempt: int, launch: Launch, worker_dir: Path,
             session: str | None = None) -> bool:
        """The attempt's launch files to its host: the worker's own directory (not its
        run directory's reports and answers, which the carrier brings, nor the
        transcripts kept here but ``session``'s, the one the launch resumes), the
        launch's spec, prompt and secrets, and the agent-bin its PATH starts with."""
        run = worker_dir / "run"
        launch_files = [launch.spec_file, launch.spec_file.with_suffix(".secrets.json"),
                        *([launch.prompt_file] if launch.prompt_file is not None else [])]
        transcript = worker_dir / SESSIONS / f"{session}.jsonl" if session else None
        roots = {SHIPPED_ROOT: worker_dir, "launch": launch.spec_file.parent}
        if self.agent_bin is not None:
            roots["agent-bin"] = self.agent_bin
        bundle = launch_bundle.pack(
            roots, trees=[worker_dir],
            leave_out=[run / mailbox.OUTBOX, run / mailbox.ANSWERS, run / mailbox.SOCKET,
                       worker_dir / SESSIONS,
                       # the controller's copy of the egress ledger: the host's starts anew
                       *(worker_dir / name for name in (LEDGER, READ_MARK, CARRIED))],
            files=[*launch_files, *([transcript] if transcript else [])],
            links_in=[self.agent_bin] if self.agent_bin is not None else [])
        self._attempt(issue, attempt).receive(bundle)
        return True

    def open_window(self, issue: str, attempt: int, *, cwd: Path, command: Sequence[str],
                    environment: Mapping[str, str], log_file: Path) -> Window:
        """``cwd`` and ``log_file`` name this host's: the window opens in the attempt's
        workspace on its host, and logs there."""
        return self.plane.open_window(issue, attempt, command=command,
                                      environment=environment)

    def placement(self, issue: str, attempt: int) -> Placement | None:
        return self._attempt(issue, attempt).where()

    def send_text(self, target: str, text: str) -> None:
        self.plane.attempt(target).send_text(text)

    def dismiss(self, target: str) -> None:
        self.plane.attempt(target).dismiss()

    def capture(self, target: str, lines: int = 40) -> str:
        return self.plane.attempt(target).capture(lines)

    def slots(self) -> HostSlots | None:
        return HostSlots(free=self.plane.free_slots(), nodes=tuple(self.plane.nodes()))

    def shared_with(self) -> Mapping[str, ProjectLoad] | None:
        return None  # the cluster's slots are its hosts' own

    def want_slots(self, count: int) -> None:
        if self.plane.want_slots(count):
            self.say("cluster_slots_asked", slots=count)

    def publish(self, load: ProjectLoad | None, windows: Sequence[Window]) -> None:
        return None

    def admit(self, issue: str, priority: int) -> AbstractContextManager[None]:
        return contextlib.nullcontext()  # a slot is taken as Ray places the attempt

    # -- the change where its worker works (``WorkerChanges``) ---------------------------

    def snapshot(self, name: str) -> list[str]:
        return self._attempt(name).snapshot()

    def describe(self, name: str, message: str, *, require_change: bool = False) -> None:
        self._attempt(name).describe(message, require_change)

    def change_diff(self, name: str) -> str:
        return self._attempt(name).change_diff()

    def conflicted_files(self, name: str) -> list[str]:
        return self._attempt(name).conflicted_files()

    # -- what a person's commands reach (``RemoteWorkers``) ------------------------------

    def screen(self, issue: str, lines: int = 200) -> str:
        return self._attempt(issue).capture(lines)

    def read_log(self, issue: str, position: int, limit: int) -> tuple[bytes, int]:
        return self._attempt(issue).read_log(position, limit)

    def type_line(self, issue: str, text: str) -> None:
        self._attempt(issue).send_text(text)

    def nodes(self) -> list[NodeSlots]:
        return self.plane.nodes()

    # -- back ---------------------------------------------------------------------------

    def end(self, issue: str, attempt: int, targets: Sequence[str], *, bring_in: bool,
            session: str | None) -> Ended:
        """The attempt pushes its work first (once its processes end nothing more can
        be pushed), its log and transcript are copied here, then its processes end:
        with its workspace on its host when its work came back."""
        came_back, transcript = False, None
        if targets and attempt:
            came_back = self._final_push(issue, attempt)
            if came_back and session:
                transcript = self._keep_transcript(issue, attempt, session)
            if came_back and self.ledgers is not None:
                self._final_ledger(self.ledgers, issue, attempt)
        for target in targets:
            self.plane.kill_window(target, remove=came_back)
        if came_back and bring_in:
            # what ``decide`` weighs next (a conflict a resolve worker just resolved) is
            # the workspace here: it holds the done work from now on
            self._bring(issue, attempt, again=True)
        return Ended(came_back=came_back, transcript=transcript,
                     session_kept=transcript is not None)

    def _final_push(self, issue: str, attempt: int) -> bool:
        calls = self._attempt(issue, attempt)
        try:
            calls.push()
        except RalphError as exc:  # its host is gone or cut off: its last snapshot stands
            self.say("final_push_failed", issue=issue, attempt=attempt, error=str(exc))
            return False
        with contextlib.suppress(RalphError, OSError):  # `logs` reads it once the host is gone
            data, _ = calls.read_log(0, LOG_COPY_BYTES)
            atomic_write_bytes(self.log_path(issue), data)
        return True

    @staticmethod
    def _final_ledger(ledgers: LedgerCopy, issue: str, attempt: int) -> None:
        """What its proxy wrote since the carrier's last copy (the connections its agent
        closed as it finished): the controller reads it a few ticks after the end."""
        with contextlib.suppress(RalphError, OSError):
            while ledgers.bring(issue, attempt):
                pass

    def _keep_transcript(self, issue: str, attempt: int, session: str) -> Path | None:
        """The agent's transcript from its host, kept here: the issue's next attempt,
        on whichever host, resumes its session from it."""
        try:
            data = self._attempt(issue, attempt).transcript(session)
        except (RalphError, OSError) as exc:
            self.say("transcript_not_kept", issue=issue, attempt=attempt, error=str(exc))
            return None
        if data is None:
            return None
        kept = self.kept_transcript(issue, session)
        atomic_write_bytes(kept, data)
        return kept

    def bring_in(self, issue: str, attempt: int) -> str | None:
        return self._bring(issue, attempt, again=False)

    def _bring(self, issue: str, attempt: int, *, again: bool) -> str | None:
        """The attempt's push, as the issue's work in its workspace here (whatever an
        earlier bring-in left there is replaced). ``again`` False: not if this
        controller brought that attempt's work in already."""
        if not again and self._brought.get(issue) == attempt:
            return None
        path = self.workspaces.workspace_path(issue)
        commit = self._fetch_into(path, lambda pushed: cluster.mergeable_push(
            issue, attempt, pushed))
        self._brought[issue] = attempt
        self.say("cluster_work_fetched", issue=issue, attempt=attempt,
                 commit=commit[:12] if commit else None)
        return commit

    def _fetch_into(self, path: Path, choose: Callable[[dict[str, str]], str | None]
                    ) -> str | None:
        pushed = PushedWork(self.jj, self.remote).fetch(path)
        bookmark = choose(pushed)
        if bookmark is None:
            return None
        self._replace_work(path, pushed[bookmark])
        return pushed[bookmark]

    def _replace_work(self, path: Path, commit: str) -> None:
        """The workspace holds exactly the pushed commits not in trunk, on the trunk
        commit they started from (the merge lane rebases them onto trunk as it is)."""
        cli, trunk = self.jj, self.trunk
        work = f"(::{commit}) ~ (::{trunk})"
        cli.run("abandon", f"{trunk}..@", cwd=path).check()
        cli.run("new", f"heads(::{commit} & ::{trunk})", cwd=path).check()
        if cli.count(work, path):
            cli.run("duplicate", work, "--insert-before", "@", cwd=path).check()

    def forget(self, issue: str, *, keep_bookmark: bool, keep_newest_push: bool) -> None:
        """A canceled issue keeps its newest push here, under its bookmark; a merged
        one's pushes leave the remote. Then its workspace here goes, as on one host
        (its hosts' workspaces went with their attempts)."""
        self._brought.pop(issue, None)  # a reopened issue counts from 1
        path = self.workspaces.workspace_path(issue)
        if path.is_dir():
            if keep_newest_push:
                self._fetch_into(path, lambda pushed: cluster.latest_push(issue, pushed))
            else:
                self._discard(issue, path)
        self.workspaces.forget(issue, keep_bookmark=keep_bookmark,
                               before_remove=self.hooks(issue).before_remove(self.hook_failed))

    def _discard(self, issue: str, path: Path) -> None:
        """Delete the issue's attempt bookmarks on the remote once its work is merged: a
        reopened issue starts afresh, not from work trunk holds already. Best effort (a
        remote that refuses keeps a stale name, which the fence ignores)."""
        try:
            pushed = PushedWork(self.jj, self.remote).fetch(path)
            names = sorted(cluster.pushed_attempts(issue, pushed).values())
            if not names:
                return
            at_remote = [f"{name}@{self.remote}" for name in names]
            self.jj.run("bookmark", "track", *at_remote, cwd=path).check()
            self.jj.run("bookmark", "delete", *names, cwd=path).check()
            pushes = [arg for name in names for arg in ("--bookmark", name)]
            self.jj.run("git", "push", "--remote", self.remote, *pushes, cwd=path).check()
        except JJError as exc:
            log.warning("cluster_pushes_kept", issue=issue, error=str(exc))

