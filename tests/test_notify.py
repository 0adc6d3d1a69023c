"""Notifications when a person is needed: every cause in the table is told once (through
real apprise to a receiver on loopback, and through the command hook), a flapping or
repeating cause does not spam, the hourly limit holds with a note of what was held back,
a restart neither repeats nor loses a message, and the secret parts of the URLs never
reach a log, an event or a file."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from ralph_dev.adapters.notify import Message, deliver, scrub, secret_parts
from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tracker.local import LocalTracker
from ralph_dev.control.daemon.notifier import CAUSES, Notifier
from ralph_dev.core.config import ConfigError, ProjectSettings, build_project
from ralph_dev.core.model import NewIssue
from ralph_dev.devtools.loopback import LoopbackServer

SECRET = "S3cretPassw0rd"
QUESTION = "Which database should this use: Postgres or SQLite?"

HOOK = """\
import json, sys
message = json.load(sys.stdin)
with open(sys.argv[1], "a") as out:
    out.write(json.dumps({"argv": sys.argv[2:], "message": message}) + "\\n")
"""


class Receiver(LoopbackServer):
    """What apprise's json:// posts to: records each message and the auth it came with."""

    name = "notify-receiver"

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[dict[str, Any]] = []

    def make_app(self) -> web.Application:
        async def take(request: web.Request) -> web.Response:
            body = await request.json()
            body["_auth"] = request.headers.get("Authorization", "")
            self.messages.append(body)
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/notify", take)
        return app


@pytest.fixture
def receiver() -> Any:
    with Receiver() as server:
        yield server


def _settings(tmp_path: Path, receiver: Receiver, **notify: Any) -> ProjectSettings:
    hook = tmp_path / "hook.py"
    hook.write_text(HOOK)
    out = tmp_path / "hook-out.jsonl"
    table = {
        "urls": [f"json://ralph:{SECRET}@127.0.0.1:{receiver.port}/notify"],
        "command": f"{shlex.quote(sys.executable)} {shlex.quote(str(hook))} "
                   f"{shlex.quote(str(out))} --fixed-arg",
        "on_merge": True,
        **notify,
    }
    return build_project("demo", {"repo": str(tmp_path), "notify": table})


def _hook_messages(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "hook-out.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def _tracker_with_question(settings: ProjectSettings) -> LocalTracker:
    tracker = LocalTracker(settings.paths.tracker_db, settings.key)
    await tracker.create_issues([NewIssue(title="Storage layer"), NewIssue(title="Docs")])
    await tracker.comment("DEMO-1", "[ralph-dev] DEMO-1 blocked: a question for a person\n\n"
                          + QUESTION, by_ralph=True)
    return tracker


def _notifier(settings: ProjectSettings, store: StateStore, tracker: LocalTracker,
              clock: Any = None) -> Notifier:
    async def lookup(identifier: str) -> Any:
        return await tracker.get(identifier)

    async def send(message: Message) -> list[str]:
        notify = settings.notify
        return await asyncio.to_thread(deliver, message, notify.urls, notify.command)

    extra = {"clock": clock} if clock else {}
    return Notifier(settings, store, lookup_issue=lookup, deliver=send, **extra)


def _raise_every_cause(store: StateStore) -> None:
    store.append_event("worker_blocked", issue="DEMO-1", role="execute", repeated=False)
    store.append_event("trunk_red", issue="DEMO-2", exit_code=2)
    store.append_event("controller_crash_loop", reason="controller exited (status 1)",
                       restarts=5, window_s=900)
    store.append_event("tracker_unavailable", error="401 authentication failed",
                       failed_calls=3)  # (the controller says an outage once it is sure)
    store.append_event("swarm_paused", kind="setup", cause="usage_limit", fix="wait")
    store.append_event("budget_breaker", reason="daily budget of $20 spent")
    store.append_event("merge", issue="DEMO-2", reason="DEMO-2: worker reported done")
    store.append_event("relay_refused", issue="DEMO-2", report="note", blame="permanent",
                       error="Linear needs a team: set tracker.linear_team")
    store.append_event("config_invalid", file="config.toml",
                       error="projects.demo.limits.max_workers: expected an integer")


async def test_every_cause_is_told_once_and_repeats_are_not(
        xdg: Path, tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    settings = _settings(tmp_path, receiver)
    store = StateStore(settings.paths)
    store.append_event("trunk_red", issue="DEMO-9")  # history from before: not news
    tracker = await _tracker_with_question(settings)
    notifier = _notifier(settings, store, tracker)
    assert notifier.enabled
    _raise_every_cause(store)
    with caplog.at_level(logging.DEBUG):
        sent = await notifier.poll()
    told = {c.name for c in CAUSES}
    assert sent == len(told) == 9
    titles = [m["title"] for m in receiver.messages]
    assert len(titles) == 9 and all(t.startswith("ralph-dev demo: ") for t in titles)
    assert "ralph-dev demo: DEMO-1 needs you" in titles
    assert "ralph-dev demo: the swarm paused: usage_limit" in titles
    held = next(m for m in receiver.messages if "DEMO-1 needs you" in m["title"])
    assert QUESTION in held["message"] and "user-feedback-given" in held["message"]
    assert "Storage layer" in held["message"]
    assert all(m["_auth"] for m in receiver.messages)  # the password did reach the receiver
    hooked = _hook_messages(tmp_path)
    assert [h["message"]["title"] for h in hooked] == titles
    assert all(h["argv"] == ["--fixed-arg"] for h in hooked)  # no message text in argv
    assert hooked[0]["message"]["data"]["cause"] == "held"

    # the same causes again, while still open: nothing new
    store.append_event("worker_blocked", issue="DEMO-1", role="execute", repeated=True)
    for _ in range(10):
        store.append_event("tracker_unavailable", error="401 authentication failed")
    store.append_event("trunk_red", issue="DEMO-2", exit_code=2)
    assert await notifier.poll() == 0
    # a flapping trunk: cleared and raised again and again within the cooldown
    for _ in range(5):
        store.append_event("trunk_green", commit="abc")
        store.append_event("trunk_red", issue="DEMO-2", exit_code=2)
    assert await notifier.poll() == 0
    assert len(receiver.messages) == 9
    suppressed = [e for e in store.iter_events() if e["event"] == "notify_suppressed"]
    assert suppressed and all("flapping" in e["reason"] for e in suppressed)

    # a person answered: the hold clears, and a new question later is told again
    store.append_event("resume", issue="DEMO-1", reason="feedback")
    store.append_event("worker_blocked", issue="DEMO-2", role="execute", repeated=False)
    assert await notifier.poll() == 1
    assert receiver.messages[-1]["title"] == "ralph-dev demo: DEMO-2 needs you"

    everything = "\n".join([caplog.text, store.paths.events_file.read_text(),
                            (store.paths.state_dir / "notify.json").read_text()])
    assert SECRET not in everything
    await tracker.close()


async def test_a_restarted_daemon_neither_repeats_nor_misses(xdg: Path, tmp_path: Path,
                                                             receiver: Receiver) -> None:
    settings = _settings(tmp_path, receiver)
    store = StateStore(settings.paths)
    tracker = await _tracker_with_question(settings)
    first = _notifier(settings, store, tracker)
    store.append_event("trunk_red", issue="DEMO-2", exit_code=2)
    assert await first.poll() == 1
    store.append_event("trunk_red", issue="DEMO-2", exit_code=2)  # still red, daemon down
    store.append_event("worker_blocked", issue="DEMO-1", role="execute")  # news meanwhile
    again = _notifier(settings, store, tracker)
    assert await again.poll() == 1
    assert [m["title"] for m in receiver.messages] == [
        "ralph-dev demo: trunk is red: merges are paused", "ralph-dev demo: DEMO-1 needs you"]
    await tracker.close()


async def test_the_hourly_limit_holds_and_says_what_it_held_back(
        xdg: Path, tmp_path: Path, receiver: Receiver) -> None:
    settings = _settings(tmp_path, receiver, max_per_hour=2, command=None)
    store = StateStore(settings.paths)
    tracker = await _tracker_with_question(settings)
    now = [datetime(2026, 1, 1, 12, tzinfo=UTC)]
    notifier = _notifier(settings, store, tracker, clock=lambda: now[0])
    for n in range(1, 6):
        store.append_event("merge", issue=f"DEMO-{n}")
    assert await notifier.poll() == 2
    now[0] += timedelta(minutes=61)
    store.append_event("trunk_red", issue="DEMO-2", exit_code=2)
    assert await notifier.poll() == 1
    assert len(receiver.messages) == 3
    assert "3 other notification(s) were held back" in receiver.messages[-1]["message"]
    await tracker.close()


def test_a_failing_url_is_reported_without_its_secret(receiver: Receiver) -> None:
    dead = f"json://ralph:{SECRET}@127.0.0.1:1/notify"
    odd = f"nosuchscheme://ralph:{SECRET}@host/x"
    problems = deliver(Message("t", "b"), [dead, odd], None)
    assert len(problems) == 2, problems
    unknown, refused = problems
    assert unknown == "notify.urls[1] (nosuchscheme://…) is not a URL apprise understands"
    assert refused.startswith("json://ralph:****@127.0.0.1:1/notify")
    assert "Connection error" in refused  # apprise's own reason, scrubbed
    assert SECRET not in "\n".join(problems)
    hooked = deliver(Message("t", "b"), [], "/nonexistent/hook --x")
    assert hooked == ["notify.command: '/nonexistent/hook' was not found; give its full path"]


def test_secret_parts_are_what_the_privacy_form_hides() -> None:
    url = "discord://1234567/abcdefTOKENxyz"
    private = "discord://1...7/a...z/?tts=no"
    assert secret_parts(url, private) == {"1234567", "abcdefTOKENxyz"}
    assert scrub("failed for 1234567/abcdefTOKENxyz", {"1234567", "abcdefTOKENxyz"}) == \
        "failed for ****/****"


def test_config_names_a_bad_url_without_showing_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        build_project("demo", {"repo": str(tmp_path),
                               "notify": {"urls": ["ntfy://ok", f"user:{SECRET}@host"]}})
    assert "notify.urls[1]" in str(err.value) and SECRET not in str(err.value)
    with pytest.raises(ConfigError, match=r"notify\.command: cannot be split"):
        build_project("demo", {"repo": str(tmp_path), "notify": {"command": "a 'b"}})
    with pytest.raises(ConfigError, match=r"notify\.max_per_hour: must be at least 1"):
        build_project("demo", {"repo": str(tmp_path), "notify": {"max_per_hour": 0}})


def test_notify_test_command_sends_one_and_names_failures(xdg: Path, receiver: Receiver) -> None:
    config = xdg / "config" / "ralph-dev" / "config.toml"
    config.parent.mkdir(parents=True)

    def run(url: str) -> subprocess.CompletedProcess[str]:
        config.write_text(f'[projects.demo]\nrepo = "{xdg}"\n[projects.demo.notify]\n'
                          f'urls = ["{url}"]\n')
        return subprocess.run([sys.executable, "-m", "ralph_dev", "notify-test", "demo"],
                              capture_output=True, text=True, env=os.environ.copy(),
                              stdin=subprocess.DEVNULL, check=False, timeout=120)

    ok = run(f"json://ralph:{SECRET}@127.0.0.1:{receiver.port}/notify")
    assert ok.returncode == 0 and "sent to 1 target(s)" in ok.stdout
    assert [m["title"] for m in receiver.messages] == ["ralph-dev demo: test notification"]
    failed = run(f"json://ralph:{SECRET}@127.0.0.1:1/notify")
    assert failed.returncode == 1 and "FAIL json://ralph:****@127.0.0.1:1/notify" in failed.stderr
    assert SECRET not in failed.stderr + failed.stdout


@pytest.mark.slow
def test_the_daemon_tells_when_a_worker_asks(tmp_path: Path, jj_bin: str, tmux_socket: str,
                                             receiver: Receiver) -> None:
    from swarm_kit import Swarm, wait_for

    swarm = Swarm.create(tmp_path / "swarm", jj_bin, tmux_socket)
    try:
        config = swarm.config_file
        config.write_text(config.read_text() + (
            f'\n[projects.demo.notify]\nurls = ["json://ralph:{SECRET}@127.0.0.1:'
            f'{receiver.port}/notify"]\n'))
        swarm.script = {"*": "work:0.5", "DEMO-1": "block"}
        swarm.write_script()
        swarm.import_plan('[[task]]\ntitle = "Pick a database"\n[[task]]\ntitle = "B"\n')
        swarm.start()
        wait_for(lambda: receiver.messages, 120, "a notification")
        held = receiver.messages[0]
        assert held["title"] == "ralph-dev demo: DEMO-1 needs you"
        assert "Which database should this use? (scripted question)" in held["message"]
        assert "Pick a database" in held["message"] and "http://127.0.0.1:" in held["message"]
        wait_for(lambda: swarm.issue("DEMO-2")["state_type"] == "completed", 120, "DEMO-2")
        assert len(receiver.messages) == 1  # merges are not told unless on_merge
        state = swarm.state_dir
        for path in [*(state / "logs").iterdir(), state / "events.jsonl", state / "notify.json"]:
            assert SECRET not in path.read_text(errors="replace"), path
    finally:
        swarm.teardown()


async def test_a_hostile_title_reaches_no_notification_raw(xdg: Path, tmp_path: Path,
                                                           receiver: Receiver) -> None:
    """Issue 27: a message shows tracker text (the title, the question), and a notify
    command or ntfy's CLI may print it on a terminal: it goes through the same sanitizer
    as `status` (escapes visible, never obeyed; bidi overrides and the like replaced)."""
    settings = _settings(tmp_path, receiver)
    store = StateStore(settings.paths)
    tracker = LocalTracker(settings.paths.tracker_db, settings.key)
    await tracker.create_issues([NewIssue(title="Fix \x1b]0;owned\x07 it \u202egnp.exe")])
    await tracker.comment("DEMO-1", "[ralph-dev] DEMO-1 blocked: a question for a person\n\n"
                          "Which \u202eone\u200b?", by_ralph=True)
    notifier = _notifier(settings, store, tracker)
    store.append_event("worker_blocked", issue="DEMO-1", role="execute", repeated=False)
    assert await notifier.poll() == 1
    for message in (_hook_messages(tmp_path)[0]["message"], receiver.messages[0]):
        shown = message["title"] + "\n" + message.get("body", message.get("message", ""))
        assert all(c.isprintable() or c == "\n" for c in shown), ascii(shown)
        assert "Fix" in shown and "gnp.exe" in shown and "Which" in shown
    await tracker.close()


async def test_a_usage_limit_is_told_once_by_its_reset(
        xdg: Path, tmp_path: Path, receiver: Receiver) -> None:
    """Issue 24: the limit pauses the swarm, a second worker's error lengthens the pause
    with another cause: one message, "usage limit until HH:MM" (local), cause and fix."""
    from ralph_dev.control.state.pause_text import clock, limit_lifts
    from ralph_dev.core.agent_faults import USAGE_LIMIT
    from ralph_dev.core.model import Pause

    settings = _settings(tmp_path, receiver)
    store = StateStore(settings.paths)
    now = datetime.now(UTC)
    reset = now.replace(second=0, microsecond=0) + timedelta(hours=2)
    notifier = _notifier(settings, store, await _tracker_with_question(settings))
    for n, cause in enumerate(("the model's usage limit was reached: You've hit your limit",
                               "the API's rate limit was reached (…): Request rejected")):
        store.set_pause(Pause(kind=USAGE_LIMIT, cause=cause, fix="nothing: wait", since=now,
                              until=reset + timedelta(minutes=n),
                              quiet_workers=True))
    assert await notifier.poll() == 1
    (message,) = receiver.messages
    assert message["title"] == (f"ralph-dev demo: the swarm paused: usage limit until "
                                f"{clock(limit_lifts(reset), now)}")
    assert "You've hit your limit" in message["message"] and "nothing: wait" in message["message"]
    assert "?" not in message["message"].split("See `")[0]  # every field was there
