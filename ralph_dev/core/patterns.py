"""Pattern learning: which ways of splitting work have gone well, as plain counters.

A plan worker's plan text is matched against a fixed vocabulary of
decomposition strategies (``strategies.toml``, extended per project in
config). When the phase it planned settles, each strategy it named gets one
observation, helpful or harmful (``phase_verdict``). Observations lose weight
with a 90-day half-life; the weighted counts put each strategy in a lifecycle
state, and the states feed the next plan workers' prompts ("Proven patterns",
"Avoid"). No embeddings and no model calls: a person can read every number.

Everything here is pure (the clock is an argument); storage and the hooks
into workers and the controller are ``adapters.pattern_store``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from importlib import resources
from typing import Any

from ralph_dev.core.errors import ConfigError
from ralph_dev.core.model import StateType

HALF_LIFE_DAYS = 90.0
"""An observation's weight halves every 90 days: old lessons fade, they do not vanish."""

ESTABLISHED_AFTER = 3.0
PROVEN_HELPFUL = 5.0
PROVEN_MAX_HARMFUL_SHARE = 0.15
DEPRECATED_HARMFUL_SHARE = 0.30

STRATEGY_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,47}")
"""What a strategy may be called: it is a JSON key, a CLI argument and a prompt word."""


# --- the vocabulary --------------------------------------------------------------


@dataclass(frozen=True)
class Strategy:
    name: str
    pattern: re.Pattern[str]


def compile_strategy(name: str, regex: str, where: str) -> Strategy:
    """One vocabulary entry, or a ``ConfigError`` naming ``where`` and the fix."""
    if not STRATEGY_NAME_RE.fullmatch(name):
        raise ConfigError(f"{where}: {name!r} is not a strategy name (use 1-48 lowercase "
                          "letters, digits and '-', e.g. 'split-by-layer')")
    if not isinstance(regex, str) or not regex.strip():
        raise ConfigError(f"{where}.{name}: expected a non-empty regular expression")
    try:
        return Strategy(name, re.compile(regex, re.IGNORECASE))
    except re.error as exc:
        raise ConfigError(f"{where}.{name}: {regex!r} is not a valid regular expression "
                          f"({exc})") from None


def default_vocabulary() -> dict[str, str]:
    """The strategies shipped with ralph-dev (``ralph_dev/core/strategies.toml``)."""
    text = resources.files("ralph_dev.core").joinpath("strategies.toml").read_text()
    table = tomllib.loads(text)["strategies"]
    return {str(name): str(regex) for name, regex in table.items()}


def vocabulary(extra: Mapping[str, str]) -> tuple[Strategy, ...]:
    """The shipped strategies with the project's own added (same name: the project's wins)."""
    merged = {**default_vocabulary(), **extra}
    return tuple(compile_strategy(name, regex, "patterns.strategies")
                 for name, regex in sorted(merged.items()))


def strategies_in(text: str, vocab: Iterable[Strategy]) -> tuple[str, ...]:
    """The names of the strategies ``text`` mentions, in vocabulary order."""
    return tuple(s.name for s in vocab if s.pattern.search(text))


PLAN_TEXT_CHARS = 16_000
"""How much of a plan file is kept to be matched (its start: where a plan says how it splits)."""


def plan_text(file_text: str, entries: Iterable[Mapping[str, Any]]) -> str:
    """What a plan's strategies are read from: the start of its file (comments and all)
    and every task's title and description (what the controller itself creates)."""
    parts = [file_text[:PLAN_TEXT_CHARS]]
    for entry in entries:
        parts += [str(entry.get("title", "")), str(entry.get("description") or "")]
    return "\n".join(parts)


# --- one observation per settled phase --------------------------------------------


class Verdict(StrEnum):
    HELPFUL = "helpful"
    HARMFUL = "harmful"


@dataclass(frozen=True)
class SubIssueOutcome:
    """What became of one sub-issue of a planned phase, as the controller saw it."""

    state: StateType
    unmerged: bool = False
    """Its workspace still holds a change that is not in trunk."""
    held: bool = False
    """ralph-dev put a hold on it (``user-input-needed``): a person had to step in."""
    exhausted: bool = False
    """It reached the attempt cap."""
    resolved_conflict: bool = False
    """Its change conflicted with trunk and a resolve worker was started for it."""


def phase_verdict(children: Sequence[SubIssueOutcome]) -> Verdict | None:
    """The phase's observation once it has settled; ``None`` while it has not.

    Settled: at least one sub-issue, and every one finished (completed, canceled
    or duplicate) with no change left unmerged. Harmful: any sub-issue was held,
    exhausted its attempts, was canceled (or closed as a duplicate) or needed a
    conflict resolver. Helpful: otherwise, i.e. all completed and merged without
    a hold.
    """
    if not children or any(not c.state.finished or c.unmerged for c in children):
        return None
    if any(c.held or c.exhausted or c.resolved_conflict or c.state is not StateType.COMPLETED
           for c in children):
        return Verdict.HARMFUL
    return Verdict.HELPFUL


# --- lifecycle ---------------------------------------------------------------------


class Lifecycle(StrEnum):
    CANDIDATE = "candidate"
    ESTABLISHED = "established"
    PROVEN = "proven"
    DEPRECATED = "deprecated"

    @property
    def weight(self) -> float:
        """How strongly a plan worker's prompt recommends it (0: not at all)."""
        weight: float = _WEIGHTS[self]
        return weight


_WEIGHTS: dict[Lifecycle, float] = {
    Lifecycle.CANDIDATE: 0.5, Lifecycle.ESTABLISHED: 1.0, Lifecycle.PROVEN: 1.5,
    Lifecycle.DEPRECATED: 0.0,
}


@dataclass(frozen=True)
class Observation:
    at: datetime
    verdict: Verdict
    phase: str = ""


def decay(age_days: float) -> float:
    """The weight of an observation ``age_days`` old (1 today, ½ after 90 days)."""
    return float(0.5 ** (max(age_days, 0.0) / HALF_LIFE_DAYS))


def lifecycle(helpful: float, harmful: float) -> Lifecycle:
    """The state for these (decayed) counts; deprecated wins over everything else."""
    total = helpful + harmful
    share = harmful / total if total else 0.0
    if total and share > DEPRECATED_HARMFUL_SHARE:
        return Lifecycle.DEPRECATED
    if helpful >= PROVEN_HELPFUL and share < PROVEN_MAX_HARMFUL_SHARE:
        return Lifecycle.PROVEN
    if total >= ESTABLISHED_AFTER:
        return Lifecycle.ESTABLISHED
    return Lifecycle.CANDIDATE


@dataclass(frozen=True)
class Standing:
    """One strategy's record today: decayed counts, state and prompt weight."""

    name: str
    helpful: float
    harmful: float
    state: Lifecycle

    @property
    def observations(self) -> float:
        return self.helpful + self.harmful

    @property
    def helpful_share(self) -> float:
        return self.helpful / self.observations if self.observations else 0.0

    @property
    def weight(self) -> float:
        return self.state.weight

    def summary(self) -> str:
        """``PROVEN — 83 % helpful from 6 observations``."""
        count = f"{self.observations:.1f}".removesuffix(".0")
        plural = "" if count == "1" else "s"
        return (f"{self.state.value.upper()} — {round(100 * self.helpful_share)} % helpful "
                f"from {count} observation{plural}")


def standing(name: str, observations: Iterable[Observation], now: datetime) -> Standing:
    helpful = harmful = 0.0
    for obs in observations:
        weight = decay((now - obs.at).total_seconds() / 86400)
        if obs.verdict is Verdict.HELPFUL:
            helpful += weight
        else:
            harmful += weight
    return Standing(name, helpful, harmful, lifecycle(helpful, harmful))


def standings(observations: Mapping[str, Sequence[Observation]],
              now: datetime) -> tuple[Standing, ...]:
    """Every observed strategy, strongest recommendation first, then by name."""
    rows = [standing(name, obs, now) for name, obs in observations.items() if obs]
    return tuple(sorted(rows, key=lambda s: (-s.weight, -s.helpful_share, s.name)))


def prompt_sections(rows: Iterable[Standing]) -> str:
    """The "Proven patterns" and "Avoid" sections of a plan worker's prompt ("" if none)."""
    rows = list(rows)
    sections: list[str] = []
    good = [f"- {s.name}: {s.summary()}, weight {s.weight:g}" for s in rows if s.weight > 0]
    if good:
        sections.append("\n".join(["Proven patterns (how earlier plans of this project split "
                                    "work, and how much to trust each):", *good]))
    bad = [f"- {s.name}: {s.summary()}" for s in rows if s.state is Lifecycle.DEPRECATED]
    if bad:
        sections.append("\n".join(["Avoid (these splits went wrong here more than 30 % of "
                                    "the time):", *bad]))
    return "\n\n".join(sections)
