"""The git command: which git a process would run, its version, and what ralph-dev asks
the person's git about their repository.

jj drives git itself (colocated repos); ralph-dev asks git only read-only
questions a person's setup needs answered: the git jj's processes get and the
git on the person's own PATH must both be able to open the repository
(``doctor``), and which branch the person's checkout is on (``init`` takes it
as trunk). Nothing here writes to the repository, not even git's index.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ralph_dev.adapters.process import CommandResult, run_command


def find_git(path: str | None = None) -> str | None:
    """The git that a process with this PATH runs (None: no git on it)."""
    return shutil.which("git", path=path)


def git_version(git_bin: str) -> CommandResult:
    return run_command([git_bin, "--version"], timeout=15)


def git_toplevel(repo: Path, git_bin: str) -> CommandResult:
    """``git rev-parse --show-toplevel`` in ``repo``: where the checkout ``repo`` is in
    starts, or git's reason it cannot open it (e.g. an unknown repository extension)."""
    return run_command([git_bin, "-C", str(repo), "rev-parse", "--show-toplevel"], timeout=15)


def git_head_branch(repo: Path, git_bin: str) -> str | None:
    """The branch the checkout's HEAD is on (None: detached, or no git repository)."""
    result = run_command([git_bin, "-C", str(repo), "symbolic-ref", "--quiet", "--short",
                          "HEAD"], timeout=15)
    return result.stdout.strip() or None if result.ok else None


def git_remote_url(repo: Path, remote: str, git_bin: str = "git") -> str | None:
    """The URL of the repository's git remote ``remote`` (None: no such remote, or no
    git repository): the default remote a cluster's hosts fetch from and push to."""
    result = run_command([git_bin, "-C", str(repo), "remote", "get-url", "--", remote],
                         timeout=15)
    return result.stdout.strip() or None if result.ok else None
