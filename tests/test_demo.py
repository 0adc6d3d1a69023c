"""The README's main command: `ralph-dev demo` runs a swarm to the end and
leaves nothing running, with the scripted agent, with real Claude Code and with the
real Codex CLI (``--agent codex``: every spawn event names it), and
leaves nothing either when it is stopped by SIGTERM or SIGHUP, as by Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import running

from ralph_dev.agent.codex import find_codex
from ralph_dev.agent.gemini import find_gemini

pytestmark = pytest.mark.slow


CODEX_BIN = find_codex()
GEMINI_BIN = find_gemini()
"""Found before a fixture repoints HOME and XDG_CACHE_HOME (scripts/setup.sh installs
them)."""


@pytest.mark.parametrize("agent", ["--scripted", "--claude", "--agent=codex",
                                   "--agent=gemini", "--review-agent=codex"])
def test_demo_runs_to_completion_and_leaves_nothing_running(
    agent: str, xdg, jj_bin: str
) -> None:
    env = {**os.environ, "RALPH_DEV_JJ": jj_bin}
    if agent in ("--claude", "--review-agent=codex"):
        from claude_env import find_claude

        env["RALPH_DEV_CLAUDE_BIN"] = find_claude()
    keep = []
    if "codex" in agent:
        assert CODEX_BIN, "the Codex CLI is not installed: run scripts/setup.sh --test"
        env["RALPH_DEV_CODEX_BIN"] = CODEX_BIN
        keep = ["--keep"]  # its events are read below, then its files removed
    if "gemini" in agent:
        assert GEMINI_BIN, "Gemini CLI is not installed: run scripts/setup.sh --test"
        env["RALPH_DEV_GEMINI_BIN"] = GEMINI_BIN
        keep = ["--keep"]
    proc = subprocess.run([sys.executable, "-m", "ralph_dev", "demo", agent, "--timeout", "300",
                           *keep],
                          env=env, capture_output=True, text=True, timeout=420,
                          stdin=subprocess.DEVNULL, check=False)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "ralph-dev DEMO" in out  # clearly labeled
    assert "Demo finished: every issue is Done." in out
    assert ("real Claude Code" in out) is (agent in ("--claude", "--review-agent=codex"))
    assert ("real Codex CLI" in out) is ("codex" in agent)
    assert ("real Gemini CLI" in out) is ("gemini" in agent)
    trunk = out.split("Trunk (main) now holds:")[1].split("project demo")[0]
    assert len(re.findall(r"KV-\d+: ", trunk)) == 10  # every task's change, once
    socket = re.search(r"tmux -L (\S+) attach", out).group(1)
    alive = subprocess.run(["tmux", "-L", socket, "list-sessions"], capture_output=True)
    assert alive.returncode != 0  # its tmux server is gone
    where = re.search(r"everything lives in (\S+)", out).group(1)
    if keep:  # the workers ran on the CLIs asked for, and their spawn events say so
        events = [json.loads(line) for line in
                  (Path(where) / "state/ralph-dev/demo/events.jsonl").read_text().splitlines()]
        spawns = [e for e in events if e["event"] == "spawn"]
        if agent.startswith("--agent="):
            assert spawns and {e.get("cli") for e in spawns} == {agent.split("=")[1]}
        else:  # a review on Codex before each merge, the work itself on Claude Code
            reviews = [e for e in spawns if e.get("role") == "review"]
            assert {e["issue"] for e in reviews} >= set(re.findall(r"KV-\d+", trunk))
            assert {e.get("cli") for e in reviews} == {"codex"}
            assert {e.get("cli") for e in spawns if e not in reviews} == {"claude"}
        shutil.rmtree(where)
    assert not Path(where).exists()  # throwaway files removed (no --keep)
    # it never touched the person's own ralph-dev instance
    assert not (xdg / "config" / "ralph-dev").exists()


def swarm_of(marks: tuple[str, ...], *, skip: int) -> dict[int, list[str]]:
    """Live processes whose command line or environment names one of ``marks`` (the
    demo's temporary directory, its tmux socket): its daemon, controller, tmux server,
    workers and their shells. ``skip`` (the demo itself) aside; pid to argv."""
    found: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (skip, os.getpid()):
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(m.encode() in cmdline or m.encode() in environ for m in marks) and running(
                int(entry.name)):
            found[int(entry.name)] = cmdline.decode(errors="replace").split("\0")
    return found


def wait_for(what: str, predicate, timeout: float, proc: subprocess.Popen[bytes], out: Path):
    """Poll ``predicate`` until it is truthy; on the deadline, fail with the demo's output."""
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout}s (demo exit {proc.poll()}):\n"
                                 + out.read_text(errors="replace"))
        time.sleep(0.05)
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_ends_the_demos_swarm_and_removes_its_files(
    sig: signal.Signals, xdg: Path, jj_bin: str
) -> None:
    out = xdg / "demo.out"
    env = {**os.environ, "RALPH_DEV_JJ": jj_bin, "PYTHONUNBUFFERED": "1"}
    with out.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "ralph_dev", "demo", "--scripted",
                                 "--timeout", "300"], env=env, stdout=sink,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    marks: tuple[str, ...] = ()
    try:
        found = wait_for("demo header", lambda: re.search(
            r"everything lives in (\S+)\n watch live:  tmux -L (\S+) ", out.read_text()),
            60, proc, out)
        root, socket = found.group(1), found.group(2)
        marks = (root, socket)
        wait_for("running worker", lambda: any(  # `python -m ralph_dev.devtools.demo_agent`
            "ralph_dev.devtools.demo_agent" in argv
            for argv in swarm_of(marks, skip=proc.pid).values()), 120, proc, out)
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            code = None
        text = out.read_text(errors="replace")
        deadline = time.monotonic() + 30
        while (left := swarm_of(marks, skip=proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"left running: {left}\n{text}"
        alive = subprocess.run(["tmux", "-L", socket, "list-sessions"], capture_output=True)
        assert alive.returncode != 0, text  # its tmux server is gone
        assert not Path(root).exists(), text  # its throwaway files are removed
        assert code == 128 + sig, text  # stopped, and it says so
        assert f"Demo stopped by {sig.name}" in text, text
    finally:  # whatever the demo left (the old code: everything) goes, for the next tests
        proc.kill()
        proc.wait()
        for _ in range(20):
            left_over = swarm_of(marks, skip=proc.pid) if marks else {}
            if not left_over:
                break
            for pid in left_over:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        if marks:
            subprocess.run(["tmux", "-L", marks[1], "kill-server"], capture_output=True)
            shutil.rmtree(marks[0], ignore_errors=True)
