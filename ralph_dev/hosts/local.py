"""Workers on this host: each a window of the project's tmux session, in a jj workspace
of the project's repository here.

Nothing travels: the workspace the agent works in is the one the merge lane merges
from, the launch's files are already where the launcher reads them, and an ended
worker's work never left. So most of the port's steps are the tmux or jj call
itself, or nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from ralph_dev.adapters.host_admission import HostAdmission, HostRoom
from ralph_dev.adapters.mailbox_server import MailboxServer
from ralph_dev.adapters.tmux_args import TmuxServerGone
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import HostUnavailable
from ralph_dev.core.host_share import ProjectLoad
from ralph_dev.core.model import Ended, HostSlots, Launch, Placement, Window
from ralph_dev.core.ports import Hear, Panes, WorkerChanges, WorkerMailboxes, Workspaces
from ralph_dev.hosts.hooks import HookFailed, Hooks


class LocalHost:
    """This host's tmux and jj, as the one worker-host port."""

    def __init__(self, panes: Panes, workspaces: Workspaces, *,
                 hooks: Callable[[str], Hooks], hook_failed: HookFailed,
                 settings: Callable[[], ProjectSettings] | None = None,
                 admission: HostAdmission | None = None) -> None:
        self.panes = panes
        self.workspaces = workspaces
        self.hooks = hooks
        """The project's hooks for an issue, as the settings in force now say them."""
        self.hook_failed = hook_failed
        self.settings = settings
        """The settings in force now (``[host] max_workers`` applies live)."""
        self.admission = admission
        """The host's workers as every project on it shares them (None: not shared)."""
        self._admitted: set[str] = set()
        """Issues whose start holds a place on the host until its window opens."""

    @property
    def changes(self) -> WorkerChanges:
        return self.workspaces

    def mailboxes(self, run_dir: Callable[[str], Path], hear: Hear,
                  attempt_of: Callable[[str], int]) -> WorkerMailboxes:
        return MailboxServer(run_dir, hear)

    def list_windows(self) -> list[Window]:
        return self.panes.list_windows()

    def make_workspace(self, issue: str, attempt: int, *, rebase: bool = False) -> Path:
        # a resolve worker meets its conflicts in the workspace the merge left them in
        return self.workspaces.add_workspace(issue, after_create=self.hooks(issue).after_create())

    def sessions_found_in(self, workspace: Path) -> bool:
        return True  # a session here is found where its agent left it

    def ship(self, issue: str, attempt: int, launch: Launch, worker_dir: Path,
             session: str | None = None) -> bool:
        return False  # the launch's files are here already

    def open_window(self, issue: str, attempt: int, *, cwd: Path, command: Sequence[str],
                    environment: Mapping[str, str], log_file: Path) -> Window:
        try:
            window = self.panes.open_window(issue, cwd=cwd, command=command,
                                            environment=environment, log_file=log_file)
        except TmuxServerGone as exc:  # a cause outside the issue: its next start is free
            raise HostUnavailable(f"{issue}: the tmux session went away while its window "
                                  f"opened ({exc})") from exc
        if self.admission is not None and issue in self._admitted:
            self.admission.hold(issue, window.pid)  # its place lives with its process
        return window

    def placement(self, issue: str, attempt: int) -> Placement | None:
        return None

    def send_text(self, target: str, text: str) -> None:
        self.panes.send_text(target, text)

    def dismiss(self, target: str) -> None:
        self.panes.dismiss(target)

    def capture(self, target: str, lines: int = 40) -> str:
        return self.panes.capture(target, lines)

    def end(self, issue: str, attempt: int, targets: Sequence[str], *, bring_in: bool,
            session: str | None) -> Ended:
        for target in targets:
            self.panes.kill_window(target)
        return Ended(came_back=True, session_kept=True)  # it never left

    def bring_in(self, issue: str, attempt: int) -> str | None:
        return None

    def forget(self, issue: str, *, keep_bookmark: bool, keep_newest_push: bool) -> None:
        self.workspaces.forget(issue, keep_bookmark=keep_bookmark,
                               before_remove=self.hooks(issue).before_remove(self.hook_failed))

    def slots(self) -> HostSlots | None:
        return None

    def _shared(self) -> tuple[HostAdmission, ProjectSettings] | None:
        settings = self.settings() if self.settings is not None else None
        if self.admission is None or settings is None or settings.host.max_workers is None:
            return None
        return self.admission, settings

    def shared_with(self) -> Mapping[str, ProjectLoad] | None:
        shared = self._shared()
        return None if shared is None else shared[0].loads()

    def want_slots(self, count: int) -> None:
        return None  # this host's places are its own: no one to ask for more

    def publish(self, load: ProjectLoad | None, windows: Sequence[Window]) -> None:
        shared = self._shared()
        if shared is None:
            return
        admission, settings = shared
        live = {w.name: w.pid for w in windows if w.alive and w.pid is not None}
        admission.publish(load or ProjectLoad(used=len(live), share=settings.share), live)

    @contextlib.contextmanager
    def admit(self, issue: str, priority: int) -> Iterator[None]:
        shared = self._shared()
        if shared is None:
            yield
            return
        admission, settings = shared
        assert settings.host.max_workers is not None  # _shared says so
        room = HostRoom(min_free_memory_mb=settings.limits.min_free_memory_mb,
                        worker_memory_mb=settings.host.worker_memory_mb,
                        max_load_per_cpu=settings.limits.max_load_per_cpu)
        with admission.admit(issue, max_workers=settings.host.max_workers,
                             share=settings.share, top_priority=priority, room=room):
            self._admitted.add(issue)
            try:
                yield
            finally:
                self._admitted.discard(issue)
