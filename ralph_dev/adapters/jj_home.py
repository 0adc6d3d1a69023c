"""ralph-dev's home in a repository: where its repo-level jj writes run.

The person's checkout (the repo root, jj's ``default`` workspace) is never a
place ralph-dev runs jj with a working copy, and in a colocated repo not even
a place for a jj *write*: every transaction there also exports to git, which
resets the person's git index (staged files become unstaged) and may move
their HEAD. So ralph-dev keeps a workspace of its own, ``<root>/.ralph-base``
(no files: its ``@`` is an empty child of the root commit), and runs every
repo-level write — adding, forgetting, bookmarks — from there. Workspaces are
added with ``--no-colocate``: a colocated one is a git worktree whose
``extensions.relativeWorktrees`` makes every git older than 2.48 (Debian 12's
2.39) refuse the whole repository.

Workspaces that are not colocated do not sync with git by themselves, so
trunk is exported to the person's git explicitly after it moves (and the
person's own git commits imported before): ``git log main`` shows the merged
work, and a git HEAD attached to trunk's branch is detached where it was
(jj does this) instead of having the work appear reverted in ``git status``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import structlog

from ralph_dev.adapters.jj_cli import JjCli, JJError, JJResult

log = structlog.get_logger(__name__)

BASE_WORKSPACE = "ralph-base"
"""ralph-dev's own workspace at ``<root>/.ralph-base`` (the dot keeps it apart from
every worker workspace name)."""
FIELD_SEP = "\x1f"  # field separator in our templates (never in names we accept)


class JjHome(JjCli):
    """The repository as ralph-dev may touch it: its own workspaces, never the person's."""

    def __init__(
        self,
        repo: Path,
        workspace_root: Path,
        *,
        jj_bin: str | None = None,
        user: tuple[str, str] = ("ralph-dev", "ralph-dev@localhost"),
    ) -> None:
        super().__init__(repo, jj_bin=jj_bin, user=user)
        self.workspace_root = Path(workspace_root)

    def owns_checkout(self, where: Path) -> bool:
        root = self.workspace_root.resolve()
        return Path(where).resolve().is_relative_to(root) and Path(where).resolve() != root

    def _listed(self) -> dict[str, Path]:
        out = self._read("workspace", "list", "-T", f'name ++ "{FIELD_SEP}" ++ root ++ "\\n"')
        found: dict[str, Path] = {}
        for line in out.lines():
            name, _, root = line.partition(FIELD_SEP)
            found[name] = Path(root)
        return found

    # -- the base workspace --

    def base(self) -> Path:
        """``<root>/.ralph-base``, made on first use (and again if someone deleted it)."""
        path = (self.workspace_root / f".{BASE_WORKSPACE}").resolve()
        if (path / ".jj").is_dir():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            shutil.rmtree(path)  # ours, and never holds files: a half-made base
        registered = BASE_WORKSPACE in self._listed()
        name = f"{BASE_WORKSPACE}-new" if registered else BASE_WORKSPACE
        # Run from the repo root, so with --ignore-working-copy (see JjCli.run): jj
        # registers the workspace with an empty @ on the root commit and then,
        # unable to update a working copy, exits 1 — which is all a base needs.
        # Whether it worked is judged by asking the new workspace, not by that exit.
        added = self.run("workspace", "add", "--no-colocate", "--name", name,
                         "-r", "root()", str(path))
        if not (path / ".jj").is_dir() or not self.run("log", "--no-graph", "-r", "@", "-T",
                                                       "commit_id", cwd=path).ok:
            added.check()
            raise JJError(f"jj could not make ralph-dev's workspace {path}: "
                          f"{added.stderr.strip() or 'no output'}")
        if registered:  # the old base's directory was deleted: take over its name
            self.run("workspace", "forget", BASE_WORKSPACE, cwd=path).check()
            self.run("workspace", "rename", BASE_WORKSPACE, cwd=path).check()
        log.info("jj_base_workspace_added", path=str(path))
        return path

    def _workspace_add(self, name: str, path: Path, revset: str) -> JJResult:
        """``jj workspace add`` of a full, non-colocated workspace, run from the base."""
        path.parent.mkdir(parents=True, exist_ok=True)
        return self.run("workspace", "add", "--no-colocate", "--sparse-patterns", "full",
                        "--name", name, "-r", revset, str(path), cwd=self.base())

    def _workspace_forget(self, name: str) -> None:
        """Unregister workspace ``name`` (its directory is the caller's business)."""
        self.run("workspace", "forget", name, cwd=self.base()).check()
        if (self.repo / ".git" / "worktrees").is_dir():
            self._prune_git_worktrees()

    def _prune_git_worktrees(self) -> None:
        """Drop git's record of worktrees whose directory is gone.

        Only workspaces made by earlier ralph-dev versions (colocated: git
        worktrees) have one; ``jj workspace forget`` cannot unregister the worktree of a
        directory someone already deleted. Run through ``jj util exec`` so jj
        stays the one tool this module starts, with the same PATH (so a git
        that can read such a repository).
        """
        self.run("util", "exec", "--", "git", "worktree", "prune")

    # -- the person's git --

    @property
    def colocated(self) -> bool:
        """Whether the person has a git checkout at the repo root that should see trunk."""
        return (self.repo / ".git").exists()

    def import_from_git(self, cwd: Path) -> None:
        """Take in what the person committed with git (e.g. on trunk's branch) first."""
        if self.colocated:
            self.run("git", "import", cwd=cwd).check()

    def export_to_git(self, cwd: Path) -> None:
        """Make the person's git see the bookmarks (trunk's branch) where jj has them.

        Run from one of ralph-dev's workspaces, so jj touches no working copy,
        index or HEAD of the person's — except that a HEAD attached to a moved
        branch is detached at the same commit, which is what keeps the person's
        checkout exactly as it was.
        """
        if self.colocated:
            result = self.run("git", "export", cwd=cwd).check()
            if "Failed to export" in result.stderr:
                log.warning("jj_git_export_incomplete", detail=result.stderr.strip()[:500])
