"""Make text from outside safe and readable to show again: on a person's terminal
(:func:`for_terminal`, :func:`terminal_line`), in comments and logs (:func:`strip_ansi`)."""

from __future__ import annotations

import re
import unicodedata

# CSI (ESC [ … final), OSC (ESC ] … BEL/ST), other escapes (ESC, intermediates, a
# final: a charset's designation, a saved cursor), and C0/C1
# controls except newline and tab: what pipe-pane logs and issue text may carry.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b[ -/]*[0-~]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def strip_ansi(text: str) -> str:
    """Remove escape sequences and control characters; turn CR-overwrites into lines."""
    text = _ANSI.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text)


def for_terminal(text: str) -> str:
    """Text from outside ralph-dev (tracker titles, comments, labels, questions, names,
    agents' output) as a person's terminal may show it: the one sanitizer every line
    ralph-dev prints goes through.

    A terminal obeys escape sequences in what it prints (``ESC ] 0 ; … BEL`` retitles
    it, others move the cursor, clear the screen or fake lines), so no character of
    ``text`` may act: C0 controls and DEL become their visible pictures (``␛``, ``␇``),
    so the person sees that an issue holds them; C1 controls and other invisible
    characters (bidi overrides, zero-width ones) become ``�``; odd spaces a space.
    Newlines stay (CR and CRLF become one); tabs become four spaces."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    out = []
    for ch in text:
        if ch == "\n" or ch.isprintable():
            out.append(ch)
        elif ch < " ":
            out.append(chr(0x2400 + ord(ch)))
        elif ch == "\x7f":
            out.append("\u2421")
        elif unicodedata.category(ch) == "Zs":
            out.append(" ")
        else:
            out.append("\ufffd")
    return "".join(out)


def terminal_line(text: str, limit: int | None = None) -> str:
    """:func:`for_terminal` for one line (a title, a label, a name): its line breaks become
    spaces, so nothing it holds can add a line of its own to what ralph-dev prints;
    ``limit`` characters at most."""
    line = for_terminal(text).replace("\n", " ").strip()
    if limit is not None and len(line) > limit:
        line = line[: limit - 1] + "…"
    return line


def output_block(text: str, lines: int = 40, chars: int = 4000) -> str:
    """A command's output for a Markdown comment: its last lines, cleaned, in a code
    fence longer than any backtick run inside (so the output cannot close it)."""
    kept = "\n".join(strip_ansi(text).rstrip("\n").split("\n")[-lines:])
    kept = (kept if len(kept) <= chars else "…" + kept[-(chars - 1):]) or "(no output)"
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", kept)), default=0) + 1)
    return f"{fence}\n{kept}\n{fence}"


_WORD = re.compile(r"[^\W\d_]{3}")


def last_words(text: str, lines: int = 3, chars: int = 300) -> str:
    """A pane's last lines of words on one line (`` / `` between them), its controls
    removed: what an agent said as it ended. A line without a word (a TUI's redrawn
    spinner, a frame's rule) says nothing."""
    kept: list[str] = []
    for line in reversed(strip_ansi(text).splitlines()):
        if len(kept) < lines and _WORD.search(line):
            kept.insert(0, " ".join(line.split()))
    said = terminal_line(" / ".join(kept))
    return said if len(said) <= chars else "…" + said[-(chars - 1):]


def last_line(text: str, width: int = 100) -> str:
    for line in reversed(strip_ansi(text).splitlines()):
        if line.strip():
            line = line.strip()
            return line if len(line) <= width else line[: width - 1] + "…"
    return ""



