"""An agent CLI that prints its work as JSON events, supervised from its pane.

Codex (``codex exec --json``) and Gemini CLI (``gemini --output-format stream-json``)
have no hooks that fire while they work the way Claude Code's do, and both end their
process with their turn. Each prints one event per line instead of its screen. What
reading such a stream needs is the same for both and lives here: the CLI runs as this
process's child (its prompt on its stdin when it reads it there), each event is shown
in the pane as a line a person can read, signals reach the CLI, and the controller is
told through the worker's mailbox (``adapters.mailbox``) without ever stopping the CLI
or its pane when the telling fails. What each CLI's events mean is its parser's
(``inpane.codex_exec``, ``inpane.gemini_exec``).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Protocol

from ralph_dev.adapters import mailbox as ch
from ralph_dev.core.errors import RalphError
from ralph_dev.core.questions import asked_question
from ralph_dev.inpane.asking import ask_person, reported, say
from ralph_dev.inpane.children import start_child
from ralph_dev.inpane.worker import Worker, clean_text, current_worker, one_line

TELL_ERRORS = (ch.ChannelError, ch.ReportRefused, RalphError, OSError)
"""What telling the controller may raise: none of it stops the CLI or its pane."""


class Teller:
    """The pane's and the controller's ends of one supervised run."""

    def __init__(self, worker: Worker | None, out: IO[str], prefix: str) -> None:
        self.worker = worker
        self.out = out
        self.prefix = prefix
        self._lock = threading.Lock()  # stdout's and stderr's readers both show lines

    def tell(self, kind: str, fields: dict[str, Any]) -> None:
        if self.worker is not None:
            with contextlib.suppress(*TELL_ERRORS):  # the controller hears the outbox later
                ch.tell(self.worker.run_dir, kind, fields)

    def say(self, doing: str, *, active: bool) -> None:
        if self.worker is not None:
            with contextlib.suppress(*TELL_ERRORS):
                say(self.worker, doing, active=active)

    def show(self, line: str) -> None:
        with self._lock:
            self.out.write(f"{self.prefix}: {line}\n")
            self.out.flush()

    def event(self, line: str) -> dict[str, Any] | None:
        """One line of the CLI's stdout as its event; anything else is shown as it is."""
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict):
            return event
        if line.strip():
            self.show(one_line(clean_text(line), 300))
        return None

    def ask_if_asked(self, last_message: str, how: str) -> None:
        """A turn that ended asking a person something, with no report of its own: the
        question goes on the issue as ``worker blocked`` puts it (``inpane.asking``); the
        person's answer starts this session again (its CLI's resume)."""
        question = asked_question(last_message)
        if question is None or self.worker is None:
            return
        with contextlib.suppress(*TELL_ERRORS):  # refused, or its run dir unreadable
            if reported(self.worker) is None:
                ask_person(self.worker, question, how)


class Events(Protocol):
    """One CLI's parser: each stdout line, then its exit status."""

    def take(self, line: str) -> None: ...

    def ended(self, status: int) -> None: ...


def this_worker(environ: Mapping[str, str]) -> Worker | None:
    """The worker this pane runs; None when its run dir is unreadable (the CLI still
    runs, unsupervised)."""
    try:
        return current_worker(environ)
    except RalphError:
        return None


def run_stream(argv: Sequence[str], events: Events, *, stdin_text: str | None = None,
               on_stderr: Callable[[str], None] | None = None) -> int:
    """Run the CLI (``argv``), feed each line it prints to ``events``, and return its exit
    status. ``stdin_text``: its prompt, written to its stdin (else it reads nothing
    there). ``on_stderr``: each line it prints on stderr, which then is the caller's to
    show; else stderr goes to the pane as it is."""
    child = start_child(
        argv, stdout=subprocess.PIPE, text=True, encoding="utf-8", errors="replace",
        stdin=subprocess.DEVNULL if stdin_text is None else subprocess.PIPE,
        stderr=None if on_stderr is None else subprocess.PIPE)
    if child is None:
        return 127
    if stdin_text is not None:
        assert child.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it died before reading: its status says
            child.stdin.write(stdin_text)
        with contextlib.suppress(BrokenPipeError):
            child.stdin.close()
    errors: threading.Thread | None = None
    if on_stderr is not None:
        assert child.stderr is not None
        errors = threading.Thread(target=_each_line, args=(child.stderr, on_stderr),
                                  name="stderr", daemon=True)
        errors.start()
    assert child.stdout is not None
    for line in child.stdout:
        events.take(line)
    status = child.wait()
    if errors is not None:
        errors.join(timeout=5)
    events.ended(status)
    return status


def _each_line(stream: IO[str], take: Callable[[str], None]) -> None:
    for line in stream:
        with contextlib.suppress(Exception):  # a line it could not read is no reason to stop
            take(line)


def split_prompt(argv: Sequence[str]) -> tuple[list[str], str]:
    """``CLI_ARGV... -- PROMPT`` (the launcher appends the prompt as the last word, behind
    a ``--``) as the CLI's argv and its prompt, for a CLI that reads it on stdin."""
    words = list(argv)
    if len(words) >= 2 and words[-2] == "--":
        return words[:-2], words[-1]
    return words, ""
