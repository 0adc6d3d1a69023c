"""Admission by resources (issue 13 item 7): a new worker starts only while the host
has memory, disk and CPU to spare; the wait is a swarm-wide pause that says why."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from swarm_kit import Swarm
from test_failure_policy import in_process, tick

from ralph_dev.adapters.host import sample
from ralph_dev.core.config import Limits
from ralph_dev.core.decide.swarm import shortage
from ralph_dev.core.model import Resources

LIMITS = Limits(min_free_memory_mb=1000, min_free_disk_mb=500, max_load_per_cpu=2.0)


@pytest.mark.parametrize(("have", "margin", "short"), [
    (Resources(4000, 9000, 0.5), 1.0, []),
    (Resources(900, 9000, 0.5), 1.0, ["memory"]),
    (Resources(4000, 400, 2.5), 1.0, ["free for workspaces", "load 2.5"]),
    (Resources(1050, 9000, 0.5), 1.0, []),  # above the floor: starts
    (Resources(1050, 9000, 0.5), 1.1, ["memory"]),  # while paused: needs the margin
    (Resources(None, None, None), 1.0, []),  # unreadable is never a reason to wait
    (Resources(4000, 9000, 50.0), 1.0, []),  # max_load_per_cpu = 0 below: no limit
])
def test_shortage_names_each_figure_below_its_floor(have: Resources, margin: float,
                                                    short: list[str]) -> None:
    limits = LIMITS if have.load_per_cpu != 50.0 else dataclasses.replace(
        LIMITS, max_load_per_cpu=0)
    why = shortage(have, limits, margin)
    if not short:
        assert why is None
        return
    assert why is not None
    for word in short:
        assert word in why
    assert "limits." in why  # which setting, so a person knows what to change


def test_the_host_is_sampled(tmp_path: Path) -> None:
    have = sample(tmp_path / "not" / "made" / "yet")  # the root's filesystem then
    assert have.free_memory_mb and have.free_memory_mb > 0
    assert have.free_disk_mb and have.free_disk_mb > 0
    assert have.load_per_cpu is not None and have.load_per_cpu >= 0


@pytest.mark.slow
def test_a_short_host_pauses_dispatch_and_resumes(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2)
    try:
        swarm.import_plan('[[task]]\ntitle = "A"\n')
        ctl = in_process(swarm, monkeypatch)
        roomy = ctl.settings
        ctl.settings = dataclasses.replace(roomy, limits=dataclasses.replace(
            roomy.limits, min_free_memory_mb=10**9))  # more than any host has
        assert [a.kind for a in tick(ctl).plan.actions] == ["pauseswarm"]
        assert not tick(ctl).plan.actions  # said once
        paused = [e for e in swarm.events() if e["event"] == "swarm_paused"]
        assert len(paused) == 1 and "min_free_memory_mb" in paused[0]["cause"]
        assert "resources" in swarm.cli("status", swarm.project).stdout
        ctl.settings = roomy
        assert [a.kind for a in tick(ctl).plan.actions] == ["endpause", "spawn"]
        assert any(e["event"] == "swarm_resumed" for e in swarm.events())
    finally:
        swarm.teardown()
