"""The worker ↔ controller channel: a worker's run directory and what travels through it.

A worker never touches the tracker, jj or ralph-dev's state itself. Everything it
reports (``ralph-dev worker done/blocked/note/plan``, its hooks' news) becomes a
*report*: a small JSON file written atomically into its own run directory's
``outbox/``. The controller picks it up, applies it exactly once (the report's id
is the key) and writes an *answer* next to it. A connection to the run
directory's socket ``ctl.sock`` tells the controller to look now and carries the
answer back; without a controller the report simply waits on disk.

**Who sent a report is where it lies.** The controller created one run directory
per worker (``state_dir/workers/ISSUE/run``) and the worker's sandbox shows it
only that one, at :data:`RUN_MOUNT`. Nothing in a report, the environment or a
config file can name another issue or role: the controller takes both from its
own record of the worker whose directory the report is in.

Both sides import this module (it is stdlib plus ``core``): the worker's side
writes and waits (:func:`submit`), the controller's side lists and answers
(:func:`pending_reports`, :func:`write_answer`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ralph_dev.adapters.files import atomic_write_bytes, atomic_write_text, private_dir
from ralph_dev.core.environment import RUN_DIR_VAR
from ralph_dev.core.model import SESSION_ID_RE, check_identifier
from ralph_dev.core.text import strip_ansi

RUN_MOUNT = Path("/run/ralph-dev")
"""Where a sandboxed worker sees its own run directory (and nothing else of ralph-dev)."""

# RUN_DIR_VAR (core.environment): where an UNconfined worker finds its run directory. A
# sandboxed worker's commands ignore it: only RUN_MOUNT counts there.

WORKER_FILE = "worker.json"
ISSUE_FILE = "issue.json"
BACKLOG_FILE = "backlog.json"
"""A groom worker's view of the project's issues and recent events."""
DIFF_FILE = "change.diff"
"""The worker's change as the controller last snapshotted it (jj cannot run in the
sandbox: the workspace's repository is read-only there); ``ralph-dev worker diff``."""
DIFF_MAX = 2 * 2**20
"""Bytes of the change kept in ``DIFF_FILE``: enough to read, never a disk filler."""
SOCKET = "ctl.sock"
OUTBOX = "outbox"
ANSWERS = "answers"


def diff_report(diff: str, conflicted: list[str]) -> str:
    """What ``worker diff`` shows: the files still conflicted first (a sandboxed resolve
    worker cannot ask jj), then the change."""
    head = (f"# Still conflicted: {', '.join(conflicted[:50])}. Edit each to the content "
            "you intend, removing every conflict marker.\n") if conflicted else ""
    return head + diff[:DIFF_MAX]

REPORT_KINDS = frozenset({
    "done", "blocked", "note", "plan",  # the worker's reports (tracker writes)
    "propose", "prioritize", "flag",  # a groom worker's (tracker writes too)
    "verify_failed", "session", "agent_error", "iteration_cap", "activity",  # its news
    "state", "diff", "windows",
})

ANSWER_WAIT = 120.0
"""Seconds a worker command waits for the controller's answer before it says the
report is recorded and will be applied later."""

REPORT_LIMIT = 256 * 1024
"""Bytes one report file may hold; a bigger one is refused unread."""

REPORTS_AT_ONCE = 20
"""Reports of one worker the controller takes at a time; the rest wait their turn."""


class ChannelError(Exception):
    """The run directory is missing or unusable: not a ralph-dev worker."""


class ReportRefused(Exception):
    """A report the worker's side does not write, because the controller would refuse it
    unread (too large, or not a report it can read): said at the command, where the
    agent can still act on it, instead of dropped later in silence."""

    def __init__(self, message: str, *, size: int | None = None) -> None:
        super().__init__(message)
        self.size = size


@dataclass(frozen=True)
class WorkerInfo:
    """What the controller tells a worker about itself (``run/worker.json``): all a
    worker command needs, so none of them reads the config or the environment."""

    project: str
    issue: str
    role: str
    workspace: str
    attempt: int
    verify_command: str | None = None
    iteration_cap: int = 20
    review_after_execute: bool = False

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkerInfo:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        info = cls(**known)
        check_identifier(info.issue)
        return info


@dataclass(frozen=True)
class Report:
    id: str
    kind: str
    fields: dict[str, Any] = field(default_factory=dict)
    at: str = ""


@dataclass(frozen=True)
class Answer:
    """The controller's word on one report: ``ok`` false means refused (``message``
    says why and what to do); ``pending`` means accepted but the tracker writes are
    still to come (an outage), retried by the controller."""

    id: str
    ok: bool
    message: str
    pending: bool = False
    data: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "ok": self.ok, "message": self.message,
                "pending": self.pending, "data": self.data}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Answer:
        return cls(id=str(data.get("id", "")), ok=bool(data.get("ok")),
                   message=str(data.get("message", "")), pending=bool(data.get("pending")),
                   data=dict(data.get("data") or {}))


# --- the run directory ------------------------------------------------------------------


def make_run_dir(run_dir: Path) -> Path:
    """The run directory and its outbox/answers, owner-only."""
    for directory in (run_dir, run_dir / OUTBOX, run_dir / ANSWERS):
        private_dir(directory)
    return run_dir


def write_worker_info(run_dir: Path, info: WorkerInfo) -> None:
    atomic_write_text(run_dir / WORKER_FILE, json.dumps(info.as_json(), indent=2) + "\n")


def read_worker_info(run_dir: Path) -> WorkerInfo:
    try:
        return WorkerInfo.from_json(json.loads((run_dir / WORKER_FILE).read_text("utf-8")))
    except (OSError, ValueError, TypeError) as exc:
        raise ChannelError(f"{run_dir / WORKER_FILE} is unreadable ({exc}): this run "
                           "directory was not prepared by ralph-dev's controller") from exc


def find_run_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """This worker's run directory: :data:`RUN_MOUNT` inside a sandbox (the environment
    is then ignored), else ``RALPH_DEV_RUN_DIR`` of an unconfined worker; None outside
    any worker."""
    if (RUN_MOUNT / WORKER_FILE).is_file():
        return RUN_MOUNT
    environ = os.environ if environ is None else environ
    given = environ.get(RUN_DIR_VAR, "").strip()
    if given and Path(given).is_absolute() and (Path(given) / WORKER_FILE).is_file():
        return Path(given)
    return _adopted_run_dir(environ)


def _adopted_run_dir(environ: Mapping[str, str]) -> Path | None:
    """The run dir of a worker started by a release before the channel, which the
    controller adopted after an upgrade: its pane knows only its project and issue.
    (Unconfined, as it always ran; a sandboxed worker never gets here.)"""
    from ralph_dev.core.errors import RalphError
    from ralph_dev.core.paths import ProjectPaths, check_project_name

    project, issue = environ.get("RALPH_DEV_PROJECT", ""), environ.get("RALPH_DEV_ISSUE", "")
    if not project or not issue:
        return None
    try:
        run_dir = ProjectPaths(check_project_name(project)).worker_dir(issue) / "run"
    except (RalphError, ValueError):
        return None
    return run_dir if (run_dir / WORKER_FILE).is_file() else None


# --- reports: the worker writes, the controller reads ------------------------------------


def new_report_id() -> str:
    return os.urandom(8).hex()


def write_report(run_dir: Path, kind: str, fields: Mapping[str, Any],
                 report_id: str | None = None) -> Report:
    """Durably record a report (atomic; 0600) in the outbox; returns it. Raises
    :class:`ReportRefused`, writing nothing, for one the controller would not read."""
    from ralph_dev.adapters.store import utcnow

    if kind not in REPORT_KINDS:
        raise ValueError(f"unknown report kind {kind!r}")
    report = Report(id=report_id or new_report_id(), kind=kind, fields=dict(fields),
                    at=utcnow().isoformat())
    atomic_write_bytes(run_dir / OUTBOX / f"{report.id}.json", encode_report(report))
    return report


def encode_report(report: Report) -> bytes:
    """The report's file, checked the way the controller will read it (:func:`decode_report`):
    what it would refuse unread is refused here, before anything is written."""
    try:
        raw = (json.dumps({"id": report.id, "kind": report.kind, "at": report.at,
                           "fields": report.fields}, ensure_ascii=False, allow_nan=False)
               + "\n").encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError too: not UTF-8 text
        raise ReportRefused(f"the {report.kind} report cannot be written as JSON text "
                            f"({exc}); pass plain UTF-8 text") from None
    if len(raw) > REPORT_LIMIT:
        raise ReportRefused(
            f"the {report.kind} report is {len(raw):,} bytes, over the {REPORT_LIMIT // 1024} "
            f"KiB ({REPORT_LIMIT:,} bytes) one report may hold", size=len(raw))
    if decode_report(raw, report.id) is None:
        raise ReportRefused(f"the {report.kind} report is not one the controller can read")
    return raw


def report_id_ok(text: str) -> bool:
    return 1 <= len(text) <= 64 and all(c in "0123456789abcdef" for c in text)


def decode_report(raw: bytes, report_id: str) -> Report | None:
    """A report file's bytes as the report named ``report_id``; None for anything
    malformed (the controller refuses it; the writer never writes it)."""
    if len(raw) > REPORT_LIMIT:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("fields", {}), dict):
        return None
    found_id, kind = str(data.get("id", "")), str(data.get("kind", ""))
    if found_id != report_id or not report_id_ok(found_id) or kind not in REPORT_KINDS:
        return None
    return Report(id=found_id, kind=kind, fields=dict(data.get("fields") or {}),
                  at=str(data.get("at", "")))


def read_report(path: Path) -> Report | None:
    """One outbox file as a report; None for anything malformed (it is refused)."""
    raw = read_report_bytes(path)
    return None if raw is None else decode_report(raw, path.stem)


def read_report_bytes(path: Path) -> bytes | None:
    """An outbox file's bytes (at most one over the limit); None unless a regular file.
    Read without following a link: the controller sees paths the worker's sandbox
    hides."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            return handle.read(REPORT_LIMIT + 1)
    except OSError:
        return None


def pending_reports(run_dir: Path, limit: int = REPORTS_AT_ONCE
                    ) -> list[tuple[Path, Report | None]]:
    """Outbox files not answered yet, oldest first, at most ``limit`` (a worker that
    floods its outbox is heard a few reports a tick); None: a malformed file."""
    outbox = run_dir / OUTBOX
    try:
        files = [(p.lstat().st_mtime, p.name, p) for p in outbox.iterdir()
                 if p.suffix == ".json" and not p.name.startswith(".")]
    except OSError:
        return []
    files.sort()
    waiting = [p for _mtime, _name, p in files if not (run_dir / ANSWERS / p.name).exists()]
    return [(p, read_report(p)) for p in waiting[:limit]]


def write_answer(run_dir: Path, answer: Answer) -> None:
    atomic_write_text(run_dir / ANSWERS / f"{answer.id}.json", json.dumps(answer.as_json()) + "\n")


def read_answer(run_dir: Path, report_id: str) -> Answer | None:
    try:
        return Answer.from_json(json.loads((run_dir / ANSWERS / f"{report_id}.json")
                                           .read_text(encoding="utf-8")))
    except (OSError, ValueError, AttributeError):
        return None


def reports_of(run_dir: Path, kinds: frozenset[str]) -> list[tuple[Report, Answer | None]]:
    """This worker's reports of ``kinds`` with their answers (None: not answered yet)."""
    out = []
    try:
        files = sorted((run_dir / OUTBOX).glob("*.json"))
    except OSError:
        return []
    for path in files:
        report = read_report(path)
        if report is not None and report.kind in kinds:
            out.append((report, read_answer(run_dir, report.id)))
    return out


# --- the socket: "look now", and the answer back -------------------------------------------

SUN_PATH_MAX = 107
"""Bytes of a unix socket's path the kernel takes (``sun_path``, less its NUL)."""


@contextlib.contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """An address for the socket at ``path`` that fits ``sun_path`` however deep the
    run dir lies (a long XDG_STATE_HOME, project or identifier): through an ``O_PATH``
    descriptor of its directory, ``/proc/self/fd/N/ctl.sock`` (Linux)."""
    if len(os.fsencode(str(path))) <= SUN_PATH_MAX:
        yield str(path)
        return
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{directory}/{path.name}"
    finally:
        os.close(directory)



def _ask(run_dir: Path, line: str, timeout: float) -> bytes | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        with socket_address(run_dir / SOCKET) as address:
            sock.connect(address)
        sock.sendall(line.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:  # no controller listening (yet), or it took too long
        return None
    finally:
        sock.close()


def submit(run_dir: Path, kind: str, fields: Mapping[str, Any], *,
           wait: float = ANSWER_WAIT) -> tuple[Report, Answer | None]:
    """Write a report, tell the controller, and return its answer (None: the controller
    is not running or did not answer in ``wait`` seconds; the report stays and is
    applied when it does)."""
    report = write_report(run_dir, kind, fields)
    reply = _ask(run_dir, report.id, wait)
    answer = None
    if reply:
        with contextlib.suppress(ValueError, AttributeError):
            answer = Answer.from_json(json.loads(reply.decode("utf-8")))
    return report, answer or read_answer(run_dir, report.id)


def tell(run_dir: Path, kind: str, fields: Mapping[str, Any]) -> None:
    """A report the worker does not wait for (a hook's news): written, and the
    controller told, in well under a second whatever it is doing."""
    submit(run_dir, kind, fields, wait=0.5)


# --- report fields, checked (they come from a worker) ----------------------------------


def state_fields(fields: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """A ``state`` report's record fields: what the agent does, cleaned and clipped."""
    said = fields.get("state")
    if not isinstance(said, str) or not said.strip():
        return {}
    return {"agent_state": " ".join(strip_ansi(said).split())[:160], "agent_state_at": now}


def window_fields(fields: Mapping[str, Any]) -> dict[str, tuple[float, datetime]]:
    """A ``windows`` report's usage windows (Claude Code's ``rate_limits``: name →
    ``used_percentage``, ``resets_at`` in Unix seconds), each checked: numbers only."""
    out: dict[str, tuple[float, datetime]] = {}
    said = fields.get("rate_limits")
    for name, window in (said.items() if isinstance(said, Mapping) else ()):
        if not isinstance(name, str) or not isinstance(window, Mapping):
            continue
        used, reset = window.get("used_percentage"), window.get("resets_at")
        if isinstance(used, int | float) and not isinstance(used, bool) and 0 <= used <= 100 \
                and isinstance(reset, int | float) and not isinstance(reset, bool) \
                and 0 < reset < 2**33:
            out[name[:40]] = (float(used) / 100.0, datetime.fromtimestamp(reset, UTC))
    return out


def session_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A ``session`` report's record fields, each checked (they come from a worker)."""
    out: dict[str, Any] = {}
    session, transcript = fields.get("session_id"), fields.get("transcript_path")
    if isinstance(session, str) and SESSION_ID_RE.fullmatch(session):
        out["session_id"] = session
    if isinstance(transcript, str) and transcript.startswith("/") and "\x00" not in transcript:
        out["transcript"] = transcript[:1000]
    return out
