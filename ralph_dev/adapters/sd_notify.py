"""systemd's notify protocol: one datagram per message to ``$NOTIFY_SOCKET``.

Under ``Type=notify`` systemd waits for ``READY=1`` before it calls the unit
started, and with ``WatchdogSec`` it kills and restarts a service that stops
sending ``WATCHDOG=1``: a hung daemon. The protocol is ``KEY=VALUE`` lines in a
unix datagram; an address starting with ``@`` is in the abstract namespace.
Outside systemd (no ``NOTIFY_SOCKET``) every call does nothing. Small enough
that no library is needed (sd_notify(3) documents it as a stable interface).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import structlog

log = structlog.get_logger(__name__)


class SystemdNotifier:
    """Tells the service manager that started us how we are doing."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        self.address = environ.get("NOTIFY_SOCKET") or None
        watchdog_pid = environ.get("WATCHDOG_PID")
        usec = environ.get("WATCHDOG_USEC", "")
        mine = watchdog_pid is None or watchdog_pid == str(os.getpid())
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and mine else None
        """The watchdog timeout systemd started us with (None: no watchdog)."""
        self._warned = False
        self._ready = False
        """READY=1 was sent: the watchdog is fed only from then on (a health check due
        while a slow start is still under way would otherwise say WATCHDOG=1 first)."""

    def send(self, **fields: str | int) -> bool:
        """Send one message (``READY=1``, ``WATCHDOG=1``, ``STATUS=…``); False when there is
        no service manager or it could not be reached (said once in the log)."""
        if self.address is None:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        message = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message, target)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("sd_notify_failed", socket=self.address, error=str(exc))
            return False
        return True

    def ready(self, status: str, *, watchdog_s: float | None = None) -> bool:
        """Started; when systemd watches us, also set its patience to ``watchdog_s``."""
        fields: dict[str, str | int] = {"READY": 1, "STATUS": status}
        if self.watchdog_s is not None and watchdog_s is not None:
            fields["WATCHDOG_USEC"] = int(watchdog_s * 1e6)
            self.watchdog_s = watchdog_s
        if self.watchdog_s is not None:
            fields["WATCHDOG"] = 1
        self._ready = True
        return self.send(**fields)

    def alive(self) -> bool:
        """Feed the watchdog (a no-op when systemd set none, or before READY=1)."""
        return self._ready and self.watchdog_s is not None and self.send(WATCHDOG=1)

    def stopping(self) -> bool:
        return self.send(STOPPING=1, STATUS="stopping")
