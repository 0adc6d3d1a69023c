"""Issue 12 items 1-3 with the real Claude Code CLI (scripted model), real tmux, jj and
bubblewrap: a worker whose agent tries every way out of its workspace."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import retry_until
from test_claude_smoke import (  # noqa: F401
    World,
    claude_bin,
    diagnostics,
    reported_done,
    spawn,
    world,
)

from ralph_dev.core.model import NewIssue, Role, StateType
from ralph_dev.devtools.scripted_model import (
    FakeAnthropic,
    ScriptedWorker,
    ToolUse,
    bash,
    tool_results,
)

pytestmark = [pytest.mark.slow, pytest.mark.claude]


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory of the person's outside /tmp (which the sandbox replaces anyway)."""
    path = Path("/var/tmp") / f"ralph-confine-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def attempt(name: str, command: str) -> str:
    return f"if ( {command} ) >/dev/null 2>&1; then echo ESCAPED-{name}; " \
           f"else echo refused-{name}; fi"


def test_a_worker_writes_only_its_workspace(world: World, outside: Path,  # noqa: F811
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    issue, other = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt"),
                                                     NewIssue(title="Someone else's")])
    other_ws = world.jj.workspaces.add_workspace(other)
    (other_ws / ".env").write_text("OTHER_SECRET=hunter2\n")
    paths = world.settings.paths
    config = world.tmp / "config" / "ralph-dev" / "config.toml"
    config_before = config.read_text()
    probes = [
        attempt("main-repo", f"touch {world.settings.repo}/escape.txt"),
        attempt("config", f"echo 'verify_command = \"true\"' >> {config}"),
        attempt("other-workspace", f"touch {other_ws}/dropped.txt"),
        attempt("other-secret", f"grep -q hunter2 {other_ws}/.env"),
        attempt("tracker", f"python3 -c \"open('{paths.tracker_db}', 'r+b').write(b'x')\""),
        attempt("records", f"touch {paths.records_dir}/{other}.json"),
        attempt("outside", f"touch {outside}/escape.txt"),
        attempt("python-outside", f"python3 -c \"open('{outside}/py.txt', 'w')\""),
        attempt("remount", "mount -o remount,rw,bind /"),
        attempt("people-command", f"ralph-dev issue state {other} Canceled"),
        attempt("other-issue", f"RALPH_DEV_ISSUE={other} RALPH_DEV_ROLE=research "
                               f"ralph-dev worker done {other} --summary forged"),
        attempt("tmux-socket", "ls /tmp/tmux-* /run/user"),
        "echo processes=$(ls /proc | grep -c '^[0-9]')",
        attempt("own-workspace", "echo fine > ok.txt"),
    ]
    brain = ScriptedWorker({issue: [
        bash("; ".join(probes), "probe the sandbox"),
        ToolUse("Write", {"file_path": f"{outside}/write-tool.txt", "content": "x"}),
        ToolUse("Write", {"file_path": f"{world.settings.repo}/write-tool.txt",
                          "content": "x"}),
        bash(f"ralph-dev worker done {issue} --summary 'Added ok.txt.'"),
    ]}, final_text="Done.")

    with FakeAnthropic(brain) as api:
        _launch, workspace = spawn(world, api, issue, Role.EXECUTE, monkeypatch)
        try:
            retry_until(lambda: reported_done(world, issue),
                        timeout=90, interval=0.5, what=f"{issue} reported done")
        except AssertionError as exc:
            raise AssertionError(f"{exc}{diagnostics(world, api, issue)}") from None
        results = "\n".join(tool_results(api.main_messages()[-1]))

    assert "ESCAPED-" not in results.replace("ESCAPED-own-workspace", ""), results
    assert "refused-own-workspace" not in results and (workspace / "ok.txt").is_file()
    processes = int(results.split("processes=")[1].split()[0])
    assert processes < 10, "the sandbox sees only its own processes"
    assert not list(outside.iterdir())
    assert not (world.settings.repo / "escape.txt").exists()
    assert not (world.settings.repo / "write-tool.txt").exists()
    assert config.read_text() == config_before
    assert not (other_ws / "dropped.txt").exists()
    got = world.tracker.get_sync(other)
    assert got.state_type is StateType.UNSTARTED and not got.comments
    # what the worker itself needs still works: its report reached the controller
    assert world.store.load_record(issue).done
    assert "ok.txt" in world.jj_out("diff", "-r", f"{issue}@", "--name-only")


def test_the_sandbox_refuses_typing_into_the_pane(world: World, tmp_path: Path  # noqa: F811
                                                  ) -> None:
    """TIOCSTI (push a line into the pane's terminal, which the shell behind would run)
    is refused by the sandbox's seccomp filter, and the rest of the tty still works."""
    import sys

    from ralph_dev.agent.launch import launch_via_spec, worker_sandbox

    worker_dir = world.settings.paths.worker_dir("DEMO-9")
    workspace = world.jj.workspaces.add_workspace("DEMO-9")
    sandbox = worker_sandbox(world.settings, workspace=workspace, worker_dir=worker_dir,
                             home=worker_dir / "home", environ=os.environ,
                             program=sys.executable, path=os.environ["PATH"])
    assert sandbox is not None and sandbox["seccomp"]
    code = ("import fcntl, sys, termios\n"
            "try:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x')\n"
            "except OSError as e:\n    print('refused', e.errno)\nelse:\n    print('typed')\n"
            "print('size', fcntl.ioctl(0, termios.TIOCGWINSZ, b'0' * 8) != b'0' * 8)\n")
    out = tmp_path / "out.txt"
    launch = launch_via_spec([sys.executable, "-c", code], {"PATH": os.environ["PATH"]},
                             workspace, worker_dir / "probe.json", sandbox=sandbox)
    world.tmux.open_window("DEMO-9", cwd=workspace, command=launch.argv, environment=launch.env,
                           log_file=out)
    retry_until(lambda: "size" in (out.read_text() if out.exists() else ""), 30,
                what="the probe's answer: " + "\n".join(
                    world.tmux.capture(w.pane_id, 30) for w in world.tmux.find("DEMO-9")))
    text = out.read_text()
    assert "refused 1" in text and "typed" not in text, text
    assert "size True" in text
