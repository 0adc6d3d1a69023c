"""A pane's log read as a terminal would show it (pyte, a terminal emulator).

A worker's pane log is what its program wrote to the terminal. Claude Code moves
the cursor and redraws its screen, so stripping escape sequences leaves text glued
together ("Tipsforgettingstarted│") or a spinner glyph. Replaying the bytes through
an emulator of the pane's size gives the lines a person saw: those that scrolled off
the top, then the screen as it was last drawn.
"""

from __future__ import annotations

from pathlib import Path

import pyte

COLUMNS, ROWS = 200, 50
"""The size ralph-dev gives every worker's window (``tmux new-window -x/-y``)."""
HISTORY = 5000
_FRAME = frozenset("─━│┃╭╮╯╰┌┐└┘├┤┬┴┼═║╔╗╚╝ ")


def _text(line: dict[int, pyte.screens.Char], columns: int) -> str:
    return "".join(line[x].data for x in range(columns)).rstrip()


class Replay:
    """A pane replayed through an emulator, fed as its log grows (``logs --follow``)."""

    def __init__(self, columns: int = COLUMNS, rows: int = ROWS) -> None:
        self.columns = columns
        self.screen = _Scrolling(columns, rows, history=HISTORY)
        self.stream = pyte.ByteStream(self.screen)

    def feed(self, data: bytes) -> list[str]:
        """The lines that scrolled off the top while ``data`` was drawn."""
        self.stream.feed(data)
        scrolled, self.screen.scrolled = self.screen.scrolled, []
        return [_text(line, self.columns) for line in scrolled]

    def shown(self) -> list[str]:
        """The screen as it is drawn now, trailing blank lines dropped."""
        lines = [text.rstrip() for text in self.screen.display]
        while lines and not lines[-1].strip():
            lines.pop()
        return lines


class _Scrolling(pyte.HistoryScreen):
    """Remembers each line that scrolls off the top, in order."""

    def __init__(self, columns: int, rows: int, history: int) -> None:
        super().__init__(columns, rows, history=history)
        self.scrolled: list[dict[int, pyte.screens.Char]] = []

    def index(self) -> None:
        top, bottom = self.margins or pyte.screens.Margins(0, self.lines - 1)
        if self.cursor.y == bottom:
            self.scrolled.append(self.buffer[top])
        super().index()


def render(data: bytes, columns: int = COLUMNS, rows: int = ROWS) -> list[str]:
    """The lines a terminal of that size shows after ``data``: scrolled-off lines,
    then the screen; trailing blank lines dropped."""
    replay = Replay(columns, rows)
    return replay.feed(data) + replay.shown()


def render_tail(path: Path, max_bytes: int = 65536) -> list[str]:
    """The end of a pane log, rendered (empty when there is no log)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return []
    return render(data)


def last_words(lines: list[str], width: int = 100) -> str:
    """What the worker did last, for status' LAST OUTPUT: Claude Code's last message or
    tool call (its ``●`` lines) when there is one, else the last line with words in it
    (not a box's frame)."""
    said = [line for line in lines if line.lstrip().startswith("● ")]
    for line in reversed(said or lines):
        text = " ".join(line.split())
        if text and not set(text) <= _FRAME:
            return text.strip("│┃║ ")[:width]
    return ""
