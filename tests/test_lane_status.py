"""What a person sees of the merge lane (issue 34): `status` says the batch being
verified and since when, a bisection's step, what waits, what went back and why."""

from __future__ import annotations

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
