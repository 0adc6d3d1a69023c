"""Pattern learning: vocabulary, phase verdict, lifecycle and decay, ledger storage (issue 15)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ralph_dev.core.errors import ConfigError
from ralph_dev.core.model import StateType
from ralph_dev.core.pattern_store import Ledger, PendingPhase, load_ledger, save_ledger
from ralph_dev.core.patterns import (
    Lifecycle,
    Observation,
    SubIssueOutcome,
    Verdict,
    decay,
    lifecycle,
    phase_verdict,
    prompt_sections,
    standing,
    strategies_in,
    vocabulary,
)

NOW = datetime(2026, 11, 23, tzinfo=UTC)
DONE = SubIssueOutcome(StateType.COMPLETED)


@pytest.mark.parametrize(("text", "found"), [
    ("We split by file type, then splitting by component.",
     ("split-by-component", "split-by-file-type")),
    ("One file per subtask; shared types first.", ("one-file-per-task", "shared-types-first")),
    ("Tests in separate task. PARALLELIZE EVERYTHING", ("maximize-parallelization",
                                                       "tests-in-separate-task")),
    ("nothing to see", ()),
])
def test_shipped_vocabulary_finds_strategies(text: str, found: tuple[str, ...]) -> None:
    assert strategies_in(text, vocabulary({})) == found


def test_config_extends_the_vocabulary_and_refuses_bad_regex() -> None:
    vocab = vocabulary({"layer-by-layer": r"layer\s+by\s+layer"})
    assert strategies_in("Go LAYER by layer", vocab) == ("layer-by-layer",)
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        vocabulary({"broken": "(unclosed"})
    with pytest.raises(ConfigError, match="not a strategy name"):
        vocabulary({"Bad Name": "x"})


@pytest.mark.parametrize(("children", "verdict"), [
    ([], None),
    ([DONE, SubIssueOutcome(StateType.STARTED)], None),
    ([DONE, SubIssueOutcome(StateType.COMPLETED, unmerged=True)], None),
    ([DONE, DONE], Verdict.HELPFUL),
    ([DONE, SubIssueOutcome(StateType.COMPLETED, held=True)], Verdict.HARMFUL),
    ([DONE, SubIssueOutcome(StateType.COMPLETED, exhausted=True)], Verdict.HARMFUL),
    ([DONE, SubIssueOutcome(StateType.COMPLETED, resolved_conflict=True)], Verdict.HARMFUL),
    ([DONE, SubIssueOutcome(StateType.CANCELED)], Verdict.HARMFUL),
    ([DONE, SubIssueOutcome(StateType.DUPLICATE)], Verdict.HARMFUL),
])
def test_phase_verdict(children: list[SubIssueOutcome], verdict: Verdict | None) -> None:
    assert phase_verdict(children) == verdict


@pytest.mark.parametrize(("helpful", "harmful", "state"), [
    (0, 0, Lifecycle.CANDIDATE),
    (2, 0, Lifecycle.CANDIDATE),
    (3, 0, Lifecycle.ESTABLISHED),
    (4, 1, Lifecycle.ESTABLISHED),      # 20 % harmful: not proven, not deprecated
    (5, 0, Lifecycle.PROVEN),
    (6, 1, Lifecycle.PROVEN),           # 14.3 % harmful
    (5, 1, Lifecycle.ESTABLISHED),      # 16.7 % harmful
    (7, 3, Lifecycle.ESTABLISHED),      # exactly 30 %: not more than 30 %
    (1, 1, Lifecycle.DEPRECATED),       # deprecated from candidate too
    (6, 3, Lifecycle.DEPRECATED),
])
def test_lifecycle(helpful: float, harmful: float, state: Lifecycle) -> None:
    assert lifecycle(helpful, harmful) is state


@pytest.mark.parametrize(("days", "weight"), [(0, 1.0), (90, 0.5), (180, 0.25), (-5, 1.0)])
def test_decay_half_life_is_90_days(days: float, weight: float) -> None:
    assert decay(days) == pytest.approx(weight)


def test_old_observations_count_less() -> None:
    old = [Observation(NOW - timedelta(days=180), Verdict.HELPFUL)] * 4
    assert standing("x", old, NOW).state is Lifecycle.CANDIDATE      # 4 × ¼ = 1
    fresh = [Observation(NOW, Verdict.HELPFUL)] * 4
    assert standing("x", fresh, NOW).state is Lifecycle.ESTABLISHED


def test_prompt_sections() -> None:
    obs = [Observation(NOW, Verdict.HELPFUL)] * 5 + [Observation(NOW, Verdict.HARMFUL)] * 0
    proven = standing("shared-types-first", [*obs, Observation(NOW, Verdict.HELPFUL)], NOW)
    bad = standing("maximize-parallelization", [Observation(NOW, Verdict.HARMFUL)], NOW)
    text = prompt_sections([proven, bad])
    assert "Proven patterns" in text
    assert "- shared-types-first: PROVEN — 100 % helpful from 6 observations, weight 1.5" in text
    assert "Avoid" in text and "- maximize-parallelization: DEPRECATED — 0 % helpful" in text
    assert prompt_sections([]) == ""


def test_ledger_round_trip_and_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "patterns.json"
    assert load_ledger(path).observations == {}
    ledger = Ledger(phases={"DEMO-1": PendingPhase(("a",), ("DEMO-2",), NOW, 7)},
                    observations={"a": [Observation(NOW, Verdict.HARMFUL, "DEMO-0")]})
    save_ledger(path, ledger)
    again = load_ledger(path)
    assert again.phases == ledger.phases and again.observations == ledger.observations
    path.write_text("{not json")
    assert load_ledger(path).observations == {}
    assert (tmp_path / "patterns.json.corrupt").read_text() == "{not json"
