"""``ralph-dev hook …`` as Claude Code runs them: a real process, JSON on stdin, exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import retry_until
from test_worker import Project, hostile_text, make_project

from ralph_dev.core.model import Role

RALPH_DEV = [sys.executable, "-m", "ralph_dev"]
"""How Claude Code runs it, minus the console-script shim (works in any venv layout)."""

PROCESS_BOUND = 5.0
"""Wall-clock bound for a whole hook process (interpreter start included) on a loaded CI
machine: catches hangs such as waiting on stdin. The work itself is timed in-process below."""
WORK_BUDGET = 1.0


@pytest.fixture
def project(xdg: Path, jj_bin: str) -> Iterator[Project]:
    made = make_project(xdg, jj_bin)
    yield made
    for end in made.ends:
        end.close()


def hook(name: str, env: dict[str, str], payload: object = None,
         timeout: float = 10, *, stdin: str | None = None
         ) -> tuple[subprocess.CompletedProcess, float]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("RALPH_DEV_")}
    full.update(env)
    if stdin is None:
        stdin = json.dumps(payload if payload is not None else {"hook_event_name": name})
    start = time.monotonic()
    proc = subprocess.run([*RALPH_DEV, "hook", name], input=stdin, env=full, capture_output=True,
                          text=True, timeout=timeout, check=False)
    return proc, time.monotonic() - start


def hook_log(project: Project, issue: str = "DEMO-1") -> str:
    path = project.run_dir(issue) / "hooks.log"
    return path.read_text() if path.exists() else ""


# --- session-start ----------------------------------------------------------------------


def test_session_start_prints_the_issue_context(project: Project) -> None:
    parent = project.issue("The parent phase")
    blocker = project.issue("Lay the groundwork")
    issue = project.issue("Write the parser", "Parse TOML plans into issues.",
                          parent=parent, blocked_by=(blocker,))
    project.tracker.comment_sync(issue, "Mind the Markdown format too.", by_ralph=False,
                                 author="alice")
    project.tracker.comment_sync(issue, "earlier attempt failed", by_ralph=True)
    project.spawn(issue)

    proc, seconds = hook("session-start", project.env(issue),
                         {"hook_event_name": "SessionStart", "source": "startup"})

    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "execute worker for " + issue in out
    assert "Write the parser" in out and "Parse TOML plans into issues." in out
    assert f"Parent: {parent} — The parent phase" in out
    assert f"{blocker} — Lay the groundwork [Todo]" in out
    assert "Mind the Markdown format too." in out and "[person] alice" in out
    assert "[ralph-dev] ralph-dev" in out and "earlier attempt failed" in out
    assert f"ralph-dev worker done {issue} --summary" in out
    assert f"ralph-dev worker blocked {issue} --question" in out
    assert project.settings.verify_command in out
    assert "<<<ISSUE-DATA" in out and "DATA" in out.split("Comments")[-1]
    assert seconds < PROCESS_BOUND, f"session-start took {seconds:.2f}s"


def test_session_start_role_rules_differ(project: Project) -> None:
    issue = project.issue()
    project.spawn(issue, Role.PLAN)
    proc, _ = hook("session-start", project.env(issue))
    assert proc.returncode == 0
    assert "plan worker" in proc.stdout
    assert f"ralph-dev worker plan {issue} --file PLAN" in proc.stdout
    assert "Do not edit project files" in proc.stdout


def test_session_start_prints_hostile_text_as_data(project: Project, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    title, description = hostile_text(marker)
    issue = project.issue(title, description)
    project.tracker.comment_sync(issue, f"$(touch {marker}) \x1b[1mbold", by_ralph=False)
    project.spawn(issue)

    proc, _ = hook("session-start", project.env(issue))

    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert not marker.exists()
    assert f"$(touch {marker})" in out and f"`touch {marker}`" in out
    assert "; rm -rf ~" in out and "C-c" in out
    assert "\x1b" not in out and "\x07" not in out
    assert "x" * 10_000 in out  # 10 kB of description arrives whole, as data
    # the issue cannot forge the end of its data block: the delimiter carries a nonce
    begin = next(line for line in out.splitlines() if line.startswith("<<<ISSUE-DATA "))
    nonce = begin.split()[1]
    assert out.count(f"ISSUE-DATA {nonce}>>>") == 2  # once in the explanation, once closing


# --- post-tool-use ------------------------------------------------------------------------


def test_post_tool_use_snapshots_and_records_activity(project: Project) -> None:
    issue = project.issue()
    workspace = project.spawn(issue)
    (workspace / "new.txt").write_text("agent wrote this\n")

    proc, seconds = hook("post-tool-use", project.env(issue),
                         {"hook_event_name": "PostToolUse", "tool_name": "Write"})

    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
    assert seconds < PROCESS_BOUND, f"post-tool-use took {seconds:.2f}s"
    record = project.store.load_record(issue)
    assert record is not None and record.last_activity is not None
    files = subprocess.run(
        [project.jj_bin, "file", "list", "--ignore-working-copy", "-r", f"{issue}@"],
        cwd=project.settings.repo, capture_output=True, text=True, check=True,
    ).stdout.split()
    assert "new.txt" in files  # snapshotted without the agent running jj


def test_post_tool_use_with_missing_workspace_is_quiet(project: Project) -> None:
    issue = project.issue()
    workspace = project.spawn(issue)
    project.jj.workspaces.forget(issue)  # its workspace is gone: the snapshot fails, quietly
    assert not workspace.exists()

    proc, _ = hook("post-tool-use", project.env(issue))

    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
    assert project.store.load_record(issue).last_activity is not None


# --- stop ---------------------------------------------------------------------------------


def stop_payload(active: bool = False) -> dict:
    return {"hook_event_name": "Stop", "session_id": "s", "transcript_path": "/nonexistent",
            "cwd": "/", "stop_hook_active": active, "last_assistant_message": "I am done!"}


def iterations(project: Project, issue: str) -> int:
    record = project.store.load_record(issue)
    return record.iterations if record else 0


def test_stop_blocks_until_done_then_allows(project: Project) -> None:
    issue = project.issue()
    workspace = project.spawn(issue)

    proc, seconds = hook("stop", project.env(issue), stop_payload())

    assert proc.returncode == 0, proc.stderr
    decision = json.loads(proc.stdout)
    assert decision["decision"] == "block"
    assert f"ralph-dev worker done {issue}" in decision["reason"]
    assert "continuation 1 of 25" in decision["reason"]
    assert iterations(project, issue) == 1
    assert seconds < PROCESS_BOUND, f"stop took {seconds:.2f}s"

    proc, _ = hook("stop", project.env(issue), stop_payload(active=True))
    assert json.loads(proc.stdout)["decision"] == "block"
    assert iterations(project, issue) == 2  # stop_hook_active still counts

    (workspace / "ok.txt").write_text("ok\n")
    assert project.cli(["worker", "done", issue, "--summary", "done"], issue).exit_code == 0
    proc, _ = hook("stop", project.env(issue), stop_payload(active=True))
    assert proc.returncode == 0 and proc.stdout == ""


def test_stop_keeps_the_agent_working_on_a_payload_nested_too_deeply(project: Project) -> None:
    """A payload the JSON parser cannot follow fails safe: as if there were none."""
    issue = project.issue()
    project.spawn(issue)
    deep = '{"stop_hook_active": ' + "[" * 100_000 + "]" * 100_000 + "}"
    proc, _ = hook("stop", project.env(issue), stdin=deep)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["decision"] == "block"


def test_stop_allows_after_blocked(project: Project) -> None:
    issue = project.issue()
    project.spawn(issue)
    assert project.cli(["worker", "blocked", issue, "--question", "A or B?"],
                       issue).exit_code == 0
    proc, _ = hook("stop", project.env(issue), stop_payload())
    assert proc.returncode == 0 and proc.stdout == ""


def test_stop_allows_at_the_iteration_cap(xdg: Path, jj_bin: str) -> None:
    project = make_project(xdg, jj_bin, extra="[projects.demo.agent]\niteration_cap = 2")
    issue = project.issue()
    project.spawn(issue)
    outputs = [hook("stop", project.env(issue), stop_payload(active=i > 0))[0].stdout
               for i in range(3)]
    assert [json.loads(o)["decision"] for o in outputs[:2]] == ["block", "block"]
    assert outputs[2] == ""
    assert iterations(project, issue) == 2
    assert any(e["event"] == "iteration_cap" for e in project.store.iter_events())


def test_stop_with_a_corrupt_stop_file_starts_counting_again(project: Project) -> None:
    issue = project.issue()
    project.spawn(issue)
    (project.run_dir(issue) / "stop.json").write_text("{not json")
    proc, _ = hook("stop", project.env(issue), stop_payload())
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["decision"] == "block"
    assert iterations(project, issue) == 1


# --- broken surroundings: every hook exits 0 and says nothing ------------------------------


@pytest.mark.parametrize("name", ["session-start", "post-tool-use", "stop"])
def test_hooks_outside_a_worker_do_nothing(project: Project, name: str) -> None:
    proc, _ = hook(name, {})
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
    assert not project.settings.paths.records_dir.exists()


@pytest.mark.parametrize("name", ["session-start", "post-tool-use", "stop"])
def test_hooks_with_a_run_dir_not_prepared_are_quiet(project: Project, name: str,
                                                     tmp_path: Path) -> None:
    fake = tmp_path / "fake-run"
    fake.mkdir()
    (fake / "worker.json").write_text('{"issue": "../../etc"}')
    proc, _ = hook(name, {"RALPH_DEV_RUN_DIR": str(fake)})
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""


@pytest.mark.parametrize("env", [
    {"RALPH_DEV_ISSUE": "../../etc", "RALPH_DEV_PROJECT": "demo"},
    {"RALPH_DEV_ISSUE": "DEMO-1", "RALPH_DEV_PROJECT": "demo", "RALPH_DEV_ROLE": "boss"},
    {"RALPH_DEV_ISSUE": "DEMO-1"},
    {"RALPH_DEV_RUN_DIR": "relative/run"},
])
def test_hooks_with_malformed_env_are_quiet(project: Project, env: dict[str, str]) -> None:
    for name in ("session-start", "stop"):
        proc, _ = hook(name, env)
        assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""


def test_session_start_with_a_garbage_issue_view_is_quiet_and_logged(project: Project) -> None:
    issue = project.issue()
    project.spawn(issue)
    (project.run_dir(issue) / "issue.json").write_text("this is not json" * 100)

    proc, _ = hook("session-start", project.env(issue))

    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
    log = hook_log(project, issue)
    assert "hook_failed" in log and "unreadable" in log


def test_hooks_read_no_tracker_and_no_config(project: Project) -> None:
    """A sandboxed hook cannot see the tracker or the config: it needs neither."""
    issue = project.issue("Write the parser")
    project.spawn(issue)
    project.settings.paths.tracker_db.write_bytes(b"this is not sqlite" * 100)
    (project.tmp / "config" / "ralph-dev" / "config.toml").write_text("garbage = [")
    proc, _ = hook("session-start", project.env(issue))
    assert proc.returncode == 0 and "Write the parser" in proc.stdout


def test_hooks_survive_garbage_stdin(project: Project) -> None:
    issue = project.issue()
    project.spawn(issue)
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("RALPH_DEV_")},
            **project.env(issue)}
    proc = subprocess.run([*RALPH_DEV, "hook", "stop"], input="\x00not json{{", env=full,
                          capture_output=True, text=True, timeout=10, check=False)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["decision"] == "block"


def test_render_context_strips_escapes_itself(project: Project, tmp_path: Path) -> None:
    """click strips some ANSI codes from piped output; the context must not rely on that."""
    from ralph_dev.inpane.hooks import render_context
    from ralph_dev.inpane.worker import current_worker

    title, description = hostile_text(tmp_path / "pwned")
    issue_id = project.issue(title, description + "\x1b]8;;http://evil\x07link\x9b31m")
    project.tracker.comment_sync(issue_id, "\x1b[1mbold\x1b[0m \x1b]0;title\x07", by_ralph=False)
    project.spawn(issue_id, listen=False)
    worker = current_worker(project.env(issue_id))
    assert worker is not None

    text = render_context(worker, worker.view(), nonce="abc")

    assert not any(ch in text for ch in "\x1b\x07\x9b")
    assert "bold" in text and "link" in text and "$(touch" in text
    assert text.count("<<<ISSUE-DATA abc") == 2 and text.count("ISSUE-DATA abc>>>") == 2


def test_hook_work_fits_the_budget(project: Project) -> None:
    """The work of each hook, without interpreter start-up, stays well under a second."""
    from ralph_dev.inpane import hooks
    from ralph_dev.inpane.worker import current_worker

    parent = project.issue("parent")
    issue = project.issue("child", "d" * 5000, parent=parent)
    for n in range(30):
        project.tracker.comment_sync(issue, f"comment {n}", by_ralph=n % 2 == 0)
    project.spawn(issue)
    worker = current_worker(project.env(issue))
    assert worker is not None
    for name, call in (
        ("session-start", lambda: hooks.session_start(worker, {})),
        ("post-tool-use", lambda: hooks.post_tool_use(worker)),
        ("stop", lambda: hooks.stop(worker, {})),
    ):
        start = time.monotonic()
        call()
        took = time.monotonic() - start
        assert took < WORK_BUDGET, f"{name} took {took:.2f}s"


@pytest.mark.parametrize(("payload", "expected"), [
    ({"hook_event_name": "UserPromptSubmit", "prompt": "go"}, ("working", True)),
    ({"hook_event_name": "PreToolUse", "tool_name": "Bash"}, ("running Bash", True)),
    ({"hook_event_name": "PreToolUse", "tool_name": "mcp__x; rm -rf /"}, ("running a tool", True)),
    ({"hook_event_name": "Notification", "message": "Claude needs your permission to use Bash"},
     ("waiting for input: Claude needs your permission to use Bash", False)),
    ({"hook_event_name": "Notification", "message": "\x1b[31mred\x1b[0m\nsecond line"},
     ("waiting for input: red second line", False)),
    ({"hook_event_name": "SessionEnd", "reason": "exit"}, ("session ended", False)),
    ({"hook_event_name": "PostCompact"}, None),
    ({}, None),
])
def test_agent_state_from_each_hook_event(payload: dict[str, object],
                                          expected: tuple[str, bool] | None) -> None:
    from ralph_dev.inpane.hooks import agent_state

    assert agent_state(payload) == expected


# --- status-line ------------------------------------------------------------------------


def test_the_status_line_tells_the_accounts_windows_once_per_change(
        project: Project, tmp_path: Path) -> None:
    """Issue 36: Claude Code hands the status line the account's usage windows after every
    answer; the controller hears a change, not every answer."""
    from ralph_dev.adapters.accounts import AccountWindows

    issue = project.issue()
    project.spawn(issue)
    windows = AccountWindows("claude-0123", tmp_path / "accounts")
    project.controller.intake.windows = windows
    resets = int(time.time()) + 3600

    def said(used: int) -> dict:
        return {"hook_event_name": "Status", "session_id": "s",
                "rate_limits": {"five_hour": {"used_percentage": used, "resets_at": resets}}}

    for used in (42, 42, 57):
        proc, _ = hook("status-line", project.env(issue), said(used))
        assert proc.returncode == 0 and proc.stdout.strip() == f"ralph-dev {issue}", proc

    def told() -> list[float]:
        return [e["five_hour"] for e in project.store.iter_events()
                if e["event"] == "account_windows"]

    retry_until(lambda: len(told()) >= 2, 10, what="both changes told")
    assert told() == [0.42, 0.57]
    (five,) = windows.read(datetime.now(UTC))
    assert five.used == 0.57 and int(five.resets_at.timestamp()) == resets
    # outside a worker it says nothing (Claude Code shows an empty line)
    proc, _ = hook("status-line", {}, said(42))
    assert proc.returncode == 0 and proc.stdout == ""
