"""Grooming end to end: the real daemon and controller, real tmux, jj and local tracker,
a scripted groom worker whose commands the controller checks and relays (issue 15)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from swarm_kit import Swarm, wait_for


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2)
    yield s
    s.teardown()


def _issue(swarm: Swarm, title: str) -> dict[str, Any] | None:
    return next((i for i in swarm.issues() if i["title"] == title), None)


def test_an_idle_swarm_grooms_its_backlog(swarm: Swarm) -> None:
    swarm.cli("issue", "add", swarm.project, "Old idea", "--priority", "2",
              "--state", "Backlog")                                      # DEMO-1
    commands = swarm.shared / "groom.json"
    commands.write_text(json.dumps([
        ["backlog"],
        ["propose", "--title", "Validate the config", "--reason", "README promises it"],
        ["prioritize", "DEMO-1", "--priority", "1", "--reason", "refused: a person's"],
        ["prioritize", "DEMO-1", "--priority", "4", "--reason", "nobody asked in a year"],
        ["flag", "DEMO-1", "--stale", "--reason", "no activity"],
    ]))
    swarm.script = {"DEMO-2": f"groom:{commands}", "*": "work:0.3"}
    swarm.write_script()
    swarm.env["RALPH_DEV_GROOM_WHEN_IDLE"] = "true"
    swarm.start()

    run = wait_for(lambda: (i := _issue(swarm, "Groom the backlog")) and i["state_type"] ==
                   "completed" and i, 90, "the groom run to open and finish")
    assert run["identifier"] == "DEMO-2" and "ralph:groom" in run["labels"]
    proposal = wait_for(lambda: _issue(swarm, "Validate the config"), 30, "the proposal")
    assert proposal["state_type"] == "backlog" and "ralph:proposed" in proposal["labels"]
    old = _issue(swarm, "Old idea")
    assert old is not None and old["priority"] == 4  # lowered; never raised
    assert "agent-feedback-given" in old["labels"]
    events = [e.get("event") for e in swarm.events()]
    assert "groom_opened" in events and "groom_proposed" in events
    # the proposal is not dispatched, and no second run opens within min_interval
    assert _issue(swarm, "Validate the config")["state_type"] == "backlog"
    assert [i["title"] for i in swarm.issues()].count("Groom the backlog") == 1
