"""Atomic file writes: a reader sees the old file or the new one, never half."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner can enter (made, or tightened if an older
    version left it open): ralph-dev's files hold issue text, logs and keys."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def atomic_write_text(path: Path, text: str, *, mode: int = 0o600) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory + rename
    (private unless ``mode`` says otherwise)."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def read_bytes(path: Path) -> bytes | None:
    """The file's bytes; None when it cannot be read (not there, not a file)."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """``atomic_write_text`` for bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp).chmod(mode)
        Path(tmp).replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            Path(tmp).unlink()
        raise


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive OS lock (flock) on ``path`` for the block: one process at a
    time; the kernel drops it with a killed holder."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def pid_lock(path: Path, refuse: Callable[[str], Exception]) -> Iterator[None]:
    """Hold an OS lock (flock) on ``path`` with our pid in it, for as long as we run.

    The kernel drops the lock when the process dies, even by ``kill -9``, so a
    stale file never blocks a restart. When another process holds it,
    ``refuse(holder_pid)`` is raised. The pid is cleared on a clean exit.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    # a probe (``status``, ``start`` waiting for the daemon) holds the lock for a
    # moment: only a holder that keeps it for a whole second is another instance
    for attempt in range(21):
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == 20:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                handle.close()
                raise refuse(holder) from None
            time.sleep(0.05)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        with contextlib.suppress(OSError):
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def read_owner_only_file(path: Path, what: str, setting: str) -> str:
    """The stripped contents of a secret file that only its owner may read.

    ``what`` names the file in errors ("Linear API key file") and ``setting`` is
    the config key that points at it, so the message says what to fix. Raises
    ``ConfigError``; the contents never appear in a message.
    """
    import stat

    from ralph_dev.core.errors import ConfigError

    path = Path(path).expanduser()
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror}; create it or fix {setting}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{what} {path} can be read by other users; run: chmod 600 {path}")
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc
    if not value:
        raise ConfigError(f"{what} {path} is empty; put the secret in it")
    return value


def read_lines_from(path: Path, offset: int, max_bytes: int) -> tuple[list[bytes], int]:
    """The whole lines of an append-only file from byte ``offset`` on (at most
    ``max_bytes``), and the offset after them. A line still being written waits for
    the next call; a single line longer than ``max_bytes`` is skipped, never a stall.
    A missing file, or one not grown past ``offset``, reads as nothing (no open)."""
    try:
        if path.stat().st_size <= offset:
            return [], offset
        with path.open("rb") as handle:
            handle.seek(offset)
            chunk = handle.read(max_bytes)
    except OSError:
        return [], offset
    end = chunk.rfind(b"\n") + 1
    if end == 0 and len(chunk) == max_bytes:
        return [], offset + len(chunk)
    return chunk[:end].splitlines(), offset + end


def read_tail(path: Path, position: int = 0, limit: int = 65536) -> tuple[bytes, int]:
    """What a growing file holds from ``position`` on, at most its last ``limit`` bytes
    (from the start again when it is shorter than ``position``: rotated), and where it
    ends now; a missing file reads as nothing. The one reader of a log's or a
    transcript's end (``logs``, a cluster host's log, a verify's output, a question)."""
    try:
        with path.open("rb") as handle:
            end = handle.seek(0, os.SEEK_END)
            handle.seek(max(position if position <= end else 0, end - limit))
            return handle.read(), end
    except OSError:
        return b"", 0
