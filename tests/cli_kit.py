"""What the tests of the agent CLIs share: the pinned program, a project whose workers
run it, and the scenarios each supervised CLI goes through against its scripted API
(``test_codex_smoke``, ``test_gemini_smoke``, ``test_egress``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from conftest import make_jj_repo, retry_until

from ralph_dev.core.agent_profiles import AgentProfile
from ralph_dev.core.config import Timing
from ralph_dev.core.model import NewIssue, StateType
from ralph_dev.devtools.api_faults import Hang
from ralph_dev.devtools.scripted_model import Text, bash, conversation_text


def pinned_cli(profile: AgentProfile, found: str | None) -> str:
    """``found``, the CLI ``scripts/setup.sh`` installed, once it is the pinned version
    (``scripts/compat.sh`` runs the tests on others: ``RALPH_DEV_COMPAT``)."""
    if found is None:
        pytest.fail(f"{profile.title} is not installed: run scripts/setup.sh --test (it "
                    f"installs {profile.package}@{profile.pinned} into ~/.cache/ralph-dev/"
                    f"{profile.name}-{profile.pinned})")
    version = subprocess.run([found, *profile.version_args], capture_output=True, text=True,
                             check=False, timeout=60).stdout
    if not os.environ.get("RALPH_DEV_COMPAT"):
        assert profile.pinned in version, \
            f"{found} is {version!r}, not the pinned {profile.pinned}"
    return found


def cli_project(xdg: Path, tmux_socket: str, profile: AgentProfile, program: str,
                agent: tuple[str, ...] = ()) -> Path:
    """The config of project ``demo`` (a new jj repository, the local tracker) whose
    workers run ``profile``'s CLI, ``program``, with more ``agent`` keys: its path."""
    repo = make_jj_repo(xdg / "repo")
    config = xdg / "config" / "ralph-dev" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("\n".join([
        "[projects.demo]", f"repo = {json.dumps(str(repo))}", 'trunk = "main"',
        f"tmux_socket = {json.dumps(tmux_socket)}",
        f"verify_command = {json.dumps('test -f ok.txt')}",
        "[projects.demo.tracker]", 'key = "DEMO"',
        "[projects.demo.timing]", "poll_interval = 0.5",
        "[projects.demo.agent]", f"cli = {json.dumps(profile.name)}",
        f"{profile.bin_setting} = {json.dumps(program)}", 'home = "isolated"', *agent, ""]))
    return config


# --- the scenarios every supervised CLI goes through ---------------------------------------

SwarmOf = Callable[..., AbstractContextManager[tuple[Any, Callable[[], Any]]]]
"""``swarm(brain, settings=None)``: a CLI's scripted API playing ``brain``, the CLI pointed
at it, and one real controller tick per call: (the API, the tick)."""


def until_done(world: Any, issue: str, tick: Callable[[], Any], timeout: float,
               what: str) -> None:
    retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                         is StateType.COMPLETED)[1], timeout, 0.5, what=what)


def question_goes_to_a_person(world: Any, swarm: SwarmOf, calls: Callable[[Any], int]
                              ) -> None:
    """The CLI ends its turn asking a person something and reports nothing: the question
    goes on the issue (the label, a comment in its words), no attempt is charged, the
    worker waits, and the person's answer starts the same session again, which then
    finishes the issue."""
    question = "Should the file hold JSON or YAML?"
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt")])
    finish = f"touch ok.txt && ralph-dev worker done {issue} --summary 'added ok.txt'"

    def brain(request: dict[str, Any]) -> list[Any]:
        said = conversation_text(request)
        if "JSON, please." not in said:
            return [Text(f"I can write it either way. {question}")]
        return [Text("Done.")] if "touch ok.txt" in said else [bash(finish)]

    with swarm(brain) as (api, tick):

        def asked() -> bool:
            found = world.tracker.get_sync(issue)
            return "user-input-needed" in found.labels and any(
                question in c.body for c in found.comments)

        retry_until(lambda: (tick(), asked())[1], 120, 0.5, what="the question on the issue")
        asked_calls = calls(api)
        for _ in range(4):
            tick()
        assert calls(api) == asked_calls  # it waits for the person
        world.tracker.comment_sync(issue, "JSON, please.", by_ralph=False)
        world.tracker.change_labels_sync(issue, add=["user-feedback-given"])
        until_done(world, issue, tick, 180, "the issue done after the answer")
    events = list(world.store.iter_events())
    starts = [e for e in events if e["event"] == "spawn"]
    assert [e["attempt"] for e in starts] == [1, 1] and starts[1].get("resume"), starts
    assert "worker_blocked" in [e["event"] for e in events]
    assert not [e for e in events if e["event"] in ("hold", "nudge", "restart")]
    assert "ok.txt" in world.jj_out("file", "list", "-r", "main")


def crash_resumes_its_session(world: Any, swarm: SwarmOf, calls: Callable[[Any], int]
                              ) -> None:
    """The CLI dies mid-task (kill -9 of everything in its workspace while a call to the
    model hangs); its next attempt resumes the session its supervisor told: the model
    sees the first step in the history and goes on."""
    import signal

    from test_claude_smoke import working_in

    settings = dataclasses.replace(world.settings, timing=Timing(
        poll_interval=0.5, retry_base=0.5, retry_cap=1))
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Two steps")])
    finish = f"touch ok.txt && ralph-dev worker done {issue} --summary 'two steps'"
    crashed = {"yet": False}

    def brain(request: dict[str, Any]) -> list[Any]:
        said = conversation_text(request)
        if "echo step-one" not in said:
            return [bash("echo step-one > one.txt", "step one")]
        if not crashed["yet"]:
            return [Hang()]  # the agent dies while it waits here
        return [Text("Done.")] if "touch ok.txt" in said else [bash(finish)]

    with swarm(brain, settings) as (api, tick):
        retry_until(lambda: (tick(), calls(api) >= 2
                             and world.store.load_record(issue).session_id)[1], 120, 0.5,
                    what="the hanging second call, the session told")
        session = world.store.load_record(issue).session_id
        crashed["yet"] = True
        for pid in working_in(world.jj.workspaces.workspace_path(issue)):
            with contextlib.suppress(ProcessLookupError):  # the agent, its supervisor…
                os.kill(pid, signal.SIGKILL)
        until_done(world, issue, tick, 180, "the issue done after the crash")
    starts = [e for e in world.store.iter_events() if e["event"] == "spawn"]
    assert [e["attempt"] for e in starts] == [1, 2], starts
    assert starts[1].get("resume") == session  # the same session goes on
    assert "ok.txt" in world.jj_out("file", "list", "-r", "main")


def through_a_fault(world: Any, swarm: SwarmOf, timing: Timing,
                    fault: Callable[[], list[Any]]) -> list[dict[str, Any]]:
    """One worker adds ok.txt: its first step, then ``fault()`` answers each call while it
    says something, then the finish; the real controller ticks (with ``timing``) until
    the issue is done. Its events."""
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt")])
    finish = f"touch ok.txt && ralph-dev worker done {issue} --summary 'added ok.txt'"

    def brain(request: dict[str, Any]) -> list[Any]:
        said = conversation_text(request)
        if "echo started" not in said:
            return [bash("echo started > started.txt", "start")]
        return fault() or ([Text("Done.")] if "touch ok.txt" in said else [bash(finish)])

    settings = dataclasses.replace(world.settings, timing=timing)
    with swarm(brain, settings) as (api, tick):
        until_done(world, issue, tick, 240, f"{issue} done after the fault: {api.errors}")
    return list(world.store.iter_events())


def hang_restarts_its_session(world: Any, swarm: SwarmOf) -> None:
    """A model call that never answers (the CLI's events stop, no retry announced) is a
    hang: after ``hang_timeout`` the worker is restarted in its own session, free."""
    hung: list[float] = []

    def hanging() -> list[Any]:
        if hung:
            return []
        hung.append(time.time())
        return [Hang(120)]

    events = through_a_fault(world, swarm, Timing(
        poll_interval=0.5, stall_timeout=600, restart_timeout=600, hang_timeout=10), hanging)
    restarts = [e for e in events if e["event"] == "restart"]
    assert restarts and "has not answered" in restarts[0]["reason"], restarts
    assert "no attempt charged" in restarts[0]["reason"] and restarts[0].get("resume")
    assert not [e for e in events if e["event"] == "hold"]
