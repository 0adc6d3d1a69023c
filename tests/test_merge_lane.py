"""The verified merge lane (issue 9 item 3, issue 12 item 3), on real jj, tmux and the
real controller: trunk moves only to a change that passed the verify command (from
the controller's own config) rebased onto trunk.

* two changes that each pass alone and fail together: the second is sent back to a
  worker of its own issue (same workspace, the failure's output in its prompt, an
  attempt counted) and trunk never holds the failing pair; once fixed it merges;
* a pass on a trunk that moved during the verify is re-run on the new trunk.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from swarm_kit import Swarm, wait_for
from test_failure_policy import in_process, labels, tick

pytestmark = pytest.mark.slow


def both_present(files: list[str]) -> bool:
    return {"changes/DEMO-1.txt", "changes/DEMO-2.txt"} <= set(files)


def test_green_alone_red_together_the_second_goes_back_and_trunk_stays_green(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    allow = tmp_path / "shared" / "allow-both"  # the fix: the pair passes once it exists
    verify = (f"ls changes; test ! -e changes/DEMO-1.txt || test ! -e changes/DEMO-2.txt "
              f"|| test -e {allow}")
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2, verify=verify,
                         timing={"max_attempts": 3})
    try:
        assert allow.parent == swarm.shared  # visible inside every worker's sandbox
        swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')
        ctl = in_process(swarm, monkeypatch)
        first = tick(ctl)
        assert [a.kind for a in first.plan.actions] == ["spawn", "spawn"]  # both alone

        def sent_back() -> bool:
            tick(ctl)
            assert not both_present(swarm.trunk_files()), "trunk went red"
            return any(e["event"] == "merge_sent_back" for e in swarm.events())

        wait_for(sent_back, 120, "DEMO-2 sent back after DEMO-1 merged")
        assert "changes/DEMO-1.txt" in swarm.trunk_files()
        event = next(e for e in swarm.events() if e["event"] == "merge_sent_back")
        assert event["issue"] == "DEMO-2"
        comment = swarm.issue("DEMO-2")["comments"][-1]["body"]
        assert "failed (exit 1)" in comment and "main is untouched" in comment
        assert "DEMO-1.txt" in comment and "DEMO-2.txt" in comment  # the output, fenced
        record = ctl.store.load_record("DEMO-2")
        assert record is not None and record.merge_failures == 0  # not a failed merge
        assert record.last_failure and "fails the verify command" in record.last_failure
        assert "DEMO-2" in swarm.workspaces()  # the work is kept for its worker

        allow.write_text("a person fixed the pair\n")  # as the worker's fix would

        def second_attempt_merged() -> bool:
            tick(ctl)
            return "changes/DEMO-2.txt" in swarm.trunk_files()

        wait_for(second_attempt_merged, 120, "DEMO-2 redone and merged")
        spawns = [e for e in swarm.events() if e["event"] == "spawn" and e["issue"] == "DEMO-2"]
        assert len(spawns) == 2  # a worker of its own, once more
        prompt = ctl.settings.paths.prompts_dir / "DEMO-2.execute.2.md"
        text = prompt.read_text()
        assert "FAILS the project's verify command" in text and "DEMO-1.txt" in text
        assert "user-input-needed" not in labels(swarm, "DEMO-2")
        assert not [e for e in swarm.events() if e["event"] == "kill"
                    and e["issue"] == "DEMO-2" and "still running" in e["reason"]]
        assert not [e for e in swarm.events() if e["event"] == "tripwire"]  # merges touch
        # neither the main working copy nor the config
    finally:
        swarm.teardown()


def test_a_pass_on_a_trunk_that_moved_meanwhile_is_verified_again(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1, verify="true")
    try:
        swarm.import_plan('[[task]]\ntitle = "A"\n')
        ctl = in_process(swarm, monkeypatch)
        jj_env = {**swarm.env, "JJ_USER": "Person", "JJ_EMAIL": "person@example.com"}

        def person(*args: str) -> None:
            subprocess.run([swarm.jj, *args], cwd=swarm.repo, env=jj_env, check=True,
                           capture_output=True)

        real_prepare = ctl.jj.merger.prepare_merge
        prepared: list[Any] = []

        def prepare_merge(name: str) -> Any:
            head = real_prepare(name)
            prepared.append(head)
            if len(prepared) == 1:  # a person pushes to trunk while the change is verified
                person("new", "main", "-m", "a person's fix")
                (swarm.repo / "person.txt").write_text("pushed meanwhile\n")
                person("bookmark", "set", "main", "-r", "@")
            return head

        ctl.jj.merger.prepare_merge = prepare_merge  # type: ignore[method-assign]
        wait_for(lambda: (tick(ctl), "changes/DEMO-1.txt" in swarm.trunk_files())[1], 90,
                 "DEMO-1 merged")
        assert len(prepared) == 2 and prepared[0] != prepared[1]  # rebased and verified again
        assert "person.txt" in swarm.trunk_files()  # the person's commit stays under it
        events = [e["event"] for e in swarm.events()]
        assert events.count("merge_reverify") == 1 and "merge_verified" in events
    finally:
        swarm.teardown()


def test_without_the_lane_trunk_moves_unverified(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``merge.verified = false`` is the old behaviour: a verify command only gates
    `worker done`; the pair that fails together reaches trunk."""
    verify = "test ! -e changes/DEMO-1.txt || test ! -e changes/DEMO-2.txt"
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2, verify=verify)
    try:
        config = swarm.config_file
        config.write_text(config.read_text() + "\n[projects.demo.merge]\nverified = false\n")
        swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')
        ctl = in_process(swarm, monkeypatch)
        wait_for(lambda: (tick(ctl), both_present(swarm.trunk_files()))[1], 120,
                 "both merged unverified")
        assert not [e for e in swarm.events() if e["event"] == "merge_sent_back"]
    finally:
        swarm.teardown()


def test_the_controllers_verify_runs_workers_code_in_their_sandbox(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verify command runs code workers wrote: the controller runs it confined like
    a worker (ralph-dev's config hidden, the main repository read-only)."""
    config = tmp_path / "config" / "ralph-dev" / "config.toml"
    escaped = tmp_path / "repo" / "escaped"
    verify = f"test ! -e {config} && ! touch {escaped} 2>/dev/null"
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1, verify=verify)
    try:
        assert swarm.config_file == config and config.exists()
        swarm.import_plan('[[task]]\ntitle = "A"\n')
        ctl = in_process(swarm, monkeypatch)
        wait_for(lambda: (tick(ctl), "changes/DEMO-1.txt" in swarm.trunk_files())[1], 90,
                 "DEMO-1 verified on trunk and merged")
        assert "merge_verified" in [e["event"] for e in swarm.events()]
        assert not escaped.exists()
    finally:
        swarm.teardown()



def test_the_merge_verify_gets_the_variables_worker_done_had(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27: a verify command that reads the worker's variables passes at `worker done`
    (inside the worker) and again on the change rebased onto trunk (the controller's own
    run, in the workers' sandbox): it was sent back 3 times and held before."""
    verify = ('test -n "$RALPH_DEV_ISSUE" && test -e "changes/$RALPH_DEV_ISSUE.txt" '
              '&& test "$RALPH_DEV_PROJECT" = demo && test "$RALPH_DEV_ROLE" = execute '
              '&& test "$RALPH_DEV_ATTEMPT" = 1 '
              '&& test "$(cd "$RALPH_DEV_WORKSPACE" && pwd -P)" = "$(pwd -P)" '
              '&& touch "$HOME/.verify-ran" && echo "verified $RALPH_DEV_ISSUE"')
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2, verify=verify)
    try:
        swarm._add_agent_line('home = "isolated"')  # a HOME of the worker's own, writable
        swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')
        ctl = in_process(swarm, monkeypatch)

        def both_merged() -> bool:
            tick(ctl)
            assert not [e for e in swarm.events() if e["event"] == "merge_sent_back"], \
                swarm.issue("DEMO-1")["comments"][-1:]
            return both_present(swarm.trunk_files())

        wait_for(both_merged, 120, "DEMO-1 and DEMO-2 verified and merged")
        done = [e for e in swarm.events() if e["event"] == "worker_done"]
        assert {e["issue"] for e in done} == {"DEMO-1", "DEMO-2"}  # passed at `worker done`
        verified = [e["issue"] for e in swarm.events() if e["event"] == "merge_verified"]
        assert sorted(verified) == ["DEMO-1", "DEMO-2"]  # and at the merge
        assert "user-input-needed" not in labels(swarm, "DEMO-1") + labels(swarm, "DEMO-2")
    finally:
        swarm.teardown()
