"""The second line behind the sandbox (issue 12 item 2): the controller notices files
no worker may change (the main working copy, ralph-dev's config) changing while
workers run; unconfined, the live workers' issues are held for a person."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from swarm_kit import Swarm, wait_for
from test_failure_policy import in_process, labels, tick

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sandbox", ["off", "bwrap"])
def test_a_write_into_the_main_working_copy_is_caught(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch,
        sandbox: str) -> None:
    """Issue 12 item 2, the second line: unconfined, a worker's write into the main
    working copy is noticed, recorded and its issue held; confined, it cannot happen."""
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1)
    swarm.tripwires_expected = sandbox == "off"
    try:
        swarm.set_sandbox(sandbox)
        swarm.import_plan('[[task]]\ntitle = "A"\n')
        escaped = swarm.repo / "planted.txt"
        swarm.script = {"*": f"escape:{escaped}"}
        swarm.write_script()
        ctl = in_process(swarm, monkeypatch)
        tick(ctl)
        if sandbox == "bwrap":
            log = ctl.store.log_path("DEMO-1")
            wait_for(lambda: (tick(ctl), log.exists() and "could not write" in log.read_text())[1],
                     30, "the refused write")
            tick(ctl)
            assert not escaped.exists()
            assert not [e for e in swarm.events() if e["event"] == "tripwire"]
            return
        wait_for(lambda: (tick(ctl), escaped.exists())[1], 30, "the hostile write")
        wait_for(lambda: (tick(ctl), "user-input-needed" in labels(swarm, "DEMO-1"))[1], 30,
                 "DEMO-1 held")
        event = next(e for e in swarm.events() if e["event"] == "tripwire")
        assert event["files"] == ["planted.txt"] and event["held"] == ["DEMO-1"]
        comment = swarm.issue("DEMO-1")["comments"][-1]["body"]
        assert "planted.txt" in comment and 'agent.sandbox = "off"' in comment
        assert "DEMO-1" not in swarm.worker_windows()  # stopped: it may be the one
    finally:
        swarm.teardown()


def _reported_done(ctl: Any, issue: str) -> bool:
    record = ctl.store.load_record(issue)
    return record is not None and record.done


def test_a_file_planted_in_a_finished_workspace_is_never_merged_as_its_work(
        tmp_path: Path, jj_bin: str, tmux_socket: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 12 finding 1: a file one worker dropped into another's workspace reached
    trunk inside THAT issue's commit. DEMO-1 is done and waits for its merge (trunk is
    red) when DEMO-2, unconfined, writes into DEMO-1's workspace: the controller notices
    the workspace changing while it had no worker, holds both issues, and once trunk is
    green again DEMO-1 is not merged with the planted file."""
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1)
    swarm.tripwires_expected = True
    try:
        swarm.set_sandbox("off")
        swarm.import_plan("".join(f'[[task]]\ntitle = "{t}"\n\n' for t in "ABC"))
        ctl = in_process(swarm, monkeypatch)
        planted = ctl.settings.workspaces / "DEMO-1" / "planted.txt"
        swarm.script = {"DEMO-1": "work:0.1", "DEMO-2": f"escape:{planted}", "DEMO-3": "hang"}
        swarm.write_script()
        red = ctl.store.paths.trunk_red_file
        red.write_text('{"ok": false, "output": "red on purpose", "commit": null}\n')
        wait_for(lambda: (tick(ctl), _reported_done(ctl, "DEMO-1"))[1], 30,
                 "DEMO-1 done, its merge waiting for a green trunk")
        wait_for(lambda: (tick(ctl), planted.exists())[1], 30, "DEMO-2's hostile write")
        wait_for(lambda: (tick(ctl), "user-input-needed" in labels(swarm, "DEMO-1"))[1], 30,
                 "DEMO-1 held")
        event = next(e for e in swarm.events()
                     if e["event"] == "tripwire" and e.get("workspace") == "DEMO-1")
        assert event["files"] == ["planted.txt"] and event["held"] == ["DEMO-1", "DEMO-2"]
        assert "user-input-needed" in labels(swarm, "DEMO-2")
        assert "DEMO-2" not in swarm.worker_windows()  # the suspect was stopped
        comment = swarm.issue("DEMO-1")["comments"][-1]["body"]
        assert "planted.txt" in comment and "worker diff DEMO-1" in comment
        red.unlink()
        for _ in range(5):
            tick(ctl)
        assert "planted.txt" not in swarm.trunk_files()
        assert "DEMO-1" in swarm.workspaces()  # its work waits for a person, not lost

        # the person looks, removes the planted file and lets DEMO-1 go on while DEMO-3
        # works: their edit in a held issue's workspace is theirs (an event, nobody held
        # again), and DEMO-1 merges with its own work only
        wait_for(lambda: (tick(ctl), "DEMO-3" in swarm.worker_windows())[1], 30,
                 "DEMO-3 working in the freed slot")
        planted.unlink()
        tick(ctl)
        tick(ctl)
        again = [e for e in swarm.events() if e["event"] == "tripwire"][1:]
        assert [(e["files"], e["held"], e["persons_hands"]) for e in again] == [
            (["planted.txt"], [], True)]
        swarm.cli("issue", "label", "DEMO-1", "+user-feedback-given")
        wait_for(lambda: (tick(ctl), "changes/DEMO-1.txt" in swarm.trunk_files())[1], 30,
                 "DEMO-1 merged once a person let it go on")
        assert "planted.txt" not in swarm.trunk_files()
        assert "user-input-needed" not in labels(swarm, "DEMO-1")
    finally:
        swarm.teardown()


def test_the_controllers_own_merges_trip_nothing(
        tmp_path: Path, jj_bin: str, tmux_socket: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch on resting workspaces must not cry wolf: unconfined, three issues
    finish together and wait their turn in the verified merge lane, each rebased and
    verified in its workspace (the verify writes there), DEMO-2 sent back once by a red
    verify; nothing trips and nothing is held."""
    once = tmp_path / "sent-back-once"
    verify = ('touch verified-here && if [ -e changes/DEMO-1.txt ] && [ -e changes/DEMO-2.txt ]'
              f' && [ ! -e {once} ]; then touch {once}; exit 1; fi')  # red together, once
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=3, verify=verify)
    try:
        swarm.set_sandbox("off")
        swarm.import_plan("".join(f'[[task]]\ntitle = "T{n}"\n\n' for n in range(3)))
        swarm.script = {"*": "work:0.2"}
        swarm.write_script()
        ctl = in_process(swarm, monkeypatch)
        wanted = {f"changes/DEMO-{n}.txt" for n in (1, 2, 3)}
        wait_for(lambda: (tick(ctl), wanted <= set(swarm.trunk_files()))[1], 60,
                 "all three merged")
        assert once.exists() and [e for e in swarm.events() if e["event"] == "merge_sent_back"]
        assert not [e for e in swarm.events() if e["event"] == "tripwire"]
        assert not any("user-input-needed" in labels(swarm, f"DEMO-{n}") for n in (1, 2, 3))
    finally:
        swarm.teardown()
