"""The tmux adapter: the only place ralph-dev talks to tmux.

tmux is the source of truth for processes: which worker windows exist, whether
their command still runs, and how it ended. Everything here goes through one
subprocess site (:meth:`Tmux.run`, via libtmux's ``Server.cmd``) so that
timeouts, error reporting, secret
redaction and tmux's own argument quirks are handled once.

Traps this module exists to absorb (all checked against tmux 3.3a):

* tmux splits its argv at any argument that *ends* with ``;`` (``send-keys -l
  'ls;'`` types ``ls`` and starts a new, empty command). :func:`escape_arg`
  turns a trailing ``;`` into ``\\;``, which tmux turns back into ``;``.
* ``-t NAME`` matches session names by prefix (``ralph-a`` finds
  ``ralph-ab``); sessions are targeted as ``=NAME`` (``=NAME:`` where tmux
  expects a window, as ``list-panes -s`` does), except by ``set-option``, which
  does not understand ``=`` and gets the session's ``$id``.
* ``-c DIR`` and the ``pipe-pane`` command are format-expanded (``#{…}``), and
  a missing ``-c`` directory silently falls back to another one: ``#`` is
  doubled and the directory is checked first.
* A window whose command exits before ``remain-on-exit`` is set vanishes with
  its exit status. Windows are therefore born running a harmless placeholder,
  configured, and only then respawned with the real command.
* ``new-window``/``respawn-pane`` with several argv words exec them directly
  (no shell); a single word goes through ``default-shell -c``. Commands are
  always passed as words, and a one-word command gets ``env --`` in front, so
  no shell (sh, zsh, fish…) ever interprets any of it.
* ``send-keys -l`` sends text literally, but the bytes still reach the pane's
  terminal: a raw ``\\x03`` is Ctrl-C to the line discipline and ``ESC``
  interrupts Claude Code. :func:`sanitize_text` makes control characters
  visible instead. Text goes in chunks because one tmux command is limited to
  about 16 kB ("command too long").
* Programs may rename their window through escape sequences if a person's
  tmux.conf allows it; ralph-dev's windows get ``allow-rename off`` and
  ``automatic-rename off`` so their identifier names stay put.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import libtmux
import structlog
from libtmux import exc as libtmux_exc

from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import CONTROLLER_WINDOW, Window, check_identifier

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings

log = structlog.get_logger(__name__)

HOME_WINDOW = "ralph-home"
"""Name of a new session's first window: an idle shell for a person who
attaches. Lower case, so it can never be mistaken for an issue identifier."""

HISTORY_LIMIT = 50_000
DEFAULT_TIMEOUT = 15.0
"""Seconds before a tmux command counts as hung (a wedged server must not
freeze the controller forever)."""

SEND_CHUNK_BYTES = 2_000
"""UTF-8 bytes per ``send-keys -l`` call; tmux refuses commands near 16 kB."""

_SESSION_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,79}")
_TARGET_RE = re.compile(r"[@%][0-9]{1,9}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_ABSENT_MARKERS = (
    "no server running",
    "error connecting to",
    "can't find session",
    "can't find window",
    "can't find pane",
    "no current session",
    "no current target",
    "server exited unexpectedly",  # asked while the server shuts down (last session gone)
    "lost server",
)
"""stderr fragments meaning "the thing is not there", as opposed to a failure."""

_SEP = "\t"
_LIST_FORMAT = _SEP.join(
    (
        "#{window_id}",
        "#{pane_id}",
        "#{pane_dead}",
        "#{pane_dead_status}",
        "#{pane_dead_signal}",
        "#{pane_pid}",
        "#{window_activity}",
        "#{pane_current_command}",
        "#{window_name}",  # last: a person's window name may hold anything
    )
)
_PLACEHOLDER = ("sleep", "86400")


class TmuxError(RalphError):
    """A tmux command failed; carries the (redacted) argv, stderr and exit code."""

    def __init__(
        self,
        message: str,
        *,
        command: Sequence[str] = (),
        stderr: str = "",
        returncode: int | None = None,
    ) -> None:
        super().__init__(message)
        self.command = list(command)
        self.stderr = stderr
        self.returncode = returncode


class TmuxNotFound(TmuxError):
    """The tmux binary is missing."""


class TmuxInputError(TmuxError, ValueError):
    """ralph-dev was asked to do something unsafe or impossible (bad name, target…)."""


@dataclass(frozen=True)
class TmuxResult:
    """One tmux invocation: the argv (secrets redacted) and what it printed."""

    argv: tuple[str, ...]
    returncode: int
    stdout: list[str]
    stderr: list[str]

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def absent(self) -> bool:
        """True when the failure only says a server/session/window/pane is missing."""
        text = "\n".join(self.stderr)
        return not self.ok and any(marker in text for marker in _ABSENT_MARKERS)

    def check(self) -> TmuxResult:
        """Return self, or raise :class:`TmuxError` naming the command and tmux's words."""
        if self.ok:
            return self
        stderr = "\n".join(self.stderr).strip()
        raise TmuxError(
            f"tmux command failed (exit {self.returncode}): {_show(self.argv)}: "
            f"{stderr or 'no error message'}",
            command=self.argv,
            stderr=stderr,
            returncode=self.returncode,
        )


# --- pure helpers ------------------------------------------------------------------


def escape_arg(arg: str) -> str:
    """Keep tmux from reading a trailing ``;`` as a command separator."""
    if arg.endswith(";"):
        return arg[:-1] + "\\;"
    return arg


def escape_format(text: str) -> str:
    """Make text safe where tmux expands ``#{…}`` formats (``-c``, ``pipe-pane``)."""
    return text.replace("#", "##")


def sanitize_text(text: str) -> str:
    """Text as it may be typed into a pane: no byte of it acts as a control key.

    Newlines are kept (LF is a newline inside a prompt, never Enter, which is a
    CR); CR/CRLF become LF; tabs become spaces; every other C0 control, DEL
    and C1 control becomes a visible stand-in (``␛``, ``␃``, …), so ANSI
    escapes, Ctrl-C or Ctrl-D in issue text cannot interrupt, end or steer the
    program reading the pane.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    out = []
    for ch in text:
        code = ord(ch)
        if ch == "\n" or (0x20 <= code < 0x7F) or code > 0x9F:
            out.append(ch)
        elif code < 0x20:
            out.append(chr(0x2400 + code))
        elif code == 0x7F:
            out.append("\u2421")
        else:
            out.append("\ufffd")
    return "".join(out)


def chunk_text(text: str, limit: int = SEND_CHUNK_BYTES) -> list[str]:
    """Split text into pieces of at most ``limit`` UTF-8 bytes, never inside a character."""
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for ch in text:
        width = len(ch.encode("utf-8"))
        if current and size + width > limit:
            chunks.append("".join(current))
            current, size = [], 0
        current.append(ch)
        size += width
    if current:
        chunks.append("".join(current))
    return chunks


def check_window_name(name: str) -> str:
    """Window names ralph-dev creates: an issue identifier or the controller."""
    if name == CONTROLLER_WINDOW:
        return name
    return check_identifier(name)


def check_target(target: str) -> str:
    """Targets are tmux's unique ids (``@3`` window, ``%5`` pane), never names."""
    if not isinstance(target, str) or not _TARGET_RE.fullmatch(target):
        raise TmuxInputError(
            f"{target!r} is not a tmux window or pane id: pass Window.window_id (@N) "
            "or Window.pane_id (%N) from list_windows()/find(), not a window name"
        )
    return target


def _check_environment(environment: Mapping[str, str]) -> list[str]:
    args: list[str] = []
    for key, value in environment.items():
        if not _ENV_NAME_RE.fullmatch(key):
            raise TmuxInputError(f"environment variable name {key!r} is not valid")
        if "\0" in value:
            raise TmuxInputError(f"environment variable {key} holds a NUL byte")
        args += ["-e", f"{key}={value}"]
    return args


def _redact(argv: Sequence[str]) -> tuple[str, ...]:
    """argv with environment values hidden: they may carry API keys."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(arg.split("=", 1)[0] + "=<redacted>")
            hide_next = False
        else:
            out.append(arg)
            hide_next = arg == "-e"
    return tuple(out)


def _show(argv: Sequence[str], limit: int = 300) -> str:
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def parse_panes(lines: Sequence[str]) -> list[Window]:
    """Windows from ``list-panes`` lines; one entry per window (its first pane).

    A window a person split has several panes: the worker's is the oldest
    (lowest ``%N``), so that one stands for the window. Malformed lines are
    skipped, not fatal.

    A pane can be dead with ``exit_status=None``: tmux saw its terminal close
    but has not reaped the process (yet).
    """
    by_window: dict[str, tuple[int, Window]] = {}
    order: list[str] = []
    for line in lines:
        parts = line.split(_SEP, 8)
        if len(parts) != 9:
            continue
        window_id, pane_id, dead, status, signal, pid, activity, command, name = parts
        if not _TARGET_RE.fullmatch(window_id) or not _TARGET_RE.fullmatch(pane_id):
            continue
        alive = dead != "1"
        exit_status = _int(status) if not alive else None
        if not alive and exit_status is None and _int(signal) is not None:
            exit_status = 128 + (_int(signal) or 0)
        seconds = _int(activity)
        window = Window(
            name=name,
            pane_id=pane_id,
            window_id=window_id,
            alive=alive,
            exit_status=exit_status,
            command=command,
            pid=_int(pid),
            last_activity=datetime.fromtimestamp(seconds, UTC) if seconds else None,
        )
        pane_number = int(pane_id[1:])
        known = by_window.get(window_id)
        if known is None:
            order.append(window_id)
        if known is None or pane_number < known[0]:
            by_window[window_id] = (pane_number, window)
    return [by_window[w][1] for w in order]


# --- the adapter -------------------------------------------------------------------


class Tmux:
    """One ralph-dev session on one tmux server (the user's, or a ``-L`` socket)."""

    def __init__(
        self,
        session: str,
        socket_name: str | None = None,
        *,
        tmux_bin: str = "tmux",
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if not _SESSION_RE.fullmatch(session):
            raise TmuxInputError(
                f"{session!r} is not a usable tmux session name: "
                "use letters, digits, '-', '_' (no ':' or spaces)"
            )
        if socket_name is not None and not _SESSION_RE.fullmatch(socket_name):
            raise TmuxInputError(
                f"{socket_name!r} is not a usable tmux socket name (setting tmux_socket / "
                "RALPH_DEV_TMUX_SOCKET): use letters, digits, '-', '_', '.'"
            )
        self.session = session
        self.socket_name = socket_name
        self.tmux_bin = tmux_bin
        self.timeout = timeout
        resolved = shutil.which(tmux_bin) or tmux_bin
        self._server = libtmux.Server(socket_name=socket_name, tmux_bin=resolved)

    @classmethod
    def from_settings(cls, settings: ProjectSettings) -> Tmux:
        return cls(settings.session_name, settings.tmux_socket)

    def __repr__(self) -> str:
        return f"Tmux(session={self.session!r}, socket_name={self.socket_name!r})"

    @property
    def _session_target(self) -> str:
        return f"={self.session}"

    # The one subprocess site.
    def run(self, *args: str, timeout: float | None = None) -> TmuxResult:
        """Run one tmux command (or several joined by :meth:`run_many`); never raises
        for tmux's own failures — call :meth:`TmuxResult.check` for that."""
        return self._invoke([escape_arg(a) for a in args], timeout=timeout)

    def run_many(self, *commands: Sequence[str]) -> TmuxResult:
        """Several tmux commands in ONE invocation: tmux runs them back to back,
        before it reaps any child, which is what makes window creation race-free."""
        argv: list[str] = []
        for command in commands:
            if argv:
                argv.append(";")
            argv += [escape_arg(a) for a in command]
        return self._invoke(argv)

    def _invoke(self, args: list[str], *, timeout: float | None = None) -> TmuxResult:
        """Run tmux through libtmux (``Server.cmd``), bounded by a timeout.

        libtmux waits on its tmux client without a limit, and a wedged tmux server
        must not freeze the controller: the call runs on a short-lived thread and
        the caller stops waiting after ``timeout`` (a hung client thread is left to
        finish on its own; it holds nothing of ours).
        """
        shown = [self.tmux_bin, *(["-L", self.socket_name] if self.socket_name else []), *args]
        shown = _redact(shown)
        limit = timeout or self.timeout
        outcome: list[object] = []

        def call() -> None:
            try:
                outcome.append(self._server.cmd(*args))
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=call, name="tmux-cmd", daemon=True)
        worker.start()
        worker.join(limit)
        if not outcome:
            raise TmuxError(
                f"tmux did not answer within {limit:.0f}s: {_show(shown)}; "
                "the tmux server may be wedged (check `tmux ls`)",
                command=shown,
                stderr="timeout",
            )
        answer = outcome[0]
        if isinstance(answer, libtmux_exc.TmuxCommandNotFound | FileNotFoundError):
            raise TmuxNotFound(
                f"tmux is not installed (looked for {self.tmux_bin!r} on PATH): "
                "install tmux 3.3 or newer",
                command=shown,
            ) from answer
        if isinstance(answer, BaseException):
            raise answer
        result = TmuxResult(
            argv=shown,
            returncode=answer.returncode,
            stdout=list(answer.stdout),
            stderr=list(answer.stderr),
        )
        if not result.ok:
            log.debug("tmux_failed", argv=_show(shown), stderr=" ".join(result.stderr)[:300])
        return result

    # --- liveness ------------------------------------------------------------------

    def server_alive(self) -> bool:
        result = self.run("list-sessions", "-F", "#{session_id}")
        if result.ok:
            return True
        if result.absent:
            return False
        result.check()
        return False  # unreachable: check() raised

    def session_exists(self) -> bool:
        result = self.run("has-session", "-t", self._session_target)
        if result.ok:
            return True
        if result.absent:
            return False
        result.check()
        return False

    def ensure_session(self, cwd: Path, environment: Mapping[str, str]) -> None:
        """Create the session if it is missing; an existing one is left as it is.

        Its first window, :data:`HOME_WINDOW`, is an idle shell for a person who
        attaches; ralph-dev's own windows are opened next to it.
        """
        if self.session_exists():
            return
        cwd = _check_dir(cwd)
        result = self.run(
            "new-session", "-d", "-s", self.session, "-n", HOME_WINDOW,
            "-x", "200", "-y", "50", "-c", escape_format(str(cwd)),
            *_check_environment(environment), "-P", "-F", "#{session_id}",
        )
        if not result.ok and "duplicate session" in "\n".join(result.stderr):
            return  # someone else created it meanwhile: already as wanted
        session_id = result.check().stdout[0] if result.stdout else self.session
        # set-option does not understand `=NAME`, so the new session's $id is the target;
        # panes take the limit when they are created: every ralph-dev window gets it.
        self.run_many(
            ["set-option", "-t", session_id, "history-limit", str(HISTORY_LIMIT)],
            # a person's tmux.conf may destroy detached sessions; this one runs detached
            ["set-option", "-t", session_id, "destroy-unattached", "off"],
        ).check()
        log.info("tmux_session_created", session=self.session, socket=self.socket_name)

    def kill_session(self) -> None:
        result = self.run("kill-session", "-t", self._session_target)
        if not result.ok and not result.absent:
            result.check()

    # --- windows -------------------------------------------------------------------

    def list_windows(self) -> list[Window]:
        """Every window of the session with liveness, in ONE tmux call; [] if absent."""
        # `=NAME:` (with the colon): list-panes reads a bare `=NAME` as a window and
        # then falls back to prefix matching, listing `NAME-other`'s panes.
        listing = ["list-panes", "-s", "-t", f"{self._session_target}:", "-F", _LIST_FORMAT]
        result = self.run(*listing)
        if result.absent:
            return []
        windows = parse_panes(result.check().stdout)
        if any(not w.alive and w.exit_status is None for w in windows):
            # tmux 3.3a sometimes misses the SIGCHLD of a command that exits within
            # milliseconds: the pane is dead, its process a zombie, its status unknown
            # until some other child of the server exits. `run-shell true` is such a
            # child, and tmux waits for it, so the listing after it has the status.
            again = self.run_many(["run-shell", "true"], listing)
            if again.ok:
                windows = parse_panes(again.stdout)
        return windows

    def find(self, name: str) -> list[Window]:
        """Windows called ``name``; a list, since a person may open a duplicate."""
        return [w for w in self.list_windows() if w.name == name]

    def open_window(
        self,
        name: str,
        *,
        cwd: Path,
        command: Sequence[str],
        environment: Mapping[str, str],
        log_file: Path | None = None,
    ) -> Window:
        """Open window ``name`` running ``command`` (argv words, never a shell line).

        The pane gets exactly ``environment`` on top of the server's (pass PATH:
        panes otherwise get the server's PATH from when it started), keeps
        showing after its command ends (``remain-on-exit``, so liveness and exit
        status stay readable), and copies its output to ``log_file``. On any
        failure the half-made window is killed before the error is raised.
        """
        check_window_name(name)
        cwd = _check_dir(cwd)
        words = [str(w) for w in command]
        if not words or not words[0]:
            raise TmuxInputError(f"window {name}: empty command")
        if len(words) == 1:
            words = ["env", "--", *words]  # one word would go through `sh -c`
        env_args = _check_environment(environment)
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
        created = self.run(
            "new-window", "-d", "-t", f"{self._session_target}:", "-n", name,
            "-c", escape_format(str(cwd)), "-P", "-F", "#{window_id} #{pane_id}",
            "--", *_PLACEHOLDER,
        )
        if created.absent:
            raise TmuxError(
                f"cannot open window {name}: tmux session {self.session!r} does not exist "
                "(ralph-dev creates it when the daemon starts; run `ralph-dev start`)",
                command=created.argv,
                stderr="\n".join(created.stderr),
                returncode=created.returncode,
            )
        created.check()
        try:
            window_id, pane_id = [*created.stdout[0].split(), "", ""][:2]
            check_target(window_id)
            check_target(pane_id)
        except (IndexError, TmuxInputError) as exc:
            raise TmuxError(
                f"tmux new-window printed {created.stdout!r}, not a window and pane id",
                command=created.argv,
            ) from exc
        try:
            steps: list[list[str]] = [
                ["set-option", "-w", "-t", window_id, "remain-on-exit", "on"],
                ["set-option", "-w", "-t", window_id, "allow-rename", "off"],
                ["set-option", "-w", "-t", window_id, "automatic-rename", "off"],
                ["respawn-pane", "-k", "-t", pane_id, "-c", escape_format(str(cwd)),
                 *env_args, "--", *words],
            ]
            if log_file is not None:
                pipe = "cat >> " + shlex.quote(str(log_file))
                steps.append(["pipe-pane", "-t", pane_id, escape_format(pipe)])
            steps.append(["display-message", "-p", "-t", pane_id, "#{pane_pid}"])
            started = self.run_many(*steps).check()
        except BaseException:
            self.kill_window(window_id)
            raise
        pid = _int(started.stdout[-1]) if started.stdout else None
        log.info("tmux_window_opened", window=name, window_id=window_id, pane_id=pane_id,
                 pid=pid)
        return Window(
            name=name,
            pane_id=pane_id,
            window_id=window_id,
            alive=True,
            command=Path(str(command[0])).name,
            pid=pid,
            last_activity=datetime.now(UTC),
        )

    def kill_window(self, target: str) -> None:
        """Kill a window by id (a pane id kills its window); already gone is fine."""
        result = self.run("kill-window", "-t", check_target(target))
        if not result.ok and not result.absent:
            result.check()

    # --- pane I/O --------------------------------------------------------------------

    def capture(self, target: str, lines: int = 40) -> str:
        """The last ``lines`` non-blank-tail lines of the pane, as plain text."""
        lines = max(1, int(lines))
        result = self.run(
            "capture-pane", "-p", "-J", "-t", check_target(target), "-S", f"-{lines}"
        ).check()
        text = [line.rstrip() for line in result.stdout]
        while text and not text[-1]:
            text.pop()
        return "\n".join(text[-lines:])

    def output_hash(self, target: str, lines: int = 40) -> str:
        """A digest of the pane tail: unchanged for long = a silent worker."""
        return hashlib.sha256(self.capture(target, lines).encode("utf-8")).hexdigest()

    def send_text(
        self, target: str, text: str, *, submit: bool = True, submit_delay: float = 0.15
    ) -> None:
        """Type ``text`` into a pane literally, then press Enter.

        Only ``send-keys -l`` carries the text, so nothing in it is read as a
        key name; control characters are made visible first
        (:func:`sanitize_text`). A pane a person left in copy mode is taken out
        of it, or the text would drive copy mode instead. The pause before
        Enter lets agent TUIs that treat a fast burst as a paste finish it, so
        Enter submits rather than adding a line.
        """
        target = check_target(target)
        chunks = chunk_text(sanitize_text(text))
        first = ["copy-mode", "-q", "-t", target]
        if chunks:
            self.run_many(first, ["send-keys", "-t", target, "-l", "--", chunks[0]]).check()
        else:
            self.run(*first).check()
        for chunk in chunks[1:]:
            self.run("send-keys", "-t", target, "-l", "--", chunk).check()
        if submit:
            if submit_delay > 0 and chunks:
                time.sleep(submit_delay)
            self.run("send-keys", "-t", target, "Enter").check()


def _check_dir(path: Path) -> Path:
    """tmux silently starts in another directory when ``-c`` is missing: refuse instead."""
    path = Path(path)
    if not path.is_absolute():
        path = Path.cwd() / path
    if not path.is_dir():
        raise TmuxInputError(f"{path} is not a directory: a tmux window cannot start there")
    return path


def tmux_available(tmux_bin: str = "tmux") -> bool:
    return shutil.which(tmux_bin) is not None
