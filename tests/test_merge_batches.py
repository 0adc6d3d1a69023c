"""The merge lane of issue 34, on real jj, tmux, processes and the real controller:

* the verify runs beside the loop: an issue added while a merge's verify runs starts
  within 3 s, and a controller killed mid-verify adopts the run (or runs it again) and
  loses nothing;
* changes ready together are verified together: a green batch moves trunk once, each
  change keeping its own commit; a red one is bisected, and of two that pass alone and
  fail together the later goes back while the others land, trunk green throughout.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from swarm_kit import Swarm, wait_for
from test_failure_policy import in_process, tick

from ralph_dev.adapters.store import from_iso
from ralph_dev.control.state.status import load_schema

pytestmark = pytest.mark.slow


def slow_after_first(shared: Path, seconds: int) -> str:
    """A verify command that passes at once the first time (the worker's own, at
    `worker done`) and takes ``seconds`` every later time (the merge lane's) until the
    file ``fast`` exists."""
    count, fast = shared / "verifies", shared / "fast"
    return (f'n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}; '
            f'if [ "$n" -ge 1 ] && [ ! -e {fast} ]; then sleep {seconds}; fi; true')


def events_of(swarm: Swarm, name: str, issue: str | None = None) -> list[dict[str, Any]]:
    return [e for e in swarm.events()
            if e["event"] == name and (issue is None or e.get("issue") == issue)]


def test_an_issue_added_while_a_merge_is_verified_starts_at_once(
        tmp_path: Path, jj_bin: str, tmux_socket: str) -> None:
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2,
                         verify=slow_after_first(tmp_path / "shared", 15))
    try:
        swarm.import_plan('[[task]]\ntitle = "A"\n')
        swarm.start()
        wait_for(lambda: events_of(swarm, "merge_verify_started", "DEMO-1"), 90,
                 "DEMO-1's merge verify to start")
        swarm.cli("issue", "add", swarm.project, "B")
        added = time.monotonic()
        wait_for(lambda: events_of(swarm, "spawn", "DEMO-2"), 3,
                 "DEMO-2 to start while DEMO-1 is being verified", interval=0.05)
        started = time.monotonic() - added
        assert not events_of(swarm, "merge_verified"), "the verify was not running"
        status = swarm.status()
        lane = status["lane"]
        assert lane["batch"] == ["DEMO-1"] and lane["state"] == "running", lane
        (swarm.shared / "fast").write_text("")
        wait_for(lambda: "changes/DEMO-1.txt" in swarm.trunk_files(), 60, "DEMO-1 merged")
        wait_for(swarm.all_done, 90, "both issues done")
        print(f"DEMO-2 started {started:.2f}s after it was added")
    finally:
        swarm.teardown()


@pytest.mark.parametrize("verify_too", [False, True], ids=["adopted", "run-again"])
def test_a_controller_killed_mid_verify_loses_nothing_and_the_change_lands(
        tmp_path: Path, jj_bin: str, tmux_socket: str, verify_too: bool) -> None:
    """Killed alone, the controller's successor adopts the verify still running; killed
    with the verify (a reboot, an OOM killer), it runs the verify again."""
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1,
                         verify=slow_after_first(tmp_path / "shared", 8))
    try:
        swarm.import_plan('[[task]]\ntitle = "A"\n')
        swarm.start()
        wait_for(lambda: events_of(swarm, "merge_verify_started", "DEMO-1"), 90,
                 "DEMO-1's merge verify to start")
        pid = int(next(line.split()[1] for line in swarm.tmux(
            "list-panes", "-a", "-F", "#{window_name} #{pane_pid}").stdout.splitlines()
            if line.startswith("controller ")))
        os.kill(pid, signal.SIGKILL)
        if verify_too:
            run = json.loads((swarm.state_dir / "lane" / "run.json").read_text())["id"]
            runs = swarm.state_dir / "lane" / "runs" / run
            for part in ("runner.json", "group"):
                os.killpg(json.loads((runs / part).read_text())["pgid"], signal.SIGKILL)
        wait_for(lambda: len(events_of(swarm, "controller_started")) >= 2, 60,
                 "the daemon to start the controller again")
        wait_for(lambda: "changes/DEMO-1.txt" in swarm.trunk_files(), 60, "DEMO-1 merged")
        wait_for(swarm.all_done, 30, "DEMO-1 done")
        # adopted (its outcome taken), or run again once found lost
        assert len(events_of(swarm, "merge_verify_started")) == (2 if verify_too else 1)
        assert len(events_of(swarm, "merge_verified", "DEMO-1")) == 1
        assert swarm.workspaces() == []
    finally:
        swarm.teardown()


def red_until_released(ctl: Any, swarm: Swarm) -> None:
    """Trunk red at its own commit: nothing merges (nor is trunk verified again) until
    the marker goes, so the changes done meanwhile are ready together."""
    commit = ctl.jj.trunk.trunk_commit()
    ctl.store.paths.trunk_red_file.write_text(json.dumps({"commit": commit, "exit_code": 1}))


def test_a_red_batch_is_bisected_the_later_of_two_goes_back_and_the_rest_land(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    allow = tmp_path / "shared" / "allow-both"
    verify = (f"test ! -e changes/DEMO-1.txt || test ! -e changes/DEMO-3.txt "
              f"|| test -e {allow}")
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=3, verify=verify,
                         timing={"max_attempts": 3})
    try:
        swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n'
                          '[[task]]\ntitle = "C"\n')
        ctl = in_process(swarm, monkeypatch)
        red_until_released(ctl, swarm)

        def all_waiting() -> bool:
            tick(ctl)
            return len(events_of(swarm, "worker_done")) == 3  # done, unmerged

        wait_for(all_waiting, 120, "all three done and waiting behind the red trunk")
        ctl.store.paths.trunk_red_file.unlink()

        def verify_started() -> list[Any]:
            return [a for a in tick(ctl).plan.actions if a.kind == "verifymerge"]

        starts = wait_for(verify_started, 30, "the lane to start")
        assert [a.batch for a in starts] == [("DEMO-1", "DEMO-2", "DEMO-3")]

        def sent_back() -> bool:
            tick(ctl)
            files = swarm.trunk_files()
            assert not {"changes/DEMO-1.txt", "changes/DEMO-3.txt"} <= set(files), "red trunk"
            return bool(events_of(swarm, "merge_sent_back"))

        wait_for(sent_back, 120, "the batch bisected and DEMO-3 sent back")
        assert [e["issue"] for e in events_of(swarm, "merge_sent_back")] == ["DEMO-3"]
        steps = [e["batch"] for e in events_of(swarm, "merge_verify_started")]
        assert steps == [["DEMO-1", "DEMO-2", "DEMO-3"], ["DEMO-1"], ["DEMO-1", "DEMO-2"]]
        wait_for(lambda: (tick(ctl), {"changes/DEMO-1.txt", "changes/DEMO-2.txt"}
                          <= set(swarm.trunk_files()))[1], 30, "DEMO-1 and DEMO-2 landed")
        landed = events_of(swarm, "merge_verified")
        assert {e["issue"] for e in landed} == {"DEMO-1", "DEMO-2"}
        assert {tuple(e["batch"]) for e in landed} == {("DEMO-1", "DEMO-2")}  # at once
        log = swarm.jj_out("log", "--no-graph", "-r", "::main ~ root()", "-T",
                           'description.first_line() ++ "\\n"').split("\n")
        assert [line.split(":")[0] for line in log[:2]] == ["DEMO-2", "DEMO-1"]  # own commits
        comment = swarm.issue("DEMO-3")["comments"][-1]["body"]
        assert "together with DEMO-1, DEMO-2" in comment and "main is untouched" in comment

        allow.write_text("a person fixed the pair\n")
        wait_for(lambda: (tick(ctl), "changes/DEMO-3.txt" in swarm.trunk_files())[1], 120,
                 "DEMO-3 redone and merged")
        wait_for(lambda: (tick(ctl), swarm.all_done())[1], 60, "all three done")
        assert swarm.workspaces() == []
    finally:
        swarm.teardown()


def test_six_changes_done_together_reach_trunk_in_two_verifies_after_the_last_done(
        tmp_path: Path, jj_bin: str, tmux_socket: str) -> None:
    """The issue's own check, counted in verifies rather than seconds (the seconds are
    `benchmarks/merge_lane.py`'s figure, which a loaded host stretches): with a 15 s
    verify, six changes done together reach trunk in batches: at most two verifies start
    after the last `worker done` (one at a time: six)."""
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=6, verify="sleep 15")
    try:
        idents = swarm.import_plan("".join(f'[[task]]\ntitle = "T{n}"\n' for n in range(6)))
        swarm.start()
        wait_for(lambda: len(events_of(swarm, "worker_done")) == 6, 180, "six workers done")
        wait_for(lambda: len(events_of(swarm, "merge_verified")) == 6, 240, "six merged")
        last_done = max(from_iso(e["time"]) for e in events_of(swarm, "worker_done"))
        last_merged = max(from_iso(e["time"]) for e in events_of(swarm, "merge_verified"))
        runs = events_of(swarm, "merge_verify_started")
        print(f"in trunk {(last_merged - last_done).total_seconds():.1f}s after the last "
              f"done, batches {[len(e['batch']) for e in runs]}")
        after = [e["batch"] for e in runs if from_iso(e["time"]) >= last_done]
        assert len(after) <= 2, ([e["batch"] for e in runs], after)
        assert len(runs) < 6  # batched, not one at a time
        assert {f"changes/{i}.txt" for i in idents} <= set(swarm.trunk_files())
        wait_for(swarm.all_done, 60, "all six done")
    finally:
        swarm.teardown()



def test_with_parallel_verifies_a_batch_and_its_half_are_verified_at_once(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``merge.parallel_verifies = 2``: a batch of four is verified with its first two
    beside it, two processes at once (each of the lane's verifies waits up to 5 s to
    meet another); DEMO-3 breaks it (with DEMO-1), so the next round verifies only the
    first three, and the two that passed land as the verify of two checked them out."""
    shared = tmp_path / "shared"
    meet = (f'case "$PWD" in */.ralph-lane*) here=$(mktemp {shared}/at/XXXXXX); i=0; '
            f'while [ "$(ls {shared}/at | wc -l)" -lt 2 ] && [ $i -lt 50 ]; do sleep 0.1; '
            f'i=$((i+1)); done; [ "$(ls {shared}/at | wc -l)" -ge 2 ] && touch {shared}/met; '
            f'i=0; while [ ! -e {shared}/go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); '
            f'done; rm -f "$here";; esac; ')
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=4,
                         verify=meet + "test ! -e changes/DEMO-1.txt "
                                       "|| test ! -e changes/DEMO-3.txt",
                         timing={"max_attempts": 3})
    (shared / "at").mkdir()
    swarm.config_file.write_text(swarm.config_file.read_text()
                                 + "\n[projects.demo.merge]\nparallel_verifies = 2\n")
    try:
        swarm.import_plan("".join(f'[[task]]\ntitle = "{t}"\n' for t in "ABCD"))
        ctl = in_process(swarm, monkeypatch)
        red_until_released(ctl, swarm)
        wait_for(lambda: (tick(ctl), len(events_of(swarm, "worker_done")) == 4)[1], 120,
                 "all four done and waiting behind the red trunk")
        ctl.store.paths.trunk_red_file.unlink()
        wait_for(lambda: (tick(ctl), (shared / "met").exists())[1], 60,
                 "the batch's verify and its half's running at once")
        doc = swarm.status()  # what a person sees of it
        jsonschema.Draft202012Validator(load_schema()).validate(doc)
        shown = doc["lane"]
        assert shown["parallel_verifies"] == 2 and shown["state"] == "running"
        assert shown["run"]["at_once"] == [{"size": 2, "state": "running", "exit_code": None}]
        assert "its first 2 verified beside it" in shown["run"]["step"]
        assert "its first 2 verified beside it" in swarm.cli("status", swarm.project).stdout
        (shared / "go").touch()
        wait_for(lambda: (tick(ctl), bool(events_of(swarm, "merge_sent_back")))[1], 120,
                 "the batch bisected and DEMO-3 sent back")
        started = events_of(swarm, "merge_verify_started")
        assert [(e["batch"], e.get("at_once")) for e in started] == [
            (["DEMO-1", "DEMO-2", "DEMO-3", "DEMO-4"], [2, 4]),
            (["DEMO-1", "DEMO-2", "DEMO-3"], None)]  # 2 rounds; one at a time takes 3
        assert [e["issue"] for e in events_of(swarm, "merge_sent_back")] == ["DEMO-3"]
        wait_for(lambda: (tick(ctl), {"changes/DEMO-1.txt", "changes/DEMO-2.txt"}
                          <= set(swarm.trunk_files()))[1], 30, "DEMO-1 and DEMO-2 landed")
        assert "changes/DEMO-3.txt" not in swarm.trunk_files()
        landed = events_of(swarm, "merge_verified")
        assert {tuple(e["batch"]) for e in landed} == {("DEMO-1", "DEMO-2")}
    finally:
        swarm.teardown()
