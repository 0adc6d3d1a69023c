"""One worker end to end with the REAL Claude Code CLI, in a real tmux window.

Claude Code (the pinned npm release) talks to the scripted fake Anthropic API
on loopback; ralph-dev's plugin (skills + hooks), the local tracker, jj and
the verify command are all real. Nobody presses a key: the launch from
``build_launch`` must get from a fresh workspace to a finished issue alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from channel_kit import ControllerEnd
from claude_env import ClaudeUnavailable, find_claude
from conftest import retry_until

from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.jj_cli import child_path
from ralph_dev.adapters.store import StateStore, utcnow
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.adapters.tracker.local import LocalTracker
from ralph_dev.agent.launch import build_launch
from ralph_dev.core.config import ProjectSettings, load_project
from ralph_dev.core.model import NewIssue, Role, StateType, WorkerRecord
from ralph_dev.devtools.scripted_model import (
    FakeAnthropic,
    ScriptedWorker,
    Text,
    bash,
    conversation_text,
    is_main_conversation,
    tool_names,
    tool_results,
    tool_uses_so_far,
)

pytestmark = [pytest.mark.slow, pytest.mark.claude]

FAKE_KEY = "sk-ant-api03-fake-smoke-test-key-0123456789abcdef"
VERIFY = "test -f ok.txt || { echo 'ok.txt is missing'; exit 3; }"


@pytest.fixture(scope="session")
def claude_bin() -> str:
    try:
        return find_claude()
    except ClaudeUnavailable as exc:
        pytest.fail(str(exc))


@dataclass
class World:
    tmp: Path
    settings: Any
    tracker: LocalTracker
    jj: JjRepository
    store: StateStore
    tmux: Tmux
    jj_bin: str
    controller: ControllerEnd

    def jj_out(self, *args: str) -> str:
        env = {**os.environ, "PATH": self.jj.cli.child_path()}
        return subprocess.run([self.jj_bin, *args, "--ignore-working-copy"],
                              cwd=self.settings.repo, env=env, capture_output=True, text=True,
                              check=True).stdout


def working_in(workspace: Path) -> list[int]:
    """Processes whose current directory is in the workspace (the agent, its shells)."""
    workspace, found = workspace.resolve(), []
    for proc in Path("/proc").iterdir():
        try:
            cwd = (proc / "cwd").readlink()
        except OSError:
            continue
        if proc.name.isdigit() and (cwd == workspace or workspace in cwd.parents):
            found.append(int(proc.name))
    return found


def files_of(workspace: Path) -> dict[str, tuple[int, int]]:
    """Size and mtime of each file of a workspace (jj's own directory left out)."""
    return {str(path.relative_to(workspace)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in workspace.rglob("*") if path.is_file() and ".jj" not in path.parts}


@pytest.fixture
def world(xdg: Path, jj_bin: str, tmux_socket: str, claude_bin: str,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    repo = xdg / "repo"
    env = {**os.environ, "JJ_USER": "t", "JJ_EMAIL": "t@example.com",
           "PATH": child_path()}
    subprocess.run([jj_bin, "git", "init", str(repo)], check=True, capture_output=True, env=env)
    (repo / "README").write_text("hello\n")
    for args in (["commit", "-m", "init"], ["bookmark", "create", "main", "-r", "@-"]):
        subprocess.run([jj_bin, *args], cwd=repo, check=True, capture_output=True, env=env)
    config = xdg / "config" / "ralph-dev" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("\n".join([
        "[projects.demo]",
        f"repo = {json.dumps(str(repo))}",
        'trunk = "main"',
        # the controller's host (controller_ticks) opens windows on the test's own server
        f"tmux_socket = {json.dumps(tmux_socket)}",
        f"verify_command = {json.dumps(VERIFY)}",
        "[projects.demo.tracker]",
        'key = "DEMO"',
        "[projects.demo.agent]",
        f"claude_bin = {json.dumps(claude_bin)}",
        'home = "isolated"',
        "iteration_cap = 8",
        "",
    ]))
    with open_world(xdg, jj_bin, tmux_socket, config) as world:
        yield world


@contextlib.contextmanager
def open_world(xdg: Path, jj_bin: str, tmux_socket: str, config: Path) -> Iterator[World]:
    """Project ``demo`` of ``config``: its tmux session on the test's server, its tracker,
    repository, store and the controller's end of the workers' mailboxes."""
    settings = load_project("demo", path=config)
    tmux = Tmux(settings.session_name, socket_name=tmux_socket)
    tmux.ensure_session(xdg, {"PATH": os.environ["PATH"]})
    tracker, jj, store = (LocalTracker(settings.paths.tracker_db, "DEMO"),
                          JjRepository.from_settings(settings), StateStore(settings.paths))
    controller = ControllerEnd(settings, store=store, tracker=tracker, jj=jj.workspaces)
    try:
        yield World(xdg, settings, tracker, jj, store, tmux, jj_bin, controller)
    finally:
        tmux.kill_session()
        controller.close()


def reported_done(world: World, issue: str) -> bool:
    """The worker's done was accepted and written back: its evidence is on the issue (the
    controller completes the issue once its change is merged)."""
    return any(c.by_ralph and c.body.startswith(f"[ralph-dev] {issue} done")
               for c in world.tracker.get_sync(issue).comments)


def spawn(world: World, api: FakeAnthropic, issue: str, role: Role,
          monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Path]:
    """What the controller does for a Spawn: workspace, record, state, window."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    workspace = world.jj.workspaces.add_workspace(issue)
    world.store.update_record(issue, role=role, attempts=1, started_at=utcnow(), done=False,
                              blocked=False, iterations=0)
    world.tracker.set_state_sync(issue, type=StateType.STARTED)
    dirs = world.controller.dirs
    dirs.publish(tuple(world.tracker.list_issues_sync()))
    worker_dir = dirs.prepare(world.tracker.get_sync(issue), role, workspace, 1)
    world.controller.listen()
    launch = build_launch(world.settings, world.tracker.get_sync(issue), role, workspace,
                          "sonnet", attempt=1, worker_dir=worker_dir)
    world.tmux.open_window(issue, cwd=launch.cwd, command=launch.argv, environment=launch.env,
                           log_file=world.store.log_path(issue))
    return launch, workspace


def diagnostics(world: World, api: FakeAnthropic, issue: str) -> str:
    panes = "\n".join(world.tmux.capture(w.pane_id, 60) for w in world.tmux.find(issue))
    hooks = world.settings.paths.worker_dir(issue) / "run" / "hooks.log"
    return (f"\n--- pane ---\n{panes}\n--- hooks.log ---\n"
            f"{hooks.read_text()[-3000:] if hooks.exists() else '(none)'}\n"
            f"--- api ---\n{[(r.method, r.path) for r in api.requests]}\nerrors: {api.errors}")


def test_one_worker_end_to_end_with_real_claude(world: World, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "pwned"
    title = f"Add ok.txt $(touch {marker}-1) `touch {marker}-2` ; rm -rf ~ C-c Enter \x1b[31m!"
    description = (f"Create ok.txt. $(touch {marker}-3)\nKeys: C-c Enter C-d Escape\n"
                   + "x" * 10_240)
    (issue,) = world.tracker.create_issues_sync([NewIssue(title=title, description=description)])

    def first(request: dict[str, Any]) -> list[Any]:
        # Before anything else the model tries to stop: the Stop hook must say no.
        said_something = any(m.get("role") == "assistant" for m in request["messages"])
        if not said_something:
            return [Text("I think I am finished.")]
        return [bash(f"ralph-dev worker done {issue} --summary 'too early'")]

    brain = ScriptedWorker({issue: [
        first,
        bash("echo fine > ok.txt", "create the file"),
        bash(f"ralph-dev worker done {issue} --summary 'Added ok.txt; verify passes.'"),
    ]}, final_text="All done, reported.")

    with FakeAnthropic(brain) as api:
        launch, workspace = spawn(world, api, issue, Role.EXECUTE, monkeypatch)
        # the window's command carries no issue text at all
        assert title not in " ".join(launch.argv) and "touch" not in " ".join(launch.argv)
        try:
            retry_until(lambda: reported_done(world, issue),
                        timeout=90, interval=0.5, what=f"{issue} reported done")
            at_done = files_of(workspace)
            retry_until(lambda: api.answered("All done, reported."), timeout=60, interval=0.5,
                        what="the final turn")
        except AssertionError as exc:
            raise AssertionError(f"{exc}{diagnostics(world, api, issue)}") from None

        main = api.main_messages()
        opening = conversation_text(main[0])
        # no keypress needed: the first prompt arrived by itself, preamble first
        assert "You are ONE ralph-dev worker of project demo, started for ONE issue: " \
               f"{issue}" in opening
        # the plugin's skill is offered, the SessionStart hook's context reached the model
        assert "ralph-dev:ralph-dev-execute" in opening
        assert f"# ralph-dev: you are the execute worker for {issue}" in opening
        # the role's tool fence as Claude Code applied it
        offered = set(tool_names(main[0]))
        assert {"Bash", "Edit", "Write", "Read", "Skill"} <= offered
        assert "Agent" not in offered and "AskUserQuestion" in offered  # its hook asks
        assert "sonnet" in main[0]["model"]
        # the Stop hook blocked the early stop, with a reason that reached the model
        assert any("is not reported finished yet" in conversation_text(m) for m in main)
        # the failing verify refused the first `done` and the agent saw why
        results = tool_results(main[-1])
        assert "ok.txt is missing" in results[0]
        # the scripted Bash edit ran in the workspace, the issue is Done with evidence
        assert (workspace / "ok.txt").read_text() == "fine\n"
        done = world.tracker.get_sync(issue)
        evidence = [c for c in done.comments if c.by_ralph and "done" in c.body]
        assert len(evidence) == 1 and "Added ok.txt; verify passes." in evidence[0].body
        record = world.store.load_record(issue)
        assert record is not None and record.done and record.iterations >= 1
        # the change is in the workspace's commit
        assert "ok.txt" in world.jj_out("diff", "-r", f"{issue}@", "--name-only")
        assert world.jj_out("log", "--no-graph", "-r", f"{issue}@", "-T",
                            "description").startswith(f"{issue}: ")
        # after the report the Stop hook let the agent stop: no more turns arrive
        settled = len(api.main_messages())
        retry_until(lambda: len(api.main_messages()) == settled, timeout=5, what="quiet")
        assert len(api.main_messages()) == settled
        assert api.errors == []
        # once done, Claude Code leaves the workspace alone, even as its window is closed:
        # the tripwires take any later change of a resting workspace for a foreign hand
        assert working_in(workspace)  # Claude Code still runs there, idle
        for window in world.tmux.list_windows():
            if window.name == issue:
                world.tmux.kill_window(window.window_id)
        retry_until(lambda: not working_in(workspace), timeout=20,
                    what="every process of the worker gone")
        assert files_of(workspace) == at_done
    # nothing from the issue was ever executed
    assert not list(tmp_path.glob("pwned*"))


def test_review_worker_gets_no_edit_tools_from_real_claude(world: World,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           ) -> None:
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Review the README")])
    brain = ScriptedWorker({issue: [
        bash(f"jj diff; ralph-dev worker diff {issue}", "see the change under review"),
        bash(f"ralph-dev worker done {issue} --summary 'APPROVED: read it'"),
    ]}, final_text="Reviewed.")
    with FakeAnthropic(brain) as api:
        workspace = world.jj.workspaces.add_workspace(issue)
        (workspace / "README").write_text("a change to review\n")  # the execute worker's
        spawn(world, api, issue, Role.REVIEW, monkeypatch)
        # jj cannot run in the sandbox; `worker diff` shows the change anyway
        retry_until(lambda: any("+a change to review" in r
                                for m in api.main_messages() for r in tool_results(m)), 60,
                    what="the diff in the review worker's hands" + diagnostics(world, api, issue))
        try:
            retry_until(lambda: api.main_messages(), timeout=90, interval=0.5,
                        what="the review worker's first request")
        except AssertionError as exc:
            raise AssertionError(f"{exc}{diagnostics(world, api, issue)}") from None
        first = api.main_messages()[0]
        offered = set(tool_names(first))
        assert {"Bash", "Read", "Skill"} <= offered
        assert not {"Edit", "Write", "NotebookEdit", "Agent"} & offered
        text = conversation_text(first)
        assert "ralph-dev:ralph-dev-review" in text
        assert f"you are the review worker for {issue}" in text


def test_a_sandboxed_resolve_worker_finds_and_clears_its_conflicts(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """jj cannot run inside the sandbox, and the resolve skill once told workers to run
    `jj status`/`jj resolve --list`: `worker diff` says what is still conflicted."""
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Resolve ok.txt")])
    env = {**os.environ, "JJ_USER": "t", "JJ_EMAIL": "t@example.com",
           "PATH": world.jj.cli.child_path()}

    def jj(cwd: Path, *args: str) -> None:
        subprocess.run([world.jj_bin, *args], cwd=cwd, check=True, capture_output=True, env=env)

    workspace = world.jj.workspaces.add_workspace(issue)
    (workspace / "ok.txt").write_text("mine\n")
    jj(workspace, "describe", "-m", "mine")
    repo = world.settings.repo  # meanwhile trunk got its own ok.txt
    jj(repo, "new", "main")
    (repo / "ok.txt").write_text("theirs\n")
    jj(repo, "bookmark", "set", "main", "-r", "@")
    jj(workspace, "rebase", "-b", "@", "-o", "main")  # the conflict the merge hit
    brain = ScriptedWorker({issue: [
        bash(f"ralph-dev worker diff {issue}", "what is still conflicted"),
        bash("printf 'ok\\n' > ok.txt", "resolve it"),
        bash(f"ralph-dev worker diff {issue}", "check"),
        bash(f"ralph-dev worker done {issue} --summary 'kept both sides: ok'"),
    ]}, final_text="Resolved.")
    with FakeAnthropic(brain) as api:
        spawn(world, api, issue, Role.RESOLVE, monkeypatch)
        try:
            retry_until(lambda: (r := world.store.load_record(issue)) is not None and r.done,
                        timeout=120, interval=0.5, what="the resolve worker done")
        except AssertionError as exc:
            raise AssertionError(f"{exc}{diagnostics(world, api, issue)}") from None
        results = [r for m in api.main_messages() for r in tool_results(m)]
        diffs = [r for r in results if "ok.txt" in r and "diff --git" in r]
        assert diffs and diffs[0].startswith("# Still conflicted: ok.txt.")
        assert not diffs[-1].startswith("# Still conflicted")
    assert (workspace / "ok.txt").read_text() == "ok\n"
    assert world.jj_out("log", "--no-graph", "-r", f"conflicts() & ::{issue}@",
                        "-T", "commit_id") == ""


def test_two_workers_at_once_each_finish_their_own_issue(world: World,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    issues = world.tracker.create_issues_sync([NewIssue(title="First"), NewIssue(title="Second")])
    brain = ScriptedWorker({
        issue: [
            bash(f"echo {issue} > ok.txt && echo {issue} > mine.txt"),
            bash(f"ralph-dev worker done {issue} --summary 'wrote ok.txt for {issue}'"),
        ]
        for issue in issues
    })
    with FakeAnthropic(brain) as api:
        workspaces = {issue: spawn(world, api, issue, Role.EXECUTE, monkeypatch)[1]
                      for issue in issues}
        try:
            retry_until(lambda: all(reported_done(world, i) for i in issues),
                        timeout=90, interval=0.5, what="both issues reported done")
        except AssertionError as exc:
            raise AssertionError(f"{exc}{diagnostics(world, api, issues[0])}"
                                 f"{diagnostics(world, api, issues[1])}") from None
        for issue, workspace in workspaces.items():
            assert (workspace / "mine.txt").read_text() == f"{issue}\n"
        assert api.errors == []


def test_supervisor_runs_ralph_dev_commands_only(world: World, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from ralph_dev.agent.supervisor import build_supervisor_launch

    marker = tmp_path / "supervisor-wrote-this"
    project = world.settings.name
    steps = [bash(f"ralph-dev status {project}"),
             bash(f"ralph-dev init {project} --force --repo {tmp_path} --verify true"),
             bash("ralph-dev issue state DEMO-1 Canceled"), bash(f"touch {marker}"),
             [Text("Diagnosis: all healthy.")]]

    def brain(request: dict[str, Any]) -> list[Any]:
        if "Bash" not in tool_names(request):
            return [Text("ok")]
        used = sum(1 for m in request["messages"] if m.get("role") == "assistant"
                   and any(b.get("type") == "tool_use" for b in m["content"]
                           if isinstance(b, dict)))
        step = steps[min(used, len(steps) - 1)]
        return list(step) if isinstance(step, list) else [step]

    with FakeAnthropic(brain) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        launch = build_supervisor_launch(world.settings, "controller heartbeat stale $(id)",
                                         reason="the controller restarted 5 times")
        proc = subprocess.run(launch.argv, env={**launch.env, "TERM": "dumb"}, cwd=launch.cwd,
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "Diagnosis: all healthy." in proc.stdout
        main = api.main_messages()
        assert set(tool_names(main[0])) == {"Bash", "Read", "Skill"}
        opening = conversation_text(main[0])
        assert "ralph-dev:ralph-dev-supervisor" in opening
        assert "controller heartbeat stale $(id)" in opening
        results = tool_results(main[-1])
        assert "denied" not in results[0] and project in results[0]  # a read ran
        # init (which rewrites the verify command), issue writes and anything else:
        # denied without asking (issue 12)
        for refused in results[1:4]:
            assert "denied" in refused and "don't ask mode" in refused, refused
        assert not marker.exists()
        assert api.errors == []


SENTINELS = {
    "GH_TOKEN": "sentinel-gh-4711",
    "MY_DB_PASSWORD": "sentinel-pw-4711",
    "LINEAR_API_KEY": "lin_api_sentinel4711",  # the controller relays every tracker write
    "RALPH_DEV_LINEAR_WEBHOOK_SECRET": "sentinel-whsec-4711",
    "RALPH_DEV_WEB_TOKEN": "sentinel-web-token-4711",  # the dashboard's: the daemon's alone
    "PERSONAL_NOTE": "sentinel-note-4711",  # from a person's shell: no agent needs it
}


def controller_ticks(world: World, settings: Any) -> Callable[[], Any]:
    """One controller tick per call, the real controller on the world's parts."""
    from ralph_dev.adapters.gh import Gh
    from ralph_dev.agent.launch import build_launch
    from ralph_dev.control.loop.controller import Controller
    from ralph_dev.control.loop.wiring import host_for

    ctl = Controller(settings, tracker=world.tracker,
                     host=host_for(settings, world.jj, world.store), jj=world.jj,
                     launcher=build_launch, pull_requests=Gh("gh", settings.repo),
                     store=world.store)
    return lambda: asyncio.run(ctl.tick())


def test_workers_get_no_secret_of_the_daemon(world: World, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 12: the tmux server and every agent start from an allowlist. The daemon's
    keys and a person's shell variables reach neither claude, nor its Bash shells (nor
    the hooks, its children), nor the server's global environment. Issue 25: not even
    the tracker's key in Linear mode (worker commands and hooks never call Linear)."""
    for name, value in SENTINELS.items():
        monkeypatch.setenv(name, value)
    tracker = dataclasses.replace(world.settings.tracker, kind="linear", linear_project="Alpha")
    world.settings = dataclasses.replace(world.settings, tracker=tracker)  # the launch's view
    world.tmux.kill_session()  # the server starts again, from this environment
    world.tmux.ensure_session(world.tmp, {"PATH": os.environ["PATH"]})
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Look around")])
    # into its workspace: the only place of the host's its sandbox may write
    look = ("env > .seen.env; tr '\\0' '\\n' < /proc/$PPID/environ > .seen.parent; "
            "touch .seen.done")

    def brain(request: dict[str, Any]) -> list[Any]:
        if "Bash" not in tool_names(request):
            return [Text("ok")]
        ran = any(m.get("role") == "assistant" and "tool_use" in json.dumps(m["content"])
                  for m in request["messages"])
        return [Text("Looked.")] if ran else [bash(look)]

    with FakeAnthropic(brain) as api:
        _launch, workspace = spawn(world, api, issue, Role.EXECUTE, monkeypatch)
        dump = workspace / ".seen"
        retry_until(lambda: Path(f"{dump}.done").exists(), 90,
                    what="the agent's Bash step" + diagnostics(world, api, issue))
        (window,) = world.tmux.find(issue)
        pid = world.tmux.run("display-message", "-p", "-t", window.pane_id, "#{pane_pid}")
        claude_env = Path(f"/proc/{pid.check().stdout.split()[0]}/environ").read_bytes().decode()
        seen = {
            "claude": claude_env,
            "its Bash shell": Path(f"{dump}.env").read_text(),
            "the shell's parent": Path(f"{dump}.parent").read_text(),
            "tmux show-environment -g": world.tmux.run("show-environment", "-g").check().stdout,
        }
        for where, text in seen.items():
            # the server's own list keeps a person's harmless variables, never a secret
            kept = {"PERSONAL_NOTE"} if where.startswith("tmux") else set()
            leaked = [name for name, value in SENTINELS.items()
                      if value in text and name not in kept]
            assert not leaked, f"{leaked} reached {where}"
        assert FAKE_KEY in claude_env  # what it needs still comes (from the 0600 spec file)
        assert FAKE_KEY not in seen["tmux show-environment -g"]


def test_a_hung_model_call_is_named_and_restarted_free_in_its_own_session(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issues 13 and 24: the API accepts a request and then says nothing. Claude Code's
    spinner keeps the pane busy, yet the worker's own activity (hooks, transcript) has
    stopped: after hang_timeout the controller says the model API has not answered and
    restarts the worker in its own session, charging nothing and typing no nudge into
    the frozen pane; the resumed session finishes the issue."""
    from ralph_dev.core.config import Timing
    from ralph_dev.devtools.api_faults import Hang

    settings = dataclasses.replace(world.settings, timing=Timing(
        poll_interval=0.5, stall_timeout=600, restart_timeout=600, hang_timeout=6))
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Think hard")])
    finish = f"touch ok.txt && ralph-dev worker done {issue} --summary 'added ok.txt'"
    hung: list[float] = []

    def brain(request: dict[str, Any]) -> list[Any]:
        if not is_main_conversation(request):
            return [Text("ok")]
        if not hung:
            hung.append(time.time())
            return [Hang()]
        return [Text("Done.")] if tool_uses_so_far(request) else [bash(finish)]

    with FakeAnthropic(brain) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        tick = controller_ticks(world, settings)

        tick()  # spawns the worker; its first model call hangs
        log_file = world.store.log_path(issue)
        retry_until(lambda: hung, 60, what="the first model call" + diagnostics(world, api, issue))
        size = log_file.stat().st_size
        retry_until(lambda: (tick(), world.store.load_record(issue).session_id)[1], 30,
                    what="the session id" + diagnostics(world, api, issue))
        retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                             is StateType.COMPLETED)[1], 120, interval=0.5,
                    what=f"{issue} done after the hang" + diagnostics(world, api, issue))
    assert log_file.stat().st_size > size  # the spinner printed all along
    events = list(world.store.iter_events())
    assert not [e for e in events if e["event"] == "nudge"]  # nothing typed into it
    (restart,) = [e for e in events if e["event"] == "restart"]
    assert "the model API has not answered for" in restart["reason"]
    assert "no attempt charged" in restart["reason"]
    assert restart["attempt"] == 1 and not restart.get("charged")  # (False is not written)
    assert [e["attempt"] for e in events if e["event"] == "spawn"] == [1]
    # the same conversation goes on: the first session's start is in its history
    history = json.dumps(api.main_messages()[1]["messages"])
    assert "SessionStart:startup" in history and "SessionStart:resume" in history
    assert not [e for e in events if e["event"] == "session_fresh"]


def test_a_cli_that_retries_by_itself_is_not_taken_for_hung(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: during an overload Claude Code retries for a while by itself, and neither
    its hooks nor its transcript move. Its pane says so ("Retrying in 4s · attempt 3/10"):
    it is not hung, so no restart and no nudge, and the issue is done in its first start
    once the API answers, the gap between the retry that got through and the answer's
    first hook included. (Without the screen's word it would be restarted as hung.)"""
    from ralph_dev.devtools.api_faults import overloaded

    # 20 s: well under the 35 s the hooks stand still, and above the few seconds a
    # loaded host may take between the retry that got through and its first hook
    settings = dataclasses.replace(outage_settings(world), timing=dataclasses.replace(
        outage_settings(world).timing, hang_timeout=20))
    out = through_a_fault(world, monkeypatch, overloaded, 35, settings=settings)
    events = list(world.store.iter_events())
    assert out.spawns == 1 and out.holds == 0
    assert not [e for e in events if e["event"] in ("restart", "nudge")], \
        [e["reason"] for e in events if e["event"] in ("restart", "nudge")]
    assert not [e for e in events if e["event"] == "agent_api_error"]  # it rode it out
    assert out.recovered_after < 60


def two_steps_with_a_crash(issue: str, crashed: dict[str, bool]
                           ) -> Callable[[dict[str, Any]], list[Any]]:
    """The model of a two-step task: step one, then a call that hangs until the test has
    killed the agent (``crashed["yet"]``), then the finish. A resumed session carries
    step one in its history."""
    from ralph_dev.devtools.api_faults import Hang

    finish = f"touch ok.txt && ralph-dev worker done {issue} --summary 'two steps'"

    def brain(request: dict[str, Any]) -> list[Any]:
        if not is_main_conversation(request):
            return [Text("ok")]
        text = json.dumps(request["messages"])
        if "echo step-one" not in text:
            return [bash("echo step-one > one.txt")]
        if not crashed["yet"]:
            return [Hang()]  # the agent dies while it waits here
        return [Text("Done.")] if "touch ok.txt &&" in text else [bash(finish)]

    return brain


@contextlib.contextmanager
def crashed_mid_task(world: World, monkeypatch: pytest.MonkeyPatch
                     ) -> Iterator[tuple[str, FakeAnthropic, Callable[[], Any], WorkerRecord]]:
    """A two-step issue whose agent is killed (-9) while its second model call waits:
    yields the issue, the API, the controller's tick and the worker's record then (its
    session and transcript known)."""
    from ralph_dev.core.config import Timing

    settings = dataclasses.replace(world.settings, timing=Timing(
        poll_interval=0.5, retry_base=0.5, retry_cap=1))
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Two steps")])
    crashed = {"yet": False}
    with FakeAnthropic(two_steps_with_a_crash(issue, crashed)) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        tick = controller_ticks(world, settings)
        tick()
        retry_until(lambda: len(api.main_messages()) >= 2, 60,
                    what="the second model call" + diagnostics(world, api, issue))
        tick()  # the controller hears the SessionStart hook's news
        record = world.store.load_record(issue)
        assert record.session_id and record.transcript
        (window,) = world.tmux.find(issue)
        pid = world.tmux.run("display-message", "-p", "-t", window.pane_id, "#{pane_pid}")
        crashed["yet"] = True
        os.kill(int(pid.check().stdout.split()[0]), 9)  # kill -9 of the agent
        yield issue, api, tick, record


def test_a_crashed_agent_is_resumed_in_its_own_session(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13: the agent process dies mid-task; its restart continues the same
    conversation (``--resume`` of the session its SessionStart hook recorded), and its
    prompt says it is a continuation."""
    with crashed_mid_task(world, monkeypatch) as (issue, api, tick, _record):
        retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                             is StateType.COMPLETED)[1], 120,
                    what="the issue done after the crash" + diagnostics(world, api, issue))
        spawns = [e for e in world.store.iter_events() if e["event"] == "spawn"]
        assert [e["attempt"] for e in spawns] == [1, 2]
        after = api.main_messages()[2:]
        history = json.dumps(after[0]["messages"])
        # the same conversation goes on: the first session's start is in its history.
        # (Claude Code 2.1.197 drops a tool call whose result it had not yet written
        # when it was killed, so the agent may redo that last step.)
        assert "SessionStart:startup" in history and "SessionStart:resume" in history
        assert "continuation of your own earlier session" in json.dumps(after[0]["messages"])


def test_a_session_that_cannot_be_resumed_is_left_for_a_fresh_one_free(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in CI: an agent died before its transcript held a conversation, and each
    next start resumed that session; Claude Code said "No conversation found" and exited
    at once, three times, and the issue was held. A resume whose agent ends before saying
    anything is not tried again: the next start is a fresh session, charged nothing, and
    the person reads the agent's last words in the event."""
    from ralph_dev.core.decide.issues import RESUME_FAILED

    with crashed_mid_task(world, monkeypatch) as (issue, api, tick, record):
        assert record.transcript is not None
        Path(record.transcript).write_text("")  # its conversation never written
        retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                             is StateType.COMPLETED)[1], 120,
                    what="the issue done after a fresh start" + diagnostics(world, api, issue))
    events = list(world.store.iter_events())
    spawns = [e for e in events if e["event"] == "spawn"]
    assert [e["attempt"] for e in spawns] == [1, 2, 2], [e["reason"] for e in spawns]
    assert spawns[1]["resume"] == record.session_id and not spawns[2].get("resume")
    (failed,) = [e for e in events if e["event"] == "reap" and e.get("lost") == RESUME_FAILED]
    assert "charged" not in failed  # (an event leaves out what is False)
    assert "No conversation found with session ID" in failed["reason"], failed["reason"]
    assert not [e for e in events if e["event"] == "hold"]


def test_a_groom_worker_proposes_through_real_claude(world: World,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15 item 2: a groom worker (read-only tools, like review) reads the backlog
    and proposes an issue with `ralph-dev worker propose` from its Bash tool; the
    proposal lands in the backlog state with `ralph:proposed` and its reason, and the
    worker cannot edit files."""
    (existing,) = world.tracker.create_issues_sync([NewIssue(title="Phase 2: validate config")])
    (run,) = world.tracker.create_issues_sync([NewIssue(title="Groom the backlog",
                                                        labels=("ralph:groom",))])
    propose = (f"ralph-dev worker propose {run} --title 'Validate config keys' --priority 3 "
               "--description 'Nothing checks the config file keys.' "
               "--reason 'phase 2 promises config validation; nothing does it'")
    brain = ScriptedWorker({run: [
        bash(f"ralph-dev worker backlog {run}", "read the backlog"),
        bash(propose, "propose the gap"),
        bash(f"ralph-dev worker done {run} --summary 'proposed one issue'"),
    ]}, final_text="Groomed.")

    with FakeAnthropic(brain) as api:
        spawn(world, api, run, Role.GROOM, monkeypatch)
        try:
            retry_until(lambda: any("ralph:proposed" in i.labels
                                    for i in world.tracker.list_issues_sync()), 90,
                        what="the proposal in the tracker")
            retry_until(lambda: api.answered("Groomed."), 60, what="the final turn")
        except AssertionError as exc:
            raise AssertionError(f"{exc}{diagnostics(world, api, run)}") from None
        backlog_read = tool_results(api.main_messages()[-1])
        assert any(existing in text for text in backlog_read)  # it saw the open issues
        tools = tool_names(api.main_messages()[0])
        assert "Bash" in tools and "Edit" not in tools and "Write" not in tools
    (proposal,) = [i for i in world.tracker.list_issues_sync() if "ralph:proposed" in i.labels]
    assert proposal.title == "Validate config keys"
    assert proposal.state_type is StateType.BACKLOG  # waits for a person
    assert any("nothing does it" in c.body for c in proposal.comments)


def test_spend_is_counted_from_the_transcript_and_a_budget_stops_the_worker(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13 item 5: what each agent spends is read from its transcript; the done
    comment and the state say it; an issue over its budget has its worker stopped and
    is held with the figures, and is not started again."""
    from ralph_dev.control.loop import costs as spending
    from ralph_dev.core.costs import CostSettings

    (cheap, dear) = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt"),
                                                      NewIssue(title="Think forever")])
    finish = f"touch ok.txt && ralph-dev worker done {cheap} --summary 'added ok.txt'"

    def brain(request: dict[str, Any]) -> list[Any]:
        if not is_main_conversation(request):
            return [Text("ok")]
        if ScriptedWorker({cheap: [], dear: []}).issue_of(request) == cheap:
            return [Text("Done.")] if tool_uses_so_far(request) else [bash(finish)]
        return [bash("sleep 1", "think")]  # never finishes: spends on every call

    with FakeAnthropic(brain) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        settings = dataclasses.replace(world.settings, limits=dataclasses.replace(
            world.settings.limits, max_workers=1))
        tick = controller_ticks(world, settings)
        retry_until(lambda: (tick(), world.tracker.get_sync(cheap).state_type
                             is StateType.COMPLETED)[1], 90,
                    what="the cheap issue done" + diagnostics(world, api, cheap))
        done = next(c.body for c in world.tracker.get_sync(cheap).comments
                    if c.body.startswith(f"[ralph-dev] {cheap} done"))
        assert "Spent so far:" in done and "tokens" in done
        spent = spending.issue_spend(spending.load(world.settings), cheap)
        assert spent.tokens > 0 and spent.usd > 0  # priced at sonnet's list price

        budget = spent.tokens * 2
        tick = controller_ticks(world, dataclasses.replace(
            settings, costs=CostSettings(issue_tokens=budget)))
        retry_until(lambda: (tick(), "user-input-needed"
                             in world.tracker.get_sync(dear).labels)[1], 120,
                    what="the dear issue held over its budget" + diagnostics(world, api, dear))
        comment = world.tracker.get_sync(dear).comments[-1].body
        assert "over its budget" in comment and "costs.issue_tokens" in comment
        said = world.store.load_record(dear).agent_state  # from its own hooks, not the pane
        assert said in ("running Bash", "waiting for the model", "working"), said
        assert not any(w.name == dear and w.alive for w in world.tmux.list_windows())
        calls = len(api.main_messages())
        for _ in range(4):
            tick()
        assert len(api.main_messages()) == calls  # stopped, and not started again
        spawns = [e for e in world.store.iter_events()
                  if e["event"] == "spawn" and e["issue"] == dear]
        assert len(spawns) == 1
        assert any(e["event"] == "stop" and e.get("cause") == "budget"
                   for e in world.store.iter_events())


# --- the model API misbehaving for a while (issue 13): nobody is charged for it ----------


@dataclass
class Outcome:
    calls_in_fault: int
    spawns: int
    holds: int
    recovered_after: float
    """Seconds from the fault's end to the issue Done."""


def outage_settings(world: World) -> ProjectSettings:
    """Quick ticks, a short first outage step, and stall timeouts no fault reaches: a
    nudge or restart in these tests is the pause's doing, never a stall's."""
    from ralph_dev.core.config import Timing

    return dataclasses.replace(world.settings, timing=Timing(
        poll_interval=0.5, stall_timeout=600, restart_timeout=600, outage_wait=5))


def through_a_fault(world: World, monkeypatch: pytest.MonkeyPatch, fault: Callable[[], Any],
                    seconds: float, *, timeout: float = 240,
                    settings: ProjectSettings | None = None, **env: str) -> Outcome:
    """One worker adds ok.txt while the API answers ``fault()`` for its first
    ``seconds``; the real controller ticks throughout."""

    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt")])
    finish = f"touch ok.txt && ralph-dev worker done {issue} --summary 'added ok.txt'"
    started: list[float] = []
    faulted: list[float] = []

    def brain(request: dict[str, Any]) -> list[Any]:
        if not is_main_conversation(request):
            return [Text("ok")]
        now = time.time()
        started.append(now)
        if now - started[0] < seconds:
            faulted.append(now)
            return [fault()]
        return [Text("Done.")] if tool_uses_so_far(request) else [bash(finish)]

    settings = settings or outage_settings(world)
    with FakeAnthropic(brain) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        tick = controller_ticks(world, settings)
        retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                             is StateType.COMPLETED)[1], timeout, interval=0.5,
                    what=f"{issue} done after the fault" + diagnostics(world, api, issue))
        done_at = time.time()
    events = list(world.store.iter_events())
    return Outcome(
        calls_in_fault=len(faulted),
        spawns=sum(e["event"] == "spawn" for e in events),
        holds=sum(e["event"] == "hold" for e in events),
        recovered_after=done_at - (started[0] + seconds))


def test_429_for_a_minute_is_ridden_out_by_the_cli_itself(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from ralph_dev.devtools.api_faults import rate_limited

    out = through_a_fault(world, monkeypatch, lambda: rate_limited(5), 60)
    assert out.spawns == 1 and out.holds == 0  # no attempt charged, nobody held
    assert out.calls_in_fault <= 10  # the CLI's own backoff, not a storm
    assert out.recovered_after < 60


def test_529_for_a_while_pauses_the_swarm_with_a_backoff_and_then_goes_on(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI gives up on its retries (capped here so the test is short): the turn
    ends on `server_error`, the swarm pauses (5 s, doubling), the same session goes on
    after each pause, and one probe per step is all the API sees meanwhile."""
    from ralph_dev.devtools.api_faults import overloaded

    out = through_a_fault(world, monkeypatch, overloaded, 40, CLAUDE_CODE_MAX_RETRIES="2")
    events = [e["event"] for e in world.store.iter_events()]
    assert out.spawns == 1 and out.holds == 0
    assert events.count("worker_continued") >= 2  # each pause ended by continuing
    continued = events.count("worker_continued")
    assert out.calls_in_fault <= 3 * (continued + 1)  # 3 per probe: the CLI's own retries
    assert continued <= 5  # backed off (5, 10, 20, 40 s), not once a tick
    assert out.recovered_after < 90


def test_an_outage_is_probed_by_one_session_and_its_answer_resumes_everyone(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: two workers (one on opus) and a minute of 529. Each turn ends on the
    error; then one worker's session probes the API per step while the other waits, and
    the probe's first answer sends everyone on: both issues merge within a minute of the
    API's recovery, nothing is nudged, restarted or charged, and the API sees one
    session's calls during the outage, not both."""
    from ralph_dev.devtools.api_faults import overloaded

    outage = 60.0
    first, second = world.tracker.create_issues_sync([
        NewIssue(title="Add one.txt", labels=("model:claude-opus-4-1",)),
        NewIssue(title="Add two.txt")])
    began: list[float] = []
    during: list[str] = []  # the first line of each conversation called during the outage

    def brain(request: dict[str, Any]) -> list[Any]:
        if not is_main_conversation(request):
            return [Text("ok")]
        now = time.time()
        began.append(now)
        text = json.dumps(request["messages"])
        issue = first if f"Issue: {first}" in text else second
        if now - began[0] < outage:
            during.append(issue)
            return [overloaded()]
        name = "one.txt" if issue == first else "two.txt"
        finish = f"touch ok.txt {name} && ralph-dev worker done {issue} --summary 'added {name}'"
        return [Text("Done.")] if tool_uses_so_far(request) else [bash(finish)]

    settings = outage_settings(world)
    with FakeAnthropic(brain) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "2")
        tick = controller_ticks(world, settings)
        retry_until(lambda: (tick(), all(world.tracker.get_sync(i).state_type
                                         is StateType.COMPLETED for i in (first, second)))[1],
                    240, interval=0.5,
                    what="both done after the outage" + diagnostics(world, api, first))
        recovered_after = time.time() - (began[0] + outage)
    events = list(world.store.iter_events())
    kinds = [e["event"] for e in events]
    assert recovered_after < 60, recovered_after
    assert sorted(e["attempt"] for e in events if e["event"] == "spawn") == [1, 1]
    for absent in ("restart", "nudge", "hold", "reap"):
        assert absent not in kinds, absent
    probes = [e for e in events if e["event"] == "swarm_paused" and e.get("probe")]
    assert probes, "no probe was sent"
    probe = probes[0]["probe"]
    other = second if probe == first else first
    assert {e["probe"] for e in probes} == {probe}  # one session probes, step after step
    waited = [e for e in events if e["event"] == "worker_continued" and e["issue"] == other]
    assert len(waited) == 1  # the other goes on once, when the probe is answered
    assert "swarm_resumed" in kinds
    # the outage saw the other session's first turn (3 calls: the CLI's own retries) and
    # then only the probe's
    assert during.count(other) <= 3, during
    files = world.jj_out("file", "list", "-r", "main").split()
    assert "one.txt" in files and "two.txt" in files


def test_a_malformed_stream_pauses_and_the_session_goes_on(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from ralph_dev.devtools.api_faults import Malformed

    out = through_a_fault(world, monkeypatch, Malformed, 15)
    errors = [e for e in world.store.iter_events() if e["event"] == "agent_api_error"]
    assert errors and errors[0]["error"] == "unknown"  # what this CLI calls it
    assert errors[0]["text"].startswith("API Error")
    assert out.spawns == 1 and out.holds == 0
    assert out.recovered_after < 60


def test_a_model_that_never_reports_is_held_with_its_words_after_one_restart(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: it keeps saying it is finished without `worker done` and without asking:
    the Stop hook sends it back up to the iteration cap; then one restart in its own
    session (charged: the cause is the issue's), and the second time a hold that quotes
    its last message — no nudge, no stall timeout waited out, not three attempts."""
    from ralph_dev.core.config import Timing

    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt")])

    def brain(request: dict[str, Any]) -> list[Any]:
        return [Text("I think this is finished.")] if is_main_conversation(request) \
            else [Text("ok")]

    settings = dataclasses.replace(
        world.settings,
        agent=dataclasses.replace(world.settings.agent, iteration_cap=2),
        timing=Timing(poll_interval=0.5, stall_timeout=600, restart_timeout=600,
                      max_attempts=3, retry_base=1, retry_cap=2))
    with FakeAnthropic(brain) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        tick = controller_ticks(world, settings)
        retry_until(lambda: (tick(), "user-input-needed"
                             in world.tracker.get_sync(issue).labels)[1], 150, interval=0.5,
                    what="the issue held" + diagnostics(world, api, issue))
        calls = len(api.main_messages())
    events = list(world.store.iter_events())
    assert [e["attempt"] for e in events if e["event"] in ("spawn", "restart")] == [1, 2]
    assert sum(e["event"] == "iteration_cap" for e in events) == 2
    assert not [e for e in events if e["event"] == "nudge"]
    comment = world.tracker.get_sync(issue).comments[-1].body
    assert "ralph-dev stopped" in comment and "without asking anything" in comment
    assert "> I think this is finished." in comment  # in the agent's own words
    assert calls <= 2 * (2 + 1) + 4  # the cap bounds what it spends per attempt
