"""A worker's agent asks a person: the question goes on its issue, wherever it was asked.

An agent asks in three ways ralph-dev hears: ``ralph-dev worker blocked`` (the
documented one), a question at the end of its turn (the Stop hook,
``core.questions``), and Claude Code's ``AskUserQuestion`` tool, whose picker
nobody in a worker's pane can answer. A fourth is a safety net: an agent idle on a
question it asked (Claude Code's ``idle_prompt`` notification) after the Stop hook
let it stop without posting it. Each way ends the same: a label and a comment in the
agent's words (``worker blocked``'s report, no attempt charged), the agent waiting in
its session, and the person's answer typed into that session.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.adapters import mailbox as ch
from ralph_dev.adapters.files import read_tail
from ralph_dev.core.questions import asked_question, last_message, tool_question
from ralph_dev.inpane.reports import blocked
from ralph_dev.inpane.worker import Worker, WorkerError, one_line

log = structlog.get_logger(__name__)

WAITING = "waiting for input"


def say(worker: Worker, doing: str, *, active: bool = False) -> None:
    """Tell the controller what the agent does now (``agent_state``; active: it works)."""
    ch.tell(worker.run_dir, "state", {"state": doing, "active": active})


PROMPTED = "prompted"
"""In the run dir: touched when something is typed into the session (a person's answer
relayed, a prompt): a question asked before it is answered, or overtaken."""


def prompted(worker: Worker) -> None:
    """Something was typed into the session: the agent works again, so a question it
    asked before no longer lets it stop, and a new one is posted afresh."""
    (worker.run_dir / PROMPTED).touch()


def reported(worker: Worker) -> str | None:
    """``done``/``blocked`` when this worker's latest start has such a report the
    controller accepted, or has not answered yet (it applies it when it runs). A
    ``blocked`` counts until something is typed into the session after it."""
    started = (worker.run_dir / ch.WORKER_FILE).stat().st_mtime
    try:
        answered = max(started, (worker.run_dir / PROMPTED).stat().st_mtime)
    except OSError:
        answered = started
    for report, answer in reversed(ch.reports_of(worker.run_dir,
                                                 frozenset({"done", "blocked"}))):
        try:
            at = (worker.run_dir / ch.OUTBOX / f"{report.id}.json").stat().st_mtime
        except OSError:
            continue
        fresh = at >= (answered if report.kind == "blocked" else started)
        if fresh and (answer is None or answer.ok):
            return report.kind
    return None


def ask_person(worker: Worker, question: str, how: str) -> None:
    """Put a question the agent asked on its issue as ``worker blocked`` would: a label
    and a comment in the agent's words, no attempt charged; the agent waits in its
    session and the person's answer is typed into it."""
    outcome = blocked(worker, question)
    log.info("asked_a_person", how=how, answer=outcome.message[:200])
    say(worker, f"{WAITING}: {one_line(question.splitlines()[-1])[:120]}")


ASKED_WITH_TOOL = (
    "ralph-dev: nobody can answer AskUserQuestion in a ralph-dev worker, so it did not run. "
    "Your question is posted on {issue} for a person, as `ralph-dev worker blocked` does. "
    "Do not guess and do not ask again: end your turn now; the person's answer will be typed "
    "into this session.")
NOT_ASKED = (
    "ralph-dev: nobody can answer AskUserQuestion in a ralph-dev worker, so it did not run"
    "{why}. If a person must decide, ask with `ralph-dev worker blocked {issue} --question "
    "\"…\"`, then stop.")
IDLE_MESSAGE = "Claude is waiting for your input"
TRANSCRIPT_TAIL = 512_000
"""Bytes read from the end of a transcript for the agent's last message."""


def ask_user_question(worker: Worker, payload: Mapping[str, Any]) -> str:
    """PreToolUse for AskUserQuestion: its picker would wait for a key nobody presses, so
    the call is denied and its question (with its options) goes on the issue instead."""
    question, why = tool_question(payload.get("tool_input")), " (it held no question)"
    if question is not None:
        try:
            ask_person(worker, question, "AskUserQuestion")
            why = ""
        except WorkerError as exc:  # refused: the agent is told to ask the usual way
            question, why = None, f" and its question could not be posted ({exc})"
    reason = ASKED_WITH_TOOL if question is not None else NOT_ASKED
    return json.dumps({"hookSpecificOutput": {
        "hookEventName": "PreToolUse", "permissionDecision": "deny",
        "permissionDecisionReason": reason.format(issue=worker.issue, why=why)}})


def idle(worker: Worker, payload: Mapping[str, Any]) -> bool:
    """Claude Code says the agent waits for input (``idle_prompt``): when its last message
    asks a person something and no report of its own stands (``reported``: the Stop hook
    let it stop at the iteration cap, or failed), the question is posted, so an idle
    question is answered instead of nudged and restarted. True when it was posted."""
    if payload.get("hook_event_name") != "Notification" or not (
            payload.get("notification_type") == "idle_prompt"
            or payload.get("message") == IDLE_MESSAGE):
        return False
    path = payload.get("transcript_path")
    if not isinstance(path, str) or not path or reported(worker) is not None:
        return False
    question = asked_question(last_message(_tail(Path(path))))
    if question is None:
        return False
    ask_person(worker, question, "idle on a question")
    return True


def _tail(path: Path) -> list[bytes]:
    """The whole lines of the end of a file (a transcript grows without bound)."""
    chunk, size = read_tail(path, 0, TRANSCRIPT_TAIL)
    lines = chunk.split(b"\n")
    return lines[1:] if size > TRANSCRIPT_TAIL else lines
