"""A question reaches a person, with the REAL Claude Code CLI (issue 24 item 5).

However the agent asks (in the prose of its last message, or with Claude Code's
``AskUserQuestion`` tool, whose picker nobody in a worker's pane can answer), the
question goes on the issue as ``worker blocked`` puts it there: the label and a comment
in the agent's words, at once, with no continuation, nudge or restart and no attempt
charged beyond the first start; a person's answer is typed into the same session,
which then finishes the issue.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import test_claude_smoke as smoke
from conftest import retry_until
from test_asking import ISSUE_24
from test_claude_smoke import FAKE_KEY, World, controller_ticks, diagnostics

from ralph_dev.adapters.terminal import last_words, render_tail
from ralph_dev.core.model import NewIssue, StateType
from ralph_dev.devtools.scripted_model import (
    FakeAnthropic,
    Text,
    ToolUse,
    bash,
    conversation_text,
    is_main_conversation,
    tool_results,
    tool_uses_so_far,
)

pytestmark = [pytest.mark.slow, pytest.mark.claude]

claude_bin, world = smoke.claude_bin, smoke.world  # the smoke tests' fixtures

def answer_and_finish(world: World, api: FakeAnthropic, issue: str, tick: Any) -> None:
    """The agent waits for the person; the person answers; the same session finishes."""
    asked = len(api.main_messages())
    for _ in range(4):
        tick()
    assert len(api.main_messages()) == asked  # it waits for the person
    assert any(w.name == issue and w.alive for w in world.tmux.list_windows())
    world.tracker.comment_sync(issue, "JSON, please.", by_ralph=False)
    world.tracker.change_labels_sync(issue, add=["user-feedback-given"])
    retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                         is StateType.COMPLETED)[1], 90,
                what="the issue done after the answer" + diagnostics(world, api, issue))
    assert "left feedback" in conversation_text(api.main_messages()[-1])
    events = [e["event"] for e in world.store.iter_events()]
    for absent in ("nudge", "restart", "reap", "hold", "iteration_cap"):
        assert absent not in events, absent
    # one start, one attempt charged: the same session all along
    assert [e["attempt"] for e in world.store.iter_events() if e["event"] == "spawn"] == [1]
    assert "worker_blocked" in events


def finish(issue: str) -> str:
    return f"touch ok.txt && ralph-dev worker done {issue} --summary 'added ok.txt'"


def until_asked(world: World, api: FakeAnthropic, issue: str) -> Callable[[], Any]:
    """Start the issue's worker and tick until its question is on the issue; the ticks."""
    tick = controller_ticks(world, world.settings)
    tick()  # spawns the worker
    retry_until(lambda: (tick(), "user-input-needed"
                         in world.tracker.get_sync(issue).labels)[1], 60,
                what="the question on the issue" + diagnostics(world, api, issue))
    return tick


@pytest.mark.parametrize(("question", "drawn"), [
    ("Should the file be called ok.txt or okay.txt?", "Should the file be called ok.txt"),
    (ISSUE_24, "JSON or SQLite?"),
], ids=["a last line that asks", "issue 24: a question, then please reply"])
def test_a_question_asked_in_prose_goes_to_a_person_and_the_answer_to_the_session(
        world: World, monkeypatch: pytest.MonkeyPatch, question: str, drawn: str) -> None:
    """Issue 13 item 4, issue 24 item 5: the model ends its turn with a question instead
    of `worker blocked`. The question goes on the issue (label and comment) at once — no
    Stop-hook continuations burnt, no nudge, no restart — and a person's answer is typed
    into the same session, which then finishes the issue."""
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add the file")])

    def brain(request: dict[str, Any]) -> list[Any]:
        if not is_main_conversation(request):
            return [Text("ok")]
        if "left feedback" not in conversation_text(request):
            return [Text(f"I looked at the repository.\n\n{question}")]
        return [Text("Done.")] if tool_uses_so_far(request) else [bash(finish(issue))]

    with FakeAnthropic(brain) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        tick = until_asked(world, api, issue)
        comments = [c.body for c in world.tracker.get_sync(issue).comments]
        assert any(question in body for body in comments), comments  # in its own words
        # the pane as it looked (issue 13 item 6): the question on a line of its own, and
        # status' LAST OUTPUT is the agent's last message, not its spinner or footer
        retry_until(lambda: any(drawn in line
                                for line in render_tail(world.store.log_path(issue))), 30,
                    what="the question drawn in the pane")
        assert last_words(render_tail(world.store.log_path(issue))).startswith("● ")
        assert len(api.main_messages()) == 1  # asked once; no continuation pushed it on
        # the controller applies the hook's state report: it must be running (a tick that
        # ends mid-reply leaves the report for the next one)
        retry_until(lambda: (tick(), world.store.load_record(issue).agent_state or "")[1]
                    .startswith(f"waiting for input: {question[:30]}"), 20,
                    what="the agent's own state: waiting for a person's answer")
        answer_and_finish(world, api, issue, tick)


def test_a_second_question_after_the_answer_reaches_the_person_too(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer is typed into the session; the agent then asks again instead of
    finishing. The second question goes on the issue like the first (the first one,
    answered, no longer counts as the agent's report), and the second answer finishes."""
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add the file")])
    second = "Thanks. Should the exported file also be gzipped, or stay plain?"

    def brain(request: dict[str, Any]) -> list[Any]:
        if not is_main_conversation(request):
            return [Text("ok")]
        answers = conversation_text(request).count("a person left feedback")
        if answers == 0:
            return [Text(ISSUE_24)]
        if answers == 1:
            return [Text(second)]
        return [Text("Done.")] if tool_uses_so_far(request) else [bash(finish(issue))]

    def asked(question: str) -> bool:
        tick()
        found = world.tracker.get_sync(issue)
        return "user-input-needed" in found.labels and any(question in c.body
                                                           for c in found.comments)

    with FakeAnthropic(brain) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        tick = controller_ticks(world, world.settings)
        tick()  # spawns the worker
        retry_until(lambda: asked(ISSUE_24), 60,
                    what="the first question" + diagnostics(world, api, issue))
        world.tracker.comment_sync(issue, "JSON.", by_ralph=False)
        world.tracker.change_labels_sync(issue, add=["user-feedback-given"])
        retry_until(lambda: asked(second), 60,
                    what="the second question" + diagnostics(world, api, issue))
        answer_and_finish(world, api, issue, tick)
    comments = [c.body for c in world.tracker.get_sync(issue).comments]
    for question in (ISSUE_24, second):  # each on the issue once
        assert sum(question in body for body in comments) == 1, comments


ASK = {"questions": [{
    "question": "Which storage format should the exporter write?",
    "header": "Format",
    "multiSelect": False,
    "options": [{"label": "JSON", "description": "one file, readable by people"},
                {"label": "SQLite", "description": "queryable, one more dependency"}],
}]}

WAITS = "I asked which format to use; I'll wait for the answer."


def test_ask_user_question_is_denied_and_its_question_goes_to_a_person(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """AskUserQuestion would draw a picker in a pane nobody watches and wait for ever.
    The PreToolUse hook denies it, tells the agent its question was posted and to end its
    turn, and posts the question with its options on the issue."""
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add the exporter")])

    def brain(request: dict[str, Any]) -> list[Any]:
        if not is_main_conversation(request):
            return [Text("ok")]
        if "left feedback" in conversation_text(request):
            return [Text("Done.")] if tool_uses_so_far(request) > 1 else [bash(finish(issue))]
        if not tool_uses_so_far(request):
            return [ToolUse("AskUserQuestion", ASK)]
        return [Text(WAITS)]

    with FakeAnthropic(brain) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        tick = until_asked(world, api, issue)
        (comment,) = [c.body for c in world.tracker.get_sync(issue).comments
                      if "Which storage format" in c.body]
        for said in ("Which storage format should the exporter write?", "- JSON — one file",
                     "- SQLite — queryable"):
            assert said in comment, comment
        retry_until(lambda: len(api.main_messages()) >= 2, 30, what="the denial's answer")
        denial = json.dumps(tool_results(api.main_messages()[1]))
        assert f"Your question is posted on {issue} for a person" in denial, denial
        retry_until(lambda: api.answered(WAITS), 30,
                    what="the agent ends its turn")
        answer_and_finish(world, api, issue, tick)
