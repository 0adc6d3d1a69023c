"""The config file, read again whenever it changes: a person's edit applies live.

Each tick the controller looks at the file (a ``stat``, nothing more) and at a reload
request (``ralph-dev reload PROJECT``, or ``SIGHUP`` to the daemon); when either says
so, it reads the file again. A valid file is applied from that tick on, but for what
only a restart can change (``core.config.RESTART_NEEDED``), and an event lists what
changed. An invalid one changes nothing — the last good config keeps running — and is
said once per problem (the event names the file, the key and what is wrong; the
heartbeat carries it for ``status``, the dashboard and notifications). Each valid read is
kept as the last good config (``adapters.config_file``): a controller that starts while the
file is invalid starts on it, and the commands that only read use it meanwhile.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from ralph_dev.adapters.config_file import Signature, config_signature, read_good
from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.adapters.store import StateStore
from ralph_dev.core.config import ProjectSettings, live_settings
from ralph_dev.core.errors import ConfigError

RELOAD_FILE = "reload"
"""In the project's state dir: a person asked for the config to be read again."""


def request_reload(store: StateStore) -> None:
    """Ask the running controller to read its config again (its next tick does)."""
    atomic_write_text(store.paths.state_dir / RELOAD_FILE, "reload\n")


@dataclass
class Reloaded:
    """What one read of the config came to."""

    settings: ProjectSettings | None = None
    """The settings to run with from now on; None when the file is invalid."""
    changed: list[str] = field(default_factory=list)
    restart_needed: list[str] = field(default_factory=list)
    error: str | None = None


class ConfigWatch:
    def __init__(self, name: str, path: Path, store: StateStore, *,
                 requests: bool = True) -> None:
        """``requests``: this watch answers reload requests (the controller's does; the
        daemon's reads the file when it changes or when it is told to itself)."""
        self.name = name
        self.path = path
        self.store = store
        self.requests = requests
        self.seen = config_signature(path)
        self.error: str | None = None
        """The problem with the file as last read (None: the last read was good)."""
        self.restart_needed: list[str] = []
        """Keys the file changes that the running swarm keeps until a restart."""

    def started_with(self, seen: Signature | None, error: str | None) -> None:
        """The settings this process started with were read when the file's signature was
        ``seen`` (taken before that read: an edit since is read at the next check);
        ``error``: the file was invalid then, and the last good config runs (said already)."""
        self.seen = seen
        self.error = error

    def _requested(self) -> bool:
        if not self.requests:
            return False
        request = self.store.paths.state_dir / RELOAD_FILE
        if not request.exists():
            return False
        with contextlib.suppress(OSError):
            request.unlink()
        return True

    def check(self, running: ProjectSettings, *, force: bool = False) -> Reloaded | None:
        """Read the config again when it changed or a reload was asked for; None when
        there was nothing to read or nothing is new."""
        signature = config_signature(self.path)
        if not self._requested() and not force and signature == self.seen:
            return None
        self.seen = signature
        try:
            new = read_good(self.name, self.path)  # kept as the last good when valid
        except ConfigError as exc:
            error = str(exc)
            if error == self.error:
                return None  # said already
            self.error = error
            return Reloaded(error=error)
        self.error = None
        settings, changed, later = live_settings(running, new)
        self.restart_needed = later
        return Reloaded(settings=settings, changed=changed, restart_needed=later)
