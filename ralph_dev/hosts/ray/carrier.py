"""The controller's end of cluster workers' mailboxes: what ``MailboxServer`` is on one host.

A worker on another host writes its reports into a run directory on that host
(``hosts.node.mailbox``). For each worker the carrier keeps one call to its
actor going (``AttemptCalls.exchange``): it carries the controller's answers and
files there, and brings the worker's reports back into the run directory here,
where the controller reads every report, from any host, the same way
(``control.intake``). Then it asks the controller to hear them, as a worker's poke
does on one host.

A report is kept here first and only then said taken, so a controller stopped in
between takes it again from the host the next time. The carrier knows nothing of what
reports mean. When the host does not answer, it tries again with the project's kind
of backoff and says nothing louder than a debug line: the observer, not the carrier,
says when a worker's host is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import structlog

from ralph_dev.adapters import mailbox
from ralph_dev.adapters.files import atomic_write_bytes, read_bytes
from ralph_dev.core.errors import RalphError
from ralph_dev.core.policy import RetryPolicy
from ralph_dev.hosts.node.mailbox import CONTROLLER_FILES
from ralph_dev.hosts.node.worker import LEASE_STOP
from ralph_dev.hosts.ray.ledger import LedgerCopy

log = structlog.get_logger(__name__)

CARRY_WAIT = 3.0
"""Seconds one exchange waits on the host for a report: short, so a controller that
stops waits no longer than this for its last call."""

CARRIER_THREADS = 128
"""Calls carried at once (one per cluster worker, each a long-poll of ``CARRY_WAIT``):
a pool of their own, as the event loop's default one (a few threads per core) would
queue them behind one another, and each call renews its attempt's lease."""

LEDGER_EVERY = 2.0
"""Seconds between copies of a worker's egress ledger from its host (``ledger``)."""

CARRY_RETRY = RetryPolicy(initial=1.0, backoff=2.0, cap=30.0)
"""The wait before the next exchange after ones that failed in a row (a host that
does not answer, an attempt not started yet, one that ended)."""

LEASE_CALLS = 4
"""Calls a backing-off carrier still makes within the part of a lease its attempt waits
before it stops itself (``LEASE_STOP``): a host back from a cut hears from the
controller before its attempt gives up."""


def carry_retry(lease: float) -> RetryPolicy:
    """:data:`CARRY_RETRY`, its longest wait short enough that an attempt with this
    ``lease`` (0: none) is called again in time (``LEASE_CALLS``)."""
    if lease <= 0:
        return CARRY_RETRY
    return dataclasses.replace(CARRY_RETRY,
                               cap=min(CARRY_RETRY.cap, lease * LEASE_STOP / LEASE_CALLS))

Hear = Callable[[str, str], Awaitable[mailbox.Answer | None]]
Renewed = Callable[[str, int, datetime], None]
"""An attempt's host answered a call sent then: its lease runs from there."""


class Exchange(Protocol):
    def __call__(self, issue: str, attempt: int, files: dict[str, bytes],
                 answers: dict[str, bytes], taken: list[str], wait: float
                 ) -> dict[str, bytes]: ...


class MailboxCarrier:
    def __init__(self, run_dir: Callable[[str], Path], hear: Hear, exchange: Exchange,
                 attempt_of: Callable[[str], int], wake: Callable[[], None] = lambda: None,
                 renewed: Renewed = lambda name, attempt, at: None,
                 ledger: LedgerCopy | None = None, retry: RetryPolicy = CARRY_RETRY) -> None:
        self.run_dir = run_dir
        self.hear = hear
        self.exchange = exchange
        self.attempt_of = attempt_of
        """The issue's current cluster attempt: the only one the carrier talks to."""
        self.wake = wake
        self.renewed = renewed
        """Told of every call the host answered (each renews the attempt's lease on its
        host), with when it was sent."""
        self.ledger = ledger
        """Brings each worker's egress ledger here (``agent.network = "allowlist"``)."""
        self.retry = retry
        """The waits between failed calls (``carry_retry``: within the attempts' lease)."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._pool = ThreadPoolExecutor(CARRIER_THREADS, thread_name_prefix="carrier")

    async def listen(self, names: Iterable[str]) -> None:
        """A carrier for every worker in ``names``; none for any other."""
        names = set(names)
        for name, task in list(self._tasks.items()):
            if task.done() and not task.cancelled() and task.exception() is not None:
                # a bug, not the host (that is retried inside): said, and started again
                log.warning("carrier_failed", issue=name, error=repr(task.exception()))
            if name not in names or task.done():
                await self.stop(name)
        for name in names - set(self._tasks):
            self._tasks[name] = asyncio.create_task(self._carry(name), name=f"carry-{name}")

    async def stop(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def close(self) -> None:
        for name in list(self._tasks):
            await self.stop(name)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _carry(self, name: str) -> None:
        attempt, failures = 0, 0
        sent: dict[str, tuple[int, int, int]] = {}
        answered: set[str] = set()
        taken: list[str] = []
        ledger_at = 0.0
        loop = asyncio.get_running_loop()
        while True:
            current = self.attempt_of(name)
            if current != attempt:  # a new attempt's host has none of it, and owes no wait
                attempt, sent, answered, taken, failures = current, {}, set(), [], 0
            run = self.run_dir(name)
            # a file is read only once it changed (every write replaces it): change.diff
            # may hold megabytes, and this loop turns every few seconds per worker
            changed = {f: stamp for f in sorted(CONTROLLER_FILES)
                       if (stamp := _stamp(run / f)) is not None and sent.get(f) != stamp}
            files = {f: data for f in changed if (data := read_bytes(run / f)) is not None}
            answers = {p.stem: data for p in _answer_files(run)
                       if p.stem not in answered and (data := read_bytes(p)) is not None}
            try:
                if attempt < 1:
                    raise RalphError(f"{name}: no cluster attempt yet")
                sent_at = datetime.now(UTC)  # the host renews when the call arrives
                got = await loop.run_in_executor(
                    self._pool, self.exchange, name, attempt, files, answers, taken,
                    CARRY_WAIT)
            except RalphError as exc:
                failures += 1
                log.debug("carrier_waits", issue=name, attempt=attempt, error=str(exc))
                await self._pause(name, attempt, self.retry.delay(failures))
                continue
            failures = 0
            self.renewed(name, attempt, sent_at)
            sent.update({f: changed[f] for f in files})
            answered.update(answers)
            taken = _kept(run, got)
            if taken:
                await self._heard(name, taken[-1])
            if self.ledger is not None and loop.time() >= ledger_at:
                ledger_at = loop.time() + LEDGER_EVERY
                await self._bring_ledger(name, attempt)

    async def _bring_ledger(self, name: str, attempt: int) -> None:
        assert self.ledger is not None
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._pool, self.ledger.bring, name, attempt)
        except (RalphError, OSError) as exc:  # the next turn tries again
            log.debug("ledger_not_brought", issue=name, attempt=attempt, error=str(exc))

    async def _pause(self, name: str, attempt: int, seconds: float) -> None:
        """Wait ``seconds``, or less when the issue's next attempt starts: its worker's
        first reports are not kept waiting by its predecessor's backoff."""
        deadline = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < deadline \
                and self.attempt_of(name) == attempt:
            await asyncio.sleep(min(0.5, seconds))

    async def _heard(self, name: str, report_id: str) -> None:
        try:
            await self.hear(name, report_id)
        except (RalphError, OSError) as exc:  # the reports stay; the tick reads them
            log.warning("carrier_hear_failed", issue=name, error=str(exc))
        self.wake()


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells one version of a file from the next: inode, time and size."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


def _answer_files(run: Path) -> list[Path]:
    try:
        return sorted(p for p in (run / mailbox.ANSWERS).iterdir() if p.suffix == ".json"
                      and mailbox.report_id_ok(p.stem))
    except OSError:
        return []


def _kept(run: Path, reports: dict[str, bytes]) -> list[str]:
    """Each report from the host written into the outbox here, unless it is here already
    (or answered): the ids now safe here."""
    kept = []
    for report_id, data in reports.items():
        if not mailbox.report_id_ok(report_id):
            continue
        name = f"{report_id}.json"
        if not (run / mailbox.OUTBOX / name).exists() \
                and not (run / mailbox.ANSWERS / name).exists():
            atomic_write_bytes(run / mailbox.OUTBOX / name, data)
        kept.append(report_id)
    return kept
