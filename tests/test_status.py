"""`status`, `events` and `attach` for people who come back after hours: the state
document (one versioned shape, validated against its shipped JSON Schema), what needs
them first with each held issue's question and age, local times with the zone shown,
`--watch`, `events -f`, and option values checked before anything runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pytest
from conftest import make_jj_repo
from swarm_kit import Swarm, wait_for

from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.control.state.status import SCHEMA_VERSION, held_question, load_schema
from ralph_dev.control.state.text import local_time
from ralph_dev.core.config import load_project
from ralph_dev.core.model import Comment, Issue, StateType

QUESTION = "Which database should this use: Postgres or SQLite?"


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket)
    yield s
    s.teardown()


def _ask(swarm: Swarm, issue: str, question: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a worker's `ralph-dev worker blocked` comes to: its report, accepted and
    relayed by the controller's end of the channel."""
    from channel_kit import ControllerEnd

    from ralph_dev.adapters import mailbox as ch
    from ralph_dev.adapters.jj import JjRepository
    from ralph_dev.adapters.tracker import open_tracker
    from ralph_dev.core.model import Role

    store = _store(swarm, monkeypatch)
    settings = load_project(swarm.project)
    tracker = open_tracker(settings)

    end = ControllerEnd(settings, store=store, tracker=tracker,
                        jj=JjRepository.from_settings(settings).workspaces)
    try:
        store.update_record(issue, role=Role.EXECUTE)
        end.dirs.prepare(end.call(tracker.get(issue)), Role.EXECUTE, swarm.root, 1)
        ch.write_report(end.dirs.run_dir(issue), "blocked", {"text": question})
        end.call(end.intake.accept_all())
        end.call(tracker.close())
    finally:
        end.close()


def _store(swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> StateStore:
    for key, value in swarm.env.items():
        monkeypatch.setenv(key, value)
    return StateStore(load_project(swarm.project).paths)


def test_state_document_matches_its_schema_and_names_what_needs_you(
        swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> None:
    swarm.import_plan()
    _ask(swarm, "DEMO-11", QUESTION, monkeypatch)
    swarm.cli("issue", "label", "DEMO-12", "+ralph:hold")
    doc = swarm.status()
    jsonschema.Draft202012Validator(load_schema()).validate(doc)
    assert doc["schema_version"] == SCHEMA_VERSION == 1

    held = {item["identifier"]: item for item in doc["board"]["held"]}
    assert held["DEMO-11"]["needs_you"] and held["DEMO-11"]["reason"] == "question"
    assert held["DEMO-11"]["question"] == QUESTION
    assert held["DEMO-11"]["since"] and held["DEMO-11"]["age_s"] >= 0
    assert not held["DEMO-12"]["needs_you"] and held["DEMO-12"]["reason"] == "on_hold"
    # "needs you" first: the stopped swarm, then the question; a deliberate hold is not in it
    kinds = [(n["kind"], n.get("issue")) for n in doc["needs_you"]]
    assert kinds == [("daemon", None), ("issue", "DEMO-11")]
    assert doc["needs_you"][1]["message"] == QUESTION
    blocked = {item["identifier"]: item for item in doc["board"]["blocked"]}
    assert blocked["DEMO-4"]["blocked_by"] == "DEMO-2"  # Domain model waits for Storage
    assert doc["issues"]["total"] == 12 and doc["issues"]["held"] == 2
    assert doc["trunk"]["head"] and doc["trunk"]["colour"] == "unverified"
    assert doc["merges"][0]["title"] == "initial commit"

    table = swarm.cli("status", swarm.project).stdout
    lines = table.splitlines()
    needs = lines.index("  NEEDS YOU:")
    assert needs == 1, table  # right under the title line, before daemon and controller
    assert "DEMO-11" in lines[needs + 2] and "held" in lines[needs + 2]
    assert QUESTION in lines[needs + 3]
    assert "on hold:    DEMO-12" in table and "ralph:hold" in table


def test_status_json_has_one_shape_for_one_or_many_projects(swarm: Swarm, tmp_path: Path
                                                            ) -> None:
    one = json.loads(swarm.cli("status", "--json").stdout)
    assert one["schema_version"] == 1 and [d["project"] for d in one["projects"]] == ["demo"]
    other = make_jj_repo(tmp_path / "other")
    swarm.cli("init", "other", "--repo", str(other))
    shutil.rmtree(other / ".jj")  # its repository went away after init
    many = json.loads(swarm.cli("status", "--json").stdout)
    assert [d["project"] for d in many["projects"]] == ["demo", "other"]
    validator = jsonschema.Draft202012Validator(load_schema())
    for doc in many["projects"]:
        validator.validate(doc)
    broken = next(d for d in many["projects"] if d["project"] == "other")
    assert broken["trunk"]["error"]  # not a jj repo: said, not crashed
    # issue 36: the text of every project puts what needs you, in any project, first
    swarm.import_plan()  # ready work, and neither daemon runs: each project needs you
    plan = tmp_path / "plan.toml"
    plan.write_text('[[task]]\ntitle = "A"\n')
    swarm.cli("issue", "import", "other", str(plan))
    text = swarm.cli("status").stdout
    lines = text.splitlines()
    assert lines[0] == "NEEDS YOU (every project):", text
    first_project = next(i for i, line in enumerate(lines) if line.startswith("project "))
    needs = lines[:first_project]
    assert "  demo:" in needs and "  other:" in needs, text
    assert "  NEEDS YOU:  " in text and "said above" in text


@pytest.mark.parametrize("args, complaint", [
    (["status", "demo", "--events", "-1"], "'--events': -1 is not in the range 0<=x<=1000"),
    (["status", "demo", "--watch", "--interval", "0"], "'--interval'"),
    (["status", "demo", "--watch", "--json"], "--watch redraws the terminal view"),
    (["events", "demo", "--since", "soon"], "use a duration like 30m"),
])
def test_bad_option_values_are_refused_clearly(swarm: Swarm, args: list[str],
                                               complaint: str) -> None:
    out = swarm.cli(*args, check=False)
    assert out.returncode == 2 and complaint in out.stderr
    assert not out.stdout


def test_attach_refuses_an_issue_without_a_window(swarm: Swarm) -> None:
    out = swarm.cli("attach", "DEMO-7", check=False)
    assert out.returncode == 1 and "ralph-dev is not running for demo" in out.stderr
    settings_env = {**os.environ, **swarm.env}
    tmux = Tmux("ralph-demo", swarm.env["RALPH_DEV_TMUX_SOCKET"])
    tmux.ensure_session(swarm.repo, {"PATH": settings_env["PATH"]})
    out = swarm.cli("attach", "DEMO-7", check=False)
    assert out.returncode == 1
    assert "DEMO-7 has no window in ralph-demo" in out.stderr and "status demo" in out.stderr


def test_events_follow_prints_what_is_appended(swarm: Swarm,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(swarm, monkeypatch)
    store.append_event("before", issue="DEMO-1", reason="already there")
    proc = subprocess.Popen([sys.executable, "-m", "ralph_dev", "events", swarm.project, "-f"],
                            env=swarm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                              daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("before" in line for line in lines), 20, "the old event")
        store.append_event("after_start", issue="DEMO-2", reason="appended later")
        wait_for(lambda: any("after_start" in line for line in lines), 20, "the new event")
        assert proc.poll() is None  # still following
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    line = next(line for line in lines if "after_start" in line)
    assert "UTC" in line and "appended later" in line  # the zone is shown


def test_watch_redraws_with_local_times_and_their_zone(swarm: Swarm,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(swarm, monkeypatch)
    store.append_event("hello", issue="DEMO-1", reason="to show a time")
    env = {**swarm.env, "TZ": "Asia/Tokyo"}
    proc = subprocess.Popen([sys.executable, "-m", "ralph_dev", "status", swarm.project,
                             "--watch", "--interval", "0.5"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read1(4096),
                                                                b"")), daemon=True)
    reader.start()
    try:
        # (on a terminal each redraw first clears the screen; click drops that in a pipe)
        wait_for(lambda: b"".join(chunks).count(b"project demo") >= 3, 60, "three redraws")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    text = b"".join(chunks).decode()
    assert " JST" in text and "hello" in text and "(every 0.5s; Ctrl-C ends)" in text


def test_held_question_is_the_newest_asking_comment_as_clean_text() -> None:
    def comment(body: str, minutes: int, by_ralph: bool = True) -> Comment:
        return Comment("ralph-dev" if by_ralph else "ann", body,
                       datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=minutes), by_ralph)

    asked = "[ralph-dev] DEMO-1 blocked: a question for a person\n\n"
    issue = Issue("DEMO-1", "t", "Todo", StateType.UNSTARTED, comments=(
        comment(asked + "old question", 1),
        comment(asked + "Use \x1b[31mPostgres\x1b[0m or\x07 SQLite?\n\n\n\nThanks", 2),
        comment("[ralph-dev] DEMO-1 note\n\nan FYI, not a question", 3),
        comment("I am a person, not a question", 4, by_ralph=False),
    ))
    kind, text, when = held_question(issue)
    assert kind == "question" and text == "Use Postgres or SQLite?\n\nThanks"
    assert when == datetime(2026, 1, 1, 0, 2, tzinfo=UTC)
    gave_up = Issue("DEMO-2", "t", "Todo", StateType.STARTED, comments=(comment(
        "ralph-dev stopped retrying DEMO-2 after 3/3 attempts (pane died). Last failure: x", 5),))
    assert held_question(gave_up)[0] == "attempt_cap"
    assert held_question(Issue("DEMO-3", "t", "Todo", StateType.UNSTARTED)) == (None, None, None)


def test_local_time_shows_the_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    try:
        now = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
        assert local_time("2026-07-01T10:00:00+00:00", now=now) == "12:00:00 CEST"
        assert local_time("2026-06-30T10:00:00+00:00", now=now) == "2026-06-30 12:00 CEST"
        assert local_time(None) == "-"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


HOSTILE = "Fix it \x1b]0;owned\x07 now\x1b[2J \u202egnp.exe"
"""An issue title that retitles the terminal, clears it and reverses the line after it."""


def _raw(text: str) -> list[str]:
    """Characters a terminal would act on rather than show."""
    return sorted({repr(c) for c in text if not (c.isprintable() or c == "\n")})


def test_tracker_text_reaches_no_terminal_raw(swarm: Swarm,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27: `status` printed an issue title's `ESC ] 0 ; owned BEL` (which sets the
    terminal's title) under NEEDS YOU while `issue list/show` stripped it. Every command
    that prints tracker text now shows it through one sanitizer: the escape is visible
    (␛…␇), never obeyed."""
    import sqlite3

    swarm.cli("issue", "add", swarm.project, HOSTILE)
    swarm.cli("issue", "add", swarm.project, HOSTILE + " (held)", "--label", "ralph:hold")
    _ask(swarm, "DEMO-1", "Which \x1b]0;asked\x07 one?\u202e", monkeypatch)
    swarm.cli("issue", "comment", "DEMO-1", "see \x1b]0;commented\x07 here", "--author",
              "ann\x1b]0;author\x07")
    settings = load_project(swarm.project)
    with sqlite3.connect(settings.paths.tracker_db) as db:  # a label made in Linear's UI
        db.execute("INSERT INTO labels VALUES (1, ?)", ("bug\x1b]0;label\x07",))
    store = _store(swarm, monkeypatch)
    store.append_event("hold", issue="DEMO-1", reason=f"held: {HOSTILE}", title=HOSTILE)
    log = store.log_path("DEMO-1")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(f"[agent] working on {HOSTILE}\n".encode())

    printed = {
        "status": swarm.cli("status", swarm.project).stdout,
        "status (all)": swarm.cli("status").stdout,
        "events": swarm.cli("events", swarm.project).stdout,
        "events --issue": swarm.cli("events", swarm.project, "--issue", "DEMO-1").stdout,
        "issue list": swarm.cli("issue", "list", swarm.project).stdout,
        "issue show": swarm.cli("issue", "show", "DEMO-1").stdout,
        "logs": swarm.cli("logs", "DEMO-1").stdout,
        "plan": swarm.cli("plan", swarm.project).stdout,
    }
    for command, out in printed.items():
        assert not _raw(out), (command, _raw(out), out)
    needs = printed["status"].split("NEEDS YOU:")[1].split("daemon:")[0]
    assert "DEMO-1  Fix it ␛]0;owned␇ now␛[2J" in needs  # shown, not obeyed
    assert "Which" in needs and "one?" in needs
    assert "on hold:    DEMO-2  Fix it ␛]0;owned␇" in printed["status"]
    assert "held: Fix it ␛]0;owned␇" in printed["events"]
    assert "bug␛]0;label␇" in printed["issue show"] and "ann␛]0;author␇" in printed["issue show"]
    assert "see ␛]0;commented␇ here" in printed["issue show"]


def test_a_usage_limit_is_said_by_its_local_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: "usage limit until 14:05", the reset in local time (the date when not
    today); a rate limit whose reset is unknown says when it is asked again."""
    from ralph_dev.control.state.pause_text import limit_lifts, pause_headline
    from ralph_dev.core.agent_faults import RATE_LIMIT, USAGE_LIMIT

    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    try:
        now = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
        reset = datetime(2026, 7, 1, 12, 5, tzinfo=UTC)
        assert pause_headline(USAGE_LIMIT, "c", reset, now) == "usage limit until 14:05"
        assert limit_lifts(reset + timedelta(seconds=1)) \
            == reset + timedelta(minutes=1)  # never before the reset: the next minute
        assert pause_headline(USAGE_LIMIT, "c", reset + timedelta(days=1), now) \
            == "usage limit until 2026-07-02 14:05"
        # its reset came and one worker's session asks the API first (issue 36)
        assert pause_headline(USAGE_LIMIT, "c", reset, now, probe="DEMO-3") == \
            "usage limit: its end has come; DEMO-3's session asks the model API first"
        assert pause_headline(RATE_LIMIT, "c", reset, now).endswith("trying again at 14:05")
        assert pause_headline("api-outage", "the model API failed", None, now) \
            == "the model API failed"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_status_and_its_document_say_the_pause(swarm: Swarm,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from ralph_dev.control.state.pause_text import clock
    from ralph_dev.core.agent_faults import USAGE_LIMIT
    from ralph_dev.core.model import Pause

    store = _store(swarm, monkeypatch)
    now = datetime.now(UTC)
    reset = now.replace(second=0, microsecond=0) + timedelta(hours=1)
    store.set_pause(Pause(kind=USAGE_LIMIT, cause="the model's usage limit was reached: "
                          "You've hit your session limit", fix="nothing: wait", since=now,
                          until=reset, quiet_workers=True))
    doc = swarm.status()
    jsonschema.Draft202012Validator(load_schema()).validate(doc)
    (pause,) = doc["pauses"]
    said = f"usage limit until {clock(reset, now)}"
    assert pause["headline"] == said and pause["lifts"] == reset.isoformat()
    table = swarm.cli("status", swarm.project).stdout
    assert f"PAUSED:     {said} (the model's usage limit was reached" in table, table
