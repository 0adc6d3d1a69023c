"""``ralph-dev init``'s look at the repository: can ralph-dev work in it, and which
bookmark is trunk?

A person's project is usually a plain git repository. ralph-dev works through
jj, beside git: ``--colocate`` makes the repository a colocated jj repository
(``jj git init --colocate``, the person's git keeps working and sees merged
work on its branch), and without it init says so and changes nothing. Trunk is
what the person works on — the branch git's HEAD is on, else a ``main`` /
``master`` / ``trunk`` bookmark — and init says which it took and why. Every
refusal names a fix that works when followed as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ralph_dev.adapters.git import find_git, git_head_branch, git_toplevel
from ralph_dev.adapters.jj_cli import JjCli
from ralph_dev.core.errors import ConfigError

TRUNK_NAMES = ("main", "master", "trunk")
"""Bookmarks taken as trunk when git's HEAD names no branch, in this order."""


@dataclass(frozen=True)
class RepoFindings:
    trunk: str
    notes: tuple[str, ...]
    """What init found and did, one line each, for the person to read."""


def prepare_repo(repo: Path, *, trunk: str | None, colocate: bool,
                 jj_bin: str | None = None) -> RepoFindings:
    """Check ``repo`` (making it a colocated jj repo when asked) and settle trunk.

    Raises :class:`ConfigError` with the fix when ralph-dev cannot work there.
    """
    if not repo.is_dir():
        raise ConfigError(f"--repo {repo}: no such directory; create the repository first")
    jj = JjCli(repo, jj_bin=jj_bin, user=None)  # the person's own identity, if anything
    notes: list[str] = []
    root = jj.run("root")
    if not root.ok:
        _colocate_git_repo(jj, colocate)
        notes.append(f"made {repo} a colocated jj repository (ran `jj git init --colocate`): "
                     "your files and git are as they were; jj keeps its data in .jj/")
    elif Path(root.stdout.strip()).resolve() != repo.resolve():
        raise ConfigError(f"--repo {repo} is inside the jj repository {root.stdout.strip()}: "
                          f"use --repo {root.stdout.strip()}")
    elif colocate:
        notes.append(f"{repo} is already a jj repository: --colocate changed nothing")
    bookmarks = jj.local_bookmarks()
    chosen, why = (trunk, "as given") if trunk else _detect_trunk(jj, bookmarks)
    if chosen is None or chosen not in bookmarks:
        missing = chosen or "main"
        what = (f"no bookmark {missing!r}" if chosen else
                "no trunk: git's HEAD is on no branch and there is no main or master bookmark")
        raise ConfigError(f"{repo} has {what}; "
                          + jj.missing_trunk_fix(missing, bookmarks, "pass --trunk with"))
    notes.append(f"trunk: {chosen} ({why}); finished work is merged there")
    return RepoFindings(chosen, tuple(notes))


def _colocate_git_repo(jj: JjCli, colocate: bool) -> None:
    """``repo`` is no jj repository: colocate a git repository there, or say what to do."""
    repo = jj.repo
    git = find_git()
    top = git_toplevel(repo, git) if git else None
    if top is None or not top.ok:
        raise ConfigError(
            f"{repo} is not a repository: make it one with a first commit and a trunk, "
            f"e.g. `jj git init && jj commit -m 'initial commit' && jj bookmark create main "
            f"-r @-` in {repo}")
    if Path(top.stdout.strip()).resolve() != repo.resolve():
        raise ConfigError(f"--repo {repo} is inside the git repository {top.stdout.strip()}: "
                          f"use --repo {top.stdout.strip()}")
    if not colocate:
        raise ConfigError(
            f"{repo} is a git repository but not a jj one, and ralph-dev works through jj "
            "beside git (your git keeps working and sees the merged work on its branch): "
            "run init again with --colocate to make it a colocated jj repository (it runs "
            f"`jj git init --colocate` in {repo}), or run that yourself first")
    jj.colocate()


def _detect_trunk(jj: JjCli, bookmarks: list[str]) -> tuple[str | None, str]:
    """Trunk as the person has it, and why that one."""
    git = find_git()
    branch = git_head_branch(jj.repo, git) if git and (jj.repo / ".git").exists() else None
    if branch and branch in bookmarks:
        return branch, "the branch git's HEAD is on"
    for name in TRUNK_NAMES:
        if name in bookmarks:
            return name, f"the repository's {name!r} bookmark"
    return None, ""
