"""Whether an agent ended its turn asking a person something, in its own words.

A worker should ask with ``ralph-dev worker blocked``; a model often just asks in
its last message instead. Left alone, that question never reaches anyone: the Stop
hook pushes the agent on, it guesses or asks again, and attempts burn. Taken too
eagerly, a finished summary that closes with "let me know if you want anything
else" holds its issue for a person who has nothing to decide. So the hooks read
the agent's last message with these rules (plain rules a person can check against
a message, no model):

* Only prose asks. Code (fenced or indented), inline code, links' addresses,
  tables and quoted text never do, whatever ``?`` they hold.
* The end decides. Read from the last sentence back, passing over what only waits
  or is polite ("please reply and I will continue", "I'll go on once you decide",
  "I'd recommend the first", "let me know if you want anything else", an offer of
  more work); the first sentence left must ask: a question that is not an offer or
  a "does this look good?" after finished work, or a request for a decision without
  ``?`` ("I need you to decide between…", "let me know which…", "should I … or …").
  A statement there (a summary, the agent's own answer to its question) means the
  turn does not end asking.
* Options may follow a choice ("Which do you prefer?" then a list or a table).

What is posted is the asking part of the message (the asking paragraph, the options
and the paragraph that leads into them), cleaned of control characters and at most
``QUESTION_CHARS`` long, so the person reads the question, not the whole turn.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from ralph_dev.core.jsonsafe import parse_json
from ralph_dev.core.text import strip_ansi

QUESTION_CHARS = 2000
"""The most of an agent's message posted as its question (the end is kept)."""


def asked_question(message: object) -> str | None:
    """The question an agent's last message ends by asking a person, or None."""
    if not isinstance(message, str):
        return None
    lines = strip_ansi(message).strip().split("\n")
    units = _units(lines)
    start = _asking_start(units)
    if start is None:
        return None
    return _clip("\n".join(lines[start:]).strip())


def _clip(text: str) -> str:
    """At most ``QUESTION_CHARS``, the end kept: a question's last words are its ask."""
    return text if len(text) <= QUESTION_CHARS else "…" + text[-(QUESTION_CHARS - 1):].lstrip()


def tool_question(tool_input: object) -> str | None:
    """The questions of Claude Code's ``AskUserQuestion`` call as a person reads them in a
    comment (each question, then its options with what each means), or None when the
    call holds no question. In a worker nobody can answer the tool's picker, so the
    question goes to a person on the issue like any other (Claude Code 2.1's input:
    ``questions[]`` of ``question``, ``header``, ``options[]`` of ``label`` and
    ``description``, ``multiSelect``)."""
    questions = tool_input.get("questions") if isinstance(tool_input, dict) else None
    out: list[str] = []
    for item in questions if isinstance(questions, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("question"), str):
            continue
        header = item.get("header")
        head = f"**{_flat(header)}**: " if isinstance(header, str) and header.strip() else ""
        out += ["", head + _flat(item["question"])] if out else [head + _flat(item["question"])]
        if item.get("multiSelect") is True:
            out.append("(one or more of:)")
        for option in item.get("options") or []:
            if isinstance(option, dict) and isinstance(option.get("label"), str):
                about = option.get("description")
                out.append(f"- {_flat(option['label'])}"
                           + (f" — {_flat(about)}" if isinstance(about, str) and about.strip()
                              else ""))
    text = "\n".join(out).strip()
    return _clip(text) if text else None


def _flat(text: str) -> str:
    return " ".join(strip_ansi(text).split())


def last_message(transcript_lines: Iterable[str | bytes]) -> str | None:
    """The text of the agent's last message in its Claude Code transcript (JSON lines,
    oldest first), or None when its last message holds no text (it called a tool). The
    Notification hook has no ``last_assistant_message`` as Stop has: this is where an
    agent that went idle said its last words."""
    last: str | None = None
    for line in transcript_lines:
        try:
            entry = parse_json(line)
        except ValueError:  # TooDeep too: a tool call's input is the model's JSON
            continue
        message = entry.get("message") if isinstance(entry, dict) else None
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            continue
        texts = [b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text"
                 and isinstance(b.get("text"), str)]
        if texts:
            last = "\n\n".join(texts)
        elif any(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks):
            last = None
    return last


# --- the message in units: prose, list items, and what never asks ----------------------


class _Kind(Enum):
    PROSE = "prose"
    ITEM = "item"
    CODE = "code"
    TABLE = "table"
    QUOTE = "quote"
    HEADING = "heading"
    RULE = "rule"


@dataclass(frozen=True)
class _Unit:
    kind: _Kind
    text: str
    line: int
    """Where the unit starts in the message (its line index)."""


_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_ITEM = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)]|\(?[a-dA-D]\))\s+")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s")
_RULE = re.compile(r"^\s{0,3}(?:-{3,}|\*{3,}|_{3,})\s*$")


def _starts_block(line: str) -> bool:
    """A line that ends the prose paragraph before it."""
    stripped = line.lstrip()
    return bool(_FENCE.match(line) or _ITEM.match(line) or _HEADING.match(line)
                or _RULE.match(line) or stripped.startswith(("|", ">")))


def _units(lines: list[str]) -> list[_Unit]:
    units: list[_Unit] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        start = i
        fence = _FENCE.match(line)
        if fence:  # to its closing fence, or to the end when it has none
            mark = fence.group(1)
            i += 1
            while i < n and not lines[i].strip().startswith(mark[0] * len(mark)):
                i += 1
            units.append(_Unit(_Kind.CODE, "", start))
            i += 1
            continue
        indented = line.startswith(("    ", "\t")) and not _ITEM.match(line)
        if indented and (i == 0 or not lines[i - 1].strip() or
                         (units and units[-1].kind is _Kind.CODE)):
            while i < n and (not lines[i].strip() or lines[i].startswith(("    ", "\t"))):
                i += 1
            units.append(_Unit(_Kind.CODE, "", start))
            continue
        for kind, prefix in ((_Kind.TABLE, "|"), (_Kind.QUOTE, ">")):
            if line.lstrip().startswith(prefix):
                while i < n and lines[i].lstrip().startswith(prefix):
                    i += 1
                units.append(_Unit(kind, "", start))
                break
        else:
            if _HEADING.match(line) or _RULE.match(line):
                kind = _Kind.HEADING if _HEADING.match(line) else _Kind.RULE
                units.append(_Unit(kind, line.strip(), start))
                i += 1
                continue
            kind = _Kind.ITEM if _ITEM.match(line) else _Kind.PROSE
            text = [_ITEM.sub("", line, count=1) if kind is _Kind.ITEM else line]
            i += 1
            while i < n and lines[i].strip() and not _starts_block(lines[i]):
                text.append(lines[i])
                i += 1
            units.append(_Unit(kind, " ".join(t.strip() for t in text), start))
    return units


# --- sentences ----------------------------------------------------------------------

_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+\1")
_LINK = re.compile(r"\[([^\]]*)\]\([^)\s]*\)")
_URL = re.compile(r"\b(?:https?|ftp|file)://\S+|\bwww\.\S+")
_ABBREVIATION = re.compile(r"\b(e\.g|i\.e|etc|vs|approx|cf|incl)\.", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?…:])[\"'”’)\]*_]*\s+")
_EDGES = " \t*_`\"'“”‘’()[]»«"
_SYMBOLS = re.compile(r"[\U0001F000-\U0001FAFF\u2600-\u27BF\uFE0F]+")


def _sentences(text: str) -> list[str]:
    text = _INLINE_CODE.sub("CODE", text.replace("\u2019", "'"))
    text = _LINK.sub(r"\1", text)
    text = _URL.sub("URL", text)
    text = _ABBREVIATION.sub(r"\1", text)
    out = []
    for part in _SENTENCE_END.split(text):
        part = _SYMBOLS.sub("", part).strip(_EDGES)
        if part:
            out.append(part)
    return out


# --- what one sentence does -----------------------------------------------------------


class _Says(Enum):
    ASKS = "asks"
    WAITS = "waits"
    """Only waits or is polite: please reply, I'll go on once you…, thanks, an offer."""
    OPTIONS = "options"
    """Describes the options of a choice asked just before."""
    STATES = "states"


def _rx(*patterns: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE)


_I = r"(?:i|we)"
_ME = r"(?:me|i|we|us)"
_PERSON = (r"(?:you|your|a person|someone|somebody|a human|the user|a maintainer|"
           r"the (?:issue )?author|the team)")

OFFER = _rx(
    # more work than was asked, offered: never something to wait for
    rf"\b(?:would you like|do you want|did you want|want|shall|should|can|could|may)\s+"
    rf"{_ME}\b.*\b(?:also|too|as well|anything else|further|additional(?:ly)?|extra|"
    r"(?:add|write|do|make|run|cover)\s+(?:a few\s+|some\s+)?more|next|follow[- ]?ups?)\b",
    r"\b(?:anything else|any (?:other |more |further )?questions|"
    r"any (?:other|more|further) (?:changes|tweaks|edits|adjustments)|"
    r"anything (?:you'd like|i (?:should|can)|to (?:add|change)))\b",
)
"""A question that offers more work or asks for more wishes."""

CHECK_IN = _rx(
    r"\b(?:does|do|did|is|are|would|will)\s+(?:this|that|these|it|everything|all of this)\s+"
    r"(?:look|sound|seem|work|meet|match|cover|do)\b",
    r"^(?:sounds?|looks?) (?:good|ok|okay|right|fine)\b",
    r"^(?:so,?\s+)?(?:what do you think|thoughts|any thoughts|any feedback|how does (?:this|that|"
    r"it) (?:look|sound))\b",
    r"\b(?:make sense|work for you|what you (?:wanted|had in mind|expected|meant))\b",
    rf"\b(?:would you like|do you want|want|shall|should|can|may)\s+{_ME}\s+"
    r"(?:to\s+)?(?:commit|push|open|create|merge|run|ship|proceed|continue|go ahead|"
    r"finali[sz]e|wrap up|clean up|submit|report)\b",
)
"""A question that checks in after finished work ("does this look good?", "shall I
commit?"): the work is there to report, nothing to wait for. Before any work is done
the same words ask for a go-ahead, which is a question."""

FINISHED = _rx(
    r"\ball (?:the )?(?:\d+ )?(?:\w+ )?(?:tests?|checks?|specs?)\b.{0,20}\b(?:pass|passed|passing|"
    r"green|succeed)",
    r"\b(?:tests?|checks?|build|ci)\b (?:now |still |all )?(?:pass|passes|passed|passing|green)",
    rf"\b{_I}(?:'ve| have)\s+(?:now\s+|also\s+|just\s+)?(?:implemented|added|fixed|updated|"
    r"created|written|refactored|completed|finished|made|changed|removed|renamed|moved|"
    r"resolved|merged|cleaned|replaced|wired|extended|documented)\b",
    r"\b(?:is|are|was|were)\s+(?:now\s+)?(?:done|complete|completed|implemented|fixed|in place|"
    r"working|passing|resolved)\b",
    r"\b(?:summary of (?:the )?changes|changes made|what (?:i|was) changed)\b",
    r"^(?:done|fixed|finished|completed|implemented)\b",
    "\u2705",
)
"""Words of work done: after them a check-in or an offer is a courtesy."""

DECISION = _rx(
    # "I need you to decide between X and Y", "I need a decision: …", "we need your input"
    rf"\b{_I}\s+(?:still\s+|first\s+|really\s+)?(?:need|require|would need|'d need|must have)"
    rf"\s+(?:{_PERSON}|a (?:decision|choice|call|ruling|go-ahead|sign-off|steer)|an answer|"
    r"confirmation|approval|clarification|input|guidance|direction|a person's)\b",
    # imperative requests: "please decide", "choose one of the options above"
    r"^(?:ok(?:ay)?,?\s+|so,?\s+)?(?:please\s+|kindly\s+)?(?:could you\s+|can you\s+|would you\s+)?"
    r"(?:please\s+)?(?:decide|choose|pick|select|confirm|advise|clarify|specify|approve|"
    r"provide|supply|share|send me|give me)\b(?!.*\bif\s+(?:you|anything|something|needed)\b)",
    r"^(?:please\s+|so,?\s+)?(?:let me know|tell me|advise|confirm|decide|indicate)\s+"
    r"(?:\w+\s+){0,2}?(?:which|whether|what|how|where|when|who)\b"
    r"(?!\s+(?:you think|it goes|else))",
    r"\b(?:let me know|tell me)\s+(?:\w+\s+){0,2}?(?:which|whether)\b",
    r"\b(?:reply|respond|answer|come back)\b.{0,30}\byour (?:choice|decision|preference|"
    r"pick|call|answer)\b",
    rf"\b(?:blocked|waiting|wait|stuck|paused|held up)\b.{{0,40}}\b(?:on|for|until)\s+"
    rf"(?:{_PERSON}|a decision|a choice|an answer|input|guidance|confirmation|clarification)"
    r"\b.{0,60}\b(?:decid|choos|confirm|answer|decision|choice|clarif|input|guidance|"
    r"tell|reply|respon|which|whether)",
    # a question without its question mark
    rf"^(?:so,?\s+)?(?:should|shall)\s+{_I}\b.*\bor\b",
    r"^(?:so,?\s+)?(?:do|would)\s+you\s+(?:want|prefer|like)\b.*\bor\b",
    r"^(?:so,?\s+)?which\b.{0,60}\b(?:do|would|should|shall|will|can|could)\s+(?:you|we|i)\b",
    r"\bwhich (?:one |option |approach |of (?:these|them|the two) )?(?:do|would) you "
    r"(?:prefer|want|like|choose|pick)\b",
    r"^(?:option|approach|choice) \w+ or (?:option |approach |choice )?\w+\b",
)
"""Asking for a decision without a question mark."""

WAITING = _rx(
    r"^(?:please\s+|just\s+)?(?:reply|respond|answer|let me know|tell me|get back to me|"
    r"ping me)(?:\s+\S+){0,6}[.!]*$",
    r"\b(?:i'll|i will|i can|i'd|i would|i'm|i am|happy to|and then i)\b.{0,80}\b"
    r"(?:once|when|after|as soon as|until|if) (?:you|i hear|i get|i have|i know|someone|"
    r"a person|the decision|that's|it's)\b",
    r"\b(?:once|when|after|as soon as) (?:you|i hear|i get|i have|i know|someone|a person)"
    r"\b.{0,80}\b(?:i'll|i will|i can|i'd|i will)\b",
    r"\b(?:i'm|i am|i'll|i will|i'll be|i've|i have|i|we're|we are)\s+(?:now\s+|just\s+)?"
    r"(?:waiting|wait|hold(?:ing)? off|paus(?:e|ed|ing)|standing by|stand by|"
    r"stopp(?:ed|ing) here|stop here)\b",
    r"^(?:waiting|standing by|awaiting|holding)\b|\bwaiting (?:for|on) your\b",
    r"\b(?:i|we)\s+(?:haven't|have not|didn't|did not|won't|will not)\b.{0,30}\b(?:change|"
    r"changed|touch|touched|start|started|commit|committed|make|made|edit|edited|proceed|"
    r"continue|modified)\b.{0,40}\b(?:yet|until|before|without)\b",
    r"\bnothing (?:has been|is|was) (?:changed|touched|committed|started) yet\b",
    r"\bno changes (?:have been |were )?made yet\b",
    r"^(?:thanks|thank you|cheers|much appreciated)\b",
    r"^(?:and\s+)?(?:then\s+)?(?:i'll|i will)\s+(?:pick (?:it|this|that) up|take it|continue|"
    r"carry on|go on|proceed|resume)\b",
    r"\b(?:i(?:\s+would|'d)?\s+(?:recommend|suggest|lean)|my (?:recommendation|suggestion|"
    r"preference|vote|pick)|i(?:'d| would) (?:go|opt) (?:with|for)|leaning towards|"
    r"i prefer|(?:is|as) (?:the )?recommended)\b",
    r"^(?:let me know if|just let me know if|feel free|if you(?:'d| would)? (?:like|want|"
    r"prefer)|happy to|don't hesitate|do not hesitate|hope (?:this|that) helps|i can also|"
    r"i could also|alternatively,? i can)\b",
)
"""Sentences that only wait for the answer, or are polite, or recommend: they change
nothing about what came before."""

OPTION_NOTES = _rx(
    r"\b(?:both|either|neither|each (?:option|approach|one)|the (?:first|second|third|former|"
    r"latter)(?: one| option| approach)?|options?|approach [a-d1-4]|trade-?offs?|pros|cons|"
    r"alternatives?|choices|possibilities|candidates)\b",
)
"""A sentence about a choice's options, fine after the choice."""

ANNOUNCED = _rx(
    r"^(?:(?:a|one|quick|small|last|final|open)\s+)*question\b.{0,40}:$",
    rf"^{_I}\s+(?:have|'ve got|still have)\s+(?:a|one)\s+(?:quick\s+|small\s+|last\s+)?"
    r"question\b",
)
"""A paragraph that opens by saying it asks ("Quick question before I start:"): what
follows its question there is context for it, not an answer to it."""

CHOICE = _rx(r"\b(?:or|which|whether|prefer|preference|options?|between|choose|choice|pick|"
             r"select|approach(?:es)?|alternatives?|versus|vs)\b")

QUESTION_END = re.compile(r"\?[?!]*$")


@dataclass(frozen=True)
class _Reading:
    says: _Says
    choice: bool = False


def _read(sentence: str, after_work: bool) -> _Reading:
    """What one sentence does, given whether work was reported done before it."""
    text = re.sub(r"^(?:q|question|decision(?: needed)?|open question|ask)\s*:\s*", "",
                  sentence, flags=re.IGNORECASE)
    choice = bool(CHOICE.search(text))
    if QUESTION_END.search(text):
        if OFFER.search(text) or (after_work and CHECK_IN.search(text) and not choice):
            return _Reading(_Says.WAITS)
        return _Reading(_Says.ASKS, choice)
    if DECISION.search(text):
        return _Reading(_Says.ASKS, choice)
    if WAITING.search(text):
        return _Reading(_Says.WAITS)
    if OPTION_NOTES.search(text):
        return _Reading(_Says.OPTIONS)
    return _Reading(_Says.STATES)


# --- reading the end of a message ---------------------------------------------------------


def _asking_start(units: list[_Unit]) -> int | None:
    """The line where the question the message ends with begins, or None."""
    spoken = [(index, sentence) for index, unit in enumerate(units)
              if unit.kind in (_Kind.PROSE, _Kind.ITEM) for sentence in _sentences(unit.text)]
    position = len(spoken)
    options_after = False
    for index in range(len(units) - 1, -1, -1):
        unit = units[index]
        if unit.kind in (_Kind.HEADING, _Kind.RULE):
            continue
        if unit.kind in (_Kind.CODE, _Kind.TABLE, _Kind.QUOTE):
            options_after = True
            continue
        mine = [s for i, s in spoken if i == index]
        position -= len(mine)
        announced = bool(mine) and bool(ANNOUNCED.search(mine[0]))
        for offset in range(len(mine) - 1, -1, -1):
            before = " ".join(s for _i, s in spoken[:position + offset])
            reading = _read(mine[offset], bool(FINISHED.search(before)))
            if reading.says is _Says.WAITS:
                continue
            if reading.says is _Says.OPTIONS or (unit.kind is _Kind.ITEM
                                                 and reading.says is _Says.STATES):
                options_after = True
                continue
            if reading.says is _Says.STATES and announced and offset > 0:
                continue
            if reading.says is _Says.STATES or (options_after and not reading.choice):
                return None
            return units[_lead_in(units, index)].line
    return None


def _lead_in(units: list[_Unit], index: int) -> int:
    """The first unit of the asking part: the asking paragraph, with the options and
    the paragraph just before it (what the question is about)."""
    while index > 0 and units[index - 1].kind in (_Kind.ITEM, _Kind.CODE, _Kind.TABLE,
                                                   _Kind.QUOTE):
        index -= 1
    if index > 0 and units[index - 1].kind in (_Kind.PROSE, _Kind.HEADING):
        index -= 1
    return index
