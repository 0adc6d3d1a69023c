"""The git command: which git a process would run, and its version.

jj drives git itself (colocated repos); ralph-dev asks git only what a person's
setup needs checked (``doctor``): the git jj's processes get, and the git on
the person's own PATH, must both be able to open the repository.
"""

from __future__ import annotations

import shutil

from ralph_dev.adapters.process import CommandResult, run_command


def find_git(path: str | None = None) -> str | None:
    """The git that a process with this PATH runs (None: no git on it)."""
    return shutil.which("git", path=path)


def git_version(git_bin: str) -> CommandResult:
    return run_command([git_bin, "--version"], timeout=15)
