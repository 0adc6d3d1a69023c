"""What goes into tmux commands and what comes out: escaping, parsing, and how a failed
tmux command reads (its errors).

Pure functions and plain data, so tmux's argument quirks (a trailing ``;``,
``#{…}`` expansion, control characters typed into a pane, a 16 kB command
limit) and the meaning of its failures ("no server running" is an answer, not
an error) are handled and tested in one place without a tmux server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from ralph_dev.adapters.process import CommandResult, show_argv
from ralph_dev.core.errors import CommandError
from ralph_dev.core.model import CONTROLLER_WINDOW, Window, check_identifier

SEND_CHUNK_BYTES = 2_000
"""UTF-8 bytes per ``send-keys -l`` call; tmux refuses commands near 16 kB."""

TARGET_RE = re.compile(r"[@%][0-9]{1,9}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

ABSENT_MARKERS = (
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

SEP = "\t"
LIST_FORMAT = SEP.join(
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

class TmuxError(CommandError):
    """A tmux command failed; carries the (redacted) argv, stderr and exit code."""


class TmuxServerGone(TmuxError):
    """The tmux server (or the session) went away while a command ran: a person's
    `tmux kill-server`, a crash, a reboot. No fault of what was asked of it."""


class TmuxNotFound(TmuxError):
    """The tmux binary is missing."""


class TmuxInputError(TmuxError, ValueError):
    """ralph-dev was asked to do something unsafe or impossible (bad name, target…)."""


def is_absent(result: CommandResult) -> bool:
    """True when the failure only says a server/session/window/pane is missing."""
    return not result.ok and any(marker in result.stderr for marker in ABSENT_MARKERS)


def tmux_failure(result: CommandResult, fix: str = "") -> TmuxError:
    """How a failed tmux command reads: tmux missing, tmux hung (a wedged server), or
    tmux's own refusal, naming the command (``-e`` values redacted) and tmux's words."""
    shown = show_argv(result.argv)
    stderr = result.stderr.strip()
    more = f"; {fix}" if fix else ""
    if result.returncode == 127 and not result.timed_out:
        return TmuxNotFound(
            f"tmux is not installed (looked for {result.argv[0]!r} on PATH): "
            f"install tmux 3.3 or newer{more}",
            command=result.argv, stderr=stderr, returncode=result.returncode)
    if result.timed_out:
        return TmuxError(
            f"tmux {stderr.splitlines()[-1]}: {shown}; the tmux server may be wedged "
            f"(check `tmux ls`){more}",
            command=result.argv, stderr=stderr, returncode=result.returncode)
    return TmuxError(
        f"tmux command failed ({result.how_it_ended}): {shown}: "
        f"{stderr or 'no error message'}{more}",
        command=result.argv, stderr=stderr, returncode=result.returncode)


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
    if not isinstance(target, str) or not TARGET_RE.fullmatch(target):
        raise TmuxInputError(
            f"{target!r} is not a tmux window or pane id: pass Window.window_id (@N) "
            "or Window.pane_id (%N) from list_windows()/find(), not a window name"
        )
    return target


def environment_args(environment: Mapping[str, str]) -> list[str]:
    args: list[str] = []
    for key, value in environment.items():
        if not ENV_NAME_RE.fullmatch(key):
            raise TmuxInputError(f"environment variable name {key!r} is not valid")
        if "\0" in value:
            raise TmuxInputError(f"environment variable {key} holds a NUL byte")
        args += ["-e", f"{key}={value}"]
    return args


def as_int(text: str) -> int | None:
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
        parts = line.split(SEP, 8)
        if len(parts) != 9:
            continue
        window_id, pane_id, dead, status, signal, pid, activity, command, name = parts
        if not TARGET_RE.fullmatch(window_id) or not TARGET_RE.fullmatch(pane_id):
            continue
        alive = dead != "1"
        exit_status = as_int(status) if not alive else None
        if not alive and exit_status is None and as_int(signal) is not None:
            exit_status = 128 + (as_int(signal) or 0)
        seconds = as_int(activity)
        window = Window(
            name=name,
            pane_id=pane_id,
            window_id=window_id,
            alive=alive,
            exit_status=exit_status,
            command=command,
            pid=as_int(pid),
            last_activity=datetime.fromtimestamp(seconds, UTC) if seconds else None,
        )
        pane_number = int(pane_id[1:])
        known = by_window.get(window_id)
        if known is None:
            order.append(window_id)
        if known is None or pane_number < known[0]:
            by_window[window_id] = (pane_number, window)
    return [by_window[w][1] for w in order]


