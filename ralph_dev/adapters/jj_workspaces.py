"""Workers' jj workspaces: add, list, snapshot, describe, diff, conflicts, forget.

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

from ralph_dev.adapters.jj_cli import FIELD_SEP, LIST_SEP, JJError, quote_revset
from ralph_dev.adapters.jj_home import JjHome
from ralph_dev.core.errors import WorkspaceHookFailed
from ralph_dev.core.model import Workspace
from ralph_dev.core.ports import work_bookmark

if TYPE_CHECKING:
    from ralph_dev.core.ports import WorkspaceHook

log = structlog.get_logger(__name__)


class UnmergeableWork(JJError):
    """The workspace holds what its merge would refuse (files jj did not record,
    conflicts, no change at all): the agent can fix it while it is still running."""


def refuse_if_unrecorded(name: str, refused: list[str], doing: str, repo: Path) -> None:
    """Refuse to ``doing`` workspace NAME while files jj refused to record (too large)
    exist only on disk: they would be lost."""
    if refused:
        shown = ", ".join(refused[:5]) + (" …" if len(refused) > 5 else "")
        raise UnmergeableWork(
            f"refusing to {doing} workspace {name}: jj did not record {shown} (too large "
            f"for snapshot.max-new-file-size), so it would be lost; add it to .gitignore, "
            f"remove it, or raise the limit with `jj config set --repo "
            f"snapshot.max-new-file-size SIZE` in {repo}"
        )


# --- the adapter ----------------------------------------------------------------


class JjWorkspaces:
    """Workers' workspaces in the project's repository (the ``Workspaces`` port)."""

    def __init__(self, home: JjHome, trunk: str) -> None:
        self.home = home
        self.cli = home.cli
        self.trunk = trunk
        self._listed: tuple[tuple[str, ...], list[Workspace]] | None = None
        """The last listing and the operation heads it was read at."""

    @property
    def _trunk(self) -> str:
        return quote_revset(self.trunk)

    def workspace_path(self, name: str) -> Path:
        """``<root>/NAME``, refusing any name that could leave the root or confuse jj."""
        return self.home.path(name)

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
        if self.home.pending("add", name).exists():
            self._roll_back_add(name, path)
        if not path.exists():
            created = self._add_new_workspace(name, path, after_create)
            if created is not None:
                return created
        listed = self.home.listed()
        if name in listed:
            if Path(os.path.realpath(listed[name])) != path:
                raise JJError(
                    f"jj already has a workspace {name!r} at {listed[name]}, not under "
                    f"{self.home.root}: run `jj workspace forget {name}` in {self.cli.repo} "
                    "if it is no longer used"
                )
            if not path.is_dir():
                raise self.home.gone(name, path)
            log.debug("jj_workspace_reused", workspace=name)
            self.home.snapshot(path)
            self._ensure_bookmark(name, path)
            return path
        if path.exists() and any(path.iterdir()):
            raise JJError(
                f"{path} exists and is not a jj workspace of {self.cli.repo}: move it away "
                "(it may hold someone's work) and try again"
            )
        created = self._add_new_workspace(name, path, after_create)
        if created is None:
            raise JJError(f"jj already has a workspace named {name!r}: run `jj workspace "
                          f"forget {name}` in {self.cli.repo} if it is no longer used")
        return created

    def _add_new_workspace(self, name: str, path: Path,
                           after_create: WorkspaceHook | None) -> Path | None:
        """``jj workspace add`` from trunk (or a kept ``ralph/NAME``) and bookmark it.

        The common case of every spawn, so it costs two jj calls: the add, whose revset
        picks the kept work if there is any, and the bookmark on the new change (on top of
        the kept work, that moves the bookmark forward onto it), which runs beside the
        caller's next steps unless an ``after_create`` hook is to run (every later jj call
        waits for it). Returns None when jj already knows a workspace of that name (the
        caller sorts it out).
        """
        bookmark = work_bookmark(name)
        base = (f"coalesce(present({quote_revset(bookmark)}) ~ ::{self._trunk}, "
                f"{self._trunk})")
        marker = self.home.pending("add", name)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()  # until the add is done: a directory left by a kill is ours to remove
        result = self.home.add(name, path, base)
        if not result.ok and "already exists" in result.stderr:
            marker.unlink()  # jj's workspace of that name is not ours to roll back
            return None
        result.check()
        if f" {bookmark} " in f" {result.stdout} {result.stderr} ":  # (@-: its kept work)
            log.info("jj_workspace_resumes_kept_change", workspace=name, bookmark=bookmark)
        # the new working copy is recorded as it was just checked out: no snapshot
        bookmark_it = ("--ignore-working-copy", "bookmark", "set", "--allow-backwards",
                       bookmark, "-r", f"{quote_revset(name)}@")
        log.info("jj_workspace_added", workspace=name, path=str(path))
        if after_create is None:
            # the agent's start need not wait for it (a jj process of ~15 ms); the next jj
            # call waits for it, and a reuse of the workspace sets it should it fail
            self.cli.run_beside(*bookmark_it, cwd=path,
                                why=f"{bookmark} is set again when the workspace is next "
                                    "reused; until then its change is in the workspace")
        else:  # a hook that fails takes the workspace and this bookmark away again
            self.cli.run(*bookmark_it, cwd=path).check()
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
            tracked = self.cli.run("diff", "--name-only", "-r", "@", cwd=path).check().lines()
            if tracked:
                shown = ", ".join(tracked[:5]) + (" …" if len(tracked) > 5 else "")
                raise WorkspaceHookFailed(
                    f"the after_create hook wrote files jj tracks in workspace {name} ({shown}); "
                    "they would be merged into trunk: add them to .gitignore (or have the hook "
                    "write only ignored files)", retryable=False)
        except BaseException:
            try:
                self._discard_new_workspace(name, path)
                self.home.pending("add", name).unlink(missing_ok=True)
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
        self.home.pending("add", name).unlink(missing_ok=True)

    def _discard_new_workspace(self, name: str, path: Path) -> None:
        """Remove a workspace no agent has worked in: its fresh change, its registration,
        the ``ralph/NAME`` bookmark this add set on that change (a kept bookmark of
        earlier work stays), and its directory."""
        if name in self.home.listed():
            base = self.home.base()
            fresh = f"{quote_revset(name)}@"
            ours = self.cli.count(f"present({quote_revset(work_bookmark(name))}) & {fresh}")
            self.cli.run("abandon", "-r", fresh, cwd=base).check()
            self.home.forget(name)
            if ours:
                self.cli.run("bookmark", "delete", work_bookmark(name), cwd=base).check()
        if path.exists():
            shutil.rmtree(path)

    def _ensure_bookmark(self, name: str, path: Path) -> None:
        """Keep the worker's change reachable under ``ralph/NAME`` (follows rewrites)."""
        bookmark = work_bookmark(name)
        if not self.cli.count(f"present({quote_revset(bookmark)})"):
            self.cli.run("bookmark", "set", "--allow-backwards", bookmark,
                         "-r", f"{quote_revset(name)}@", cwd=path).check()

    def list_workspaces(self) -> list[Workspace]:
        """ralph-dev's workspaces (those under the root) with what decide needs.

        Costs one ``jj log`` over every workspace's ``@`` and its non-trunk
        ancestors, whatever the number of workspaces; none while the repository's
        operation heads are the ones the last listing was read at (read before it, so
        an operation in between makes the next call read again).
        """
        heads = self.cli.op_heads()
        if heads is not None and self._listed is not None and self._listed[0] == heads:
            return list(self._listed[1])
        listed = self._list_workspaces()
        if heads is not None:
            self._listed = (heads, listed)
        return list(listed)

    def _list_workspaces(self) -> list[Workspace]:
        template = (
            f'commit_id ++ "{FIELD_SEP}" '
            f'++ parents.map(|c| c.commit_id()).join(",") ++ "{FIELD_SEP}" '
            f'++ empty ++ "{FIELD_SEP}" ++ conflict ++ "{FIELD_SEP}" '
            f'++ self.contained_in({quote_revset("::" + self._trunk)}) ++ "{FIELD_SEP}" '
            f'++ working_copies.map(|w| w.name() ++ "=" ++ w.root()).join("{LIST_SEP}") ++ "\\n"'
        )
        revset = f"working_copies() | ({self._trunk}..working_copies())"
        out = self.cli.read("log", "--no-graph", "-r", revset, "-T", template)
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
        root = self.home.root.resolve()
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

    def snapshot(self, name: str) -> list[str]:
        """Record the worker's files in its change (hooks call this after edits).

        Returns the paths jj refused to record (bigger than its
        ``snapshot.max-new-file-size``); they exist only on disk.
        """
        return self.home.snapshot(self.home.require(name))

    def describe(self, name: str, message: str, *, require_change: bool = False) -> None:
        """Set the description of the workspace's working change (snapshotting first).

        Refuses what the merge would refuse — files the snapshot left out (too large),
        conflicted changes — and, with
        ``require_change``, a workspace with no change at all: ``worker done`` then
        tells the agent while it can still fix it."""
        path = self.home.require(name)
        refuse_if_unrecorded(name, self.home.snapshot(path), "finish", self.cli.repo)
        work = f"{self._trunk}..@"
        conflicted = self.cli.count(f"conflicts() & ({work})", path)
        if conflicted:
            files = ", ".join(self.conflicted_files(name)[:20]) or "see `worker diff`"
            raise UnmergeableWork(
                f"refusing to finish workspace {name}: {conflicted} of its change(s) hold "
                f"conflicts, in: {files} (files with conflict markers such as `<<<<<<<`, "
                "`%%%%%%%`, `+++++++`, `>>>>>>>`); edit each conflicted file to the content "
                "you intend, removing the markers, then report done again")
        if require_change and not self.cli.count(f"({work}) ~ empty()", path):
            raise UnmergeableWork(
                f"refusing to finish workspace {name}: it holds no change ({self.trunk} already "
                "has everything in it), so there is nothing to merge; make the change the "
                "issue asks for, or, if it truly needs none, ask a person with `ralph-dev "
                "worker blocked` and say why")
        # `--message=…` so a message starting with '-' is never read as an option;
        # NUL cannot pass through argv at all.
        text = message.replace("\x00", "")
        self.cli.run("describe", "-r", "@", f"--message={text}", cwd=path).check()

    def conflicted_files(self, name: str) -> list[str]:
        """Files still conflicted in the workspace's change as of its last snapshot: what
        a sandboxed resolve worker, which cannot run jj, has left to do."""
        listed = self.cli.run("--ignore-working-copy", "resolve", "--list", "-r",
                              f"{quote_revset(name)}@")
        if not listed.ok:  # "No conflicts found at this revision" (exit 2)
            return []
        return [re.split(r"\s{2,}", line.strip())[0] for line in listed.lines() if line.strip()]

    def change_diff(self, name: str) -> str:
        """The workspace's change against where it left trunk, as of its last snapshot
        (git format): what a sandboxed worker, which cannot run jj, reads as its diff."""
        ws = f"{quote_revset(name)}@"
        return self.cli.read("diff", "--git", "--from", f"fork_point({self._trunk} | {ws})",
                             "--to", ws).stdout

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
        marker = self.home.pending("forget", name)
        if name not in self.home.listed():
            if path.exists() and marker.exists():
                shutil.rmtree(path)  # our forget died after jj let go: its work was safe
            elif path.exists():
                log.warning("jj_orphan_workspace_dir_kept", workspace=name, path=str(path))
            marker.unlink(missing_ok=True)
            return
        bookmark = work_bookmark(name)
        if path.is_dir():
            refuse_if_unrecorded(name, self.home.snapshot(path), "forget", self.cli.repo)
        revset_ws = f"{quote_revset(name)}@"
        unmerged = self.cli.count(f"({self._trunk}..{revset_ws}) ~ empty()")
        if unmerged and not keep_bookmark:
            raise JJError(
                f"refusing to forget workspace {name}: it would lose work ({unmerged} change(s) "
                f"not in {self.trunk}); merge it first, or forget it as canceled to keep the "
                f"change under bookmark {bookmark}"
            )
        if before_remove is not None and path.is_dir():
            before_remove(path)
        base = self.home.base()
        if unmerged:
            heads = self.cli.read(
                "log", "--no-graph", "-r",
                f'heads(({self._trunk}..{revset_ws}) ~ (empty() & description(exact:"")))',
                "-T", 'commit_id ++ "\\n"',
            ).lines()
            for i, head in enumerate(heads, start=1):
                kept = bookmark if i == 1 else f"{bookmark}-{i}"
                self.cli.run("bookmark", "set", "--allow-backwards", kept, "-r", head,
                             cwd=base).check()
            log.info("jj_change_kept", workspace=name, bookmark=bookmark)
        else:
            self.cli.run("bookmark", "delete", bookmark, cwd=base)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()  # the work is safe: a directory left by a kill is ours to remove
        self.home.forget(name)
        if path.exists():
            shutil.rmtree(path)
        marker.unlink(missing_ok=True)
        log.info("jj_workspace_forgotten", workspace=name, kept=bool(unmerged))
