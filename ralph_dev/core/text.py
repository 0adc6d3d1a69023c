"""Make terminal output safe and readable to show again (logs, status, issue context)."""

from __future__ import annotations

import re
from pathlib import Path

# CSI (ESC [ … final), OSC (ESC ] … BEL/ST), other two-byte escapes, and C0/C1
# controls except newline and tab: what pipe-pane logs and issue text may carry.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b[@-Z\\-_]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def strip_ansi(text: str) -> str:
    """Remove escape sequences and control characters; turn CR-overwrites into lines."""
    text = _ANSI.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text)


def output_block(text: str, lines: int = 40, chars: int = 4000) -> str:
    """A command's output for a Markdown comment: its last lines, cleaned, in a code
    fence longer than any backtick run inside (so the output cannot close it)."""
    kept = "\n".join(strip_ansi(text).rstrip("\n").split("\n")[-lines:])
    kept = (kept if len(kept) <= chars else "…" + kept[-(chars - 1):]) or "(no output)"
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", kept)), default=0) + 1)
    return f"{fence}\n{kept}\n{fence}"


def last_line(text: str, width: int = 100) -> str:
    for line in reversed(strip_ansi(text).splitlines()):
        if line.strip():
            line = line.strip()
            return line if len(line) <= width else line[: width - 1] + "…"
    return ""


def file_tail(path: Path, max_bytes: int = 16384) -> str:
    """The end of a file, decoded leniently; empty if it does not exist."""
    try:
        with Path(path).open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
