"""Names a cluster's workers and their pushed work go by, and which push may be merged.

On one host a worker is its tmux window, named by its issue. On a cluster a worker
attempt is a named actor on some host, and its code comes back as a git bookmark;
both names carry the attempt, because a host cut off by the network may still run
an earlier attempt, and the name is the only thing that tells its work apart from
the current one's (the fence). Pure: the adapters and the controller share it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import PurePath

from ralph_dev.core.model import IDENTIFIER_RE
from ralph_dev.core.ports import WORK_BOOKMARK_PREFIX

BASE_BOOKMARK = "ralph-trunk"
"""Where the controller pushes trunk for the hosts: a new attempt starts from it, so it
sees every change merged before it started. Its own name, so the remote's trunk branch
(a person's) is never moved by ralph-dev."""

SLOT_RESOURCE = "ralph_worker"
"""The Ray custom resource that counts a host's worker slots (``ray start
--resources='{"ralph_worker": 4}'``); each worker attempt holds one."""

_ACTOR_RE = re.compile(r"(?P<project>[^:#]+):(?P<issue>[^:#]+)#(?P<attempt>\d+)")
_PUSH_RE = re.compile(r"(?P<issue>[^/]+)/a(?P<attempt>\d+)")


LEASE_MARGIN = 5.0
"""Seconds past an attempt's lease before the controller starts the issue's next
attempt: its host stops the agent at ``LEASE_STOP`` (0.75) of the lease after the last
call it heard, which may be a call whose answer the controller never saw (one
long-poll, 3 s, after the last that came back)."""


def lease_ends(renewed_at: datetime, lease: float) -> datetime:
    """When an attempt whose host last answered a call sent at ``renewed_at`` has
    surely stopped its agent, whatever became of the host."""
    return renewed_at + timedelta(seconds=lease + LEASE_MARGIN)


def actor_name(project: str, issue: str, attempt: int) -> str:
    """``PROJECT:ISSUE#ATTEMPT``: unique cluster-wide, so Ray itself refuses a second
    actor for one attempt, and a new attempt never waits for a dead one's name."""
    return f"{project}:{issue}#{int(attempt)}"


def parse_actor_name(name: str, project: str) -> tuple[str, int] | None:
    """(issue, attempt) of one of ``project``'s worker actors; None for any other name
    (another project's, or a person's own actor)."""
    found = _ACTOR_RE.fullmatch(name)
    if found is None or found["project"] != project \
            or not IDENTIFIER_RE.fullmatch(found["issue"]):
        return None
    return found["issue"], int(found["attempt"])


def attempt_bookmark(issue: str, attempt: int) -> str:
    """``ralph/ISSUE/aN``: where attempt N of an issue pushes its change."""
    return f"{WORK_BOOKMARK_PREFIX}{issue}/a{int(attempt)}"


def pushed_attempts(issue: str, bookmarks: Iterable[str]) -> dict[int, str]:
    """Attempt → bookmark, for the attempt bookmarks of ``issue`` among ``bookmarks``."""
    found: dict[int, str] = {}
    for name in bookmarks:
        if not name.startswith(WORK_BOOKMARK_PREFIX):
            continue
        match = _PUSH_RE.fullmatch(name.removeprefix(WORK_BOOKMARK_PREFIX))
        if match is not None and match["issue"] == issue:
            found[int(match["attempt"])] = name
    return found


def mergeable_push(issue: str, current_attempt: int, bookmarks: Iterable[str]) -> str | None:
    """The one pushed bookmark that may be merged for ``issue``: its current attempt's.

    Every other attempt's push is kept (a new attempt may start from it) but never
    merged: its actor may be alive behind a partition, and two attempts landing is
    exactly what the fence is for.
    """
    return pushed_attempts(issue, bookmarks).get(int(current_attempt))


def resume_point(issue: str, attempt: int, bookmarks: Iterable[str]) -> str | None:
    """Where attempt ``attempt`` starts from: the latest earlier attempt's push (the
    last snapshot a lost host shipped), else None (trunk)."""
    earlier = {n: b for n, b in pushed_attempts(issue, bookmarks).items() if n < attempt}
    return earlier[max(earlier)] if earlier else None


def latest_push(issue: str, bookmarks: Iterable[str]) -> str | None:
    """The newest attempt's push, fenced or not: what a canceled issue keeps."""
    pushed = pushed_attempts(issue, bookmarks)
    return pushed[max(pushed)] if pushed else None


def session_folder(cwd: PurePath) -> str | None:
    """The folder of ``~/.claude/projects`` Claude Code keeps a directory's sessions in:
    the path, each character but letters and digits made ``-``; None for a path over
    the 200 characters it keeps as they are (it hashes the rest). An attempt's
    workspace has a path of its own on each host: a session resumed there goes in its
    folder."""
    folder = "".join(c if c.isascii() and c.isalnum() else "-" for c in str(cwd))
    return folder if len(folder) <= 200 else None
