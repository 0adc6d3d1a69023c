"""Issue 10 item 2: identity by Linear's stable id. Moving a running issue to another team
(Linear renumbers it) keeps its one worker, workspace and record: a real swarm (tmux, jj,
the controller, sandboxed demo agents) against the fake Linear."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from swarm_kit import Swarm, attach_fake_linear, wait_for

from ralph_dev.core.config import Labels
from ralph_dev.core.model import Issue, StateType
from ralph_dev.core.renumber import keep_local_names

pytestmark = pytest.mark.slow


@pytest.fixture
def linear_swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[tuple[Swarm, Any]]:
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2, agent_seconds=6)
    fake, team, project = attach_fake_linear(swarm, tmp_path)
    config = swarm.config_file
    config.write_text(config.read_text().replace(  # Linear read every half second
        'kind = "linear"\n', 'kind = "linear"\nlinear_poll_interval = 0.5\n'))
    ops = fake.add_team("OPS")
    fake.projects[project]["team_ids"].append(ops)
    for name in Labels().steering():
        fake.add_label(name, ops)
    try:
        yield swarm, (fake, team, project)
    finally:
        swarm.teardown()
        fake.stop()


def test_a_running_issue_moved_to_another_team_keeps_its_one_worker(
        linear_swarm: tuple[Swarm, Any]) -> None:
    swarm, (fake, team, project) = linear_swarm
    locks = swarm.lock_agents()
    first = fake.add_issue(team, "Move me while I work", project_id=project)
    swarm.start()
    wait_for(lambda: first in swarm.worker_windows(), 40, f"{first}'s worker")
    moved = fake.move_issue(first, "OPS")  # a person moves it in Linear's UI
    assert moved != first
    wait_for(lambda: fake.state_of(moved) == "Done", 90, f"{moved} Done in Linear")
    wait_for(lambda: not swarm.worker_windows() and not swarm.workspaces(), 60,
             "its window and workspace gone")
    spawns = [e["issue"] for e in swarm.events() if e["event"] in ("spawn", "restart")]
    assert spawns == [first], spawns  # never a second agent under the new name
    assert not list(locks.glob("*.TWICE"))
    assert any(body.startswith(f"[ralph-dev] {first} done") for body in fake.comments_on(moved))


def issue(ident: str, **kw: Any) -> Issue:
    return Issue(identifier=ident, title=ident, state_name="In Progress",
                 state_type=StateType.STARTED, **kw)


def test_local_names_win_only_while_local_things_carry_them() -> None:
    issues = (issue("OPS-1", parent="DEMO-9"), issue("DEMO-2", blocked_by=("OPS-1",)),
              issue("DEMO-9", children=("OPS-1",)))
    renamed = {"DEMO-1": "OPS-1"}
    kept = keep_local_names(issues, renamed, {"DEMO-1"})
    assert [i.identifier for i in kept] == ["DEMO-1", "DEMO-2", "DEMO-9"]
    assert kept[1].blocked_by == ("DEMO-1",) and kept[2].children == ("DEMO-1",)
    assert kept[0].parent == "DEMO-9"
    assert keep_local_names(issues, renamed, set()) == issues  # its worker is gone
    # a new worker already runs under the new name: that one is the issue's worker
    assert keep_local_names(issues, renamed, {"DEMO-1", "OPS-1"}) == issues
