"""A cluster worker's run directory on its own host, and its half of the carrier.

On one host a worker and its controller share the run directory
(``adapters.mailbox``): the worker writes a report into ``outbox/``, pokes
``ctl.sock`` and reads the answer the controller writes. A cluster host shares
nothing with the controller but the git remote, so the attempt's actor keeps the
run directory on its host and stands in for the controller at the socket. The
controller's carrier (``hosts.ray.carrier``) calls :meth:`NodeMailbox.exchange`
over and over: each call brings the controller's answers and files (``worker.json``,
``issue.json``, ``change.diff``, ``backlog.json``) and takes the reports the worker
wrote since. The worker's commands cannot tell the two apart.

A report stays on the host until the controller says it has it (``taken``): a
controller stopped between two calls loses none.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import structlog

from ralph_dev.adapters import mailbox
from ralph_dev.adapters.files import atomic_write_bytes, read_bytes
from ralph_dev.adapters.mailbox_server import answer_poke, listen_at

log = structlog.get_logger(__name__)

CONTROLLER_FILES = frozenset({mailbox.WORKER_FILE, mailbox.ISSUE_FILE, mailbox.BACKLOG_FILE,
                              mailbox.DIFF_FILE})
"""The run directory's files the controller writes, and so the carrier brings here."""

ANSWER_LOOK = 0.5
"""Seconds between looks for the answer a worker's command waits for."""

LOOK_AGAIN = 1.0
"""Seconds between looks at the outbox while an exchange waits: a report written
without a poke (the socket was not there yet) is found all the same."""


class NodeMailbox:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._news = threading.Condition()
        self._taken: set[str] = set()
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._asking = 0
        """Worker commands waiting for an answer on the socket now."""

    # -- the worker's side: the socket ---------------------------------------------------

    def open(self) -> None:
        """The run directory, and a listener on its ``ctl.sock`` (the controller's own
        kind, ``adapters.mailbox_server``) on an event loop in a thread of its own."""
        mailbox.make_run_dir(self.run_dir)
        sock = self.run_dir / mailbox.SOCKET
        with contextlib.suppress(OSError):
            sock.unlink()
        loop = asyncio.new_event_loop()
        self._server = loop.run_until_complete(listen_at(sock, self._serve))
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="mailbox", daemon=True)
        self._thread.start()

    def close(self) -> None:
        loop, server, thread = self._loop, self._server, self._thread
        self._loop, self._server, self._thread = None, None, None
        if loop is not None and server is not None and thread is not None:
            async def shut() -> None:
                server.close()
                loop.stop()
            asyncio.run_coroutine_threadsafe(shut(), loop)
            thread.join(timeout=5)
            if not thread.is_alive():
                loop.close()
        with contextlib.suppress(OSError):
            (self.run_dir / mailbox.SOCKET).unlink()

    def poked(self) -> None:
        with self._news:
            self._news.notify_all()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        await answer_poke(reader, writer, self._answer, os.fspath(self.run_dir))

    async def _answer(self, report_id: str, connection: asyncio.StreamReader) -> bytes | None:
        """The answer to ``report_id`` once the carrier brought it; None when the worker
        hung up first (a hook's news waits half a second) or none came in time."""
        self.poked()
        if not mailbox.report_id_ok(report_id):
            return None
        path = self.run_dir / mailbox.ANSWERS / f"{report_id}.json"
        deadline = time.monotonic() + mailbox.ANSWER_WAIT
        self._counted(+1)
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    return path.read_bytes()
                try:
                    if not await asyncio.wait_for(connection.read(1), ANSWER_LOOK):
                        return None  # the worker's command gave up waiting
                except TimeoutError:
                    pass
            return None
        finally:
            self._counted(-1)

    def _counted(self, change: int) -> None:
        with self._news:
            self._asking += change
            self._news.notify_all()

    def refuse_waiting(self, message: str, wait: float) -> list[str]:
        """Answer every report the controller has not answered with a refusal saying
        ``message`` (an attempt that stops itself: its worker's ``worker done`` learns
        why now, not after :data:`mailbox.ANSWER_WAIT`), and give the commands waiting
        on the socket up to ``wait`` seconds to read it; the reports refused."""
        refused = []
        for report_id in sorted(self._waiting()):
            if mailbox.read_answer(self.run_dir, report_id) is None:
                mailbox.write_answer(self.run_dir, mailbox.Answer(report_id, False, message))
                refused.append(report_id)
        deadline = time.monotonic() + wait
        with self._news:
            while refused and self._asking and time.monotonic() < deadline:
                self._news.wait(max(0.0, deadline - time.monotonic()))
        return refused

    # -- the controller's side: the carrier's calls ------------------------------------------

    def exchange(self, files: Mapping[str, bytes], answers: Mapping[str, bytes],
                 taken: Iterable[str], wait: float) -> dict[str, bytes]:
        """Write the controller's ``files`` and ``answers``, forget the reports it has
        (``taken``), and return the reports it does not have yet, by id: at once when
        there are any, else when one comes or ``wait`` seconds pass."""
        for name, data in files.items():
            if name in CONTROLLER_FILES and read_bytes(self.run_dir / name) != data:
                # unchanged stays untouched: a worker takes worker.json's time for its start
                atomic_write_bytes(self.run_dir / name, data)
        for report_id, data in answers.items():
            if mailbox.report_id_ok(report_id):
                atomic_write_bytes(self.run_dir / mailbox.ANSWERS / f"{report_id}.json", data)
        with self._news:
            self._taken.update(taken)
        deadline = time.monotonic() + wait
        while True:
            waiting = self._waiting()
            left = deadline - time.monotonic()
            if waiting or left <= 0:
                return waiting
            with self._news:
                self._news.wait(min(left, LOOK_AGAIN))

    def _waiting(self) -> dict[str, bytes]:
        """The outbox's reports the controller has not taken, oldest first, a batch at
        a time (``mailbox.REPORTS_AT_ONCE``)."""
        try:
            found = sorted((p.lstat().st_mtime, p.name, p)
                           for p in (self.run_dir / mailbox.OUTBOX).iterdir()
                           if p.suffix == ".json" and not p.name.startswith(".")
                           and p.stem not in self._taken)
        except OSError:
            return {}
        out: dict[str, bytes] = {}
        for _mtime, _name, path in found[:mailbox.REPORTS_AT_ONCE]:
            data = mailbox.read_report_bytes(path)
            if data is not None:
                out[path.stem] = data
        return out

