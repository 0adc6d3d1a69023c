"""Gemini CLI's supervisor in its pane: ``gemini --output-format stream-json`` read as it
runs.

Run without a terminal and given its prompt on stdin, Gemini CLI works one turn and
exits, printing one JSON event per line (``inpane.event_stream`` runs it): ``init``
(the session), the agent's ``message`` in pieces, each ``tool_use`` and its
``tool_result``, an ``error`` it went on after, and the ``result`` that ends the turn
(``success``, or ``error`` with the message of what ended it). Its retries of a
refused or failed model call (up to ten, five to thirty seconds apart) it says on stderr
only ("Attempt 2 failed … Retrying after 5519ms"): each is shown in the pane and told as
the model's silence, so a CLI waiting out the API is not taken for hung. The controller
is told what Claude Code's hooks tell it:

* ``session``: the session id and its file (``tmp/<project>/chats/session-*-ID8.jsonl``
  under its ``.gemini``), so a restart resumes it (``--resume ID``);
* ``state`` and ``activity``: what the agent does;
* ``blocked``: a question its turn ended on, when it reported nothing itself;
* ``agent_error``: the error that ended its turn, with the reset it states where one is
  stated ("Suggested retry after 3600s", "Your quota will reset after 1h2m3s") or known
  (a Gemini API key's daily quota resets at midnight Pacific time), so the controller
  pauses until then (``core.agent_faults``).

It exits with Gemini CLI's status: the pane's end is the CLI's end.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any
from zoneinfo import ZoneInfo

from ralph_dev.core.model import AWAITING_MODEL, SESSION_ENDED, SESSION_ID_RE, WORKING
from ralph_dev.inpane.event_stream import Teller, run_stream, split_prompt, this_worker
from ralph_dev.inpane.worker import Worker, clean_text, one_line

DAILY_RESET_ZONE = ZoneInfo("America/Los_Angeles")
"""The Gemini API's requests-per-day quotas reset at midnight Pacific time (its rate-limit
documentation); the CLI says only that the daily quota is used up."""

_AFTER = re.compile(r"(?:retry|reset)\s+(?:after|in)\s+(?=\d)(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m(?!s))?"
                    r"(?:(?P<s>\d+(?:\.\d+)?)s)?(?:(?P<ms>\d+)ms)?", re.IGNORECASE)
_DAILY = re.compile(r"daily quota|PerDay", re.IGNORECASE)
_QUOTA = re.compile(r"quota|exhausted your capacity|RESOURCE_EXHAUSTED|rate limit|\b429\b",
                    re.IGNORECASE)
_NO_ACCESS = re.compile(r"limit:\s*0(?![\d.])|billing|INSUFFICIENT_G1_CREDITS", re.IGNORECASE)
_REFUSED_KEY = re.compile(r"API key not valid|API_KEY_INVALID|PERMISSION_DENIED|UNAUTHENTICATED"
                          r"|\b40[13]\b", re.IGNORECASE)
_RETRY_AFTER = re.compile(r"Retrying after (\d{1,9})\s*ms", re.IGNORECASE)
_RETRY_BACKOFF = re.compile(r"Attempt (\d{1,3}) failed.*Retrying with backoff", re.IGNORECASE)
_FRAME = re.compile(r"\s+at \S.*(?:\(|:\d+:\d+)")
RETRY_WAIT_CAP = 300.0
"""The longest announced wait believed."""
BACKOFF = (5.0, 30.0, 1.3)
"""Gemini CLI's own backoff between tries of a failed call (its ``retryWithBackoff``):
five seconds, doubling, at most thirty, and up to 30% more for jitter."""


def announced_wait(line: str) -> float | None:
    """How long a retry Gemini CLI announces on stderr waits before the call goes out
    again: the wait it states ("Retrying after 5519ms", a quota's), or the longest its
    backoff may take after try N ("Attempt 2 failed with status 500. Retrying with
    backoff"); None for any other line."""
    stated = _RETRY_AFTER.search(line)
    if stated is not None:
        return min(int(stated.group(1)) / 1000, RETRY_WAIT_CAP)
    tried = _RETRY_BACKOFF.search(line)
    if tried is None:
        return None
    first, cap, jitter = BACKOFF
    return float(min(cap, first * 2 ** min(int(tried.group(1)) - 1, 8)) * jitter)


def stated_wait(text: str) -> timedelta | None:
    """The wait a quota error states: "Suggested retry after 3600s.", "Your quota will
    reset after 1h2m3s.", "Please retry in 24.5s."."""
    found = _AFTER.search(text)
    if found is None or not any(found.group(k) for k in ("h", "m", "s", "ms")):
        return None
    return timedelta(hours=int(found["h"] or 0), minutes=int(found["m"] or 0),
                     seconds=float(found["s"] or 0), milliseconds=int(found["ms"] or 0))


def next_daily_reset(now: datetime) -> datetime:
    """The next midnight, Pacific time, after ``now``: when a daily quota lifts."""
    local = now.astimezone(DAILY_RESET_ZONE)
    midnight = datetime(local.year, local.month, local.day, tzinfo=DAILY_RESET_ZONE)
    return (midnight + timedelta(days=1)).astimezone(UTC)


def error_news(message: str, now: datetime) -> dict[str, Any]:
    """The ``agent_error`` report for the error that ended Gemini CLI's turn: its kind (as
    Claude Code's StopFailure names them), its text, and a quota's reset where it is
    stated or known (``reset_at``)."""
    text = one_line(clean_text(message), 300)
    if _NO_ACCESS.search(text):  # no quota at all on this model, or no credit: a person's
        return {"error": "billing_error", "text": text}
    if _REFUSED_KEY.search(text):
        return {"error": "authentication_failed", "text": text}
    if not _QUOTA.search(text):
        return {"error": "server_error", "text": text}
    wait = stated_wait(text)
    reset = now + wait if wait is not None else \
        next_daily_reset(now) if _DAILY.search(text) else None
    news: dict[str, Any] = {"error": "rate_limit", "text": text}
    if reset is not None:
        news["reset_at"] = reset.isoformat()
    return news


class GeminiEvents:
    """What one ``gemini --output-format stream-json`` run said, told to the controller as
    it goes."""

    def __init__(self, worker: Worker | None, gemini_dir: Path | None, out: IO[str]) -> None:
        self.teller = Teller(worker, out, "gemini")
        self.gemini_dir = gemini_dir
        self.session: str | None = None
        self.told_transcript = False
        self.failed: str | None = None
        self.message: list[str] = []
        """The agent's message being streamed (its pieces), shown once it is whole."""
        self.last_message = ""
        """The agent's last whole message of its turn: a question in it goes to a person."""

    def transcript(self) -> Path | None:
        """This session's file under its ``.gemini``, once Gemini CLI wrote it (named by
        the id's first 8 characters: the file's first line names the session whole)."""
        if self.session is None or self.gemini_dir is None:
            return None
        for path in sorted(self.gemini_dir.glob(f"tmp/*/chats/session-*-{self.session[:8]}"
                                                ".jsonl"), reverse=True):
            try:
                with path.open("rb") as file:
                    head = json.loads(file.readline(65536) or b"{}")
            except (OSError, ValueError):
                continue
            if isinstance(head, dict) and head.get("sessionId") == self.session:
                return path
        return None

    def tell_session(self) -> None:
        """The session, and its file once it is there: what a restart resumes."""
        if self.session is None or self.told_transcript:
            return
        path = self.transcript()
        self.told_transcript = path is not None
        self.teller.tell("session", {"session_id": self.session,
                                     "transcript_path": str(path) if path else None})

    def flush_message(self) -> None:
        if self.message:
            self.last_message = "".join(self.message)
            self.message = []
            self.teller.show(one_line(clean_text(self.last_message), 300))

    def take(self, line: str) -> None:
        """One line of Gemini CLI's stdout: an event, or (anything else) shown as it is."""
        event = self.teller.event(line)
        if event is None:
            return
        kind = event.get("type")
        if kind == "message" and event.get("role") == "assistant":
            self.message.append(str(event.get("content", "")))
            return
        self.flush_message()
        if kind == "init":
            said = event.get("session_id")
            if isinstance(said, str) and SESSION_ID_RE.fullmatch(said):
                self.session = said
                self.teller.show(f"session {said}")
                self.teller.say(WORKING, active=True)
            self.tell_session()
        elif kind == "tool_use":
            self.tool_use(event)
        elif kind == "tool_result":
            status = str(event.get("status", ""))
            self.teller.show(f"  {one_line(clean_text(status), 40)}")
            self.teller.tell("activity", {"state": AWAITING_MODEL})
            self.tell_session()  # written by now: a crash from here on resumes from it
        elif kind == "error":
            message = str(event.get("message", ""))
            self.teller.show(f"{event.get('severity', 'error')}: "
                             f"{one_line(clean_text(message), 300)}")
        elif kind == "result":
            self.result(event)

    def tool_use(self, event: Mapping[str, Any]) -> None:
        name = str(event.get("tool_name", ""))
        parameters: Mapping[str, Any] = event["parameters"] \
            if isinstance(event.get("parameters"), dict) else {}
        if name == "run_shell_command":
            self.teller.show(f"$ {one_line(clean_text(str(parameters.get('command', ''))), 200)}")
            self.teller.say("running a command", active=True)
        else:
            self.teller.show(f"{one_line(clean_text(name), 60)}")
            self.teller.say(f"using {one_line(clean_text(name), 60)}", active=True)

    def result(self, event: Mapping[str, Any]) -> None:
        error: Mapping[str, Any] = event["error"] if isinstance(event.get("error"), dict) \
            else {}
        if event.get("status") == "success":
            stats: Mapping[str, Any] = event["stats"] \
                if isinstance(event.get("stats"), dict) else {}
            self.teller.show(f"turn done ({stats.get('input_tokens', '?')} tokens in, "
                             f"{stats.get('output_tokens', '?')} out)")
            return
        self.failed = str(error.get("message", "")) or "unknown error"
        self.teller.show(f"error: {one_line(clean_text(self.failed), 300)}")

    def took_stderr(self, line: str) -> None:
        """A line on its stderr: shown (a stack trace's frames left out). A retry it
        announces is the model's silence, not a hang: told with its wait, so the
        controller counts the retried call's silence from when it goes out
        (``control.loop.intake.quiet_from``)."""
        if line.strip() and not _FRAME.match(line):
            self.teller.show(one_line(clean_text(line), 300))
        wait = announced_wait(line)
        if wait is not None:
            self.teller.tell("activity", {"state": AWAITING_MODEL, "retry_in": round(wait, 1)})

    def ended(self, status: int) -> None:
        """Gemini CLI exited: its session's file is told if it was not yet, and the error
        that ended its turn, if one did."""
        self.flush_message()
        self.tell_session()
        if status != 0 and self.failed is not None:
            self.teller.tell("agent_error", error_news(self.failed, datetime.now(UTC)))
        elif status == 0:
            self.teller.ask_if_asked(self.last_message, "a question ending its Gemini turn")
        self.teller.say(SESSION_ENDED, active=False)


def run(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """Run Gemini CLI (``argv``, ending ``-- PROMPT``: the prompt goes on its stdin, where
    no word of it can be taken for an option) in this pane; its exit status."""
    environ = os.environ if environ is None else environ
    command, prompt = split_prompt(argv)
    if not command:
        print("usage: ralph-dev hook gemini-exec -- GEMINI_ARGV... -- PROMPT", file=sys.stderr)
        return 2
    home = environ.get("GEMINI_CLI_HOME") or environ.get("HOME")
    events = GeminiEvents(this_worker(environ), Path(home) / ".gemini" if home else None,
                          sys.stdout)
    return run_stream(command, events, stdin_text=prompt, on_stderr=events.took_stderr)
