"""What cluster workers pushed, as the controller's repository fetches it, fenced.

A worker on another host sends its change back only through the git remote, as
``ralph/ISSUE/aN``. The controller fetches those bookmarks into its own repository and
takes, for an issue, only its current attempt's (``core.cluster.mergeable_push``): an
earlier attempt's host may be cut off and still pushing, and what it pushes is kept
for a new attempt to start from, never merged.
"""

from __future__ import annotations

from ralph_dev.adapters.jj_cli import JjCli
from ralph_dev.core import cluster
from ralph_dev.core.ports import WORK_BOOKMARK_PREFIX


class PushedWork:
    """The attempt bookmarks on ``remote``, read through the controller's jj."""

    def __init__(self, jj: JjCli, remote: str = "origin") -> None:
        self.jj = jj
        self.remote = remote

    def fetch(self) -> dict[str, str]:
        """Fetch the workers' bookmarks; bookmark → commit id as the remote has them."""
        self.jj.read("git", "fetch", "--remote", self.remote,
                     "--branch", f"glob:{WORK_BOOKMARK_PREFIX}*")
        listed = self.jj.read(
            "bookmark", "list", "--all-remotes", "-T",
            f'if(remote == "{self.remote}" && normal_target, '
            'name ++ " " ++ normal_target.commit_id() ++ "\\n")').lines()
        return dict(line.split(" ", 1) for line in listed if " " in line)

    def mergeable(self, issue: str, attempt: int) -> str | None:
        """The commit the controller may merge for ``issue`` now: its current attempt's
        push, fetched; None while that attempt has pushed nothing."""
        pushed = self.fetch()
        bookmark = cluster.mergeable_push(issue, attempt, pushed)
        return pushed[bookmark] if bookmark is not None else None
