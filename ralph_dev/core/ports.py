"""The ports: what the control layer needs from each outside system, as Protocols.

Each consumer names exactly the capabilities it uses, so a narrow consumer
(``ralph-dev plan`` only observes) can be handed a narrow adapter, and a wide
one (the controller acts) cannot be built without every method it calls:
there is no optional method that is probed for at run time. The adapters in
``ralph_dev.adapters`` implement these structurally; mypy checks them where
``control.wiring`` puts the pieces together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.model import (
    Issue,
    Launch,
    MergeResult,
    NewIssue,
    NodeSlots,
    Placement,
    Role,
    StateType,
    Window,
    Workspace,
)

# --- tmux: the process plane ------------------------------------------------------------


class WindowLister(Protocol):
    def list_windows(self) -> list[Window]:
        """Every window of the project's session, with liveness, in one call."""
        ...


class Panes(WindowLister, Protocol):
    """What the controller does to worker windows."""

    def open_window(self, name: str, *, cwd: Path, command: Sequence[str],
                    environment: Mapping[str, str], log_file: Path | None = None) -> Window: ...

    def send_text(self, target: str, text: str) -> None: ...

    def dismiss(self, target: str) -> None:
        """Press Escape: close a menu the agent's UI opened (Claude Code's rate-limit
        options) before text is typed."""
        ...

    def kill_window(self, target: str) -> None: ...

    def capture(self, target: str, lines: int = 40) -> str:
        """The pane's last ``lines`` lines as the screen shows them (``logs``, a person
        looking, a CLI's own status line the controller reads)."""
        ...


class ProcessPlane(Panes, Protocol):
    """Where workers' processes run: this host's tmux (``adapters.tmux``), or a cluster
    that places each worker attempt on some host (``adapters.ray_plane``). A window is
    named by its issue; the attempt it runs is the worker's own identity
    (``RALPH_DEV_CLUSTER_ATTEMPT`` in its environment), which a cluster names its actor by."""


class WorkerChanges(Protocol):
    """A worker's change where the worker works (this host's workspace, or its host's on
    a cluster): what its reports record, check and show it."""

    def snapshot(self, name: str) -> list[str]: ...

    def describe(self, name: str, message: str, *, require_change: bool = False) -> None: ...

    def change_diff(self, name: str) -> str: ...

    def conflicted_files(self, name: str) -> list[str]: ...


class Cluster(WorkerChanges, Protocol):
    """The controller's side of workers on other hosts (``adapters.pushed_work``): where
    an attempt is placed, and its change back through the cluster's git remote. Every
    jj write runs in ``path``, the issue's workspace on the controller's host."""

    def place(self, issue: str, attempt: int, path: Path, *, rebase: bool = False) -> Path:
        """Place the attempt on a host; its workspace there (``rebase``: its start
        rebased onto trunk, so a resolve worker meets the conflicts)."""
        ...

    def where(self, issue: str, attempt: int) -> Placement: ...

    def push(self, issue: str, attempt: int) -> None:
        """The attempt's work pushed now (before its processes end)."""
        ...

    def save(self, issue: str) -> None:
        """The issue's current attempt's work pushed now (a person stops the swarm)."""
        ...

    def bring_in(self, issue: str, attempt: int, path: Path) -> str | None:
        """The attempt's push as the workspace's work; its commit (None: nothing pushed)."""
        ...

    def keep(self, issue: str, path: Path) -> str | None: ...

    def discard(self, issue: str, path: Path) -> None: ...

    def free_slots(self) -> int:
        """Worker slots free on the cluster's hosts now."""
        ...

    def nodes(self) -> list[NodeSlots]:
        """The cluster's live nodes with worker slots."""
        ...

    def screen(self, issue: str, lines: int = 200) -> str:
        """The last ``lines`` of the issue's worker's screen now, from its host."""
        ...

    def read_log(self, issue: str, position: int, limit: int) -> tuple[bytes, int]:
        """Its worker's log from ``position``, from its host, and where it ends now."""
        ...

    def type_line(self, issue: str, text: str) -> None:
        """``text`` typed into its worker's session on its host, and Enter (a person's
        ``attach``)."""
        ...

    def ship(self, issue: str, attempt: int, launch: Launch, worker_dir: Path,
             session: str | None = None) -> None:
        """The launch's files and the worker's own directory to the attempt's host, with
        the kept transcript of ``session`` when the launch resumes it."""
        ...

    def exchange(self, issue: str, attempt: int, files: dict[str, bytes],
                 answers: dict[str, bytes], taken: list[str], wait: float
                 ) -> dict[str, bytes]:
        """One round of the worker's mailbox relay: the controller's files and answers
        there, the worker's reports (by id) back."""
        ...

    def keep_transcript(self, issue: str, attempt: int, session: str, to: Path
                        ) -> Path | None:
        """The attempt's agent transcript copied from its host to ``to``; None: none."""
        ...


class WorkerMailboxes(Protocol):
    """Where workers' reports reach the controller: their sockets on this host
    (``adapters.mailbox_server``), or a relay to each cluster host
    (``adapters.cluster_relay``)."""

    wake: Callable[[], None]

    async def listen(self, names: Iterable[str]) -> None: ...

    async def stop(self, name: str) -> None: ...

    async def close(self) -> None: ...


class Session(Panes, Protocol):
    """What the daemon needs besides: the session itself."""

    def ensure_session(self, cwd: Path, environment: Mapping[str, str]) -> None: ...

    def session_exists(self) -> bool: ...


# --- jj: the code plane -----------------------------------------------------------------


class WorkspaceLister(Protocol):
    def list_workspaces(self) -> list[Workspace]:
        """ralph-dev's workspaces with what decide needs (unmerged? conflicted?)."""
        ...


WorkspaceHook = Callable[[Path], None]
"""Called with a workspace's directory: the project's after_create / before_remove hooks."""

WORK_BOOKMARK_PREFIX = "ralph/"


def work_bookmark(issue: str) -> str:
    """The bookmark an issue's change is kept under, ``ralph/ISSUE``: a canceled issue's
    work stays there, the publisher pushes it, and its pull request's head is it."""
    return WORK_BOOKMARK_PREFIX + issue


class Workspaces(WorkspaceLister, Protocol):
    """Workers' workspaces: adding, snapshotting, naming and forgetting them."""

    def add_workspace(self, name: str, *, after_create: WorkspaceHook | None = None) -> Path: ...

    def workspace_path(self, name: str) -> Path: ...

    def forget(self, name: str, *, keep_bookmark: bool = False,
               before_remove: WorkspaceHook | None = None) -> None: ...

    def snapshot(self, name: str) -> list[str]: ...

    def change_diff(self, name: str) -> str:
        """The workspace's change against its fork from trunk, in git's diff format."""
        ...

    def conflicted_files(self, name: str) -> list[str]:
        """Files still conflicted in the workspace's change (as of its last snapshot)."""
        ...

    def describe(self, name: str, message: str, *, require_change: bool = False) -> None:
        """Name the workspace's change, refusing what its merge would refuse (files jj
        left out, conflicts; no change, with ``require_change``)."""
        ...


class Merger(Protocol):
    """Merging a worker's change into trunk, behind the merge guard."""

    def merge(self, name: str) -> MergeResult: ...

    def prepare_merge(self, name: str) -> MergeResult | str:
        """The change rebased onto trunk and checked out in its workspace: its commit id,
        or the result that ends the merge here (nothing to merge, a conflict)."""
        ...

    def advance_trunk(self, name: str, head: str) -> MergeResult:
        """Trunk moved to the prepared ``head``, unless trunk moved since (``moved``)."""
        ...


class Trunk(Protocol):
    """The repository's trunk: that it is usable, its commit, and a checkout of it for
    verifying trunk after merges."""

    def check_repo(self) -> None:
        """Raise, naming the fix, unless jj can use the repository and its trunk."""
        ...

    def trunk_commit(self) -> str: ...

    def trunk_checkout(self) -> Path: ...


class Publisher(Protocol):
    """Pull-request mode: push a worker's change under its own bookmark."""

    def publish(self, name: str, remote: str = "origin") -> MergeResult: ...


class Repository(Protocol):
    """The project's repository as the controller holds it: one port per job, so each
    consumer is handed (and names) only the one it uses."""

    @property
    def workspaces(self) -> Workspaces: ...

    @property
    def merger(self) -> Merger: ...

    @property
    def trunk(self) -> Trunk: ...

    @property
    def publisher(self) -> Publisher: ...


# --- the tracker ------------------------------------------------------------------------


class TrackerReader(Protocol):
    async def list_issues(self) -> list[Issue]:
        """Every issue of the project, with blockers, parent/children, labels, comments."""
        ...

    async def get(self, identifier: str) -> Issue:
        """One issue; raises ``UnknownIssue``."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...

    def renamed(self) -> Mapping[str, str]:
        """Earlier identifiers of the project's issues → their current ones (Linear
        renumbers an issue moved to another team); empty for a tracker that never does."""
        ...

    def usage(self) -> Mapping[str, Any] | None:
        """Requests and budget spent this hour (None: the tracker has no budget)."""
        ...

    def expect_changes(self) -> None:
        """Something changed outside (a webhook said so): the next ``list_issues`` must
        really look, not answer from what it read a moment ago."""
        ...


class TrackerWriter(Protocol):
    async def set_state(self, identifier: str, *, name: str | None = None,
                        type: StateType | None = None) -> Issue:
        """Move an issue to the state called ``name``, or the first state of ``type``."""
        ...

    async def change_labels(self, identifier: str, *, add: Sequence[str] = (),
                            remove: Sequence[str] = ()) -> Issue:
        """Add and remove labels in one change (never replacing the whole set)."""
        ...

    async def add_labels(self, identifier: str, labels: Sequence[str]) -> Issue: ...

    async def set_priority(self, identifier: str, priority: int) -> Issue:
        """0 = none, 1 = urgent … 4 = low; the same priority again writes nothing."""
        ...

    async def remove_labels(self, identifier: str, labels: Sequence[str]) -> Issue: ...

    async def comment(self, identifier: str, body: str, *, by_ralph: bool = True,
                      author: str | None = None) -> None:
        """Add a comment. ``by_ralph`` marks ralph-dev's own words (never human feedback);
        ``author`` names a person where the tracker lets us (the local one)."""
        ...

    async def create_issues(self, new: Sequence[NewIssue]) -> list[str]:
        """Create issues (parents and blockers may point into the batch), all or nothing
        where the tracker allows it; return their identifiers in order."""
        ...


class Blockers(Protocol):
    async def add_blocker(self, identifier: str, blocker: str) -> Issue: ...

    async def remove_blocker(self, identifier: str, blocker: str) -> Issue: ...


class Tracker(TrackerReader, TrackerWriter, Blockers, Protocol):
    """An issue tracker as ralph-dev uses it: the local one and Linear both are one."""


# --- agents and pull requests ---------------------------------------------------------


class AgentLauncher(Protocol):
    """Prepares one worker's agent: prompt, environment, and the window's argv, from the
    settings in force when it starts (they change live)."""

    def __call__(self, settings: ProjectSettings, issue: Issue, role: Role, workspace: Path,
                 model: str, *, attempt: int, worker_dir: Path, feedback: str | None = None,
                 resume_session: str | None = None, sent_back: str | None = None,
                 stopped: str | None = None) -> Launch:
        """``sent_back``: the verify output its change failed with on top of trunk;
        ``stopped``: why its last worker was stopped (a person's hold, a state move)."""
        ...


class PullRequests(Protocol):
    """Opens the pull request of a pushed ``ralph/ISSUE`` bookmark: (its URL, newly
    opened?) — a retried tick finds the one it opened before."""

    def open_pull_request(self, *, head: str, base: str, title: str,
                          body: str) -> tuple[str, bool]: ...
