"""The real Codex CLI as a ralph-dev worker, against the scripted Responses API.

Codex (the version ``core.agent_profiles.CODEX`` pins, installed by ``scripts/setup.sh``)
runs in a real tmux window, confined by bubblewrap like a Claude Code worker, with its
own ``CODEX_HOME`` and only its own provider's key; the scripted model drives its real
shell tool to change the workspace and report done through ``ralph-dev worker done``,
which the controller's end of the mailbox receives and writes back to the tracker.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cli_kit
import pytest
from cli_kit import cli_project, pinned_cli
from conftest import retry_until
from test_claude_smoke import open_world

from ralph_dev.adapters.store import utcnow
from ralph_dev.agent.codex import find_codex
from ralph_dev.agent.launch import build_launch
from ralph_dev.core.agent_profiles import CODEX
from ralph_dev.core.model import NewIssue, Role, StateType
from ralph_dev.devtools.scripted_model import (
    ScriptedWorker,
    Text,
    bash,
    conversation_text,
    is_key_probe,
)
from ralph_dev.devtools.scripted_openai import FakeOpenAI

FAKE_KEY = "sk-fake-codex-smoke-test-key-0123456789abcdef"

INSTALLED = find_codex()
"""Found at import, before a fixture repoints XDG_CACHE_HOME (and HOME) into a tmp dir."""


@pytest.fixture
def codex_bin() -> str:
    return pinned_cli(CODEX, INSTALLED)


def test_setup_installs_the_pinned_codex() -> None:
    script = (Path(__file__).parent.parent / "scripts" / "setup.sh").read_text()
    assert re.search(rf"^CODEX_VERSION={re.escape(CODEX.pinned)}\b", script, re.M)


@contextlib.contextmanager
def codex_swarm(world: Any, monkeypatch: pytest.MonkeyPatch, brain: Any,
                settings: Any = None, **api: Any) -> Iterator[tuple[FakeOpenAI, Any]]:
    """The scripted Responses API playing ``brain``, Codex pointed at it with its own key,
    and one real controller tick per call: (the API, the tick)."""
    from test_claude_smoke import controller_ticks

    with FakeOpenAI(brain, **api) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", f"{fake.url}/v1")
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        yield fake, controller_ticks(world, settings or world.settings)


def test_codexs_usage_limit_is_read_with_the_zone_its_clock_printed_it_in() -> None:
    """Codex prints the reset in its own local time, without a zone: its supervisor adds
    the zone, and the controller reads the reset as the worker's clock meant it."""
    from datetime import UTC, datetime

    from ralph_dev.core.agent_faults import API_ACCESS, USAGE_LIMIT, classify_stop_failure
    from ralph_dev.inpane.codex_exec import error_news, local_zone

    said = ("You\u2019ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro),"
            " visit https://chatgpt.com/settings/usage to purchase more credits or try again "
            "at Nov 30th, 2026 2:23 AM.")
    news = error_news(said, "Europe/Berlin")
    assert news["error"] == "rate_limit" and "2:23 AM (Europe/Berlin)" in news["text"]
    now = datetime(2026, 11, 28, 1, 0, tzinfo=UTC)
    fault = classify_stop_failure(news["error"], news["text"], now)
    assert fault.kind == USAGE_LIMIT and fault.until == datetime(2026, 11, 30, 1, 23, tzinfo=UTC)
    today = error_news("You\u2019ve hit your usage limit. or try again at 1:24 AM.", "UTC")
    assert classify_stop_failure("rate_limit", today["text"], now).until == \
        datetime(2026, 11, 28, 1, 24, tzinfo=UTC)
    outage = error_news("stream disconnected before completion: exceeded retry limit", "UTC")
    assert outage["error"] == "server_error"
    broke = error_news("Quota exceeded. Check your plan and billing details.", "UTC")
    assert classify_stop_failure(broke["error"], broke["text"], now).kind == API_ACCESS
    assert local_zone({"TZ": "America/New_York"}) == "America/New_York"
    assert local_zone({"TZ": "$(touch x)"}) != "$(touch x)"  # a variable is data, checked


@pytest.fixture
def world(xdg: Path, jj_bin: str, tmux_socket: str, codex_bin: str) -> Iterator[Any]:
    """A project whose workers run Codex; the real controller's windows
    (``test_claude_smoke.controller_ticks``) open on the test's tmux server."""
    config = cli_project(xdg, tmux_socket, CODEX, codex_bin)
    with open_world(xdg, jj_bin, tmux_socket, config) as made:
        yield made


def test_a_codex_worker_does_its_issue_confined_with_its_own_home_and_key(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, tracker, jj, store, tmux, controller = (
        world.settings, world.tracker, world.jj, world.store, world.tmux, world.controller)
    (issue,) = tracker.create_issues_sync([NewIssue(title="Add ok.txt $(touch /tmp/no)")])
    brain = ScriptedWorker({issue: [
        bash("echo fine > ok.txt && echo \"home=$CODEX_HOME key=${ANTHROPIC_API_KEY:-none}\" "
             "&& ls ~/../../ 2>&1 | head -3", "create the file"),
        bash(f"ralph-dev worker done {issue} --summary 'Added ok.txt with Codex.'"),
    ]}, final_text="Reported.")
    with FakeOpenAI(brain) as api:
        monkeypatch.setenv("OPENAI_BASE_URL", f"{api.url}/v1")
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-must-not-reach-codex")
        workspace = jj.workspaces.add_workspace(issue)
        store.update_record(issue, role=Role.EXECUTE, attempts=1, started_at=utcnow(),
                            done=False, blocked=False, iterations=0)
        tracker.set_state_sync(issue, type=StateType.STARTED)
        controller.dirs.publish(tuple(tracker.list_issues_sync()))
        worker_dir = controller.dirs.prepare(tracker.get_sync(issue), Role.EXECUTE,
                                             workspace, 1)
        controller.listen()
        launch = build_launch(settings, tracker.get_sync(issue), Role.EXECUTE, workspace,
                              "gpt-5-codex", attempt=1, worker_dir=worker_dir)
        assert "touch" not in " ".join(launch.argv)
        tmux.open_window(issue, cwd=launch.cwd, command=launch.argv, environment=launch.env,
                         log_file=store.log_path(issue))

        def done() -> bool:
            return any(c.by_ralph and c.body.startswith(f"[ralph-dev] {issue} done")
                       for c in tracker.get_sync(issue).comments)

        try:
            retry_until(done, timeout=120, interval=0.5, what=f"{issue} reported done")
        except AssertionError as exc:
            panes = "\n".join(tmux.capture(w.pane_id, 60) for w in tmux.find(issue))
            raise AssertionError(f"{exc}\n--- pane ---\n{panes}\n--- api ---\n"
                                 f"{[(r.method, r.path) for r in api.requests]} "
                                 f"{api.errors}") from None
        bodies = api.responses()
        assert bodies and all(b.get("model") == "gpt-5-codex" for b in bodies)
        # the prompt (never a shell line) reached the model, naming the issue
        assert issue in conversation_text({"messages": [
            {"content": str(bodies[0].get("input"))}]}) or issue in json.dumps(bodies[0])
        # the worker's shell: the workspace changed, its own CODEX_HOME, no other key
        assert (workspace / "ok.txt").read_text() == "fine\n"
        said = json.dumps(bodies[-1]["input"])
        home = settings.paths.worker_dir(issue) / "home" / ".codex"
        assert f"home={home}" in said and "key=none" in said
        assert list((home / "sessions").rglob("rollout-*.jsonl")), "Codex kept its session"
        # bearer: its own key only, and the recording never keeps it
        assert all("authorization" not in r.headers for r in api.requests)
        record = store.load_record(issue)
        assert record is not None and record.done


def test_a_usage_limit_pauses_a_codex_worker_and_it_resumes_its_session_after_the_reset(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: the Responses API refuses Codex with its plan's usage limit (429
    ``usage_limit_reached``); ``codex exec`` ends its turn and exits, saying "try again at
    2:23 AM" in its local time. The swarm pauses until that minute, charging nothing; at
    it the worker starts again in its own session (``codex exec resume``: the model sees
    its first step in the history) and finishes the issue, in its first attempt."""
    from test_claude_limits import LimitFromFirstCall

    from ralph_dev.core.agent_faults import USAGE_LIMIT
    from ralph_dev.devtools.api_faults import openai_usage_limit

    limit = LimitFromFirstCall(past=0)  # a whole minute: Codex says the minute
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt")])
    finish = f"touch ok.txt && ralph-dev worker done {issue} --summary 'added ok.txt'"
    refused: list[float] = []
    fresh: list[float] = []

    def brain(request: dict[str, Any]) -> list[Any]:
        said = conversation_text(request)
        if is_key_probe(request):  # the controller asking for the key's limits
            return [Text("ok")]
        if "echo started" not in said:  # a session that has not made its first step
            fresh.append(time.time())
            return [bash("echo started > started.txt", "start")]
        now = time.time()
        if now < limit.until(now):
            refused.append(now)
            return [openai_usage_limit(limit.until(now))]
        return [Text("Done.")] if "touch ok.txt" in said else [bash(finish)]

    with codex_swarm(world, monkeypatch, brain) as (api, tick):

        def diagnostics() -> str:
            panes = "\n".join(world.tmux.capture(w.pane_id, 40) for w in world.tmux.find(issue))
            return (f"\n--- pane ---\n{panes}\n--- events ---\n"
                    f"{[(e['event'], e.get('reason', '')) for e in world.store.iter_events()]}"
                    f"\n--- api ---\n{api.errors}")

        retry_until(lambda: (tick(), any(p.kind == USAGE_LIMIT
                                         for p in world.store.load_pauses()))[1], 120, 0.5,
                    what="the usage-limit pause" + diagnostics())
        (pause,) = world.store.load_pauses()
        resets_at = limit.until(0)
        assert pause.until is not None and pause.until.timestamp() == resets_at
        retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                             is StateType.COMPLETED)[1], 240, 0.5,
                    what=f"{issue} done after the reset" + diagnostics())
    events = list(world.store.iter_events())
    spawns = [e for e in events if e["event"] == "spawn"]
    assert [e["attempt"] for e in spawns] == [1, 1], [e["reason"] for e in spawns]
    assert "no attempt charged" in spawns[1]["reason"]
    assert not [e for e in events if e["event"] == "hold"]
    assert refused and max(refused) < resets_at  # nothing went to the API during the pause
    # resumed, not started over: the start after the reset named the session, and that
    # session had its first step already
    assert "resume" not in spawns[0] and spawns[1].get("resume"), spawns
    assert len(fresh) == 1, fresh
    # its tokens and their price, read from its session file, each answer once
    from ralph_dev.control.loop.costs import issue_spend, load

    spent = issue_spend(load(world.settings), issue)
    stated = api.usages
    assert spent.output == sum(u["output_tokens"] for u in stated), (spent, stated)
    assert spent.input == sum(u["input_tokens"] for u in stated) and spent.usd > 0
    reaped = next(e for e in events if e["event"] == "reap")
    assert "no attempt charged" in reaped["reason"] and "usage limit" in reaped["reason"]
    assert "ok.txt" in world.jj_out("file", "list", "-r", "main")


def swarm_of(world: Any, monkeypatch: pytest.MonkeyPatch) -> cli_kit.SwarmOf:
    return lambda brain, settings=None: codex_swarm(world, monkeypatch, brain, settings)


def responses(api: FakeOpenAI) -> int:
    return len(api.responses())


def test_a_codex_turn_ending_on_a_question_reaches_a_person_and_the_answer_its_session(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: Codex ends its turn asking a person something and reports nothing; its
    question goes on the issue, no attempt is charged, and the person's answer starts
    the same session again (``codex exec resume``), which then finishes the issue."""
    cli_kit.question_goes_to_a_person(world, swarm_of(world, monkeypatch), responses)


def test_a_crashed_codex_is_resumed_in_its_own_session(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: Codex dies mid-task; its next attempt is ``codex exec resume`` of the
    session its supervisor told."""
    cli_kit.crash_resumes_its_session(world, swarm_of(world, monkeypatch), responses)


def test_a_run_of_5xx_codex_gives_up_on_pauses_the_swarm_free_and_it_goes_on(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: the Responses API answers 500 for a minute. Codex retries by itself, then
    ends its turn on it and exits; that is an outage (no attempt charged): the swarm
    pauses for its backoff, and the worker goes on in its session once the API answers."""
    from ralph_dev.core.config import Timing
    from ralph_dev.devtools.api_faults import Refusal

    first: list[float] = []

    def failing() -> list[Any]:
        if not first:
            first.append(time.time())
        if time.time() - first[0] < 60:
            return [Refusal(500, "server_error", "The server had an error processing your "
                                                 "request.")]
        return []

    events = cli_kit.through_a_fault(world, swarm_of(world, monkeypatch), Timing(
        poll_interval=0.5, stall_timeout=600, restart_timeout=600, outage_wait=5), failing)
    assert [e for e in events if e["event"] == "agent_api_error"]  # Codex gave up at least once
    assert [e for e in events if e["event"] == "swarm_paused"]
    starts = [e for e in events if e["event"] == "spawn"]
    assert {e["attempt"] for e in starts} == {1} and all(e.get("resume") for e in starts[1:])
    assert not [e for e in events if e["event"] == "hold"]


def test_a_hung_codex_call_is_restarted_in_its_own_session(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: a model call that never answers (Codex's own events stop) is a hang:
    after ``hang_timeout`` the worker is restarted in its own session, free."""
    cli_kit.hang_restarts_its_session(world, swarm_of(world, monkeypatch))


def test_a_chatgpt_plans_windows_codex_read_reach_the_accounts_pacing(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36 item 3, OpenAI's half: each answer states the plan's 5-hour and weekly
    windows (``x-codex-primary-*``, ``x-codex-secondary-*``); Codex writes them to its
    session file, its supervisor tells the controller, and the account's windows (what
    pacing, ``status`` and ``/metrics`` read) are those."""
    from datetime import UTC, datetime

    from ralph_dev.adapters.accounts import AccountWindows, account_of

    reset = int(time.time()) + 3 * 3600
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt")])
    finish = f"touch ok.txt && ralph-dev worker done {issue} --summary 'added ok.txt'"

    def windows() -> dict[str, str]:
        return {"x-codex-primary-used-percent": "42.5", "x-codex-primary-window-minutes": "300",
                "x-codex-primary-reset-at": str(reset),
                "x-codex-secondary-used-percent": "13", "x-codex-secondary-window-minutes":
                "10080", "x-codex-secondary-reset-at": str(reset + 86400)}

    def brain(request: dict[str, Any]) -> list[Any]:
        said = conversation_text(request)
        if "echo started" not in said:  # an answer whose windows are written before done
            return [bash("echo started > started.txt", "start")]
        return [Text("Done.")] if "touch ok.txt" in said else [bash(finish)]

    with codex_swarm(world, monkeypatch, brain, answer_headers=windows) as (_api, tick):
        account = account_of(world.settings, os.environ)
        seen = retry_until(lambda: (tick(), AccountWindows(account).read(
            datetime.now(UTC)))[1], 120, 0.5, what="the plan's windows, told")
    five, seven = sorted(seen, key=lambda w: w.name)
    assert (five.name, five.used, five.resets_at.timestamp()) == ("five_hour", 0.425, reset)
    assert (seven.name, seven.used) == ("seven_day", 0.13)
