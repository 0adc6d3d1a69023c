"""The controller's end of the worker mailbox: a listener on every worker's socket.

A connection to ``run/ctl.sock`` means "my outbox has a report" and carries one line
back, the answer to the report it names. The listener hands the poke to the
controller (``hear``) and wakes its loop; it knows nothing of what reports mean.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import structlog

from ralph_dev.adapters import mailbox

log = structlog.get_logger(__name__)

Hear = Callable[[str, str], Awaitable[mailbox.Answer | None]]
"""(worker, the report id its command waits for) → the answer to send back."""


class MailboxServer:
    def __init__(self, run_dir: Callable[[str], Path], hear: Hear,
                 wake: Callable[[], None] = lambda: None) -> None:
        self.run_dir = run_dir
        self.hear = hear
        self.wake = wake
        self._servers: dict[str, tuple[asyncio.AbstractServer, int]] = {}

    async def listen(self, names: Iterable[str]) -> None:
        """A listener on every worker's ``ctl.sock`` (made again if its file went)."""
        names = set(names)
        for name in list(self._servers):
            if name not in names:
                await self.stop(name)
        for name in names:
            sock = self.run_dir(name) / mailbox.SOCKET
            held = self._servers.get(name)
            with contextlib.suppress(OSError):
                if held is not None and sock.stat().st_ino == held[1] \
                        and held[0].get_loop() is asyncio.get_running_loop():
                    continue
            await self.stop(name)
            with contextlib.suppress(OSError):
                sock.unlink()
            try:
                with mailbox.socket_address(sock) as address:
                    server = await asyncio.start_unix_server(self._server_for(name),
                                                             path=address)
                sock.chmod(0o600)
                self._servers[name] = (server, sock.stat().st_ino)
            except OSError as exc:
                log.warning("mailbox_listen_failed", issue=name, error=str(exc))

    def _server_for(self, name: str) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                                 Awaitable[None]]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(name, reader, writer)
        return serve

    async def stop(self, name: str) -> None:
        held = self._servers.pop(name, None)
        if held is not None:
            held[0].close()
            with contextlib.suppress(Exception):
                await held[0].wait_closed()

    async def close(self) -> None:
        for name in list(self._servers):
            await self.stop(name)
            with contextlib.suppress(OSError):
                (self.run_dir(name) / mailbox.SOCKET).unlink()

    async def _serve(self, name: str, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        """One worker says "look at my outbox"; it gets the answer to the report it names."""
        try:
            line = (await asyncio.wait_for(reader.readline(), 5.0))[:100].decode().strip()
            answer = await self.hear(name, line)
            if answer is not None:
                writer.write(json.dumps(answer.as_json()).encode())
                await writer.drain()
        except (OSError, TimeoutError, UnicodeDecodeError, ValueError) as exc:
            log.info("mailbox_request_dropped", issue=name, error=str(exc))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        self.wake()
