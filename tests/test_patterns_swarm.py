"""Pattern learning end to end: the real daemon and controller, real tmux, jj and local
tracker, scripted plan workers whose plan files name their strategies (issue 15)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from swarm_kit import Swarm, wait_for

PLAN_A = """# How: split by component, one task per component.
[[task]]
title = "Storage component"
[[task]]
title = "API component"
"""

PLAN_B = """# How: parallelize everything.
[[task]]
title = "Docs"
[[task]]
title = "Examples"
"""

PLAN_C = """[[task]]
title = "Release notes"
"""


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=3)
    yield s
    s.teardown()


def _patterns(swarm: Swarm) -> dict[str, dict[str, Any]]:
    shown = json.loads(swarm.cli("patterns", swarm.project, "--json").stdout)
    return {row["name"]: row for row in shown["patterns"]}


def _prompt(swarm: Swarm, name: str) -> str | None:
    path = swarm.state_dir / "prompts" / name
    return path.read_text() if path.exists() else None


def _labels(swarm: Swarm, ident: str) -> list[str]:
    """The issue's labels (none while it does not exist yet)."""
    return next((i["labels"] for i in swarm.issues() if i["identifier"] == ident), [])


def _events(swarm: Swarm, kind: str) -> list[dict[str, Any]]:
    return [e for e in swarm.events() if e.get("event") == kind]


def test_phases_teach_the_next_plan_worker(swarm: Swarm) -> None:
    plans = {}
    for name, text in (("a", PLAN_A), ("b", PLAN_B), ("c", PLAN_C)):
        plans[name] = swarm.shared / f"plan-{name}.toml"
        plans[name].write_text(text)
    # phase B waits for phase A, so A's sub-issues are DEMO-3/4 and B's DEMO-5/6
    swarm.cli("issue", "add", swarm.project, "Phase A", "--label", "ralph:plan")
    swarm.cli("issue", "add", swarm.project, "Phase B", "--label", "ralph:plan",
              "--blocked-by", "DEMO-1")
    swarm.script = {"DEMO-1": f"plan:{plans['a']}", "DEMO-2": f"plan:{plans['b']}",
                    "DEMO-6": "block-once", "DEMO-7": f"plan:{plans['c']}", "*": "work:0.3"}
    swarm.write_script()
    swarm.start()

    first_prompt = wait_for(lambda: _prompt(swarm, "DEMO-1.plan.1.md"), 40, "A's plan prompt")
    assert "Proven patterns" not in first_prompt  # nothing learned yet
    # phase B's second task asks a person; a person answers; it finishes and merges
    wait_for(lambda: "user-input-needed" in _labels(swarm, "DEMO-6"), 90,
             "DEMO-6 to ask a person")
    swarm.cli("issue", "comment", "DEMO-6", "Use SQLite.")
    swarm.cli("issue", "label", "DEMO-6", "+user-feedback-given")

    learned = wait_for(lambda: (rows := _patterns(swarm)).keys() >= {
        "split-by-component", "maximize-parallelization"} and rows, 90, "both phases settled")
    assert learned["split-by-component"] == {
        "name": "split-by-component", "state": "candidate", "helpful_pct": 100,
        "observations": 1.0, "helpful": 1.0, "harmful": 0.0, "weight": 0.5}
    assert learned["maximize-parallelization"]["state"] == "deprecated"  # held: harmful
    assert learned["maximize-parallelization"]["weight"] == 0
    assert len(learned) == 2
    assert {e["issue"]: e["verdict"] for e in _events(swarm, "patterns_observed")} == {
        "DEMO-1": "helpful", "DEMO-2": "harmful"}
    assert sorted(e["issue"] for e in _events(swarm, "patterns_remembered")) == [
        "DEMO-1", "DEMO-2"]
    assert {i["identifier"]: i["parent"] for i in swarm.issues() if i["parent"]} == {
        "DEMO-3": "DEMO-1", "DEMO-4": "DEMO-1", "DEMO-5": "DEMO-2", "DEMO-6": "DEMO-2"}

    # the next plan worker is told; an execute worker is not
    swarm.cli("issue", "add", swarm.project, "Phase C", "--label", "ralph:plan")
    prompt = wait_for(lambda: _prompt(swarm, "DEMO-7.plan.1.md"), 40, "C's plan prompt")
    assert ("- split-by-component: CANDIDATE — 100 % helpful from 1 observation, weight 0.5"
            in prompt.split("Avoid")[0].split("Proven patterns")[1])
    assert ("- maximize-parallelization: DEPRECATED — 0 % helpful from 1 observation"
            in prompt.split("Avoid")[1])
    assert prompt.index("Avoid") < prompt.index("BEGIN ISSUE DATA")  # ralph-dev's words
    execute = wait_for(lambda: _prompt(swarm, "DEMO-8.execute.1.md"), 40, "C's task's prompt")
    assert "Proven patterns" not in execute and "Avoid" not in execute
