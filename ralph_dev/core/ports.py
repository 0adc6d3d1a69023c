"""The ports: what the control layer needs from each outside system, as Protocols.

Each consumer names exactly the capabilities it uses, so a narrow consumer
(``ralph-dev plan`` only observes) can be handed a narrow adapter, and a wide
one (the controller acts) cannot be built without every method it calls:
there is no optional method that is probed for at run time. The adapters in
``ralph_dev.adapters`` implement these structurally; mypy checks them where
``control.wiring`` puts the pieces together.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.host_share import ProjectLoad
from ralph_dev.core.model import (
    Ended,
    HostSlots,
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


class ScreenReader(Protocol):
    def capture(self, target: str, lines: int = 40) -> str:
        """The pane's last ``lines`` lines as the screen shows them."""
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


class WorkerChanges(Protocol):
    """A worker's change where the worker works (this host's workspace, or its host's on
    a cluster): what its reports record, check and show it."""

    def snapshot(self, name: str) -> list[str]: ...

    def describe(self, name: str, message: str, *, require_change: bool = False) -> None: ...

    def change_diff(self, name: str) -> str: ...

    def conflicted_files(self, name: str) -> list[str]: ...


class WorkerMailboxes(Protocol):
    """Where workers' reports reach the controller: their sockets on this host
    (``adapters.mailbox_server``), or a carrier to each cluster host
    (``hosts.ray.carrier``)."""

    wake: Callable[[], None]

    async def listen(self, names: Iterable[str]) -> None: ...

    async def stop(self, name: str) -> None: ...

    async def close(self) -> None: ...


Hear = Callable[[str, str], Awaitable[Any]]
"""The controller's ear for a worker's report: (issue, report id) → its answer."""


class WorkerHost(WindowLister, Protocol):
    """Where one project's workers run: this host (``hosts.local``) or the hosts of a Ray
    cluster (``hosts.ray``). Every step of a worker's life that differs between the two
    is one method here, so the actuator, the controller and the observer are handed a
    host and never ask which.

    A worker is known by its issue and its attempt (the record's ``host_attempt``,
    counted on every start): a cluster names an attempt's actor and pushes by it, and
    fences a stale attempt's work out by it. Windows are named by issue; a window's
    ``pane_id`` is the target the methods that type or read take."""

    @property
    def changes(self) -> WorkerChanges:
        """The change where its worker works, as its reports see it."""
        ...

    def mailboxes(self, run_dir: Callable[[str], Path], hear: Hear,
                  attempt_of: Callable[[str], int]) -> WorkerMailboxes:
        """How workers' reports reach the controller from where they run."""
        ...

    def make_workspace(self, issue: str, attempt: int, *, rebase: bool = False) -> Path:
        """The attempt's workspace where its agent works, made with the project's
        ``after_create`` hook run in it there (``rebase``: a resolve worker's, its
        earlier work rebased onto trunk so it meets the conflicts)."""
        ...

    def sessions_found_in(self, workspace: Path) -> bool:
        """Whether the agent finds a resumed session in this workspace (Claude Code keys
        its sessions by the workspace's path, which has a length limit)."""
        ...

    def ship(self, issue: str, attempt: int, launch: Launch, worker_dir: Path,
             session: str | None = None) -> bool:
        """The launch's files and the worker's own directory to where the worker runs,
        with the kept transcript of ``session`` when the launch resumes it. True when
        they were carried (the host's copy is then the launcher's to read and delete)."""
        ...

    def open_window(self, issue: str, attempt: int, *, cwd: Path, command: Sequence[str],
                    environment: Mapping[str, str], log_file: Path) -> Window: ...

    def placement(self, issue: str, attempt: int) -> Placement | None:
        """The node and host an attempt runs on (None: this host)."""
        ...

    def send_text(self, target: str, text: str) -> None: ...

    def dismiss(self, target: str) -> None:
        """Press Escape: close a menu the agent's UI opened (Claude Code's rate-limit
        options) before text is typed."""
        ...

    def capture(self, target: str, lines: int = 40) -> str: ...

    def end(self, issue: str, attempt: int, targets: Sequence[str], *, bring_in: bool,
            session: str | None) -> Ended:
        """End the attempt's windows, its work kept first (a cluster worker's final push,
        its log and its agent's transcript of ``session`` copied here); with
        ``bring_in``, its work into the issue's workspace here, where the merge lane
        takes it."""
        ...

    def bring_in(self, issue: str, attempt: int) -> str | None:
        """The attempt's done work into the issue's workspace here (fetched once per
        attempt); its commit, None when it never left this host."""
        ...

    def forget(self, issue: str, *, keep_bookmark: bool, keep_newest_push: bool) -> None:
        """The issue's workspace goes, its work safe: its change stays under its
        bookmark (``keep_bookmark``: a canceled issue's, a pull request's head); a
        canceled issue's newest work pushed from another host is taken in first
        (``keep_newest_push``), a merged one's copies elsewhere are deleted. The
        project's ``before_remove`` hook runs in it first."""
        ...

    def slots(self) -> HostSlots | None:
        """Worker slots free where workers run, beyond this host's own admission
        (None: workers run on this host only)."""
        ...

    def shared_with(self) -> Mapping[str, ProjectLoad] | None:
        """The loads of the other projects whose workers share this host's (``[host]
        max_workers``), as they last published them; None: nothing is shared (no host
        limit, or the workers run on a cluster's hosts)."""
        ...

    def publish(self, load: ProjectLoad | None, windows: Sequence[Window]) -> None:
        """This project's load and its live workers, for the projects it shares the host
        with (nothing when it shares none)."""
        ...

    def want_slots(self, count: int) -> None:
        """Ask for room for ``count`` workers where they run (a cluster's autoscaler:
        more hosts, or, at 0, none beyond what runs); nothing on this host alone. Only
        a change is passed on."""
        ...

    def admit(self, issue: str, priority: int) -> AbstractContextManager[None]:
        """A place for ``issue``'s worker, taken before its start and given back if the
        start fails (``open_window`` hands it to the worker's process); raises
        ``HostUnavailable`` when the projects sharing the host leave this one none."""
        ...


class RemoteWorkers(Protocol):
    """What a person's commands reach of workers on other hosts (``logs``, ``attach``,
    the dashboard)."""

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

    def nodes(self) -> list[NodeSlots]:
        """The cluster's live nodes with worker slots."""
        ...


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

    def land(self, batch: Sequence[tuple[str, str]], base: str, verified: str = ""
             ) -> MergeResult:
        """Trunk moved once to a batch verified together (each issue with its prepared
        head, in order, on trunk's commit ``base``), each change keeping its own commit;
        unless trunk moved since (``moved``) or the batch is not what was verified
        (``stale``)."""
        ...


class Trunk(Protocol):
    """The repository's trunk: that it is usable, its commit, and a checkout of it for
    verifying trunk after merges."""

    def check_repo(self) -> None:
        """Raise, naming the fix, unless jj can use the repository and its trunk."""
        ...

    def trunk_commit(self) -> str: ...

    def trunk_checkout(self) -> Path: ...

    def lane_checkout(self, heads: Sequence[str], slot: int = 0) -> tuple[Path, str]:
        """A checkout of the changes ``heads`` together (the merge lane's batch), and the
        commit it holds; ``slot``: which of the lane's verifies at once it is for."""
        ...

    def release_lane(self) -> None:
        """The merge lane's checkouts back on trunk."""
        ...


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
