"""What cluster workers pushed, as the controller's repository fetches it, fenced.

A worker on another host sends its change back only through the git remote, as
``ralph/ISSUE/aN``. The controller fetches those bookmarks into its own repository and
takes, for an issue, only its current attempt's (``core.cluster.mergeable_push``): an
earlier attempt's host may be cut off and still pushing, and what it pushes is kept
for a new attempt to start from, never merged.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from ralph_dev.adapters.jj_cli import JjCli
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.ports import WORK_BOOKMARK_PREFIX

log = structlog.get_logger(__name__)


class PushedWork:
    """The attempt bookmarks on ``remote``, read through the controller's jj."""

    def __init__(self, jj: JjCli, remote: str = "origin") -> None:
        self.jj = jj
        self.remote = remote

    def fetch(self, cwd: Path | None = None) -> dict[str, str]:
        """Fetch the workers' bookmarks (in ``cwd``, a workspace of ralph-dev's own: a
        jj write at a colocated repository's root resets the person's git index);
        bookmark → commit id as the remote has them."""
        args = ("git", "fetch", "--remote", self.remote,
                "--branch", f"glob:{WORK_BOOKMARK_PREFIX}*")
        if cwd is None:
            self.jj.read(*args)
        else:
            self.jj.run(*args, cwd=cwd).check()
        listed = self.jj.read(
            "bookmark", "list", "--all-remotes", "-T",
            f'if(remote == "{self.remote}" && normal_target, '
            'name ++ " " ++ normal_target.commit_id() ++ "\\n")').lines()
        return dict(line.split(" ", 1) for line in listed if " " in line)


def remote_named(jj: JjCli, url: str, preferred: str) -> str:
    """The controller repository's git remote whose URL is the cluster's ``url``
    (``preferred`` first); the fix when there is none."""
    listed = jj.read("git", "remote", "list").lines()
    found = dict(line.split(" ", 1) for line in listed if " " in line)
    if found.get(preferred) == url:
        return preferred
    for name, where in sorted(found.items()):
        if where == url:
            return name
    raise ConfigError(
        f"cluster.remote: {url} is none of {jj.repo}'s git remotes, and the controller "
        f"fetches workers' pushes through one: add it (`jj git remote add cluster {url}` "
        "in the repository), or leave cluster.remote out to use merge.remote's")


