"""Issue 36, an account is shared: a usage limit (or an outage) that any project's worker
meets pauses every project on the same account at once, with one notification, and all
go on at the reset with no attempt charged."""
# ruff: noqa: F811  (the smoke tests' fixtures, imported: their parameters shadow them)

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import make_jj_repo, retry_until
from test_claude_limits import Calls, LimitFromFirstCall
from test_claude_smoke import (  # noqa: F401 (fixtures)
    World,
    claude_bin,
    controller_ticks,
    diagnostics,
    world,
)
from test_decide import NOW, issue, rec, run, settings
from test_decide import world as observed
from test_notify import Receiver, _notifier, _settings, _tracker_with_question

from ralph_dev.adapters.accounts import ENDED_GRACE, AccountPauses, AccountWindows, account_of
from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.jj_cli import child_path
from ralph_dev.adapters.mailbox import window_fields
from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.adapters.tracker.local import LocalTracker
from ralph_dev.control.state.status import load_schema, snapshot
from ralph_dev.control.state.text import render
from ralph_dev.core.actions import EndPause, PauseSwarm, Spawn
from ralph_dev.core.agent_faults import USAGE_LIMIT, key_windows
from ralph_dev.core.config import AccountSettings, build_project, load_project
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.model import NewIssue, Pause, StateType, UsageWindow
from ralph_dev.core.pacing import pace
from ralph_dev.devtools.api_faults import usage_limit
from ralph_dev.devtools.scripted_model import (
    FakeAnthropic,
    Text,
    bash,
    is_key_probe,
    is_main_conversation,
    tool_uses_so_far,
)

# --- the account's name -----------------------------------------------------------------


def test_an_account_is_its_key_or_login_and_its_name_says_nothing_of_either() -> None:
    app = build_project("app", {"repo": "/nonexistent/app"})
    web = build_project("web", {"repo": "/nonexistent/web"})
    key = {"ANTHROPIC_API_KEY": "sk-ant-api03-very-secret-key", "HOME": "/home/me"}
    assert account_of(app, key) == account_of(web, key)
    assert "secret" not in account_of(app, key) and account_of(app, key).startswith("claude-")
    assert account_of(app, {**key, "ANTHROPIC_API_KEY": "sk-ant-api03-another"}) \
        != account_of(app, key)
    assert account_of(app, {**key, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}) \
        != account_of(app, key)
    login = {"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-subscriber", "HOME": "/home/me"}
    assert account_of(app, login) != account_of(app, key)
    assert account_of(app, {"HOME": "/home/me"}) == account_of(web, {"HOME": "/home/me"})
    command = build_project("cmd", {"repo": "/x", "agent": {"runner": "command",
                                                             "command": "true"}})
    assert account_of(command, key) == ""


def test_a_pause_met_by_one_project_is_read_by_the_others_until_its_end(
        tmp_path: Path) -> None:
    app, web = (AccountPauses("claude-0123", name, tmp_path) for name in ("app", "web"))
    pause = Pause(kind=USAGE_LIMIT, cause="the model's usage limit was reached", fix="wait",
                  since=NOW, until=NOW + timedelta(minutes=30), quiet_workers=True)
    app.share(pause)
    assert app.read(NOW) == ()  # its own is its own
    (seen,) = web.read(NOW)
    assert (seen.kind, seen.until, seen.shared_from) == (USAGE_LIMIT, pause.until, "app")
    # its end passed: it stands until app ends it there (app's probe may find the limit
    # still in force), or for ENDED_GRACE if app never does (its controller stopped)
    assert web.read(NOW + timedelta(minutes=30, seconds=10)) != ()
    assert web.read(NOW + timedelta(minutes=30) + ENDED_GRACE) == ()
    web.withdraw(USAGE_LIMIT)  # only the project that met it ends it
    assert web.read(NOW) != ()
    app.withdraw(USAGE_LIMIT)
    assert web.read(NOW) == ()
    assert "sk-ant" not in "".join(p.read_text() for p in tmp_path.iterdir() if p.is_file())


# --- decide -----------------------------------------------------------------------------


def test_another_projects_limit_on_the_account_pauses_this_one_at_once() -> None:
    until = NOW + timedelta(minutes=20)
    shared = Pause(kind=USAGE_LIMIT, cause="the model's usage limit was reached",
                   fix="nothing: wait", until=until, quiet_workers=True, shared_from="web")
    plan = run(observed(issues=[issue(1)], account_pauses=(shared,)))
    (paused,) = [a for a in plan.actions if isinstance(a, PauseSwarm)]
    assert paused.shared_from == "web" and not paused.share_account
    assert paused.until == until and paused.quiet_workers
    assert "met by project web, on the same account" in paused.cause
    assert not [a for a in plan.actions if isinstance(a, Spawn)]
    # in force: nothing more to do; over there: over here
    standing = Pause(kind=USAGE_LIMIT, cause=paused.cause, fix="", until=until,
                     quiet_workers=True, shared_from="web")
    assert not [a for a in run(observed(issues=[issue(1)], pauses=(standing,),
                                        account_pauses=(shared,))).actions
                if isinstance(a, PauseSwarm | EndPause)]
    ended = run(observed(issues=[issue(1)], pauses=(standing,)))
    (end,) = [a for a in ended.actions if isinstance(a, EndPause)]
    assert end.pause_kind == USAGE_LIMIT and not end.share_account
    assert "project web's pause on the same account is over" in end.reason
    # past its end and still not ended there: it stands, looked at again within a second
    late = NOW + timedelta(minutes=21)
    past = run(observed(issues=[issue(1)], pauses=(standing,), account_pauses=(shared,)),
               now=late)
    assert not [a for a in past.actions if isinstance(a, PauseSwarm | EndPause | Spawn)]
    assert past.due is not None and past.due <= late + timedelta(seconds=1)


def test_a_limit_met_here_is_shared_with_the_account_and_its_end_too() -> None:
    limited = rec("DEMO-1", agent_error="rate_limit", agent_error_at=NOW,
                  agent_error_text="You've hit your session limit · resets 1pm (UTC)",
                  agent_error_reset_at=NOW + timedelta(minutes=50))
    plan = run(observed(issues=[issue(1, "started")], records=[limited]))
    (paused,) = [a for a in plan.actions if isinstance(a, PauseSwarm)]
    assert paused.pause_kind == USAGE_LIMIT and paused.share_account and not paused.shared_from
    own = Pause(kind=USAGE_LIMIT, cause="x", until=NOW - timedelta(seconds=1))
    (end,) = [a for a in run(observed(pauses=(own,))).actions if isinstance(a, EndPause)]
    assert end.share_account


async def test_an_accounts_pause_is_told_by_the_project_that_met_it_only(
        xdg: Path, tmp_path: Path) -> None:
    with Receiver() as receiver:
        settings = _settings(tmp_path, receiver)
        store = StateStore(settings.paths)
        notifier = _notifier(settings, store, await _tracker_with_question(settings))
        store.set_pause(Pause(kind=USAGE_LIMIT, cause="the usage limit (met by project web)",
                              until=datetime.now(UTC) + timedelta(hours=1), quiet_workers=True,
                              shared_from="web"))
        assert await notifier.poll() == 0 and receiver.messages == []
        store.clear_pause(USAGE_LIMIT, why="over")
        store.set_pause(Pause(kind=USAGE_LIMIT, cause="the usage limit", quiet_workers=True,
                              until=datetime.now(UTC) + timedelta(hours=1)))
        assert await notifier.poll() == 1


# --- two projects, one account, the real Claude Code --------------------------------------

FINISH = 'touch ok.txt && ralph-dev worker done "$RALPH_DEV_ISSUE" --summary "added ok.txt"'
"""Each worker's one step (its issue is in its environment: one script for both)."""


def _second_project(world: World, tmux_socket: str, claude_bin: str) -> World:
    """Project ``second`` beside the world's ``demo``: its own repository, tracker and
    tmux session, on the same host, config and (through the environment) account."""
    repo = world.tmp / "second-repo"
    env = {**os.environ, "JJ_USER": "t", "JJ_EMAIL": "t@example.com", "PATH": child_path()}
    subprocess.run([world.jj_bin, "git", "init", str(repo)], check=True, capture_output=True,
                   env=env)
    (repo / "README").write_text("second\n")
    for args in (["commit", "-m", "init"], ["bookmark", "create", "main", "-r", "@-"]):
        subprocess.run([world.jj_bin, *args], cwd=repo, check=True, capture_output=True,
                       env=env)
    config = world.tmp / "config" / "ralph-dev" / "config.toml"
    config.write_text(config.read_text() + "\n".join([
        "", "[projects.second]", f"repo = {json.dumps(str(repo))}", 'trunk = "main"',
        f"tmux_socket = {json.dumps(tmux_socket)}",
        "[projects.second.tracker]", 'key = "SEC"',
        "[projects.second.agent]", f"claude_bin = {json.dumps(claude_bin)}",
        'home = "isolated"', "iteration_cap = 8", ""]))
    settings = load_project("second", path=config)
    tmux = Tmux(settings.session_name, socket_name=tmux_socket)
    tmux.ensure_session(world.tmp, {"PATH": os.environ["PATH"]})
    return World(world.tmp, settings, LocalTracker(settings.paths.tracker_db, "SEC"),
                 JjRepository.from_settings(settings), StateStore(settings.paths), tmux,
                 world.jj_bin, world.controller)


# --- pacing the account's usage windows (issue 36) ----------------------------------------


def _window(name: str, used: float, resets_in: timedelta) -> UsageWindow:
    return UsageWindow(name=name, used=used, resets_at=NOW + resets_in, seen_at=NOW)


def test_a_spent_window_holds_new_workers_until_its_reset_and_a_fresh_one_does_not() -> None:
    spent = _window("five_hour", 0.8, timedelta(hours=2))  # 20% kept for the person
    hold = pace([spent], 0.2, NOW)
    assert hold is not None and hold.until == spent.resets_at
    assert "5-hour window is 80% used (20% kept for your own use)" in hold.why
    assert pace([_window("five_hour", 0.39, timedelta(hours=1))], 0.2, NOW) is None
    assert pace([spent], 0.1, NOW) is None or pace([spent], 0.1, NOW).until < spent.resets_at
    assert pace([dataclasses.replace(spent, resets_at=NOW)], 0.2, NOW) is None  # started over


def test_a_window_used_faster_than_it_passes_slows_the_starts_until_it_catches_up() -> None:
    """60% of a 5-hour window used with 3 hours left (40% gone), 80% usable: starts wait
    until 60/80 of the window is gone, 1h45m from now; then they go on."""
    window = _window("five_hour", 0.6, timedelta(hours=3))
    hold = pace([window], 0.2, NOW)
    assert hold is not None and hold.until == NOW + timedelta(hours=1, minutes=45)
    assert "60% used with 40% of it gone" in hold.why
    assert pace([window], 0.2, hold.until) is None
    # of two windows, the one that holds longest says why
    week = _window("seven_day", 0.85, timedelta(days=2))
    assert pace([window, week], 0.2, NOW).window == week  # type: ignore[union-attr]


def test_decide_paces_every_start_and_is_due_when_the_window_allows_again() -> None:
    window = _window("five_hour", 0.9, timedelta(minutes=10))
    paced = observed(issues=[issue(1), issue(2)], account="claude-0123",
                     account_windows=(window,))
    plan = run(paced)
    assert not [a for a in plan.actions if isinstance(a, Spawn)]
    assert {i: (w.kind, w.until) for i, w in plan.waits.items()} == {
        "DEMO-1": ("pacing", window.resets_at), "DEMO-2": ("pacing", window.resets_at)}
    assert plan.due == window.resets_at
    # a reserve named for this account wins over the default: 95% usable, and 97% of
    # the window is gone

    roomy = settings(accounts={"claude-0123": AccountSettings(reserve=0.05),
                                    "default": AccountSettings(reserve=0.5)})
    assert [a.issue for a in run(paced, roomy).actions if isinstance(a, Spawn)] == [
        "DEMO-1", "DEMO-2"]


def test_the_accounts_tables_are_the_hosts_and_a_named_one_wins(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    repo = make_jj_repo(tmp_path / "repo")
    config.write_text(f'[accounts.default]\nreserve = 0.3\n[accounts.claude-0123]\n'
                      f'reserve = 0.1\n[projects.app]\nrepo = "{repo}"\n')
    app = load_project("app", path=config)
    assert app.account_settings("claude-0123").reserve == 0.1
    assert app.account_settings("claude-9999").reserve == 0.3
    config.write_text(f'[projects.app]\nrepo = "{repo}"\n[projects.app.accounts.default]\n'
                      'reserve = 0.2\n')
    with pytest.raises(ConfigError, match=r"projects\.app\.accounts: .*top-level \[accounts\]"):
        load_project("app", path=config)
    config.write_text(f'[accounts.default]\nreserve = 1\n[projects.app]\nrepo = "{repo}"\n')
    with pytest.raises(ConfigError, match=r"accounts\.default\.reserve: must be at least 0 "
                                          r"and below 1"):
        load_project("app", path=config)
    config.write_text(f'[accounts]\nreserve = 0.2\n[projects.app]\nrepo = "{repo}"\n')
    with pytest.raises(ConfigError, match=r"accounts: expected \[accounts\.NAME\] tables"):
        load_project("app", path=config)


@pytest.mark.parametrize("said", [
    {"five_hour": {"used_percentage": True, "resets_at": 1795820624}},
    {"five_hour": {"used_percentage": float("nan"), "resets_at": 1795820624}},
    {"five_hour": {"used_percentage": 420, "resets_at": 1795820624}},
    {"five_hour": {"used_percentage": "42", "resets_at": 1795820624}},
    {"five_hour": {"used_percentage": 42, "resets_at": 2**40}},
    {"five_hour": [42]},
    "42%",
])
def test_a_workers_odd_window_report_is_not_believed(said: Any) -> None:
    """A worker is a possibly hostile process: only sane numbers become windows."""
    assert window_fields({"rate_limits": said}) == {}
    assert window_fields({"rate_limits": {"five_hour": {
        "used_percentage": 42, "resets_at": 1795820624}}})["five_hour"][0] == 0.42


def test_an_accounts_windows_are_kept_once_per_change_and_dropped_at_their_reset(
        tmp_path: Path) -> None:
    windows = AccountWindows("claude-0123", tmp_path)
    reset = NOW + timedelta(hours=1)
    assert windows.note({"five_hour": (0.42, reset)}, NOW)
    assert not windows.note({"five_hour": (0.42, reset)}, NOW + timedelta(seconds=5))
    assert windows.note({"five_hour": (0.5, reset), "seven_day": (0.1, NOW + timedelta(days=9))},
                        NOW)  # (a reset more than 8 days ahead is no window: left out)
    (five,) = windows.read(NOW)
    assert (five.used, five.resets_at) == (0.5, reset)
    assert windows.read(reset) == ()
    assert not AccountWindows("", tmp_path).note({"five_hour": (0.5, reset)}, NOW)


@pytest.mark.slow
@pytest.mark.claude
def test_a_limit_one_project_meets_pauses_every_project_on_its_account(
        world: World, tmux_socket: str, claude_bin: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two projects on one subscriber's account. Once ``demo``'s worker met the usage
    limit, ``second`` starts nothing and no request leaves either project until the
    reset; both finish after it, with one notification's worth of pause (``second``'s
    names the project that met it) and no attempt charged."""
    second = _second_project(world, tmux_socket, claude_bin)
    limit = LimitFromFirstCall(past=45)
    calls = Calls()

    def brain(request: dict[str, Any]) -> list[Any]:
        now = calls.note(request)
        if now < limit.until(now):
            return [usage_limit(limit.until(now))]
        if not is_main_conversation(request):
            return [Text("ok")]
        return [Text("Done.")] if tool_uses_so_far(request) else [bash(FINISH)]

    (one,) = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt")])
    (two,) = second.tracker.create_issues_sync([NewIssue(title="Add ok.txt")])
    try:
        with FakeAnthropic(brain) as api:
            monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
            monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
            monkeypatch.setenv("CLAUDE_CODE_OAUTH_TOKEN",
                               "sk-ant-oat01-fake-subscriber-0123456789")
            monkeypatch.setenv("CLAUDE_CODE_SUBSCRIPTION_TYPE", "max")
            tick_demo = controller_ticks(world, world.settings)
            tick_second = controller_ticks(second, second.settings)
            tick_demo()  # demo's worker starts, and meets the limit
            retry_until(lambda: (tick_demo(), any(
                p.kind == USAGE_LIMIT for p in world.store.load_pauses()))[1], 90,
                what="demo's usage-limit pause" + diagnostics(world, api, one))
            seen_at = time.time()
            tick_second()  # one tick: second pauses with it, and starts nothing
            (shared,) = second.store.load_pauses()
            assert shared.kind == USAGE_LIMIT and shared.shared_from == "demo"
            assert shared.until == world.store.load_pauses()[0].until
            assert not [w for w in second.tmux.list_windows() if w.name == two]

            def both_done() -> bool:
                tick_demo()
                tick_second()
                return all(t.get_sync(i).state_type is StateType.COMPLETED
                           for t, i in ((world.tracker, one), (second.tracker, two)))

            retry_until(both_done, 240, what="both issues done after the reset"
                        + diagnostics(world, api, one) + diagnostics(second, api, two))
        def first(w: World, name: str) -> float:
            return min(datetime.fromisoformat(e["time"]).timestamp()
                       for e in w.store.iter_events() if e["event"] == name)

        resets_at = limit.until(0)
        stated = resets_at // 60 * 60  # the minute the text says: demo's probe asks then
        assert calls.between(seen_at, stated) == 0  # not one request from either before
        # demo's probe found the limit in force at the stated minute, and second started
        # nothing meanwhile (issue 36: a reset a probe finds still in force is not met again
        # by the other projects)
        assert first(world, "swarm_resumed") >= resets_at - 1
        assert first(second, "swarm_resumed") >= resets_at - 1
        assert first(second, "spawn") >= resets_at - 1
        for w, ident in ((world, one), (second, two)):
            events = list(w.store.iter_events())
            assert [e["attempt"] for e in events if e["event"] == "spawn"] == [1], ident
            assert not [e for e in events if e["event"] in ("hold", "restart")], ident
        told = [e for e in second.store.iter_events() if e["event"] == "swarm_paused"]
        assert told and {e.get("shared_from") for e in told} == {"demo"}  # demo's, not here
    finally:
        second.tmux.kill_session()


def a_short_task(request: dict[str, Any]) -> list[Any]:
    """A worker that takes two steps (a short wait, then its file and its report)."""
    if not is_main_conversation(request):
        return [Text("ok")]
    steps = tool_uses_so_far(request)
    return [bash("sleep 2")] if steps == 0 else [bash(
        'touch ok.txt "$RALPH_DEV_ISSUE.txt" && ralph-dev worker done "$RALPH_DEV_ISSUE" '
        '--summary "added its file"')] if steps == 1 else [Text("Done.")]


def started_and_done(world: World, tick: Callable[[], Any]
                     ) -> tuple[dict[str, float], Callable[[str], bool]]:
    """When each issue's first spawn was seen, and a check that ticks and says whether
    an issue is done (the spawns seen on the way noted)."""
    started: dict[str, float] = {}

    def done(ident: str) -> bool:
        tick()
        for event in world.store.iter_events():
            if event["event"] == "spawn" and event.get("issue"):
                started.setdefault(event["issue"], time.time())
        return world.tracker.get_sync(ident).state_type is StateType.COMPLETED

    return started, done


@pytest.mark.slow
@pytest.mark.claude
def test_a_subscribers_usage_windows_are_read_shown_and_pace_the_next_start(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36: pacing before the limit. Every answer of the model API states the
    subscriber's five-hour and seven-day windows; the real Claude Code hands them to the
    worker's status line, which tells the controller. With the five-hour window 85% used
    and 20% kept for the person, the next issue does not start until that window resets;
    ``status`` says the windows and why the issue waits, and it starts after the reset."""
    resets_at = int(time.time()) + 50
    week = int(time.time()) + 3 * 86400
    one, two = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt", priority=1),
                                                 NewIssue(title="Add ok.txt too", priority=2)])
    def windows() -> dict[str, str]:
        return {"anthropic-ratelimit-unified-status": "allowed",
                "anthropic-ratelimit-unified-5h-utilization": "0.85",
                "anthropic-ratelimit-unified-5h-reset": str(resets_at),
                "anthropic-ratelimit-unified-7d-utilization": "0.3",
                "anthropic-ratelimit-unified-7d-reset": str(week)}

    settings = dataclasses.replace(world.settings, limits=dataclasses.replace(
        world.settings.limits, max_workers=1))
    with FakeAnthropic(a_short_task, answer_headers=windows) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
        monkeypatch.setenv("CLAUDE_CODE_OAUTH_TOKEN", "sk-ant-oat01-fake-subscriber-0123456789")
        monkeypatch.setenv("CLAUDE_CODE_SUBSCRIPTION_TYPE", "max")
        account = account_of(settings, os.environ)
        tick = controller_ticks(world, settings)
        started, done = started_and_done(world, tick)

        retry_until(lambda: done(one), 120, what=f"{one} done" + diagnostics(world, api, one))
        (five, seven) = AccountWindows(account).read(datetime.now(UTC))
        assert (five.name, five.used, five.resets_at.timestamp()) == (
            "five_hour", 0.85, resets_at)
        assert (seven.name, seven.used) == ("seven_day", 0.3)
        tick()
        wait = world.store.read_waits()[two]
        assert wait["kind"] == "pacing" and "5-hour window is 85% used" in wait["why"]
        assert datetime.fromisoformat(wait["until"]).timestamp() == resets_at
        doc = asyncio.run(snapshot(settings))
        jsonschema.Draft202012Validator(load_schema()).validate(doc)
        assert doc["account"]["name"] == account and doc["account"]["reserve"] == 0.2
        assert doc["account"]["pacing"]["window"] == "five_hour"
        text = render(doc)
        assert "5-hour 85% used, resets" in text and "7-day 30% used" in text, text
        assert "sk-ant" not in json.dumps(doc) + text  # the account is its fingerprint
        retry_until(lambda: done(two), 180, what=f"{two} done after the reset"
                    + diagnostics(world, api, two))
    assert started[two] >= resets_at - 1  # not before the window started over


def test_an_api_keys_limits_are_read_from_its_headers() -> None:
    said = key_windows({
        "anthropic-ratelimit-tokens-limit": "100000",
        "anthropic-ratelimit-tokens-remaining": "10000",
        "anthropic-ratelimit-tokens-reset": "2026-11-23T02:11:00Z",
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "60",  # more than the limit: none used
        "anthropic-ratelimit-requests-reset": "2026-11-23T02:10:31Z",
        "anthropic-ratelimit-input-tokens-limit": "0",  # no limit stated: left out
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": "2026-11-23T02:11:00Z",
        "anthropic-ratelimit-output-tokens-limit": "8000",
        "anthropic-ratelimit-output-tokens-remaining": "100",
        "anthropic-ratelimit-output-tokens-reset": "soon",  # not a time: left out
    })
    assert said == {"tokens": (0.9, datetime(2026, 11, 23, 2, 11, tzinfo=UTC)),
                    "requests": (0.0, datetime(2026, 11, 23, 2, 10, 31, tzinfo=UTC))}
    hold = pace([UsageWindow("tokens", 0.9, said["tokens"][1], NOW)], 0.2, NOW)
    assert hold is not None and hold.until == said["tokens"][1]
    assert "tokens/min window is 90% used" in hold.why


def test_one_project_on_an_account_asks_for_its_key_limits_a_minute(tmp_path: Path) -> None:
    """Two projects' probes at the same moment make one request; the next a minute on."""
    first, second = (AccountWindows("claude-0123", tmp_path) for _ in range(2))
    assert first.claim_probe(NOW)
    assert not second.claim_probe(NOW + timedelta(seconds=59))
    assert second.claim_probe(NOW + timedelta(seconds=60))
    first.probed("claude-sonnet-4-5")
    assert second.last_probe() == (NOW + timedelta(seconds=60), "claude-sonnet-4-5")
    assert second.claim_probe(NOW - timedelta(seconds=1))  # a clock set back: asked again
    assert not AccountWindows("", tmp_path).claim_probe(NOW)  # no account: never asked


def test_decide_asks_for_the_key_limits_only_while_issues_wait_and_once_a_minute() -> None:
    from ralph_dev.core.actions import ProbeAccount

    s = settings()
    waiting = observed([issue("ENG-1")], key_account=True)
    (probe,) = [a for a in run(waiting, s).actions if isinstance(a, ProbeAccount)]
    assert "never read" in probe.reason
    recent = dataclasses.replace(waiting, account_probed_at=NOW - timedelta(seconds=30))
    assert not [a for a in run(recent, s).actions if isinstance(a, ProbeAccount)]
    stale = dataclasses.replace(waiting, account_probed_at=NOW - timedelta(seconds=61))
    assert [a for a in run(stale, s).actions if isinstance(a, ProbeAccount)]
    for quiet in (observed([], key_account=True), observed([issue("ENG-1")])):
        assert not [a for a in run(quiet, s).actions if isinstance(a, ProbeAccount)]


@pytest.mark.slow
@pytest.mark.claude
def test_an_api_keys_limits_are_asked_for_shown_and_pace_the_next_start(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36: pacing an API key. Claude Code passes a key's rate-limit headers on
    nowhere, so the controller asks the API itself, once a minute while issues wait, for
    the model its worker uses. The key's tokens-per-minute limit is 90% used with 20%
    kept for the person: the second issue waits for pacing until the limit's reset, and
    ``status`` says so."""
    resets_at = int(time.time()) + 50
    one, two = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt", priority=1),
                                                 NewIssue(title="Add ok.txt too", priority=2)])
    probes: list[float] = []

    def brain(request: dict[str, Any]) -> list[Any]:
        if is_key_probe(request):
            probes.append(time.time())
        return a_short_task(request)

    def limits() -> dict[str, str]:
        reset = datetime.fromtimestamp(resets_at, UTC).isoformat().replace("+00:00", "Z")
        return {"anthropic-ratelimit-tokens-limit": "100000",
                "anthropic-ratelimit-tokens-remaining": "10000",
                "anthropic-ratelimit-tokens-reset": reset,
                "anthropic-ratelimit-requests-limit": "50",
                "anthropic-ratelimit-requests-remaining": "49",
                "anthropic-ratelimit-requests-reset": reset}

    settings = dataclasses.replace(world.settings, limits=dataclasses.replace(
        world.settings.limits, max_workers=1))
    key = "sk-ant-api03-fake-paced-key-0123456789"
    with FakeAnthropic(brain, answer_headers=limits) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", key)
        monkeypatch.delenv("CLAUDE_CODE_OAUTH_TOKEN", raising=False)
        account = account_of(settings, os.environ)
        tick = controller_ticks(world, settings)
        started, done = started_and_done(world, tick)

        retry_until(lambda: done(one), 120, what=f"{one} done" + diagnostics(world, api, one))
        retry_until(lambda: (tick(), two in world.store.read_waits())[1], 30,
                    what=f"{two} waiting")
        windows = {w.name: w for w in AccountWindows(account).read(datetime.now(UTC))}
        assert windows["tokens"].used == 0.9 and windows["requests"].used == 0.02
        assert windows["tokens"].resets_at.timestamp() == resets_at
        wait = world.store.read_waits()[two]
        assert wait["kind"] == "pacing" and "tokens/min window is 90% used" in wait["why"]
        (probe,) = [e for e in world.store.iter_events() if e["event"] == "account_probed"]
        assert probe["tokens"] == 0.9 and probe["status"] == 200
        assert probe["model"] == api.main_messages()[0]["model"]  # the worker's own model
        doc = asyncio.run(snapshot(settings))
        jsonschema.Draft202012Validator(load_schema()).validate(doc)
        text = render(doc)
        assert "tokens/min 90% used, resets" in text, text
        assert key not in json.dumps(doc) + text + world.settings.paths.events_file.read_text()
        retry_until(lambda: done(two), 180, what=f"{two} done after the reset"
                    + diagnostics(world, api, two))
    assert started[two] >= resets_at - 1  # not before the limit was full again
    assert probes and all(b - a >= 59 for a, b in itertools.pairwise(probes))


def test_an_openai_keys_limits_are_asked_for_once_a_minute_and_hold_the_next_start(
        xdg: Path) -> None:
    """Codex keeps only a ChatGPT plan's windows: an OpenAI key's ``x-ratelimit-*`` are
    asked for by the controller with the key and model its workers use."""
    from ralph_dev.adapters.accounts import KeyProbe
    from ralph_dev.devtools.scripted_openai import FakeOpenAI
    from ralph_dev.devtools.scripted_openai import Text as Said

    key = "sk-proj-fake-openai-key-0123456789"
    limits = {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
              "x-ratelimit-reset-requests": "1s", "x-ratelimit-limit-tokens": "150000",
              "x-ratelimit-remaining-tokens": "15000", "x-ratelimit-reset-tokens": "6m0s"}
    project = build_project("codexy", {"repo": str(xdg / "repo"), "agent": {"cli": "codex"}})
    store = StateStore(project.paths)
    now = datetime.now(UTC)
    with FakeOpenAI(lambda _request: [Said("ok")], answer_headers=lambda: limits) as api:
        env = {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": f"{api.url}/v1"}
        windows = AccountWindows(account_of(project, env), xdg / "accounts")
        probe = KeyProbe.of(project, windows, store, env)
        assert probe.possible and probe.model == "gpt-5-codex"
        probe.run([], now)
        probe.run([], now + timedelta(seconds=30))  # within the minute: not asked again
        (asked,) = api.responses()
        assert asked["model"] == "gpt-5-codex" and asked["max_output_tokens"] == 16
    read = {w.name: w for w in windows.read(now)}
    assert read["tokens"].used == 0.9 and read["tokens"].resets_at == now + timedelta(minutes=6)
    hold = pace(read.values(), 0.2, now)
    assert hold is not None and hold.until == now + timedelta(minutes=6)
    assert "tokens/min window is 90% used" in hold.why
    (event,) = [e for e in store.iter_events() if e["event"] == "account_probed"]
    assert event["model"] == "gpt-5-codex" and event["tokens"] == 0.9
    assert key not in project.paths.events_file.read_text()
    # a ChatGPT login, or a Gemini key, has nothing to ask
    assert not KeyProbe.of(project, windows, store, {"OPENAI_BASE_URL": api.url}).possible
