"""What agents spend: tokens and an estimated price, from the agents' own session files.

Every assistant message Claude Code writes to its transcript (one JSON object per
line) carries the model and the API's ``usage``: input, output, cache-write and
cache-read tokens. A message split over several lines (one per content block)
repeats the same usage under the same message id: it is counted once. Codex's session
file says its session's running token totals (``token_count``) and each turn's model;
Gemini CLI's says each answer's tokens (``type: gemini``), its line written again (same
id) as the answer's tool calls finish.
The price is an estimate from a per-model table (USD per million tokens; a model
matches the first key its name contains), with defaults for the Claude and GPT-5
families and overrides in config (``[costs.prices]``). Budgets (``[costs]``): per
issue in tokens or dollars, and per day for the whole swarm.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

DEFAULT_PRICES: dict[str, tuple[float, float, float, float]] = {
    # model name contains → (input, output, cache write, cache read) USD per 1M tokens
    "opus": (15.0, 75.0, 18.75, 1.50),
    "sonnet": (3.0, 15.0, 3.75, 0.30),
    "haiku": (1.0, 5.0, 1.25, 0.10),
    "gpt-5": (1.25, 10.0, 0.0, 0.125),  # Codex's models (cached input read at a tenth)
    "flash": (0.30, 2.50, 0.0, 0.03),  # Gemini's, at most 200k tokens of prompt
    "gemini": (1.25, 10.0, 0.0, 0.31),
}


@dataclass(frozen=True)
class CostSettings:
    prices: Mapping[str, tuple[float, float, float, float]] = field(default_factory=dict)
    """More or corrected prices, e.g. ``{ "sonnet-5" = [3.0, 15.0, 3.75, 0.3] }``."""
    issue_usd: float = 0.0
    """Stop an issue's worker and hold it once the issue has cost this much (0: no cap)."""
    issue_tokens: int = 0
    """The same in tokens (input + output + cache), for when prices are unknown."""
    day_usd: float = 0.0
    """Pause dispatch once the swarm has spent this much today, UTC (0: no cap)."""


@dataclass(frozen=True)
class Usage:
    input: int = 0
    output: int = 0
    cache_write: int = 0
    cache_read: int = 0
    usd: float = 0.0

    @property
    def tokens(self) -> int:
        return self.input + self.output + self.cache_write + self.cache_read

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input + other.input, self.output + other.output,
                     self.cache_write + other.cache_write, self.cache_read + other.cache_read,
                     round(self.usd + other.usd, 6))

    def as_json(self) -> dict[str, float | int]:
        return {"input": self.input, "output": self.output, "cache_write": self.cache_write,
                "cache_read": self.cache_read, "tokens": self.tokens, "usd": round(self.usd, 4)}

    @classmethod
    def from_json(cls, raw: object) -> Usage:
        if not isinstance(raw, Mapping):
            return cls()
        try:
            return cls(int(raw.get("input", 0)), int(raw.get("output", 0)),
                       int(raw.get("cache_write", 0)), int(raw.get("cache_read", 0)),
                       float(raw.get("usd", 0.0)))
        except (TypeError, ValueError):
            return cls()


def price_of(model: str, settings: CostSettings) -> tuple[float, float, float, float]:
    """USD per 1M tokens for ``model``: the config's first matching key, else the
    defaults'; unknown models cost 0 (tokens are still counted)."""
    name = model.casefold()
    for table in (settings.prices, DEFAULT_PRICES):
        for key, price in table.items():
            if key.casefold() in name:
                return price
    return (0.0, 0.0, 0.0, 0.0)


def usage_of(message: Mapping[str, object], settings: CostSettings) -> Usage:
    raw = message.get("usage")
    if not isinstance(raw, Mapping):
        return Usage()

    def count(key: str) -> int:
        value = raw.get(key, 0)
        return value if isinstance(value, int) and value > 0 else 0

    tokens = (count("input_tokens"), count("output_tokens"),
              count("cache_creation_input_tokens"), count("cache_read_input_tokens"))
    price = price_of(str(message.get("model", "")), settings)
    usd = sum(n * p for n, p in zip(tokens, price, strict=True)) / 1_000_000
    return Usage(*tokens, usd=usd)


CODEX_MARK = "codex"
"""How a Codex session's place is kept (``last_id``): its model and the session's token
totals counted so far, ``codex MODEL INPUT CACHED OUTPUT``."""


def _codex_mark(last_id: str | None) -> tuple[str, int, int, int]:
    words = (last_id or "").split(" ")
    if len(words) == 5 and words[0] == CODEX_MARK and all(w.isdigit() for w in words[2:]):
        return words[1], int(words[2]), int(words[3]), int(words[4])
    return "", 0, 0, 0


def _codex_entry(entry: Mapping[str, object], settings: CostSettings, last_id: str | None
                 ) -> tuple[Usage, str | None] | None:
    """A line of a Codex session file (``sessions/…/rollout-*.jsonl``): its turn's model,
    or its running token totals (``token_count``, told more than once for one answer:
    only what grew since is counted); None for a line of any other kind."""
    payload = entry.get("payload")
    if not isinstance(payload, Mapping) or entry.get("type") not in ("turn_context",
                                                                     "event_msg"):
        return None
    model, seen_in, seen_cached, seen_out = _codex_mark(last_id)
    if entry.get("type") == "turn_context":
        said = payload.get("model")
        if isinstance(said, str) and said and " " not in said:
            return Usage(), f"{CODEX_MARK} {said[:80]} {seen_in} {seen_cached} {seen_out}"
        return Usage(), last_id
    info = payload.get("info") if payload.get("type") == "token_count" else None
    totals = info.get("total_token_usage") if isinstance(info, Mapping) else None
    if not isinstance(totals, Mapping):
        return Usage(), last_id

    def count(key: str) -> int:
        value = totals.get(key, 0)
        return value if isinstance(value, int) and value > 0 else 0

    total_in, cached, out = count("input_tokens"), count("cached_input_tokens"), \
        count("output_tokens")
    if total_in <= seen_in and cached <= seen_cached and out <= seen_out:
        return Usage(), last_id  # told again, or a new session's smaller totals
    fresh_in = max(0, total_in - cached - (seen_in - seen_cached))
    price = price_of(model, settings)
    grown = (fresh_in, max(0, out - seen_out), 0, max(0, cached - seen_cached))
    usd = sum(n * p for n, p in zip(grown, price, strict=True)) / 1_000_000
    return Usage(*grown, usd=usd), f"{CODEX_MARK} {model or '-'} {total_in} {cached} {out}"


def _gemini_entry(entry: Mapping[str, object], settings: CostSettings) -> Usage | None:
    """A line of Gemini CLI's session file (``tmp/…/chats/session-*.jsonl``) that is one
    answer of the model: its tokens (the prompt's include its cached part; thinking is
    billed as output). None for a line of any other kind."""
    tokens = entry.get("tokens")
    if entry.get("type") != "gemini" or not isinstance(tokens, Mapping):
        return None

    def count(key: str) -> int:
        value = tokens.get(key, 0)
        return value if isinstance(value, int) and value > 0 else 0

    cached = count("cached")
    spent = (max(0, count("input") - cached), count("output") + count("thoughts"), 0, cached)
    price = price_of(str(entry.get("model", "")), settings)
    return Usage(*spent, usd=sum(n * p for n, p in zip(spent, price, strict=True)) / 1_000_000)


def read_transcript(lines: Iterable[bytes], settings: CostSettings, last_id: str | None
                    ) -> tuple[Usage, str | None]:
    """The usage of the assistant messages in these transcript lines, each message once
    (``last_id``: the message counted last, whose further lines are not counted again).
    A Codex session's file is read the same way (:func:`_codex_entry`), and Gemini CLI's
    (:func:`_gemini_entry`)."""
    total = Usage()
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        codex = _codex_entry(entry, settings, last_id) if isinstance(entry, dict) else None
        if codex is not None:
            total, last_id = total + codex[0], codex[1]
            continue
        if not isinstance(entry, dict):
            continue
        gemini = _gemini_entry(entry, settings)
        said = entry if gemini is not None else entry.get("message")
        if not isinstance(said, dict) or (gemini is None and said.get("role") != "assistant"):
            continue
        ident = said.get("id")
        if not isinstance(ident, str) or ident == last_id:
            continue
        last_id = ident
        total = total + (gemini if gemini is not None else usage_of(said, settings))
    return total, last_id


def over_budget(spent: Usage, settings: CostSettings) -> str | None:
    """Why an issue must stop (its spend past a per-issue cap), or None."""
    if settings.issue_usd > 0 and spent.usd >= settings.issue_usd:
        return f"it has cost ${spent.usd:.2f}, costs.issue_usd is ${settings.issue_usd:.2f}"
    if settings.issue_tokens > 0 and spent.tokens >= settings.issue_tokens:
        return f"it has used {spent.tokens} tokens, costs.issue_tokens is {settings.issue_tokens}"
    return None
