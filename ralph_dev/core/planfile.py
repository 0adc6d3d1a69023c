"""Plan files: a whole plan (phases, tasks, blockers) a person or a plan worker writes by hand.

``parse_plan(path)`` turns one file into ``NewIssue`` entries that the tracker
creates in one transaction (``issue import``, ``worker plan``). Phases become
parents of their tasks. Entries point at each other with batch-local ``ref``s;
a blocker may also be an existing identifier (``DEMO-3``). The format is
chosen by suffix. Any mistake is a ``PlanError`` naming the file, the line
and the problem, raised before anything is created.

TOML (``.toml``)::

    [[phase]]                      # a phase: the parent of its tasks
    ref = "p1"                     # optional batch-local name
    title = "Phase 1: storage"     # required
    description = "…"              # optional, also for tasks
    priority = 2                   # optional 0-4 (0 none, 1 urgent … 4 low)
    labels = ["backend"]           # optional
    blocked_by = ["DEMO-3"]        # optional refs or identifiers

      [[phase.task]]               # a task of the phase above
      ref = "schema"
      title = "Design the schema"

      [[phase.task]]
      title = "API"
      blocked_by = ["schema"]

    [[task]]                       # a task without a phase
    title = "README"
    blocked_by = ["api", "DEMO-3"]

Markdown (``.md``, ``.markdown``)::

    # Any title                        ← preamble: everything before the first
    Free text.                           "## " heading or "- " bullet is ignored

    - Top-level task {#readme}         ← bullets before the first "## " are
                                         tasks without a phase
    ## Phase 1: storage {#p1} (priority: 2)
    Text right under a heading is the phase's description.

    - Design the schema {#schema} (labels: backend, db)
      Lines indented by two or more spaces (or a tab) are the task's
      description; nested bullets there are description text too.
    - API {#api} (blocked by: schema, DEMO-3)
    * [ ] Checkbox bullets work too

At the end of a heading or bullet, in any order: ``{#ref}``,
``(blocked by: a, b)``, ``(priority: N)``, ``(labels: a, b)``. Any other
trailing parenthesis stays part of the title. ``###`` and deeper headings
outside a task description are refused (only ``##`` starts a phase), and so
is unindented text after a task (indent it to make it description).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import IDENTIFIER_RE, NewIssue

REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENTRY_KEYS = ("ref", "title", "description", "priority", "labels", "blocked_by")
MAX_PLAN_BYTES = 1_000_000


class PlanError(RalphError):
    """A plan file is wrong; the message names the file, the line and the problem."""


@dataclass
class _Entry:
    title: str
    line: int | None
    where: str
    ref: str | None = None
    description: str = ""
    priority: int = 0
    labels: list[str] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)
    phase: int | None = None
    """Index of the phase entry that is this task's parent."""


def parse_plan(path: Path, *, parent: str | None = None) -> list[NewIssue]:
    """The entries of the plan in ``path``, in file order (each phase before its tasks).

    ``parent``: an identifier that top-level entries (phases and tasks outside
    a phase) become children of, as a plan worker does for its own issue.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".md", ".markdown"):
        raise PlanError(
            f"{path}: unknown plan format {suffix or '(no suffix)'!r}; name the file "
            "*.toml or *.md"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PlanError(f"{path}: cannot be read ({exc.strerror})") from exc
    if len(data) > MAX_PLAN_BYTES:
        raise PlanError(f"{path}: {len(data)} bytes is too large for a plan (at most 1 MB)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    if parent is not None and not IDENTIFIER_RE.fullmatch(parent):
        raise PlanError(f"parent {parent!r} is not an issue identifier (expected KEY-N)")
    entries = _parse_toml(path, text) if suffix == ".toml" else _parse_markdown(path, text)
    if not entries:
        raise PlanError(f"{path}: the plan has no phases or tasks")
    _check_refs(path, entries)
    out = []
    for entry in entries:
        if entry.phase is not None:
            up: str | None = entries[entry.phase].ref
        else:
            up = parent
        out.append(
            NewIssue(
                title=entry.title,
                description=entry.description,
                priority=entry.priority,
                labels=tuple(dict.fromkeys(entry.labels)),
                parent=up,
                blocked_by=tuple(dict.fromkeys(entry.blocked_by)),
                ref=entry.ref,
            )
        )
    return out


def _fail(path: Path, line: int | None, where: str, problem: str) -> PlanError:
    at = f"{path}:{line}" if line else str(path)
    return PlanError(f"{at}: {where}: {problem}" if where else f"{at}: {problem}")


def _check_refs(path: Path, entries: list[_Entry]) -> None:
    """Refs unique and well-formed, every blocker a ref of this file or an identifier.

    Phases need a ref to be their tasks' parent; a phase without one gets a
    generated ``phase-N`` that cannot clash with a written one.
    """
    seen: dict[str, _Entry] = {}
    for entry in entries:
        if entry.ref is None:
            continue
        if not REF_RE.fullmatch(entry.ref):
            raise _fail(path, entry.line, entry.where,
                        f"ref {entry.ref!r} may use only letters, digits, '.', '_' and '-' "
                        "(at most 64, starting with a letter or digit)")
        if IDENTIFIER_RE.fullmatch(entry.ref):
            raise _fail(path, entry.line, entry.where,
                        f"ref {entry.ref!r} looks like an issue identifier; use a name such "
                        "as 'schema'")
        if entry.ref in seen:
            first = seen[entry.ref]
            raise _fail(path, entry.line, entry.where,
                        f"ref {entry.ref!r} is already used by {first.where}"
                        + (f" (line {first.line})" if first.line else ""))
        seen[entry.ref] = entry
    for i, entry in enumerate(entries):
        if entry.ref is None and any(e.phase == i for e in entries):
            n = 1
            while f"phase-{n}" in seen:
                n += 1
            entry.ref = f"phase-{n}"
            seen[entry.ref] = entry
    for entry in entries:
        for blocker in entry.blocked_by:
            if blocker in seen or IDENTIFIER_RE.fullmatch(blocker):
                continue
            known = ", ".join(sorted(seen)) or "none"
            raise _fail(path, entry.line, entry.where,
                        f"blocked by {blocker!r}, which is neither a ref in this file nor an "
                        f"issue identifier (refs: {known})")
        if entry.ref is not None and entry.ref in entry.blocked_by:
            raise _fail(path, entry.line, entry.where, "an entry cannot block itself")


# --- TOML --------------------------------------------------------------------------

_HEADER_RE = re.compile(
    r"^[ \t]*\[\[[ \t]*(phase|phase[ \t]*\.[ \t]*task|task)[ \t]*\]\]", re.MULTILINE
)


def _header_lines(text: str) -> dict[str, list[int]]:
    """Line numbers of each ``[[phase]]``/``[[phase.task]]``/``[[task]]`` header, in order."""
    found: dict[str, list[int]] = {"phase": [], "phase.task": [], "task": []}
    for match in _HEADER_RE.finditer(text):
        kind = re.sub(r"\s", "", match.group(1))
        found[kind].append(text.count("\n", 0, match.start()) + 1)
    return found


def _parse_toml(path: Path, text: str) -> list[_Entry]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        line = int(match.group(1)) if match else None
        raise _fail(path, line, "", f"TOML syntax error: {exc}") from None
    lines = _trusted_lines(text, data)
    unknown = sorted(set(data) - {"phase", "task"})
    if unknown:
        raise _fail(path, None, "", f"unknown top-level key {unknown[0]!r} "
                    "(a plan has [[phase]] and [[task]] tables)")
    entries: list[_Entry] = []
    task_count = 0
    phases = _table_list(path, data.get("phase", []), "phase", None)
    for p, raw in enumerate(phases):
        line = _nth(lines["phase"], p)
        where = f"phase {p + 1}"
        tasks = _table_list(path, raw.get("task", []), f"{where}: task", line)
        phase = _toml_entry(path, {k: v for k, v in raw.items() if k != "task"}, where, line)
        index = len(entries)
        entries.append(phase)
        for t, task_raw in enumerate(tasks):
            task_line = _nth(lines["phase.task"], task_count)
            task_count += 1
            task = _toml_entry(path, task_raw, f"{where}, task {t + 1}", task_line)
            task.phase = index
            entries.append(task)
    for t, raw in enumerate(_table_list(path, data.get("task", []), "task", None)):
        entries.append(_toml_entry(path, raw, f"task {t + 1}", _nth(lines["task"], t)))
    return entries


def _trusted_lines(text: str, data: dict[str, Any]) -> dict[str, list[int]]:
    """Header lines, or none when they do not match the tables (inline arrays, headers
    quoted inside strings): no line number beats a wrong one."""
    lines = _header_lines(text)
    phases = data.get("phase", [])
    counts = {
        "phase": len(phases) if isinstance(phases, list) else -1,
        "phase.task": sum(
            len(p.get("task", [])) if isinstance(p, dict) and isinstance(p.get("task", []), list)
            else -1
            for p in (phases if isinstance(phases, list) else [])
        ),
        "task": len(data.get("task", [])) if isinstance(data.get("task", []), list) else -1,
    }
    if any(len(lines[k]) != counts[k] for k in lines):
        return {k: [] for k in lines}
    return lines


def _nth(lines: list[int], index: int) -> int | None:
    return lines[index] if index < len(lines) else None


def _table_list(path: Path, value: Any, what: str, line: int | None) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise _fail(path, line, what, "expected a list of tables, written [[…]]")
    return value


def _toml_entry(path: Path, raw: dict[str, Any], where: str, line: int | None) -> _Entry:
    unknown = sorted(set(raw) - set(ENTRY_KEYS))
    if unknown:
        raise _fail(path, line, where,
                    f"unknown key {unknown[0]!r} (known keys: {', '.join(ENTRY_KEYS)})")
    title = raw.get("title")
    if not isinstance(title, str) or not title.strip():
        raise _fail(path, line, where, "needs a title = \"…\"")
    if "\n" in title.strip():
        raise _fail(path, line, where, "the title must be one line")
    entry = _Entry(title=title.strip(), line=line, where=f"{where} ({title.strip()!r})")
    ref = raw.get("ref")
    if ref is not None:
        if not isinstance(ref, str):
            raise _fail(path, line, entry.where, f"ref must be a string, got {ref!r}")
        entry.ref = ref
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise _fail(path, line, entry.where, "description must be a string")
    entry.description = description.strip("\n")
    entry.priority = _priority(path, line, entry.where, raw.get("priority", 0))
    entry.labels = _strings(path, line, entry.where, "labels", raw.get("labels", []))
    entry.blocked_by = _strings(path, line, entry.where, "blocked_by", raw.get("blocked_by", []))
    return entry


def _priority(path: Path, line: int | None, where: str, value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 4:
        raise _fail(path, line, where,
                    f"priority {value!r} is not 0-4 (0 none, 1 urgent, 2 high, 3 medium, 4 low)")
    return value


def _strings(path: Path, line: int | None, where: str, key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise _fail(path, line, where, f"{key} must be a list of non-empty strings")
    return [v.strip() for v in value]


# --- Markdown ----------------------------------------------------------------------

_BULLET_RE = re.compile(r"^[-*]\s+(?:\[ \]\s+)?(.*)$")
_HEADING_RE = re.compile(r"^(#{1,6})\s*(.*?)\s*#*\s*$")
_REF_ATTR_RE = re.compile(r"\s*\{#([^{}\s]*)\}\s*$")
_PAREN_ATTR_RE = re.compile(r"\s*\(\s*([A-Za-z][A-Za-z _-]*?)\s*:\s*([^()]*)\)\s*$")
_ATTR_KEYS = {
    "blocked by": "blocked_by",
    "blocked-by": "blocked_by",
    "blocked_by": "blocked_by",
    "after": "blocked_by",
    "priority": "priority",
    "labels": "labels",
    "label": "labels",
}


def _indent(line: str) -> int:
    expanded = line.expandtabs(4)
    return len(expanded) - len(expanded.lstrip(" "))


def _md_title(path: Path, number: int, where: str, text: str) -> _Entry:
    """Split trailing attributes off a heading or bullet text."""
    entry = _Entry(title="", line=number, where=where)
    rest = text.rstrip()
    seen: set[str] = set()
    while True:
        match = _REF_ATTR_RE.search(rest)
        if match:
            if "ref" in seen:
                raise _fail(path, number, where, "two {#ref} attributes")
            seen.add("ref")
            if not match.group(1):
                raise _fail(path, number, where, "empty {#} attribute; write {#name}")
            entry.ref = match.group(1)
            rest = rest[: match.start()]
            continue
        match = _PAREN_ATTR_RE.search(rest)
        if match and match.group(1).lower() in _ATTR_KEYS:
            key = _ATTR_KEYS[match.group(1).lower()]
            if key in seen:
                raise _fail(path, number, where, f"({match.group(1)}: …) given twice")
            seen.add(key)
            value = match.group(2).strip()
            items = [v.strip() for v in value.split(",") if v.strip()]
            if key == "priority":
                entry.priority = _priority(path, number, where, value)
            elif not items:
                raise _fail(path, number, where, f"({match.group(1)}: …) lists nothing")
            elif key == "labels":
                entry.labels = items
            else:
                entry.blocked_by = items
            rest = rest[: match.start()]
            continue
        break
    title = rest.strip()
    if not title:
        raise _fail(path, number, where, "the title is empty")
    entry.title = title
    entry.where = f"{where} ({title!r})"
    return entry


def _parse_markdown(path: Path, text: str) -> list[_Entry]:
    entries: list[_Entry] = []
    phase: int | None = None
    current: _Entry | None = None  # the entry whose description lines follow
    in_tasks = False  # after a bullet: unindented text is an error
    started = False  # past the preamble
    buffer: list[str] = []
    fence: str | None = None  # inside a ``` block: everything is description

    def flush() -> None:
        if current is not None and buffer:
            lines = list(buffer)
            while lines and not lines[-1].strip():
                lines.pop()
            while lines and not lines[0].strip():
                lines.pop(0)
            if lines:
                depth = min(_indent(x) for x in lines if x.strip())
                current.description = "\n".join(x.expandtabs(4)[depth:] for x in lines)
        buffer.clear()

    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        stripped = line.strip()
        if fence is not None:
            if current is None:
                raise _fail(path, number, "", "code block outside a phase or task")
            buffer.append(line)
            if stripped.startswith(fence):
                fence = None
            continue
        indented = _indent(line) >= 2 and bool(stripped)
        heading = None if indented else _HEADING_RE.match(line)
        bullet = None if indented else _BULLET_RE.match(line)
        if heading and len(heading.group(1)) == 1 and not started:
            continue  # the document's own title
        if heading:
            if len(heading.group(1)) != 2:
                raise _fail(path, number, "",
                            f"{heading.group(1)} heading: only '## ' headings start a phase "
                            "(indent it to make it part of a description)")
            flush()
            started = True
            in_tasks = False
            current = _md_title(path, number, f"phase {heading.group(2)!r}", heading.group(2))
            current.where = f"phase {current.title!r}"
            phase = len(entries)
            entries.append(current)
            continue
        if bullet:
            flush()
            started = True
            in_tasks = True
            current = _md_title(path, number, "task", bullet.group(1))
            current.where = f"task {current.title!r}"
            current.phase = phase
            entries.append(current)
            continue
        if not started:
            continue  # preamble
        if not stripped:
            buffer.append("")
            continue
        if indented or not in_tasks:
            if stripped.startswith(("```", "~~~")):
                fence = stripped[:3]
            buffer.append(line)
            continue
        raise _fail(path, number, "",
                    f"unindented text {stripped[:40]!r} after a task: indent it by two spaces "
                    "to make it the task's description, or start a bullet with '- '")
    if fence is not None:
        raise _fail(path, None, "", f"a {fence} code block is never closed")
    flush()
    return entries

