"""Workers' jj workspaces: add, list, snapshot, describe, forget.

Each worker gets its own jj workspace ``<workspace_root>/ISSUE`` created from
trunk, so agents never see each other's half-done edits. Traps this is built
around (see ``shared/notes/jj-on-debian12.md``):

* A workspace goes *stale* when another workspace rewrites its ``@`` with
  different content, so every command that rewrites a workspace's commits runs
  inside that workspace, and a snapshot repairs a stale working copy first.
* ``jj workspace forget`` leaves the directory; it is removed, but only once
  the work is safe (in trunk, or kept under a bookmark).
* The person's own working copy is never snapshotted, and no jj write runs in
  it: repo-level writes run in ralph-dev's base workspace (``jj_home``).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ralph_dev.adapters.jj_cli import JJError, quote_revset, refused_paths
from ralph_dev.adapters.jj_home import FIELD_SEP, JjHome
from ralph_dev.core.errors import WorkspaceHookFailed
from ralph_dev.core.model import Workspace

if TYPE_CHECKING:
    from ralph_dev.core.ports import WorkspaceHook

log = structlog.get_logger(__name__)

WORKSPACE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
BOOKMARK_PREFIX = "ralph/"
TRUNK_WORKSPACE = "ralph-trunk"
"""jj workspace where trunk is checked out to verify it after merges.

It lives at ``<root>/.ralph-trunk``: the dot keeps it apart from every valid
worker workspace name, and list_workspaces leaves it out (like every dotted one).
"""
LIST_SEP = "\x1e"  # list separator inside a field



class UnmergeableWork(JJError):
    """The workspace holds what its merge would refuse (files jj did not record,
    conflicts, no change at all): the agent can fix it while it is still running."""

class InvalidWorkspaceName(JJError, ValueError):
    """A workspace name that is not a plain ``[A-Za-z0-9._-]`` word inside the root."""


# --- the adapter ----------------------------------------------------------------


class JJWorkspaces(JjHome):
    """The project's repository and ralph-dev's workspaces in it: add, list, snapshot, forget."""

    def __init__(
        self,
        repo: Path,
        workspace_root: Path,
        trunk: str = "main",
        *,
        jj_bin: str | None = None,
        user: tuple[str, str] = ("ralph-dev", "ralph-dev@localhost"),
    ) -> None:
        super().__init__(repo, workspace_root, jj_bin=jj_bin, user=user)
        self.trunk = trunk

    # -- names and paths --

    @property
    def _trunk(self) -> str:
        return quote_revset(self.trunk)

    @staticmethod
    def bookmark(name: str) -> str:
        return BOOKMARK_PREFIX + name

    def workspace_path(self, name: str) -> Path:
        """``<root>/NAME``, refusing any name that could leave the root or confuse jj."""
        if not isinstance(name, str) or not WORKSPACE_NAME_RE.fullmatch(name):
            shown = name if isinstance(name, str) else repr(name)
            raise InvalidWorkspaceName(
                f"{shown[:40]!r} is not a usable workspace name: use letters, digits, '.', '_' "
                "or '-', starting with a letter or digit (issue identifiers such as ENG-12 are)"
            )
        root = self.workspace_root.resolve()
        path = (root / name).resolve()
        if path.parent != root:
            raise InvalidWorkspaceName(
                f"workspace {name!r} would be at {path}, outside {root}: "
                "remove the symlink or choose another name"
            )
        return path

    # -- repo checks --

    def check_repo(self) -> None:
        """Raise with the fix unless the repo is a jj repo with the trunk bookmark."""
        if not self.repo.is_dir():
            raise JJError(
                f"repository {self.repo} does not exist: create it, or fix `repo` in "
                "ralph-dev's config"
            )
        result = self.run("--ignore-working-copy", "root")
        if result.interrupted or (not result.ok and "no jj repo" not in result.stderr):
            result.check()  # interrupted, or jj could not read it: say what jj said
        if not result.ok:
            is_git = (self.repo / ".git").exists()
            fix = (
                f"run `jj git init --colocate` in {self.repo}"
                if is_git
                else f"run `jj git init` in {self.repo}"
            )
            raise JJError(
                f"{self.repo} is not a jj repository ({result.stderr.strip() or 'no .jj'}): {fix}",
                command=result.argv,
                stderr=result.stderr,
                returncode=result.returncode,
            )
        bookmarks = self.local_bookmarks()
        if self.trunk not in bookmarks:
            raise JJError(f"{self.repo} has no trunk bookmark {self.trunk!r}: "
                          + self.missing_trunk_fix(self.trunk, bookmarks, "set `trunk` in "
                                                   "ralph-dev's config to"))

    # -- workspaces --

    def add_workspace(self, name: str, *, after_create: WorkspaceHook | None = None) -> Path:
        """Create workspace NAME from trunk (or reuse it) and bookmark its change.

        A reused workspace is snapshotted (and repaired if stale) so the new
        agent starts from what is on disk. When ``ralph/NAME`` still holds
        unmerged work (a canceled issue that came back), the new workspace
        starts on top of that work instead of trunk. ``after_create`` runs in a
        workspace this call created (see :meth:`_prepare`).
        """
        path = self.workspace_path(name)
        if self._pending("add", name).exists():
            self._roll_back_add(name, path)
        if not path.exists():
            created = self._add_new_workspace(name, path, after_create)
            if created is not None:
                return created
        listed = self._listed()
        if name in listed:
            if Path(os.path.realpath(listed[name])) != path:
                raise JJError(
                    f"jj already has a workspace {name!r} at {listed[name]}, not under "
                    f"{self.workspace_root}: run `jj workspace forget {name}` in {self.repo} "
                    "if it is no longer used"
                )
            if not path.is_dir():
                raise JJError(
                    f"workspace {name!r} is known to jj but {path} is gone: run "
                    f"`jj workspace forget {name}` in {self.repo} (its commits stay in the repo)"
                )
            log.debug("jj_workspace_reused", workspace=name)
            self._snapshot(path)
            self._ensure_bookmark(name, path)
            return path
        if path.exists() and any(path.iterdir()):
            raise JJError(
                f"{path} exists and is not a jj workspace of {self.repo}: move it away "
                "(it may hold someone's work) and try again"
            )
        created = self._add_new_workspace(name, path, after_create)
        if created is None:
            raise JJError(f"jj already has a workspace named {name!r}: run `jj workspace "
                          f"forget {name}` in {self.repo} if it is no longer used")
        return created

    def _add_new_workspace(self, name: str, path: Path,
                           after_create: WorkspaceHook | None) -> Path | None:
        """``jj workspace add`` from trunk (or a kept ``ralph/NAME``) and bookmark it.

        The common case of every spawn, so it costs three jj calls. Returns None
        when jj already knows a workspace of that name (the caller sorts it out).
        """
        bookmark = self.bookmark(name)
        base = self._trunk
        kept = f"present({quote_revset(bookmark)}) ~ ::{self._trunk}"
        if self._count(None, kept):
            base = quote_revset(bookmark)
            log.info("jj_workspace_resumes_kept_change", workspace=name, bookmark=base)
        marker = self._pending("add", name)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()  # until the add is done: a directory left by a kill is ours to remove
        result = self._workspace_add(name, path, base)
        if not result.ok and "already exists" in result.stderr:
            marker.unlink()  # jj's workspace of that name is not ours to roll back
            return None
        result.check()
        resumed = base == quote_revset(bookmark)  # a kept bookmark already points at the work
        if not resumed:
            self.run("bookmark", "set", "--allow-backwards", bookmark,
                     "-r", f"{quote_revset(name)}@", cwd=path).check()
        log.info("jj_workspace_added", workspace=name, path=str(path))
        if after_create is not None:
            self._prepare(name, path, after_create)
        marker.unlink()  # made and prepared: from now on the directory holds the agent's work
        return path

    def _prepare(self, name: str, path: Path, after_create: WorkspaceHook) -> None:
        """Run ``after_create`` in the new workspace; on any failure remove the workspace
        again, so the next spawn starts over and runs it anew.

        The workspace's ``@`` is a fresh, empty change: anything the hook wrote that
        jj would track (a copied ``.env`` missing from .gitignore) would be merged
        into trunk, so that is a failure too.
        """
        try:
            after_create(path)
            tracked = self.run("diff", "--name-only", "-r", "@", cwd=path).check().lines()
            if tracked:
                shown = ", ".join(tracked[:5]) + (" …" if len(tracked) > 5 else "")
                raise WorkspaceHookFailed(
                    f"the after_create hook wrote files jj tracks in workspace {name} ({shown}); "
                    "they would be merged into trunk: add them to .gitignore (or have the hook "
                    "write only ignored files)", retryable=False)
        except BaseException:
            try:
                self._discard_new_workspace(name, path)
                self._pending("add", name).unlink(missing_ok=True)
                log.info("jj_workspace_discarded", workspace=name, reason="after_create failed")
            except (JJError, OSError) as exc:  # the hook's failure is the one to report
                log.warning("jj_workspace_discard_failed", workspace=name, error=str(exc))
            raise

    def _roll_back_add(self, name: str, path: Path) -> None:
        """Undo an add (or its after_create hook) that was killed half-way (its marker is
        still there): jj may have registered the workspace and written only part of its
        files, and snapshotting that would record trunk's missing files as deleted. No
        agent ever ran there, so the workspace is discarded; the caller adds it anew."""
        log.warning("jj_half_made_workspace_rolled_back", workspace=name, path=str(path))
        self._discard_new_workspace(name, path)
        self._pending("add", name).unlink(missing_ok=True)

    def _discard_new_workspace(self, name: str, path: Path) -> None:
        """Remove a workspace no agent has worked in: its fresh change, its registration,
        the ``ralph/NAME`` bookmark this add set on that change (a kept bookmark of
        earlier work stays), and its directory."""
        if name in self._listed():
            base = self.base()
            fresh = f"{quote_revset(name)}@"
            ours = self._count(None, f"present({quote_revset(self.bookmark(name))}) & {fresh}")
            self.run("abandon", "-r", fresh, cwd=base).check()
            self._workspace_forget(name)
            if ours:
                self.run("bookmark", "delete", self.bookmark(name), cwd=base).check()
        if path.exists():
            shutil.rmtree(path)

    def _pending(self, operation: str, name: str) -> Path:
        """Present while ralph-dev's ``add`` or ``forget`` of NAME has not finished: a
        directory such an operation leaves behind when killed is known to be ours."""
        return self.workspace_root / ".ralph-pending" / operation / name

    def _ensure_bookmark(self, name: str, path: Path) -> None:
        """Keep the worker's change reachable under ``ralph/NAME`` (follows rewrites)."""
        bookmark = self.bookmark(name)
        if not self._count(None, f"present({quote_revset(bookmark)})"):
            self.run("bookmark", "set", "--allow-backwards", bookmark,
                     "-r", f"{quote_revset(name)}@", cwd=path).check()

    def list_workspaces(self) -> list[Workspace]:
        """ralph-dev's workspaces (those under the root) with what decide needs.

        Costs one ``jj log`` over every workspace's ``@`` and its non-trunk
        ancestors, whatever the number of workspaces.
        """
        template = (
            f'commit_id ++ "{FIELD_SEP}" '
            f'++ parents.map(|c| c.commit_id()).join(",") ++ "{FIELD_SEP}" '
            f'++ empty ++ "{FIELD_SEP}" ++ conflict ++ "{FIELD_SEP}" '
            f'++ self.contained_in({quote_revset("::" + self._trunk)}) ++ "{FIELD_SEP}" '
            f'++ working_copies.map(|w| w.name() ++ "=" ++ w.root()).join("{LIST_SEP}") ++ "\\n"'
        )
        revset = f"working_copies() | ({self._trunk}..working_copies())"
        out = self._read("log", "--no-graph", "-r", revset, "-T", template)
        commits: dict[str, tuple[list[str], bool, bool, bool]] = {}
        heads: dict[str, tuple[str, str]] = {}
        for line in out.lines():
            parts = line.split(FIELD_SEP)
            if len(parts) != 6:
                continue
            commit, parents, empty, conflict, in_trunk, wcs = parts
            commits[commit] = (
                [p for p in parents.split(",") if p],
                empty == "true",
                conflict == "true",
                in_trunk == "true",
            )
            for wc in filter(None, wcs.split(LIST_SEP)):
                wname, _, wc_root = wc.partition("=")
                heads[wname] = (commit, wc_root)
        root = self.workspace_root.resolve()
        result: list[Workspace] = []
        for wname, (commit, wroot) in sorted(heads.items()):
            real = Path(os.path.realpath(wroot))
            if wname == "default" or real.parent != root or real.name.startswith("."):
                continue  # the person's, someone else's, or ralph-dev's base and trunk
            unmerged = conflicted = False
            todo, seen = [commit], set()
            while todo:
                c = todo.pop()
                if c in seen or c not in commits:
                    continue
                seen.add(c)
                c_parents, c_empty, c_conflict, c_in_trunk = commits[c]
                if c_in_trunk:
                    continue
                unmerged = unmerged or not c_empty
                conflicted = conflicted or c_conflict
                todo.extend(c_parents)
            result.append(
                Workspace(
                    name=wname,
                    path=wroot,
                    has_unmerged_change=unmerged,
                    conflicted=conflicted,
                )
            )
        return result

    def _require(self, name: str) -> Path:
        path = self.workspace_path(name)
        if name not in self._listed():
            raise JJError(
                f"there is no jj workspace {name!r} in {self.repo}: it was never added or "
                "was forgotten"
            )
        if not path.is_dir():
            raise JJError(
                f"workspace {name!r} is known to jj but {path} is gone: run "
                f"`jj workspace forget {name}` in {self.repo} (its commits stay in the repo)"
            )
        return path

    def snapshot(self, name: str) -> list[str]:
        """Record the worker's files in its change (hooks call this after edits).

        Returns the paths jj refused to record (bigger than its
        ``snapshot.max-new-file-size``); they exist only on disk.
        """
        return self._snapshot(self._require(name))

    def _snapshot(self, path: Path) -> list[str]:
        """Snapshot the working copy at ``path``, repairing it first if it is stale."""
        result = self.run("util", "snapshot", cwd=path)
        if not result.ok and "stale" in result.stderr:
            log.info("jj_workspace_stale_repaired", workspace=path.name)
            self.run("workspace", "update-stale", cwd=path).check()
            result = self.run("util", "snapshot", cwd=path)
        refused = refused_paths(result.check().stderr)
        if refused:
            log.warning("jj_snapshot_refused", workspace=path.name, paths=refused[:10])
        return refused

    def _refuse_if_unrecorded(self, name: str, refused: list[str], doing: str) -> None:
        if refused:
            shown = ", ".join(refused[:5]) + (" …" if len(refused) > 5 else "")
            raise UnmergeableWork(
                f"refusing to {doing} workspace {name}: jj did not record {shown} (too large "
                f"for snapshot.max-new-file-size), so it would be lost; add it to .gitignore, "
                f"remove it, or raise the limit with `jj config set --repo "
                f"snapshot.max-new-file-size SIZE` in {self.repo}"
            )

    def _count(self, path: Path | None, revset: str) -> int:
        """How many commits ``revset`` holds, asked in workspace ``path`` (snapshotting
        it) or, with None, from the repo root without touching any working copy."""
        args = ("log", "--no-graph", "-r", revset, "-T", '"x\\n"')
        if path is None:
            return len(self._read(*args).lines())
        return len(self.run(*args, cwd=path).check().lines())

    def forget(self, name: str, *, keep_bookmark: bool = False,
               before_remove: WorkspaceHook | None = None) -> None:
        """Forget the workspace and remove its directory once its work is safe.

        Safe means: every non-empty change is in trunk, or ``keep_bookmark``
        (a canceled issue) and the newest change is kept under ``ralph/NAME``.
        Already forgotten is fine. A directory that jj does not know is left
        alone: it may hold edits nobody snapshotted. ``before_remove`` runs in
        the directory once it is sure to go (it must not raise). Everything in
        the directory goes with it, build outputs jj ignores included.
        """
        path = self.workspace_path(name)
        marker = self._pending("forget", name)
        if name not in self._listed():
            if path.exists() and marker.exists():
                shutil.rmtree(path)  # our forget died after jj let go: its work was safe
            elif path.exists():
                log.warning("jj_orphan_workspace_dir_kept", workspace=name, path=str(path))
            marker.unlink(missing_ok=True)
            return
        bookmark = self.bookmark(name)
        if path.is_dir():
            self._refuse_if_unrecorded(name, self._snapshot(path), "forget")
        revset_ws = f"{quote_revset(name)}@"
        unmerged = self._count(None, f"({self._trunk}..{revset_ws}) ~ empty()")
        if unmerged and not keep_bookmark:
            raise JJError(
                f"refusing to forget workspace {name}: it would lose work ({unmerged} change(s) "
                f"not in {self.trunk}); merge it first, or forget it as canceled to keep the "
                f"change under bookmark {bookmark}"
            )
        if before_remove is not None and path.is_dir():
            before_remove(path)
        base = self.base()
        if unmerged:
            heads = self._read(
                "log", "--no-graph", "-r",
                f'heads(({self._trunk}..{revset_ws}) ~ (empty() & description(exact:"")))',
                "-T", 'commit_id ++ "\\n"',
            ).lines()
            for i, head in enumerate(heads, start=1):
                kept = bookmark if i == 1 else f"{bookmark}-{i}"
                self.run("bookmark", "set", "--allow-backwards", kept, "-r", head,
                         cwd=base).check()
            log.info("jj_change_kept", workspace=name, bookmark=bookmark)
        else:
            self.run("bookmark", "delete", bookmark, cwd=base)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()  # the work is safe: a directory left by a kill is ours to remove
        self._workspace_forget(name)
        if path.exists():
            shutil.rmtree(path)
        marker.unlink(missing_ok=True)
        log.info("jj_workspace_forgotten", workspace=name, kept=bool(unmerged))
