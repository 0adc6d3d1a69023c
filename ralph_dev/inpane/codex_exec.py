"""Codex CLI's supervisor in its pane: ``codex exec --json`` read as it runs.

Codex has no hooks that fire while it works, and ``codex exec`` ends its process with
its turn. With ``--json`` it prints one event per line instead of its screen: the
session it runs (``thread.started``), each command it starts and ends (``item.*``),
the tokens a turn spent (``turn.completed``), and an error that ended the turn
(``error``, ``turn.failed``: a usage limit, an outage). This runs Codex as its child,
shows each event in the pane as a line a person can read, and tells the controller
what Claude Code's hooks tell it:

* ``session``: the session id and its file (``sessions/…/rollout-*-ID.jsonl``), so a
  restart resumes it (``codex exec resume ID``);
* ``state`` and ``activity``: what the agent does, so its silence is the model's;
* ``blocked``: a question its turn ended on, when it reported nothing itself;
* ``windows``: a ChatGPT plan's 5-hour and weekly windows, which Codex reads from each
  answer's headers and writes to its session file (pacing, ``core.pacing``);
* ``agent_error``: the error that ended its turn. Codex words a usage limit "You've
  hit your usage limit … try again at 2:23 AM" in its own local time; the zone is added
  to that text here, where it is known, so the controller reads the reset exactly as
  the worker's clock meant it (``core.agent_faults.usage_limit_reset``).

It exits with Codex's status: the pane's end is Codex's end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ralph_dev.core.model import AWAITING_MODEL, SESSION_ENDED, SESSION_ID_RE, WORKING
from ralph_dev.inpane.event_stream import TELL_ERRORS, Teller, run_stream, this_worker
from ralph_dev.inpane.hooks import tell_windows
from ralph_dev.inpane.worker import Worker, clean_text, one_line

_AGAIN_AT = re.compile(r"(try again at [^.()]*?\d{1,2}:\d{2}\s*[AP]M)(?!\s*\()", re.IGNORECASE)
_USAGE = re.compile(r"hit your [\w -]*?limit|usage limit", re.IGNORECASE)
_BILLING = re.compile(r"quota exceeded|insufficient_quota|billing", re.IGNORECASE)
_RATE = re.compile(r"rate limit|429|too many requests", re.IGNORECASE)


def local_zone(environ: Mapping[str, str] | None = None) -> str:
    """This process's time zone as an IANA name (Codex prints local times in it)."""
    environ = os.environ if environ is None else environ
    said = environ.get("TZ", "").lstrip(":")
    if said and re.fullmatch(r"[A-Za-z0-9_+\-/]{1,64}", said) and not said.startswith("/"):
        return said
    with contextlib.suppress(OSError):
        target = str(Path(said if said.startswith("/") else "/etc/localtime").readlink())
        if "zoneinfo/" in target:
            return target.split("zoneinfo/", 1)[1]
    with contextlib.suppress(OSError):
        named = Path("/etc/timezone").read_text(encoding="utf-8").strip()
        if named:
            return named
    return "UTC"


WINDOW_NAMES = {300: "five_hour", 10080: "seven_day"}
"""A ChatGPT plan's windows by their length in minutes, named as Claude Code names a
subscriber's (``core.pacing``)."""

READ_AT_MOST = 4 * 2**20
"""Session-file bytes read for the windows at a time."""


def plan_windows(rate_limits: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Codex's ``rate_limits`` (its ``primary`` and ``secondary`` window: used percent,
    length, reset) as a ``windows`` report says them; a window of another length is left
    out (pacing knows the two)."""
    out: dict[str, dict[str, float]] = {}
    for key in ("primary", "secondary"):
        window = rate_limits.get(key)
        if not isinstance(window, Mapping):
            continue
        minutes = window.get("window_minutes")
        name = WINDOW_NAMES.get(minutes) if isinstance(minutes, int) else None
        used, reset = window.get("used_percent"), window.get("resets_at")
        if name and isinstance(used, int | float) and isinstance(reset, int | float):
            out[name] = {"used_percentage": float(used), "resets_at": float(reset)}
    return out


def error_news(message: str, zone: str) -> dict[str, Any]:
    """The ``agent_error`` report for the error that ended Codex's turn: its kind (as
    Claude Code's StopFailure names them) and its text, a stated reset with its zone."""
    text = _AGAIN_AT.sub(lambda m: f"{m.group(1)} ({zone})", one_line(clean_text(message), 300))
    if _USAGE.search(text) or _RATE.search(text):
        return {"error": "rate_limit", "text": text}
    if _BILLING.search(text):  # an API key out of credit: the person's to fix
        return {"error": "billing_error", "text": text}
    return {"error": "server_error", "text": text}


class CodexEvents:
    """What one ``codex exec --json`` run said, told to the controller as it goes."""

    def __init__(self, worker: Worker | None, codex_home: Path | None, out: IO[str],
                 zone: str) -> None:
        self.worker = worker
        self.teller = Teller(worker, out, "codex")
        self.codex_home = codex_home
        self.zone = zone
        self.session: str | None = None
        self.told_id = False
        self.told_transcript = False
        self.failed: str | None = None
        self.last_message = ""
        """The agent's last message of its turn: a question in it goes to a person."""
        self.read_to = 0
        """How far its session file was read for the account's windows."""

    def transcript(self) -> Path | None:
        """This session's file under CODEX_HOME, once Codex wrote it."""
        if self.session is None or self.codex_home is None:
            return None
        found = sorted((self.codex_home / "sessions").glob(f"*/*/*/rollout-*-{self.session}"
                                                             ".jsonl"))
        return found[-1] if found else None

    def tell_session(self) -> None:
        """The session, and its file once it is there: what a restart resumes. Said once
        without the file and once with it."""
        if self.session is None or self.told_transcript:
            return
        path = self.transcript()
        if path is None and self.told_id:
            return
        self.told_id, self.told_transcript = True, path is not None
        self.teller.tell("session", {"session_id": self.session,
                                     "transcript_path": str(path) if path else None})

    def take(self, line: str) -> None:
        """One line of Codex's stdout: an event, or (anything else) shown as it is."""
        event = self.teller.event(line)
        if event is None:
            return
        kind = event.get("type")
        self.tell_session()  # its file, once Codex wrote it: a crash resumes from it
        item: dict[str, Any] = event["item"] if isinstance(event.get("item"), dict) else {}
        if kind == "thread.started" and isinstance(event.get("thread_id"), str) \
                and SESSION_ID_RE.fullmatch(event["thread_id"]):
            self.session = event["thread_id"]
            self.teller.show(f"session {self.session}")
            self.tell_session()  # the id now, its file once it is there
        elif kind == "turn.started":
            self.teller.say(WORKING, active=True)
        elif kind == "item.started" and item.get("type") == "command_execution":
            self.teller.show(f"$ {one_line(clean_text(str(item.get('command', ''))), 200)}")
            self.teller.say("running a command", active=True)
            # before the command runs (it may be `worker done`, and the window closes):
            # the answers before this one are in the session file by now
            self.tell_windows()
        elif kind == "item.completed":
            self.completed(item)
        elif kind == "turn.completed":
            usage: dict[str, Any] = event["usage"] if isinstance(event.get("usage"), dict) \
                else {}
            self.teller.show(f"turn done ({usage.get('input_tokens', '?')} tokens in, "
                             f"{usage.get('output_tokens', '?')} out)")
            self.tell_windows()
        elif kind in ("error", "turn.failed"):
            error: dict[str, Any] = event["error"] if isinstance(event.get("error"), dict) \
                else event
            message = str(error.get("message", "")) or "unknown error"
            self.teller.show(f"error: {one_line(clean_text(message), 300)}")
            if kind == "turn.failed" or self.failed is None:
                self.failed = message
            if kind == "error":  # it may retry by itself ("Reconnecting… 2/5"): alive
                self.teller.tell("activity", {"state": AWAITING_MODEL})

    def tell_windows(self) -> None:
        """The account's usage windows Codex read from its last answer's headers and
        wrote to its session file (``token_count``'s ``rate_limits``), when they changed:
        the controller paces the account's starts by them."""
        path = self.transcript()
        if path is None or self.worker is None:
            return
        try:
            with path.open("rb") as file:
                file.seek(self.read_to)
                chunk = file.read(READ_AT_MOST)
        except OSError:
            return
        whole = chunk[:chunk.rfind(b"\n") + 1]
        self.read_to += len(whole)
        found: dict[str, dict[str, float]] = {}
        for line in whole.splitlines():
            if b'"rate_limits"' not in line:
                continue
            with contextlib.suppress(ValueError, AttributeError):
                limits = json.loads(line)["payload"]["rate_limits"]
                found = plan_windows(limits) if isinstance(limits, dict) else found
        if found:
            with contextlib.suppress(*TELL_ERRORS):
                tell_windows(self.worker, found)

    def completed(self, item: Mapping[str, Any]) -> None:
        what = item.get("type")
        if what == "command_execution":
            self.teller.show(f"  exit {item.get('exit_code')}")
            self.teller.tell("activity", {"state": AWAITING_MODEL})
            self.tell_windows()
        elif what == "agent_message":
            self.last_message = str(item.get("text", ""))
            self.teller.show(one_line(clean_text(self.last_message), 300))
        elif what == "error":  # a warning of Codex's own, not the turn's end
            self.teller.show(f"note: {one_line(clean_text(str(item.get('message', ''))), 200)}")
        else:
            self.teller.tell("activity", {"state": AWAITING_MODEL})

    def ended(self, status: int) -> None:
        """Codex exited: its session's file is told if it was not yet, and the error
        that ended its turn, if one did."""
        self.tell_session()
        if status != 0 and self.failed is not None:
            self.teller.tell("agent_error", error_news(self.failed, self.zone))
        elif status == 0:
            self.teller.ask_if_asked(self.last_message, "a question ending its Codex turn")
        self.teller.say(SESSION_ENDED, active=False)


def run(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """Run Codex (``argv``, with ``--json``) in this pane; its exit status."""
    environ = os.environ if environ is None else environ
    if not argv:
        print("usage: ralph-dev hook codex-exec -- CODEX_ARGV...", file=sys.stderr)
        return 2
    home = environ.get("CODEX_HOME")
    events = CodexEvents(this_worker(environ), Path(home) if home else None, sys.stdout,
                         local_zone(environ))
    return run_stream(argv, events)
