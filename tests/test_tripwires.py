"""The second line behind the sandbox (issue 12 item 2): the controller notices files
no worker may change (the main working copy, ralph-dev's config) changing while
workers run; unconfined, the live workers' issues are held for a person."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from swarm_kit import Swarm, wait_for
from test_failure_policy import config_path, in_process, labels, tick

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sandbox", ["off", "bwrap"])
def test_a_write_into_the_main_working_copy_is_caught(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch,
        sandbox: str) -> None:
    """Issue 12 item 2, the second line: unconfined, a worker's write into the main
    working copy is noticed, recorded and its issue held; confined, it cannot happen."""
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1)
    try:
        config = config_path(swarm)
        config.write_text(config.read_text().replace(
            "shared_paths =", f'sandbox = "{sandbox}"\nshared_paths ='))
        swarm.import_plan('[[task]]\ntitle = "A"\n')
        escaped = swarm.repo / "planted.txt"
        swarm.script = {"*": f"escape:{escaped}"}
        swarm.write_script()
        ctl = in_process(swarm, monkeypatch)
        monkeypatch.setattr("ralph_dev.control.tripwires.CHECK_EVERY", timedelta(0))
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
    finally:
        swarm.teardown()
