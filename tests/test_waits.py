"""Every wait has a reason, on every surface (issue 23): the real daemon, controller, tmux,
jj and local tracker with the scripted demo agent. An issue waiting for a retry, for a
free slot, or held after its worker gave up shows why in ``status --json`` (the same
document ``/api/v1/state`` serves) and in ``status``; a hold's comment names the last
real cause — here the file ``worker done`` refused, not just "the pane died"."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest
from swarm_kit import Swarm, wait_for

pytestmark = pytest.mark.slow


def _item(swarm: Swarm, column: str, ident: str) -> dict | None:
    board = swarm.status()["board"]
    return next((i for i in board[column] if i["identifier"] == ident), None)


def test_a_retry_and_a_free_slot_are_waits_with_their_reasons(
        tmp_path: Path, jj_bin: str, tmux_socket: str) -> None:
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1,
                         timing={"retry_base": 600, "retry_cap": 600, "max_attempts": 3})
    try:
        swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')
        swarm.script = {"DEMO-1": "fail", "DEMO-2": "hang"}
        swarm.write_script()
        swarm.start()
        wait_for(lambda: _item(swarm, "waiting", "DEMO-1") is not None
                 and _item(swarm, "waiting", "DEMO-1")["wait"] is not None, 60,
                 "DEMO-1 waiting for its retry")
        retry = _item(swarm, "waiting", "DEMO-1")["wait"]
        assert retry["kind"] == "retry" and (retry["attempt"], retry["of"]) == (2, 3)
        assert "pane died (exit 1)" in retry["last_error"]
        assert datetime.fromisoformat(retry["until"]) > datetime.fromisoformat(
            swarm.status()["generated_at"])  # due in the future: a backoff, said when
        # DEMO-1 backs off, so DEMO-2 got the one slot; a third issue waits for it
        swarm.import_plan('[[task]]\ntitle = "C"\n')
        wait_for(lambda: (_item(swarm, "ready", "DEMO-3") or {}).get("wait"), 30,
                 "DEMO-3 ready, waiting for a slot")
        slot = _item(swarm, "ready", "DEMO-3")["wait"]
        assert slot["kind"] == "slot" and "1/1 workers busy" in slot["why"]
        shown = swarm.cli("status", swarm.project).stdout
        assert "DEMO-1" in shown and "attempt 2/3" in shown and "workers busy" in shown
        assert re.search(r", until [^(]+ \(in (9|10)m\)", shown), shown  # and how long
    finally:
        swarm.teardown()


def test_a_hold_names_the_file_worker_done_refused(
        tmp_path: Path, jj_bin: str, tmux_socket: str) -> None:
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1,
                         timing={"max_attempts": 1})
    try:
        (ident,) = swarm.import_plan('[[task]]\ntitle = "Add the data"\n')
        swarm.script = {"*": "big-file"}
        swarm.write_script()
        swarm.start()
        wait_for(lambda: "user-input-needed" in swarm.issue(ident)["labels"], 60,
                 f"{ident} held")
        comment = swarm.issue(ident)["comments"][-1]["body"]
        assert "big.bin" in comment, comment  # the refusal, not only "the pane died"
        need = next(n for n in swarm.status()["needs_you"] if n.get("issue") == ident)
        assert "big.bin" in need["message"]
    finally:
        swarm.teardown()
