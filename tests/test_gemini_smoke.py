"""The real Gemini CLI as a ralph-dev worker, against the scripted Gemini API.

Gemini CLI (the version ``core.agent_profiles.GEMINI`` pins, installed by
``scripts/setup.sh``) runs in a real tmux window, confined by bubblewrap like a Claude
Code worker, with its own ``.gemini`` and only its own provider's key, driven by the real
controller's ticks; the scripted model drives its real shell tool to change the
workspace and report done through ``ralph-dev worker done``.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import cli_kit
import pytest
from cli_kit import cli_project, pinned_cli
from conftest import retry_until
from test_claude_smoke import open_world

from ralph_dev.agent.gemini import find_gemini
from ralph_dev.core.agent_profiles import GEMINI
from ralph_dev.core.config import Timing
from ralph_dev.core.model import NewIssue, StateType
from ralph_dev.devtools.scripted_gemini import FakeGemini
from ralph_dev.devtools.scripted_model import Text, bash, conversation_text

FAKE_KEY = "AIza-fake-gemini-smoke-test-key-0123456789"

INSTALLED = find_gemini()
"""Found at import, before a fixture repoints XDG_CACHE_HOME (and HOME) into a tmp dir."""


@pytest.fixture
def gemini_bin() -> str:
    return pinned_cli(GEMINI, INSTALLED)


def test_setup_installs_the_pinned_gemini_cli() -> None:
    script = (Path(__file__).parent.parent / "scripts" / "setup.sh").read_text()
    assert re.search(rf"^GEMINI_VERSION={re.escape(GEMINI.pinned)}\b", script, re.M)


def test_what_ended_a_gemini_turn_pauses_as_its_cause_calls_for() -> None:
    """Gemini CLI states a quota's wait in its words, or (a key's daily quota) not at
    all: its supervisor turns each into the reset the controller pauses until; a refused
    key and a model with no quota at all are the person's to fix; anything else is an
    outage."""
    from ralph_dev.adapters.store import from_iso
    from ralph_dev.core.agent_faults import (
        API_ACCESS,
        API_OUTAGE,
        USAGE_LIMIT,
        classify_stop_failure,
    )
    from ralph_dev.inpane.gemini_exec import error_news

    now = datetime(2026, 11, 28, 13, 0, tzinfo=UTC)

    def fault(message: str) -> Any:
        news = error_news(message, now)
        return classify_stop_failure(news["error"], news["text"], now,
                                     reset_at=from_iso(news.get("reset_at")))

    capacity = fault("[API Error: You have exhausted your capacity on this model. Your "
                     "quota will reset after 1h2m3s.]\nPlease wait and try again later.")
    assert capacity.kind == USAGE_LIMIT
    assert capacity.until == now + timedelta(hours=1, minutes=2, seconds=3)
    suggested = fault("[API Error: Resource has been exhausted (e.g. check quota).\n"
                      "Suggested retry after 3600s.]")
    assert suggested.kind == USAGE_LIMIT and suggested.until == now + timedelta(hours=1)
    daily = fault("[API Error: You have exhausted your daily quota on this model.]\nPlease "
                  "wait and try again later.")
    # midnight Pacific (PST, UTC-8, on Nov 28) after 13:00 UTC = 05:00 PST
    assert daily.kind == USAGE_LIMIT and daily.until == datetime(2026, 11, 29, 8, 0,
                                                                 tzinfo=UTC)
    assert fault("[API Error: Quota exceeded for metric: generate_content_free_tier_"
                 "requests, limit: 0, model: gemini-2.5-pro]").kind == API_ACCESS
    assert fault("[API Error: API key not valid. Please pass a valid API key.]").kind \
        == API_ACCESS
    outage = fault("[API Error: An internal error has occurred. Please retry or report]")
    assert outage.kind == API_OUTAGE


def test_a_gemini_supervisor_feeds_the_prompt_on_stdin_and_reads_its_events(
        tmp_path: Path) -> None:
    """The prompt goes to the CLI's stdin, never its argv (a prompt that starts with ``-``
    is no option); the supervisor exits with the CLI's status and shows its events."""
    from ralph_dev.inpane.gemini_exec import run

    fake = tmp_path / "fake-gemini"
    fake.write_text("#!/bin/sh\nprintf '%s\\n' \"$*\" > \"$0.argv\"\ncat > \"$0.stdin\"\n"
                    "echo '{\"type\":\"init\",\"session_id\":\"0123abcd-0000-4000-8000-"
                    "000000000000\"}'\necho '{\"type\":\"result\",\"status\":\"error\","
                    "\"error\":{\"message\":\"boom\"}}'\nexit 3\n")
    fake.chmod(0o755)
    status = run([str(fake), "--model", "m", "--", "--help; $(touch x) do it"],
                 {"HOME": str(tmp_path)})
    assert status == 3
    assert (tmp_path / "fake-gemini.stdin").read_text() == "--help; $(touch x) do it"
    assert (tmp_path / "fake-gemini.argv").read_text().split() == ["--model", "m"]
    assert not (tmp_path / "x").exists()


@contextlib.contextmanager
def gemini_swarm(world: Any, monkeypatch: pytest.MonkeyPatch, brain: Any,
                 settings: Any = None) -> Iterator[tuple[FakeGemini, Callable[[], Any]]]:
    """The scripted Gemini API playing ``brain``, Gemini CLI pointed at it with its own
    key, and one real controller tick per call: (the API, the tick)."""
    from test_claude_smoke import controller_ticks

    with FakeGemini(brain) as fake:
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake.url)
        monkeypatch.setenv("GEMINI_API_KEY", FAKE_KEY)
        yield fake, controller_ticks(world, settings or world.settings)


@pytest.fixture
def world(xdg: Path, jj_bin: str, tmux_socket: str, gemini_bin: str) -> Iterator[Any]:
    """A project whose workers run Gemini CLI; the real controller's windows
    (``test_claude_smoke.controller_ticks``) open on the test's tmux server."""
    config = cli_project(xdg, tmux_socket, GEMINI, gemini_bin)
    with open_world(xdg, jj_bin, tmux_socket, config) as made:
        yield made


def diagnostics(world: Any, api: FakeGemini, issue: str) -> str:
    panes = "\n".join(world.tmux.capture(w.pane_id, 40) for w in world.tmux.find(issue))
    return (f"\n--- pane ---\n{panes}\n--- events ---\n"
            f"{[(e['event'], e.get('reason', '')) for e in world.store.iter_events()]}"
            f"\n--- api ---\n{[r.path for r in api.requests]} {api.errors}")


def done_or_say_why(world: Any, api: FakeGemini, issue: str, tick: Callable[[], Any],
               timeout: float, what: str) -> None:
    retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                         is StateType.COMPLETED)[1], timeout, 0.5,
                what=f"{what}{diagnostics(world, api, issue)}")


def test_a_gemini_worker_does_its_issue_confined_with_its_own_home_and_key(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: the controller starts Gemini CLI for an issue; it runs its real shell
    tool in the workspace with its own ``.gemini`` and no other provider's key, reports
    done, and the change is merged; its spawn names the CLI, its tokens are counted."""
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt $(touch /tmp/no)")])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-reach-gemini")

    def brain(request: dict[str, Any]) -> list[Any]:
        said = conversation_text(request)
        if "echo fine" not in said:
            return [bash("echo fine > ok.txt && echo \"home=$GEMINI_CLI_HOME "
                         "key=${OPENAI_API_KEY:-none}\"", "create the file")]
        if "Added ok.txt with Gemini" not in said:
            return [bash(f"ralph-dev worker done {issue} --summary 'Added ok.txt with "
                         "Gemini.'")]
        return [Text("Reported.")]

    with gemini_swarm(world, monkeypatch, brain) as (api, tick):
        done_or_say_why(world, api, issue, tick, 180, f"{issue} done")
    assert set(api.models()) == {GEMINI.default_model}
    assert issue in json.dumps(api.generations()[0])  # the prompt (on stdin) reached it
    said = json.dumps(api.generations()[-1])
    home = world.settings.paths.worker_dir(issue) / "home"
    assert f"home={home}" in said and "key=none" in said
    assert all("x-goog-api-key" not in r.headers for r in api.requests)  # never recorded
    spawns = [e for e in world.store.iter_events() if e["event"] == "spawn"]
    assert [e.get("cli") for e in spawns] == ["gemini"]
    assert not Path("/tmp/no").exists()
    from ralph_dev.control.loop.costs import issue_spend, load

    spent = issue_spend(load(world.settings), issue)
    assert spent.output == sum(u["candidatesTokenCount"] for u in api.usages), spent
    assert spent.usd > 0
    assert "ok.txt" in world.jj_out("file", "list", "-r", "main")


def test_a_quota_pauses_a_gemini_worker_and_it_resumes_its_session_after_the_reset(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: the API refuses with the plan's quota used up, stating its reset
    ("Your quota will reset after 31s"); Gemini CLI ends its turn and exits. The swarm
    pauses until that reset, charging nothing; then the worker starts again in its own
    session (``--resume``: the model sees its first step) and finishes."""
    from ralph_dev.core.agent_faults import USAGE_LIMIT
    from ralph_dev.devtools.api_faults import gemini_quota

    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt")])
    finish = f"touch ok.txt && ralph-dev worker done {issue} --summary 'added ok.txt'"
    resets: list[float] = []
    refused: list[float] = []
    fresh: list[float] = []

    def brain(request: dict[str, Any]) -> list[Any]:
        said = conversation_text(request)
        if "echo started" not in said:
            fresh.append(time.time())
            return [bash("echo started > started.txt", "start")]
        now = time.time()
        if not resets:
            resets.append(now + 30)
        if now < resets[0]:
            refused.append(now)
            return [gemini_quota(resets[0])]
        return [Text("Done.")] if "touch ok.txt" in said else [bash(finish)]

    with gemini_swarm(world, monkeypatch, brain) as (api, tick):
        retry_until(lambda: (tick(), any(p.kind == USAGE_LIMIT
                                         for p in world.store.load_pauses()))[1], 120, 0.5,
                    what="the quota pause" + diagnostics(world, api, issue))
        (pause,) = world.store.load_pauses()
        # until the stated reset, read from a relative wait ("after 30s"): never before
        # it, and late only by how long the CLI took to say it (seconds on a loaded host)
        assert pause.until is not None and -1 < pause.until.timestamp() - resets[0] < 10
        done_or_say_why(world, api, issue, tick, 240, f"{issue} done after the reset")
    events = list(world.store.iter_events())
    spawns = [e for e in events if e["event"] == "spawn"]
    assert [e["attempt"] for e in spawns] == [1, 1], [e["reason"] for e in spawns]
    assert "no attempt charged" in spawns[1]["reason"] and spawns[1].get("resume")
    assert not [e for e in events if e["event"] == "hold"]
    assert len(fresh) == 1, fresh  # resumed, not started over
    assert len(refused) == 1  # nothing went to the API during the pause


def swarm_of(world: Any, monkeypatch: pytest.MonkeyPatch) -> cli_kit.SwarmOf:
    return lambda brain, settings=None: gemini_swarm(world, monkeypatch, brain, settings)


def generations(api: FakeGemini) -> int:
    return len(api.generations())


def test_a_gemini_turn_ending_on_a_question_reaches_a_person_and_the_answer_its_session(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: Gemini CLI ends its turn asking a person something and reports nothing;
    the question goes on the issue, no attempt is charged, and the person's answer starts
    the same session again (``--resume``), which then finishes the issue."""
    cli_kit.question_goes_to_a_person(world, swarm_of(world, monkeypatch), generations)


def test_a_crashed_gemini_is_resumed_in_its_own_session(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: Gemini CLI dies mid-task; its next attempt resumes the session its
    supervisor told."""
    cli_kit.crash_resumes_its_session(world, swarm_of(world, monkeypatch), generations)


def test_a_run_of_5xx_gemini_retries_by_itself_is_not_taken_for_hung(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: the API answers 500 for 25 s; Gemini CLI retries by itself, 5, 10, 20 s
    apart, saying so only on stderr. Its supervisor tells each retry and each retried call,
    so with a 10 s ``hang_timeout`` the worker is never restarted as hung, and it goes on
    in its first attempt once the API answers."""
    from ralph_dev.devtools.api_faults import gemini_server_error

    first: list[float] = []

    def failing() -> list[Any]:
        if not first:
            first.append(time.time())
        return [gemini_server_error()] if time.time() - first[0] < 25 else []

    events = cli_kit.through_a_fault(world, swarm_of(world, monkeypatch), Timing(
        poll_interval=0.5, stall_timeout=600, restart_timeout=600, hang_timeout=10), failing)
    assert first  # the fault was met
    assert not [e for e in events if e["event"] in ("restart", "hold", "agent_api_error")]
    assert [e["attempt"] for e in events if e["event"] == "spawn"] == [1]


def test_a_hung_gemini_call_is_restarted_in_its_own_session(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: a model call that never answers (the CLI's events stop, it announces no
    retry) is a hang: after ``hang_timeout`` the worker is restarted in its own session,
    free."""
    cli_kit.hang_restarts_its_session(world, swarm_of(world, monkeypatch))
