"""Pattern learning: vocabulary, phase verdict, lifecycle and decay, ledger storage (issue 15)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ralph_dev.adapters.pattern_store import (
    Ledger,
    PendingPhase,
    ledger_path,
    load_ledger,
    remember_plan,
    save_ledger,
    settle_phases,
)
from ralph_dev.adapters.store import StateStore
from ralph_dev.cli import main
from ralph_dev.core.config import load_project
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.model import Issue, Observed, StateType
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


# --- the `patterns` command ---------------------------------------------------------------


def test_patterns_command_shows_and_resets(xdg: Path) -> None:
    config = xdg / "config" / "ralph-dev" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[projects.demo]\nrepo = "{xdg / "repo"}"\ntrunk = "main"\n'
                      '[projects.demo.patterns.strategies]\nsplit-by-layer = "by\\\\s+layer"\n')
    settings = load_project("demo", path=config)
    now = datetime.now(UTC)
    save_ledger(ledger_path(settings), Ledger(
        phases={"DEMO-9": PendingPhase(("split-by-component", "shared-types-first"), ("DEMO-10",),
                                       now)},
        observations={
            "shared-types-first": [Observation(now, Verdict.HELPFUL, f"DEMO-{n}")
                                   for n in range(6)],
            "maximize-parallelization": [Observation(now, Verdict.HARMFUL, "DEMO-7")],
            "split-by-component": [Observation(now, Verdict.HELPFUL, "DEMO-8")]}))

    def cli(*args: str) -> Result:
        return CliRunner().invoke(main, ["--config", str(config), "patterns", "demo", *args])

    shown = json.loads(cli("--json").output)
    assert shown["patterns"] == [
        {"name": "shared-types-first", "state": "proven", "helpful_pct": 100, "observations": 6.0,
         "helpful": 6.0, "harmful": 0.0, "weight": 1.5},
        {"name": "split-by-component", "state": "candidate", "helpful_pct": 100,
         "observations": 1.0, "helpful": 1.0, "harmful": 0.0, "weight": 0.5},
        {"name": "maximize-parallelization", "state": "deprecated", "helpful_pct": 0,
         "observations": 1.0, "helpful": 0.0, "harmful": 1.0, "weight": 0.0}]
    assert "split-by-layer" in shown["unobserved"]  # the project's own strategy counts too
    assert shown["pending_phases"] == ["DEMO-9"]
    table = cli().output
    assert re.search(r"shared-types-first\s+proven\s+100 %\s+6\.0\s+1\.5", table), table

    before = ledger_path(settings).read_text()
    unknown = cli("--reset", "split-by-layer")
    assert unknown.exit_code != 0 and "nothing learned about 'split-by-layer'" in unknown.output
    bad = cli("--reset", "Not A Name")
    assert bad.exit_code != 0 and "is not a strategy name" in bad.output
    assert ledger_path(settings).read_text() == before  # refused: nothing written

    reset = cli("--reset", "shared-types-first")
    assert reset.exit_code == 0 and "Forgot shared-types-first" in reset.output
    after = load_ledger(ledger_path(settings))
    assert "shared-types-first" not in after.observations
    assert after.phases["DEMO-9"].strategies == ("split-by-component",)  # nor counted later
    assert [r["name"] for r in json.loads(cli("--json").output)["patterns"]] == [
        "split-by-component", "maximize-parallelization"]


def test_a_hold_written_just_before_the_events_log_rotated_still_counts(
        xdg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The phase's events are read from where the plan was applied; the log rotating in
    between (64 MiB) must not hide a sub-issue's hold and turn a harmful phase helpful."""
    monkeypatch.setattr("ralph_dev.adapters.store.EVENTS_CAP", 2000)
    config = xdg / "config" / "ralph-dev" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[projects.demo]\nrepo = "{xdg / "repo"}"\ntrunk = "main"\n')
    settings = load_project("demo", path=config)
    store = StateStore(settings.paths)
    for n in range(7):
        store.append_event("spawn", issue=f"DEMO-{n}", reason="before the plan " + "x" * 150)
    found = remember_plan(settings, store, "DEMO-1", "Put shared types first.",
                          ["DEMO-2", "DEMO-3"], NOW)
    assert found == ("shared-types-first",)
    store.append_event("hold", issue="DEMO-2", reason="DEMO-2 asked a person")
    for _ in range(4):
        store.append_event("spawn", issue="DEMO-3", reason="after the hold " + "x" * 150)
    rotated = store.paths.events_file.with_name("events.jsonl.1").read_text()
    assert '"event": "hold"' in rotated  # the hold is in the old log, after the offset
    done = [Issue(f"DEMO-{n}", "t", "Done", StateType.COMPLETED) for n in (2, 3)]
    verdicts = settle_phases(settings, store, Observed(issues=tuple(done)), NOW)
    assert verdicts == {"DEMO-1": Verdict.HARMFUL}
