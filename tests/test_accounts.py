"""Issue 36, an account is shared: a usage limit (or an outage) that any project's worker
meets pauses every project on the same account at once, with one notification, and all
go on at the reset with no attempt charged."""
# ruff: noqa: F811  (the smoke tests' fixtures, imported: their parameters shadow them)

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import retry_until
from test_claude_limits import Calls
from test_claude_smoke import (  # noqa: F401 (fixtures)
    World,
    claude_bin,
    controller_ticks,
    diagnostics,
    world,
)
from test_decide import NOW, issue, rec, run
from test_decide import world as observed
from test_notify import Receiver, _notifier, _settings, _tracker_with_question

from ralph_dev.adapters.accounts import ENDED_GRACE, AccountPauses, account_of
from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.jj_cli import child_path
from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.adapters.tracker.local import LocalTracker
from ralph_dev.core.actions import EndPause, PauseSwarm, Spawn
from ralph_dev.core.agent_faults import USAGE_LIMIT
from ralph_dev.core.config import build_project, load_project
from ralph_dev.core.model import NewIssue, Pause, StateType
from ralph_dev.devtools.api_faults import usage_limit
from ralph_dev.devtools.scripted_model import (
    FakeAnthropic,
    Text,
    bash,
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
    resets_at = (int(time.time()) // 60 + 1) * 60 + 45
    if resets_at - time.time() < 40:
        resets_at += 60
    calls = Calls()

    def brain(request: dict[str, Any]) -> list[Any]:
        if calls.note(request) < resets_at:
            return [usage_limit(resets_at)]
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
