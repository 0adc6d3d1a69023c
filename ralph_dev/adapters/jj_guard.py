"""The merge guard: trunk never moves to anything but the issue's own work on top of it.

Whatever happened to a workspace before its merge — a ``jj rebase`` killed
after it moved the workspace's git HEAD but before it committed its
operation, a person's stray ``git reset``, a half-written working copy — jj may
adopt the on-disk tree on top of a newer commit as a nameless change that
silently reverts other issues' work. So before the rebase, the merge records
its *intent* (the commit the work forked from, and the paths the issue's own
work touches, both read from jj's committed view); before trunk moves, it
checks that trunk only moves forward to a descendant and that the step from
trunk to the new head touches nothing outside those paths. A merge that
would is refused, with the evidence, and trunk is left alone.

The intent is a small JSON file kept until the merge ends one way or the
other, so an attempt killed half-way is finished later against what was
recorded before anything was rewritten, not against the damage.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ralph_dev.adapters.files import atomic_write_text
from ralph_dev.adapters.jj_cli import JJError

INTENTS_DIR = ".ralph-merge"
"""Under the workspace root: the dot keeps it apart from every worker workspace."""


class MergeRefused(JJError):
    """Moving trunk would change something that is not the issue's own work."""

    retryable = False


@dataclass(frozen=True)
class MergeIntent:
    name: str
    fork: str
    """Commit on trunk's history the issue's work started from."""
    trunk: str
    """Trunk's commit when the intent was recorded."""
    paths: tuple[str, ...]
    """Every path the issue's own work touches (relative to ``fork``)."""


class IntentStore:
    """Merge intents on disk, one JSON file per workspace, written atomically."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _file(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def load(self, name: str) -> MergeIntent | None:
        try:
            data = json.loads(self._file(name).read_text(encoding="utf-8"))
            return MergeIntent(name=name, fork=str(data["fork"]), trunk=str(data["trunk"]),
                               paths=tuple(str(p) for p in data["paths"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise MergeRefused(
                f"the merge intent of {name} ({self._file(name)}) is unreadable ({exc}); "
                "it is what guards trunk after an interrupted merge, so nothing merges "
                f"until a person checks workspace {name} and deletes that file"
            ) from exc

    def save(self, intent: MergeIntent) -> None:
        atomic_write_text(self._file(intent.name), json.dumps(asdict(intent), indent=1) + "\n",
                          mode=0o600)

    def clear(self, name: str) -> None:
        self._file(name).unlink(missing_ok=True)


def foreign_paths(changed: set[str], intent: MergeIntent) -> list[str]:
    """Paths trunk → new head would change that the issue's work never touched."""
    return sorted(changed - set(intent.paths))


def refusal(name: str, *, trunk_name: str, trunk: str, head: str, extra: list[str],
            repo: Path, workspace: Path) -> MergeRefused:
    shown = ", ".join(extra[:10]) + (f" and {len(extra) - 10} more" if len(extra) > 10 else "")
    return MergeRefused(
        f"refusing to move trunk for {name}: the step from trunk ({trunk[:12]}) to its "
        f"rebased work ({head[:12]}) would also change {shown}, which {name}'s own work never "
        f"touched (it would revert or delete other work). Trunk is untouched. To fix: in "
        f"{workspace} run `jj log -r '{trunk_name}..@'` and `jj diff -r <change> --stat` to find "
        "the change that is not this issue's work, `jj abandon <change>` it (or restore the "
        "files), then ask ralph-dev to retry (label the issue user-feedback-given). "
        f"Repository: {repo}."
    )
