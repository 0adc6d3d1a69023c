"""The checks a batch of new issues passes before either tracker creates any of it.

Both trackers refuse a bad batch whole, before the first issue exists (Linear
has no transactions, so nothing could be rolled back there): every title,
priority, label and ref, and every parent or blocker that is neither a ref of
the batch nor an identifier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ralph_dev.core.errors import TrackerInputError
from ralph_dev.core.model import (
    IDENTIFIER_RE,
    InvalidLabel,
    NewIssue,
    check_identifier,
    check_label,
)


def entry_name(entries: Sequence[NewIssue], index: int) -> str:
    """How an error names one entry of a batch: ``entry 2 ('schema')``."""
    entry = entries[index]
    return f"entry {index + 1} ({entry.ref or entry.title!r})"


def checked_labels(labels: Iterable[str]) -> list[str]:
    try:
        return [check_label(label) for label in labels]
    except InvalidLabel as exc:
        raise TrackerInputError(str(exc)) from None


def check_batch(entries: Sequence[NewIssue],
                identifier: Callable[[str], object] = check_identifier) -> dict[str, int]:
    """The batch's refs (→ the index of their entry), after checking everything that
    needs no tracker; ``identifier`` checks an issue named outside the batch (the local
    tracker also checks that its key is this project's)."""
    refs: dict[str, int] = {}
    for i, entry in enumerate(entries):
        name = entry_name(entries, i)
        if not isinstance(entry.title, str) or not entry.title.strip():
            raise TrackerInputError(f"{name}: the title is empty")
        if "\n" in entry.title.strip():
            raise TrackerInputError(f"{name}: the title must be one line")
        if (not isinstance(entry.priority, int) or isinstance(entry.priority, bool)
                or not 0 <= entry.priority <= 4):
            raise TrackerInputError(
                f"{name}: priority {entry.priority!r} is not 0-4 "
                "(0 none, 1 urgent, 2 high, 3 medium, 4 low)"
            )
        checked_labels(entry.labels)
        if entry.ref is not None:
            if not entry.ref or entry.ref != entry.ref.strip():
                raise TrackerInputError(f"{name}: ref {entry.ref!r} is empty or padded")
            if IDENTIFIER_RE.fullmatch(entry.ref):
                raise TrackerInputError(
                    f"{name}: ref {entry.ref!r} looks like an issue identifier; "
                    "pick a name such as 'schema'"
                )
            if entry.ref in refs:
                raise TrackerInputError(f"{name}: ref {entry.ref!r} is used twice")
            refs[entry.ref] = i
    for i, entry in enumerate(entries):
        for text in [*entry.blocked_by, *([entry.parent] if entry.parent else [])]:
            if text in refs:
                continue
            try:
                check_identifier(text)
            except ValueError:
                known = ", ".join(sorted(refs)) or "none"
                raise TrackerInputError(
                    f"{entry_name(entries, i)}: {text!r} is neither an issue identifier "
                    f"nor a ref in this batch (refs: {known})"
                ) from None
            identifier(text)
    return refs
