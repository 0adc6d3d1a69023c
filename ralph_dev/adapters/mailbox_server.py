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
                server = await listen_at(sock, self._server_for(name))
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
        async def answer(report_id: str, _: asyncio.StreamReader) -> bytes | None:
            said = await self.hear(name, report_id)
            return None if said is None else json.dumps(said.as_json()).encode()

        await answer_poke(reader, writer, answer, name)
        self.wake()


Answerer = Callable[[str, asyncio.StreamReader], Awaitable[bytes | None]]
"""(the report id a worker's command waits for, its connection) → the bytes it gets
back (None: nothing, the command then says its report waits)."""


async def listen_at(sock: Path, serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                                Awaitable[None]]) -> asyncio.AbstractServer:
    """A listener on a run directory's ``ctl.sock``, owner-only: the controller's on one
    host, the attempt's actor's on a cluster's (``hosts.node.mailbox``). Both ends speak
    the same one-line protocol, so a worker's commands cannot tell them apart."""
    with mailbox.socket_address(sock) as address:
        server = await asyncio.start_unix_server(serve, path=address)
    sock.chmod(0o600)
    return server


async def answer_poke(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      answer: Answerer, where: str) -> None:
    """One worker command says "my outbox has a report" and names it; it gets the
    answer to that report back, and the connection closes."""
    try:
        line = (await asyncio.wait_for(reader.readline(), 5.0))[:100].decode().strip()
        data = await answer(line, reader)
        if data is not None:
            writer.write(data)
            await writer.drain()
    except (OSError, TimeoutError, UnicodeDecodeError, ValueError) as exc:
        log.info("mailbox_request_dropped", where=where, error=str(exc))
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
