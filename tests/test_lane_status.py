"""What a person sees of the merge lane (issue 34): `status` says the batch being
verified and since when, a bisection's step, what waits, what went back and why."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import retry_until

from ralph_dev.adapters import verify_runs
from ralph_dev.adapters.files import private_dir
from ralph_dev.control.loop.merging import read_lane, stop_lane
from ralph_dev.control.state.text import lane_lines


def test_status_says_the_batch_being_verified_what_waits_and_what_went_back() -> None:
    lane = {
        "mode": "verified", "max_batch": 8, "state": "running",
        "batch": ["DEMO-1", "DEMO-2"], "since": "2026-11-23T12:00:00+00:00",
        "run": {"id": "r", "kind": "merge", "state": "running", "batch": ["DEMO-1", "DEMO-2"],
                "of": ["DEMO-1", "DEMO-2", "DEMO-3", "DEMO-4"],
                "step": "bisecting: the first 2 of 4 (the first 0 pass together, the first 4 "
                        "fail)", "since": "2026-11-23T12:00:00+00:00", "running_s": 42.0,
                "finished_at": None, "exit_code": None, "why": None, "after": None},
        "waiting": ["DEMO-5"],
        "sent_back": [{"issue": "DEMO-9", "time": "2026-11-23T11:00:00+00:00",
                       "exit_code": 1, "why": "DEMO-9: its change fails the verify command"}],
    }
    text = "\n".join(lane_lines(lane))
    assert "verifying DEMO-1, DEMO-2 for 42s" in text
    assert "bisecting: the first 2 of 4" in text and "waiting: DEMO-5" in text
    assert "sent back DEMO-9" in text and "fails the verify command" in text
    idle = {**lane, "run": None, "state": "idle", "batch": [], "waiting": [], "sent_back": []}
    assert lane_lines(idle) == ["  merges:     verified, idle"]


def test_a_run_with_a_verify_beside_it_runs_until_both_end_and_stops_whole(
        tmp_path: Path) -> None:
    """``merge.parallel_verifies``: the lane's run is running while any of its verifies
    runs (its own may have ended first), each one's outcome is read, and stopping the
    lane (``stop --workers``) stops every one: the next controller finds the run lost
    and runs it again."""
    lane_dir = tmp_path / "lane"
    private_dir(lane_dir)
    (lane_dir / "run.json").write_text(json.dumps({
        "id": "r1", "kind": "merge", "batch": ["DEMO-1", "DEMO-2", "DEMO-3", "DEMO-4"],
        "size": 4, "base": "b", "also": [{"size": 2, "run": "r1-p2", "checkout_commit": "c2"},
                                         {"size": 1, "run": "../escape"}]}))
    gate = tmp_path / "gate"

    def verify(run: str, script: str) -> None:
        verify_runs.start(lane_dir / "runs" / run, ["/bin/sh", "-c", script], cwd=tmp_path,
                          env={"PATH": os.environ["PATH"]})

    verify("r1", "exit 3")
    verify("r1-p2", f"while [ ! -e {gate} ]; do sleep 0.05; done")
    retry_until(lambda: (lane_dir / "runs" / "r1" / verify_runs.EXIT).exists(), timeout=20,
                what="the batch's own verify ended")
    run = read_lane(lane_dir)
    assert run is not None and run.state == "running"  # its half's still runs
    assert [(p.size, p.run) for p in run.probes] == [(4, "r1"), (2, "r1-p2")]  # no escape
    gate.touch()
    retry_until(lambda: read_lane(lane_dir).state == "failed",  # type: ignore[union-attr]
                timeout=20, what="both verifies ended")
    done = read_lane(lane_dir)
    assert done is not None
    assert [(p.state, p.exit_code, p.checkout_commit) for p in done.probes] == [
        ("failed", 3, None), ("passed", 0, "c2")]

    gate.unlink()
    for run in ("r1", "r1-p2"):  # a runner lets go of its run's lock just after its outcome
        retry_until(lambda run=run: not verify_runs._locked(lane_dir / "runs" / run),
                    timeout=20, what=f"{run}'s runner gone")
        (lane_dir / "runs" / run / verify_runs.EXIT).unlink()
        verify(run, f"while [ ! -e {gate} ]; do sleep 0.05; done")
    assert stop_lane(lane_dir)
    stopped = retry_until(lambda: (r := read_lane(lane_dir)) is not None
                          and r.state == "lost" and r, timeout=20,
                          what="the stopped runners gone")
    assert {p.state for p in stopped.probes} == {"lost"}
    gate.touch()  # a command its stopped runner left behind ends too (see the stop note)
