"""Questions for a person through the hooks, as Claude Code runs them (issue 24 item 5).

However an agent asks — at the end of its turn in prose (Stop), with ``AskUserQuestion``
(PreToolUse), or by going idle on a question (Notification ``idle_prompt``) — the
question is posted as ``worker blocked`` posts it, once, in the agent's words; what is
typed into the session afterwards (the answer) makes the agent work again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_hooks
from conftest import retry_until
from test_hooks import PROCESS_BOUND, hook, iterations, stop_payload
from test_worker import Project

project = test_hooks.project  # the hook tests' fixture

ISSUE_24 = ("Before I go on I need a decision: should the storage format be JSON or SQLite? "
            "Please reply and I will continue.")
"""Issue 24: a question in prose whose last sentence asks nothing; pushed on 82 times."""


@pytest.mark.parametrize(("message", "question"), [
    ("I read the code.\n\nShould I use Postgres or SQLite?", True),
    ("**Which of the two APIs do you want?**", True),
    (ISSUE_24, True),
    ("Is it X? I checked: it is. All tests pass.", False),  # answered itself
    ("Done: all tests pass.", False),
    ("", False),
    (None, False),
])
def test_a_turn_that_ends_with_a_question_is_a_question_for_a_person(
        message: object, question: bool) -> None:
    """The Stop hook reads the last message with the one classifier (``core.questions``,
    its corpus in test_questions.py)."""
    from ralph_dev.core import questions
    from ralph_dev.inpane import hooks

    assert hooks.asked_question is questions.asked_question
    found = hooks.asked_question(message)
    assert (found is not None) == question
    if question:
        assert found is not None and found.strip("*") in str(message)  # its own words


def blocked_texts(project: Project, issue: str) -> list[str]:
    from ralph_dev.adapters import mailbox

    return [report.fields["text"] for report, _answer in
            mailbox.reports_of(project.run_dir(issue), frozenset({"blocked"}))]


def test_stop_posts_a_question_asked_in_prose_and_lets_the_agent_wait(
        project: Project) -> None:
    """Issue 24: the question whose last sentence is "Please reply and I will continue."
    goes to a person at the first stop, in the agent's words; no continuation is spent."""
    issue = project.issue()
    project.spawn(issue)
    proc, _ = hook("stop", project.env(issue), {**stop_payload(),
                                                "last_assistant_message": ISSUE_24})
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout  # allowed to stop
    assert blocked_texts(project, issue) == [ISSUE_24]
    assert iterations(project, issue) == 0
    assert not (project.run_dir(issue) / "stop.json").exists()


def test_after_the_answer_the_agent_works_again_and_a_new_question_is_posted(
        project: Project) -> None:
    """A question is answered by what is typed into the session (the relayed answer is a
    UserPromptSubmit): the old question no longer lets the agent stop, and a second
    question is posted like the first instead of being taken for the first."""
    issue = project.issue()
    project.spawn(issue)
    second = "Thanks. Should the file also be gzipped, or stay plain?"
    hook("stop", project.env(issue), {**stop_payload(), "last_assistant_message": ISSUE_24})
    assert blocked_texts(project, issue) == [ISSUE_24]
    hook("state", project.env(issue), {"hook_event_name": "UserPromptSubmit",
                                       "prompt": "ralph-dev: a person left feedback"})
    proc, _ = hook("stop", project.env(issue), {**stop_payload(),
                                                "last_assistant_message": "Noted, JSON."})
    assert json.loads(proc.stdout)["decision"] == "block"  # it must report again
    proc, _ = hook("stop", project.env(issue), {**stop_payload(active=True),
                                                "last_assistant_message": second})
    assert proc.stdout == ""
    assert sorted(blocked_texts(project, issue)) == sorted([ISSUE_24, second])


# --- questions: AskUserQuestion and an agent idle on a question ----------------------------

ASK = {"questions": [{
    "question": "Which storage format should the exporter write?", "header": "Format",
    "multiSelect": False,
    "options": [{"label": "JSON", "description": "one file"},
                {"label": "SQLite\x1b[31m", "description": "queryable"}]}]}


def ask_payload(tool_input: object) -> dict[str, object]:
    return {"hook_event_name": "PreToolUse", "session_id": "s", "cwd": "/",
            "tool_name": "AskUserQuestion", "tool_input": tool_input}


def test_ask_user_question_is_denied_and_its_question_posted(project: Project) -> None:
    """Nobody in a worker's pane answers the tool's picker: the call is denied with a
    reason that says the question was posted, and it is posted with its options."""
    issue = project.issue()
    project.spawn(issue)
    proc, seconds = hook("ask-user-question", project.env(issue), ask_payload(ASK))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)["hookSpecificOutput"]
    assert out["hookEventName"] == "PreToolUse" and out["permissionDecision"] == "deny"
    assert f"Your question is posted on {issue} for a person" in out["permissionDecisionReason"]
    assert "end your turn now" in out["permissionDecisionReason"]
    assert blocked_texts(project, issue) == [
        "**Format**: Which storage format should the exporter write?\n"
        "- JSON — one file\n- SQLite — queryable"]
    assert seconds < PROCESS_BOUND
    # and the Stop that follows lets the agent wait, posting nothing more
    proc, _ = hook("stop", project.env(issue), {**stop_payload(),
                                                "last_assistant_message": "Waiting."})
    assert proc.stdout == "" and len(blocked_texts(project, issue)) == 1


def test_ask_user_question_without_a_question_is_denied_with_the_way_to_ask(
        project: Project) -> None:
    issue = project.issue()
    project.spawn(issue)
    proc, _ = hook("ask-user-question", project.env(issue), ask_payload({"questions": []}))
    reason = json.loads(proc.stdout)["hookSpecificOutput"]["permissionDecisionReason"]
    assert f"ralph-dev worker blocked {issue} --question" in reason
    assert blocked_texts(project, issue) == []


def test_ask_user_question_outside_a_worker_is_left_alone(tmp_path: Path) -> None:
    """A person's own Claude Code with the plugin: the tool runs as usual."""
    proc, _ = hook("ask-user-question", {"XDG_STATE_HOME": str(tmp_path)}, ask_payload(ASK))
    assert proc.returncode == 0 and proc.stdout == ""


def transcript(path: Path, *texts: str) -> str:
    """A Claude Code transcript: one JSON line per content block, a tool call between."""
    lines = [{"type": "user", "message": {"role": "user", "content": "go"}},
             {"type": "assistant", "message": {"role": "assistant", "content": [
                 {"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]}}]
    lines += [{"type": "assistant", "message": {"role": "assistant", "content": [
        {"type": "text", "text": text}]}} for text in texts]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def idle_payload(path: str) -> dict[str, object]:
    return {"hook_event_name": "Notification", "session_id": "s", "transcript_path": path,
            "cwd": "/", "message": "Claude is waiting for your input",
            "notification_type": "idle_prompt"}


def test_an_agent_idle_on_a_question_has_it_posted_once(project: Project,
                                                          tmp_path: Path) -> None:
    """The safety net: the Stop hook let the agent stop without posting its question (at
    the iteration cap, or it failed); Claude Code's idle notification posts it."""
    issue = project.issue()
    project.spawn(issue)
    path = transcript(tmp_path / "t.jsonl", "Looking at the code.", ISSUE_24)
    for _ in range(2):
        proc, _ = hook("state", project.env(issue), idle_payload(path))
        assert proc.returncode == 0 and proc.stdout == ""
    assert blocked_texts(project, issue) == [ISSUE_24]  # once: it is reported now


@pytest.mark.parametrize("last", [
    "Done: all tests pass.",  # a statement
    None,  # the last message called a tool
])
def test_an_idle_agent_that_asked_nothing_posts_nothing(project: Project, tmp_path: Path,
                                                        last: str | None) -> None:
    issue = project.issue()
    project.spawn(issue)
    path = transcript(tmp_path / "t.jsonl", *([last] if last else []))
    hook("state", project.env(issue), idle_payload(path))
    hook("state", project.env(issue), idle_payload(str(tmp_path / "missing.jsonl")))
    assert blocked_texts(project, issue) == []
    retry_until(lambda: (project.store.load_record(issue).agent_state or "")
                == "waiting for input: Claude is waiting for your input", 5,
                what="the agent's state: waiting, nothing asked")
