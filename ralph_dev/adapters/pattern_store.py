"""Where pattern learning keeps its counts, and the two moments that feed them.

One JSON file per project, ``$XDG_DATA_HOME/ralph-dev/PROJECT/patterns.json``,
readable by a person and written atomically under a lock (the controller
writes it, and so does a person's ``ralph-dev patterns --reset``). It holds
the phases waiting to settle and every strategy's observations. A missing
file is an empty ledger; a corrupt one is set aside as
``patterns.json.corrupt`` with a warning and the ledger starts empty:
learning is advice, never a reason to stop the swarm.

- ``remember_plan`` runs when the controller has created a plan worker's
  sub-issues (the relay of its ``worker plan`` report): the strategies its plan
  text names are kept with the phase and its sub-issues, once per phase.
- ``settle_phases`` runs on the controller each tick: a remembered phase whose
  sub-issues have all finished and merged gets its verdict
  (``patterns.phase_verdict``), and each of its strategies one observation.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.adapters.store import StateStore, from_iso, to_iso
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import Observed, Role
from ralph_dev.core.patterns import (
    STRATEGY_NAME_RE,
    Observation,
    Standing,
    SubIssueOutcome,
    Verdict,
    phase_verdict,
    prompt_sections,
    standings,
    strategies_in,
    vocabulary,
)

log = structlog.get_logger(__name__)

FORMAT_VERSION = 1


@dataclass(frozen=True)
class PendingPhase:
    """A planned phase whose outcome is not known yet."""

    strategies: tuple[str, ...]
    children: tuple[str, ...]
    recorded_at: datetime
    events_offset: int = 0
    """Where the events log ended when the plan was made: settling reads only what follows."""


@dataclass
class Ledger:
    phases: dict[str, PendingPhase] = field(default_factory=dict)
    observations: dict[str, list[Observation]] = field(default_factory=dict)

    def standings(self, now: datetime) -> tuple[Standing, ...]:
        return standings(self.observations, now)


def ledger_path(settings: ProjectSettings) -> Path:
    return settings.paths.data_dir / "patterns.json"


# --- reading and writing ------------------------------------------------------------


def _ledger_from_json(raw: Any) -> Ledger:
    """Raises ``ValueError``/``KeyError``/``TypeError`` on anything malformed."""
    if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION:
        raise ValueError(f"not a version-{FORMAT_VERSION} patterns file")
    ledger = Ledger()
    for phase, data in raw["phases"].items():
        at = from_iso(data["recorded_at"])
        if at is None:
            raise ValueError(f"phase {phase}: no recorded_at")
        ledger.phases[str(phase)] = PendingPhase(
            tuple(map(str, data["strategies"])), tuple(map(str, data["children"])), at,
            int(data.get("events_offset", 0)))
    for name, rows in raw["patterns"].items():
        if not STRATEGY_NAME_RE.fullmatch(str(name)):
            raise ValueError(f"{str(name)[:60]!r} is not a strategy name")  # it reaches prompts
        observations = []
        for row in rows["observations"]:
            at = from_iso(row["at"])
            if at is None:
                raise ValueError(f"{name}: an observation has no time")
            observations.append(Observation(at, Verdict(row["verdict"]), str(row.get("phase", ""))))
        ledger.observations[str(name)] = observations
    return ledger


def _ledger_to_json(ledger: Ledger) -> dict[str, Any]:
    return {
        "version": FORMAT_VERSION,
        "phases": {phase: {"strategies": list(p.strategies), "children": list(p.children),
                           "recorded_at": to_iso(p.recorded_at),
                           "events_offset": p.events_offset}
                   for phase, p in sorted(ledger.phases.items())},
        "patterns": {name: {"observations": [{"at": to_iso(o.at), "verdict": o.verdict.value,
                                              "phase": o.phase} for o in rows]}
                     for name, rows in sorted(ledger.observations.items())},
    }


def load_ledger(path: Path) -> Ledger:
    """The ledger at ``path``; empty when missing, empty with a warning when corrupt."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Ledger()
    except OSError as exc:
        log.warning("patterns_unreadable", path=str(path), error=str(exc))
        return Ledger()
    try:
        return _ledger_from_json(json.loads(text))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("patterns_corrupt", path=str(path), error=str(exc)[:200],
                    fix="starting empty; the old file is kept as patterns.json.corrupt")
        with contextlib.suppress(OSError):
            path.replace(path.with_name(path.name + ".corrupt"))
        return Ledger()


def save_ledger(path: Path, ledger: Ledger) -> None:
    atomic_write_text(path, json.dumps(_ledger_to_json(ledger), indent=1) + "\n")


@contextlib.contextmanager
def editing(path: Path) -> Iterator[Ledger]:
    """Load, let the caller change, save — with every other writer kept out meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_name("." + path.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ledger = load_ledger(path)
        yield ledger
        save_ledger(path, ledger)


# --- the two moments ----------------------------------------------------------------


def remember_plan(settings: ProjectSettings, store: StateStore, phase: str, plan_text: str,
                  children: Sequence[str], now: datetime) -> tuple[str, ...]:
    """Keep the strategies a plan names with its phase, until the phase settles.

    Once per phase: a phase already remembered, or already observed, is left as it
    is (the relay repeats a plan's writes after a crash; the phase is still one
    observation). A plan naming no known strategy is not kept: there would be
    nothing to learn from it. Returns the strategies found.
    """
    found = strategies_in(plan_text, vocabulary(settings.patterns.strategies))
    if not found or not children:
        return found
    with editing(ledger_path(settings)) as ledger:
        if phase in ledger.phases or any(o.phase == phase for rows in
                                         ledger.observations.values() for o in rows):
            return found
        ledger.phases[phase] = PendingPhase(found, tuple(children), now, store.events_size())
    store.append_event("patterns_remembered", issue=phase, strategies=list(found))
    return found


def _child_facts(store: StateStore, offset: int) -> dict[str, dict[str, bool]]:
    """Per issue, from the events since ``offset``: held, exhausted, resolve worker."""
    facts: dict[str, dict[str, bool]] = {}
    while True:
        events, next_offset = store.read_events_from(offset)
        for event in events:
            issue = event.get("issue")
            if not isinstance(issue, str):
                continue
            kind = event.get("event")
            seen = facts.setdefault(issue, {})
            reason = str(event.get("reason", ""))
            if kind in ("hold", "worker_blocked"):  # both label it user-input-needed
                seen["held"] = True
            if kind in ("hold", "kill") and "attempt cap" in reason:
                seen["exhausted"] = True
            if kind in ("spawn", "restart") and event.get("role") == Role.RESOLVE.value:
                seen["resolved_conflict"] = True
        if next_offset == offset:  # read to the end (after a rotation it went back to 0)
            return facts
        offset = next_offset


def outcomes(pending: PendingPhase, observed: Observed, facts: Mapping[str, Mapping[str, bool]],
             hold_label: str) -> list[SubIssueOutcome] | None:
    """What became of each sub-issue, or ``None`` when one is not in the tracker's answer.

    Held: a hold or a worker's question in the events, or the hold label still on it.
    """
    issues = {i.identifier: i for i in observed.issues}
    unmerged = {w.name for w in observed.workspaces if w.has_unmerged_change}
    rows = []
    for child in pending.children:
        issue = issues.get(child)
        if issue is None:
            return None
        seen = facts.get(child, {})
        labelled = hold_label.casefold() in {label.casefold() for label in issue.labels}
        rows.append(SubIssueOutcome(
            state=issue.state_type, unmerged=child in unmerged,
            held=seen.get("held", False) or labelled, exhausted=seen.get("exhausted", False),
            resolved_conflict=seen.get("resolved_conflict", False)))
    return rows


def _looks_settled(pending: PendingPhase, observed: Observed) -> bool:
    """Every sub-issue is in the answer, finished, its change merged: worth reading events."""
    finished = {i.identifier for i in observed.issues if i.state_type.finished}
    unmerged = {w.name for w in observed.workspaces if w.has_unmerged_change}
    return set(pending.children) <= finished and not set(pending.children) & unmerged


def settle_phases(settings: ProjectSettings, store: StateStore, observed: Observed,
                  now: datetime) -> dict[str, Verdict]:
    """Give every remembered phase that has settled its observations; the verdicts given.

    Cheap when nothing is due: no tracker call (``observed`` is this tick's
    answer), the small ledger read, and the events log read only for a phase
    whose sub-issues have all finished and merged.
    """
    path = ledger_path(settings)
    if not observed.tracker_ok or not path.exists():
        return {}
    if not any(_looks_settled(p, observed) for p in load_ledger(path).phases.values()):
        return {}
    settled: dict[str, Verdict] = {}
    with editing(path) as ledger:
        for phase, pending in sorted(ledger.phases.items()):
            if not _looks_settled(pending, observed):
                continue
            rows = outcomes(pending, observed, _child_facts(store, pending.events_offset),
                            settings.labels.user_input_needed)
            verdict = phase_verdict(rows) if rows is not None else None
            if verdict is None:
                continue
            del ledger.phases[phase]
            for name in pending.strategies:
                ledger.observations.setdefault(name, []).append(Observation(now, verdict, phase))
            settled[phase] = verdict
            store.append_event("patterns_observed", issue=phase, verdict=verdict.value,
                               strategies=list(pending.strategies))
    return settled


def known_patterns(ledger: Ledger) -> set[str]:
    """Strategies the ledger holds anything of: observations, or a phase still to settle."""
    return {*ledger.observations, *(n for p in ledger.phases.values() for n in p.strategies)}


def reset_pattern(settings: ProjectSettings, name: str) -> bool:
    """Forget ``name`` (``ralph-dev patterns --reset``): its observations, and its place in
    phases still to settle (so nothing planned before the reset counts after it). True if
    the ledger knew it; an unknown name writes nothing."""
    path = ledger_path(settings)
    if name not in known_patterns(load_ledger(path)):
        return False
    with editing(path) as ledger:
        ledger.observations.pop(name, None)
        for phase, pending in list(ledger.phases.items()):
            rest = tuple(n for n in pending.strategies if n != name)
            if rest:
                ledger.phases[phase] = replace(pending, strategies=rest)
            else:
                del ledger.phases[phase]
    return True


def plan_advice(settings: ProjectSettings, now: datetime) -> str:
    """The "Proven patterns" and "Avoid" sections of the next plan worker's prompt ("" while
    nothing has been learned); read-only, and a broken ledger only costs the advice."""
    return prompt_sections(load_ledger(ledger_path(settings)).standings(now))



def remember_safely(settings: ProjectSettings, store: StateStore, phase: str, text: str,
                    children: Sequence[str], now: datetime) -> None:
    """``remember_plan``, never failing the plan's write-back: learning is advice, so a
    ledger that cannot be written (disk full, a bad permission) is said in the events and
    the write-back goes on as if learning did not exist."""
    try:
        remember_plan(settings, store, phase, text, list(children), now)
    except (RalphError, OSError, ValueError) as exc:
        log.warning("patterns_remember_failed", issue=phase, error=str(exc))
        store.append_event("patterns_failed", issue=phase, step="remember", error=str(exc))


def settle_safely(settings: ProjectSettings, store: StateStore, observed: Observed,
                  now: datetime) -> None:
    """``settle_phases`` for this tick's view, never failing the tick (logged only: it is
    tried again next tick, and an event every tick would drown the others)."""
    try:
        settle_phases(settings, store, observed, now)
    except (RalphError, OSError, ValueError) as exc:
        log.warning("patterns_settle_failed", error=str(exc))
