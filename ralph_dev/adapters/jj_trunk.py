"""Trunk: the bookmark merges go to, a checkout of it for verifying, and its history.

Everything here reads trunk without touching any working copy, except the
checkout, which is a workspace of ralph-dev's own (``<root>/.ralph-trunk``), so
verifying trunk never touches a worker's or the person's files.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from ralph_dev.adapters.jj_cli import FIELD_SEP, LIST_SEP, JJError, quote_revset
from ralph_dev.adapters.jj_home import JjHome
from ralph_dev.core.model import TrunkChange

TRUNK_WORKSPACE = "ralph-trunk"
"""jj workspace where trunk is checked out to verify it after merges.

It lives at ``<root>/.ralph-trunk``: the dot keeps it apart from every valid
worker workspace name, and list_workspaces leaves it out (like every dotted one).
"""

LANE_WORKSPACE = "ralph-lane"
"""jj workspace where the merge lane checks out a batch of changes together to verify
them (``<root>/.ralph-lane``, left out of list_workspaces like the trunk's); its
verifies beside it (``merge.parallel_verifies``) have ``ralph-lane-1`` and on."""


def lane_workspace(slot: int) -> str:
    """The lane's checkout for its ``slot``-th verify at once (0: the batch's own)."""
    return LANE_WORKSPACE if slot == 0 else f"{LANE_WORKSPACE}-{slot}"


def is_lane_workspace(name: str) -> bool:
    return name == LANE_WORKSPACE or name.startswith(f"{LANE_WORKSPACE}-")


class JjTrunk:
    """The project's trunk bookmark (the ``Trunk`` port), and whether the repository
    has one at all."""

    def __init__(self, home: JjHome, name: str) -> None:
        self.home = home
        self.cli = home.cli
        self.name = name

    @property
    def revset(self) -> str:
        return quote_revset(self.name)

    def check_repo(self) -> None:
        """Raise with the fix unless the repo is a jj repo with the trunk bookmark."""
        repo = self.cli.repo
        if not repo.is_dir():
            raise JJError(
                f"repository {repo} does not exist: create it, or fix `repo` in "
                "ralph-dev's config"
            )
        result = self.cli.run("--ignore-working-copy", "root")
        if result.interrupted or (not result.ok and "no jj repo" not in result.stderr):
            result.check()  # interrupted, or jj could not read it: say what jj said
        if not result.ok:
            is_git = (repo / ".git").exists()
            fix = f"run `jj git init --colocate` in {repo}" if is_git \
                else f"run `jj git init` in {repo}"
            raise JJError(
                f"{repo} is not a jj repository ({result.stderr.strip() or 'no .jj'}): {fix}",
                command=result.argv,
                stderr=result.stderr,
                returncode=result.returncode,
            )
        bookmarks = self.cli.local_bookmarks()
        if self.name not in bookmarks:
            raise JJError(f"{repo} has no trunk bookmark {self.name!r}: "
                          + self.cli.missing_trunk_fix(self.name, bookmarks, "set `trunk` in "
                                                       "ralph-dev's config to"))

    def trunk_commit(self) -> str:
        """The commit trunk points at (read without touching any working copy)."""
        return self.cli.read("log", "--no-graph", "-r", self.revset, "-T",
                             "commit_id").stdout.strip()

    def trunk_checkout(self) -> Path:
        """A directory holding trunk's current files (for the verify command).

        A workspace of its own, so verifying never touches a worker's or the
        person's working copy. Whatever the verify command wrote there last time
        was snapshotted into a scratch change; that change is abandoned.
        """
        path = self._scratch_workspace(TRUNK_WORKSPACE, self.revset)
        if path is None:
            return (self.home.root / f".{TRUNK_WORKSPACE}").resolve()
        on_trunk = self.cli.count(f"@- & {self.revset}", path) and not self.cli.count(
            "@ ~ empty()", path
        )
        if not on_trunk:
            self._check_out(path, [self.revset])
        return path

    def lane_checkout(self, heads: Sequence[str], slot: int = 0) -> tuple[Path, str]:
        """A directory holding the changes ``heads`` (each rebased onto trunk) together:
        a merge of them, checked out in a workspace of ralph-dev's own (the merge lane's
        verify of a batch; ``slot``: which of the lane's verifies at once); with the
        commit checked out."""
        revs = [quote_revset(h) for h in heads]
        name = lane_workspace(slot)
        path = self._scratch_workspace(name, revs[0])
        if path is None:
            path = (self.home.root / f".{name}").resolve()
        self._check_out(path, revs)
        commit = self.cli.run("log", "--no-graph", "-r", "@", "-T", "commit_id",
                              cwd=path).check().stdout.strip()
        return path, commit

    def release_lane(self) -> None:
        """The lane's checkouts back on trunk: no commit of ralph-dev's sits on top of a
        change that goes back to its worker, or that lands."""
        for name in self.home.listed():
            path = (self.home.root / f".{name}").resolve()
            if is_lane_workspace(name) and path.is_dir():
                self.home.snapshot(path)
                if self.cli.count(f"@- & {self.revset}", path) == 0 \
                        or self.cli.count("@ ~ empty()", path):
                    self._check_out(path, [self.revset])

    def _scratch_workspace(self, name: str, revset: str) -> Path | None:
        """The path of ralph-dev's own workspace ``name``, snapshotted; None when it was
        just made (at ``revset``)."""
        path = (self.home.root / f".{name}").resolve()
        listed = self.home.listed()
        if name in listed and not path.is_dir():
            self.home.forget(name)  # someone deleted it
            del listed[name]
        if name not in listed:
            if path.exists():
                shutil.rmtree(path)  # ours: a scratch checkout left by a forgotten workspace
            self.home.add(name, path, revset).check()
            return None
        self.home.snapshot(path)
        return path

    def _check_out(self, path: Path, revs: Sequence[str]) -> None:
        """A new empty change on ``revs`` in ralph-dev's workspace at ``path``; what the
        verify command wrote there last time (a scratch change) is abandoned."""
        scratch = f"@ ~ (::{self.revset} | ::({' | '.join(revs)}))"
        old = self.cli.run("log", "--no-graph", "-r", scratch, "-T", "commit_id",
                           cwd=path).check()
        self.cli.run("new", *revs, cwd=path).check()
        if old.stdout:
            # an empty scratch change is already gone (jj drops it on `new`)
            self.cli.run("abandon", "-r", f"{old.stdout} & all()", cwd=path).check()

    def trunk_log(self, limit: int = 50) -> list[str]:
        """Descriptions on trunk, newest first (root commit excluded)."""
        out = self.cli.read(
            "log", "--no-graph", "-r", f"::{self.revset} ~ root()", "--limit", str(int(limit)),
            "-T", 'description ++ "\\x00"',
        )
        return [d.strip() for d in out.stdout.split("\x00")[:-1]]

    def trunk_changes(self, limit: int = 10) -> list[TrunkChange]:
        """Trunk's newest changes with their diff stat (for the dashboard); one jj call,
        read without touching any working copy."""
        stat = "self.diff().stat()"
        template = (
            f'commit_id ++ "{FIELD_SEP}" ++ description.first_line() ++ "{FIELD_SEP}" '
            f'++ committer.timestamp().format("%Y-%m-%dT%H:%M:%S%:z") ++ "{FIELD_SEP}" '
            f'++ {stat}.total_added() ++ "{FIELD_SEP}" '
            f'++ {stat}.total_removed() ++ "{FIELD_SEP}" '
            f'++ self.diff().files().map(|f| f.path()).join("{LIST_SEP}") ++ "\\n"'
        )
        out = self.cli.read("log", "--no-graph", "-r", f"::{self.revset} ~ root()",
                            "--limit", str(max(1, int(limit))), "-T", template)
        changes = []
        for line in out.lines():
            parts = line.split(FIELD_SEP)
            if len(parts) != 6:
                continue
            commit, title, when, added, removed, files = parts
            changes.append(TrunkChange(
                commit=commit, title=title, time=when,
                added=int(added) if added.isdigit() else 0,
                removed=int(removed) if removed.isdigit() else 0,
                files=tuple(f for f in files.split(LIST_SEP) if f),
            ))
        return changes
