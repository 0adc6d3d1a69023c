"""ralph-dev's home in a repository: its own workspaces, where its repo-level jj writes run.

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

Everything the jj parts share about those workspaces lives here: their paths
(names checked), jj's list of them, snapshots (a stale one repaired first), the
markers of an add or forget in progress, and the merge intents (``jj_guard``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import structlog

from ralph_dev.adapters.jj_cli import FIELD_SEP, JjCli, JJError, is_stale, refused_paths
from ralph_dev.adapters.jj_guard import INTENTS_DIR, IntentStore
from ralph_dev.adapters.process import CommandResult

log = structlog.get_logger(__name__)

BASE_WORKSPACE = "ralph-base"
"""ralph-dev's own workspace at ``<root>/.ralph-base`` (the dot keeps it apart from
every worker workspace name)."""
WORKSPACE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class InvalidWorkspaceName(JJError, ValueError):
    """A workspace name that is not a plain ``[A-Za-z0-9._-]`` word inside the root."""


class JjHome:
    """The repository as ralph-dev may touch it: its own workspaces, never the person's."""

    def __init__(self, cli: JjCli, workspace_root: Path) -> None:
        self.cli = cli
        self.root = Path(workspace_root)
        self.intents = IntentStore(self.root / INTENTS_DIR)
        """Merge intents, kept until a merge ends (``jj_guard``)."""

    # -- paths --

    def path(self, name: str) -> Path:
        """``<root>/NAME``, refusing any name that could leave the root or confuse jj."""
        if not isinstance(name, str) or not WORKSPACE_NAME_RE.fullmatch(name):
            shown = name if isinstance(name, str) else repr(name)
            raise InvalidWorkspaceName(
                f"{shown[:40]!r} is not a usable workspace name: use letters, digits, '.', '_' "
                "or '-', starting with a letter or digit (issue identifiers such as ENG-12 are)"
            )
        root = self.root.resolve()
        path = (root / name).resolve()
        if path.parent != root:
            raise InvalidWorkspaceName(
                f"workspace {name!r} would be at {path}, outside {root}: "
                "remove the symlink or choose another name"
            )
        return path

    def pending(self, operation: str, name: str) -> Path:
        """Present while ralph-dev's ``add`` or ``forget`` of NAME has not finished: a
        directory such an operation leaves behind when killed is known to be ours."""
        return self.root / ".ralph-pending" / operation / name

    def listed(self) -> dict[str, Path]:
        """Every workspace jj knows in the repository, by name (the person's too)."""
        out = self.cli.read("workspace", "list", "-T",
                            f'name ++ "{FIELD_SEP}" ++ root ++ "\\n"')
        found: dict[str, Path] = {}
        for line in out.lines():
            name, _, root = line.partition(FIELD_SEP)
            found[name] = Path(root)
        return found

    def require(self, name: str) -> Path:
        """Workspace NAME's directory, or why there is none to work in."""
        path = self.path(name)
        if name not in self.listed():
            raise JJError(
                f"there is no jj workspace {name!r} in {self.cli.repo}: it was never added or "
                "was forgotten"
            )
        if not path.is_dir():
            raise self.gone(name, path)
        return path

    def gone(self, name: str, path: Path) -> JJError:
        """jj knows workspace NAME but its directory was deleted: how to let it go."""
        return JJError(
            f"workspace {name!r} is known to jj but {path} is gone: run "
            f"`jj workspace forget {name}` in {self.cli.repo} (its commits stay in the repo)"
        )

    # -- the base workspace --

    def base(self) -> Path:
        """``<root>/.ralph-base``, made on first use (and again if someone deleted it)."""
        path = (self.root / f".{BASE_WORKSPACE}").resolve()
        if (path / ".jj").is_dir():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            shutil.rmtree(path)  # ours, and never holds files: a half-made base
        registered = BASE_WORKSPACE in self.listed()
        name = f"{BASE_WORKSPACE}-new" if registered else BASE_WORKSPACE
        # Run from the repo root, so with --ignore-working-copy (see JjCli.run): jj
        # registers the workspace with an empty @ on the root commit and then,
        # unable to update a working copy, exits 1 — which is all a base needs.
        # Whether it worked is judged by asking the new workspace, not by that exit.
        added = self.cli.run("workspace", "add", "--no-colocate", "--name", name,
                             "-r", "root()", str(path))
        if not (path / ".jj").is_dir() or not self.cli.run("log", "--no-graph", "-r", "@", "-T",
                                                           "commit_id", cwd=path).ok:
            added.check()
            raise JJError(f"jj could not make ralph-dev's workspace {path}: "
                          f"{added.stderr.strip() or 'no output'}")
        if registered:  # the old base's directory was deleted: take over its name
            self.cli.run("workspace", "forget", BASE_WORKSPACE, cwd=path).check()
            self.cli.run("workspace", "rename", BASE_WORKSPACE, cwd=path).check()
        log.info("jj_base_workspace_added", path=str(path))
        return path

    def add(self, name: str, path: Path, revset: str) -> CommandResult:
        """``jj workspace add`` of a full, non-colocated workspace, run from the base."""
        path.parent.mkdir(parents=True, exist_ok=True)
        return self.cli.run("workspace", "add", "--no-colocate", "--sparse-patterns", "full",
                            "--name", name, "-r", revset, str(path), cwd=self.base())

    def forget(self, name: str) -> None:
        """Unregister workspace ``name`` (its directory is the caller's business)."""
        self.cli.run("workspace", "forget", name, cwd=self.base()).check()
        if (self.cli.repo / ".git" / "worktrees").is_dir():
            self._prune_git_worktrees()

    def _prune_git_worktrees(self) -> None:
        """Drop git's record of worktrees whose directory is gone.

        Only workspaces made by earlier ralph-dev versions (colocated: git
        worktrees) have one; ``jj workspace forget`` cannot unregister the worktree of a
        directory someone already deleted. Run through ``jj util exec`` so jj
        stays the one tool this module starts, with the same PATH (so a git
        that can read such a repository).
        """
        self.cli.run("util", "exec", "--", "git", "worktree", "prune")

    # -- snapshots --

    def run_fresh(self, *args: str, cwd: Path) -> CommandResult:
        """Run a jj command that needs the working copy at ``cwd`` up to date: a stale one
        (left by a command killed mid-rewrite, or another workspace's rewrite) is repaired
        first and the command run again, so a killed merge is retried and lands."""
        result = self.cli.run(*args, cwd=cwd)
        if is_stale(result):
            log.info("jj_workspace_stale_repaired", workspace=cwd.name, before=args[0])
            self.cli.run("workspace", "update-stale", cwd=cwd).check()
            result = self.cli.run(*args, cwd=cwd)
        return result

    def snapshot(self, path: Path) -> list[str]:
        """Snapshot the working copy at ``path``, repairing it first if it is stale;
        the paths jj refused to record (bigger than ``snapshot.max-new-file-size``)."""
        result = self.run_fresh("util", "snapshot", cwd=path)
        refused = refused_paths(result.check().stderr)
        if refused:
            log.warning("jj_snapshot_refused", workspace=path.name, paths=refused[:10])
        return refused

    # -- the person's git --

    @property
    def colocated(self) -> bool:
        """Whether the person has a git checkout at the repo root that should see trunk."""
        return (self.cli.repo / ".git").exists()

    def import_from_git(self, cwd: Path) -> None:
        """Take in what the person committed with git (e.g. on trunk's branch) first."""
        if self.colocated:
            self.run_fresh("git", "import", cwd=cwd).check()

    def export_to_git(self, cwd: Path) -> None:
        """Make the person's git see the bookmarks (trunk's branch) where jj has them.

        Run from one of ralph-dev's workspaces, so jj touches no working copy,
        index or HEAD of the person's — except that a HEAD attached to a moved
        branch is detached at the same commit, which is what keeps the person's
        checkout exactly as it was.
        """
        if self.colocated:
            result = self.run_fresh("git", "export", cwd=cwd).check()
            if "Failed to export" in result.stderr:
                log.warning("jj_git_export_incomplete", detail=result.stderr.strip()[:500])
