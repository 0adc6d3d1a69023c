"""The jj adapter the controller uses: workspaces (``JJWorkspaces``), merges, trunk.

Merge strategy (linear history): the workspace's change(s) are rebased onto
trunk inside the workspace, checked for conflicts, then the trunk bookmark is
moved forward to the newest non-empty change. Trunk therefore contains every
merged change exactly once, one after another, with no merge commits, and no
other workspace's ``@`` is touched (none goes stale). On a conflict, trunk
stays where it was and the workspace holds the conflicted (rebased) change so
a resolve worker can fix it there.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ralph_dev.adapters.jj_cli import JJError, quote_revset
from ralph_dev.adapters.jj_guard import (
    INTENTS_DIR,
    IntentStore,
    MergeIntent,
    MergeRefused,
    foreign_paths,
    refusal,
)
from ralph_dev.adapters.jj_home import FIELD_SEP
from ralph_dev.adapters.jj_workspaces import (
    LIST_SEP,
    TRUNK_WORKSPACE,
    JJWorkspaces,
    UnmergeableWork,
)
from ralph_dev.core.model import MergeResult, TrunkChange

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings

log = structlog.get_logger(__name__)


class JJ(JJWorkspaces):
    """One project's repository: its workspaces, merges into trunk and trunk itself."""

    @property
    def intents(self) -> IntentStore:
        return IntentStore(self.workspace_root / INTENTS_DIR)

    @classmethod
    def from_settings(cls, settings: ProjectSettings, **kwargs: object) -> JJ:
        return cls(settings.repo, settings.workspaces, settings.trunk, **kwargs)  # type: ignore[arg-type]

    def _work_heads(self, path: Path) -> list[str]:
        """Commit ids of the newest changes in the workspace that are not in trunk."""
        # an empty nameless change on top is the agent's scratch @, not work; an empty
        # merge (`jj new h1 h2`) is what joins two lines of work, so it counts
        revset = f"heads(({self._trunk}..@) ~ (empty() & description(exact:\"\") ~ merges()))"
        return self.run(
            "log", "--no-graph", "-r", revset, "-T", 'commit_id ++ "\\n"', cwd=path
        ).check().lines()

    def describe(self, name: str, message: str, *, require_change: bool = False) -> None:
        """Set the description of the workspace's working change (snapshotting first).

        Refuses what the merge would refuse — files the snapshot left out (too large),
        conflicted changes — and, with
        ``require_change``, a workspace with no change at all: ``worker done`` then
        tells the agent while it can still fix it."""
        path = self._require(name)
        self._refuse_if_unrecorded(name, self._snapshot(path), "finish")
        work = f"{self._trunk}..@"
        conflicted = self._count(path, f"conflicts() & ({work})")
        if conflicted:
            files = ", ".join(self.conflicted_files(name)[:20]) or "see `worker diff`"
            raise UnmergeableWork(
                f"refusing to finish workspace {name}: {conflicted} of its change(s) hold "
                f"conflicts, in: {files} (files with conflict markers such as `<<<<<<<`, "
                "`%%%%%%%`, `+++++++`, `>>>>>>>`); edit each conflicted file to the content "
                "you intend, removing the markers, then report done again")
        if require_change and not self._count(path, f"({work}) ~ empty()"):
            raise UnmergeableWork(
                f"refusing to finish workspace {name}: it holds no change ({self.trunk} already "
                "has everything in it), so there is nothing to merge; make the change the "
                "issue asks for, or, if it truly needs none, ask a person with `ralph-dev "
                "worker blocked` and say why")
        # `--message=…` so a message starting with '-' is never read as an option;
        # NUL cannot pass through argv at all.
        text = message.replace("\x00", "")
        self.run("describe", "-r", "@", f"--message={text}", cwd=path).check()

    def conflicted_files(self, name: str) -> list[str]:
        """Files still conflicted in the workspace's change as of its last snapshot: what
        a sandboxed resolve worker, which cannot run jj, has left to do."""
        listed = self.run("--ignore-working-copy", "resolve", "--list", "-r",
                          f"{quote_revset(name)}@")
        if not listed.ok:  # "No conflicts found at this revision" (exit 2)
            return []
        return [re.split(r"\s{2,}", line.strip())[0] for line in listed.lines() if line.strip()]

    def change_diff(self, name: str) -> str:
        """The workspace's change against where it left trunk, as of its last snapshot
        (git format): what a sandboxed worker, which cannot run jj, reads as its diff."""
        ws = f"{quote_revset(name)}@"
        return self._read("diff", "--git", "--from", f"fork_point({self._trunk} | {ws})",
                          "--to", ws).stdout

    def in_trunk(self, name: str) -> bool:
        """True when every non-empty change of the workspace is in trunk (nothing to merge)."""
        path = self._require(name)
        self._snapshot(path)
        return self._count(path, f"({self._trunk}..@) ~ empty()") == 0

    def _rebased_head(self, name: str, path: Path, verb: str) -> MergeResult | str:
        """Rebase the workspace's work onto trunk; its single head, or why not.

        Everything that rewrites commits runs inside the workspace, so its
        working copy follows and no other workspace goes stale. A conflict
        leaves the conflicted change in the workspace and trunk untouched. The
        head is returned only once the merge guard (``jj_guard``) has checked it.
        """
        intent = self.intents.load(name)
        fork = intent.fork if intent else self._fork_point(name)
        self._refuse_if_unrecorded(name, self._snapshot(path), verb)
        if intent is None:
            # recorded before anything is rewritten: what the issue's own work touches
            own = self._changed(fork, f"{quote_revset(name)}@")
            intent = MergeIntent(name=name, fork=fork, trunk=self.trunk_commit(),
                                 paths=tuple(sorted(own)))
            self.intents.save(intent)
        work = self._trunk + "..@"
        if self._count(path, f"({work}) ~ empty()") == 0:
            self.intents.clear(name)
            return MergeResult(
                merged=False,
                detail=f"nothing to {verb}: {name} has no changes outside {self.trunk}",
            )
        if self._count(path, f"conflicts() & ({work})") == 0:
            self.run("rebase", "-b", "@", "-o", self._trunk, cwd=path).check()
        conflicted = self._count(path, f"conflicts() & ({work})")
        if conflicted:
            log.info("jj_merge_conflict", workspace=name, commits=conflicted)
            self.intents.clear(name)  # the rebase is done; a resolve worker's edits are its own
            return MergeResult(
                merged=False,
                conflicted=True,
                detail=(
                    f"{name} conflicts with {self.trunk}: {conflicted} conflicted change(s) left "
                    f"in workspace {name} for resolution; {self.trunk} not moved"
                ),
            )
        heads = self._work_heads(path)
        if len(heads) != 1:
            raise JJError(
                f"cannot {verb} workspace {name}: it has {len(heads)} separate lines of work "
                f"({', '.join(h[:12] for h in heads)}); join them into one change in "
                f"{path} (e.g. `jj new {' '.join(h[:12] for h in heads)}`) and try again"
            )
        self._guard(name, path, intent, heads[0])
        # no nameless commits leave the workspace (they cannot be pushed): name them,
        # now that the guard has checked they hold only this work
        nameless = f'({work}) & description(exact:"") ~ (empty() ~ merges())'
        if self._count(path, nameless):
            self.run("describe", "-r", nameless, "-m", name, cwd=path).check()
        head = self._work_heads(path)[0]
        if self._count(path, f"@ & {head}"):
            # @ is about to be published: give the workspace a fresh change first,
            # so later edits there (a hook's snapshot) never rewrite it.
            self.run("new", "-r", "@", cwd=path).check()
        return head

    def _fork_point(self, name: str) -> str:
        """Where the workspace's work left trunk's history, from jj's committed view
        (``--ignore-working-copy``: nothing on disk is adopted by asking)."""
        out = self._read("log", "--no-graph", "-r",
                         f"heads(::{self._trunk} & ::{quote_revset(name)}@)", "-T", "commit_id")
        return out.stdout.strip()

    def _changed(self, old: str, new: str) -> set[str]:
        """Paths whose content differs between two revisions."""
        out = self._read("diff", "--from", old, "--to", new, "--name-only")
        return set(out.lines())

    def _guard(self, name: str, path: Path, intent: MergeIntent, head: str) -> None:
        """Trunk moves only forward, and only by the issue's own paths; else refuse."""
        trunk = self.trunk_commit()
        if not self._count(None, f"{trunk} & ::{head}"):
            raise MergeRefused(
                f"refusing to move trunk for {name}: its rebased work ({head[:12]}) does not "
                f"descend from trunk ({trunk[:12]}); trunk is untouched")
        extra = foreign_paths(self._changed(trunk, head), intent)
        if extra:
            log.error("jj_merge_refused", workspace=name, trunk=trunk[:12], head=head[:12],
                      foreign=extra[:20])
            raise refusal(name, trunk_name=self.trunk, trunk=trunk, head=head, extra=extra,
                          repo=self.repo, workspace=path)

    def merge(self, name: str) -> MergeResult:
        """Rebase the workspace's change(s) onto trunk and move trunk forward to them."""
        head = self.prepare_merge(name)
        if isinstance(head, MergeResult):
            return head
        return self._move_trunk(name, head)

    def prepare_merge(self, name: str) -> MergeResult | str:
        """Rebase the workspace's work onto current trunk: its single head, checked out
        in the workspace (for the verify command), or why there is nothing to move."""
        path = self._require(name)
        self.import_from_git(path)  # trunk may have moved in the person's git
        self.export_to_git(path)  # and a merge killed before it told git is told now
        head = self._rebased_head(name, path, "merge")
        if isinstance(head, MergeResult):
            return head
        if not self._count(path, f"@- & {head}") or self._count(path, "@ ~ empty()"):
            self.run("new", "-r", head, cwd=path).check()
        return head

    def advance_trunk(self, name: str, head: str) -> MergeResult:
        """Move trunk to ``head`` prepared by :meth:`prepare_merge` — unless trunk moved
        since (a person pushed while the change was verified): then nothing moves and
        the result says so (``moved``), so the change is rebased and verified again."""
        path = self._require(name)
        self.import_from_git(path)
        trunk = self.trunk_commit()
        if not self._count(None, f"{trunk} & ::{head}"):
            return MergeResult(merged=False, moved=True,
                               detail=f"{self.trunk} moved to {trunk[:12]} while {name} was "
                                      "being verified")
        intent = self.intents.load(name)
        if intent is not None:
            self._guard(name, path, intent, head)
        return self._move_trunk(name, head)

    def _move_trunk(self, name: str, head: str) -> MergeResult:
        path = self._require(name)
        self.run("bookmark", "set", self.trunk, "-r", head, cwd=path).check()
        self.intents.clear(name)
        self.run("bookmark", "delete", self.bookmark(name), cwd=path)
        self.export_to_git(path)
        log.info("jj_merged", workspace=name, commit=head[:12], trunk=self.trunk)
        return MergeResult(
            merged=True, commit=head, detail=f"{name} merged into {self.trunk} at {head[:12]}"
        )

    def publish(self, name: str, remote: str = "origin") -> MergeResult:
        """PR mode: rebase the work onto trunk, point ``ralph/NAME`` at it and push it.

        Trunk does not move; the pushed bookmark is what the pull request merges.
        """
        path = self._require(name)
        head = self._rebased_head(name, path, "publish")
        if isinstance(head, MergeResult):
            return head
        bookmark = self.bookmark(name)
        self.run("bookmark", "set", "--allow-backwards", bookmark, "-r", head, cwd=path).check()
        self.run("git", "push", "--remote", remote, "--bookmark", bookmark, cwd=path).check()
        self.intents.clear(name)
        log.info("jj_published", workspace=name, commit=head[:12], remote=remote)
        return MergeResult(
            merged=True, commit=head, detail=f"{name} pushed as {bookmark} to {remote}"
        )

    # -- trunk --

    def trunk_commit(self) -> str:
        """The commit trunk points at (read without touching any working copy)."""
        return self._read("log", "--no-graph", "-r", self._trunk, "-T", "commit_id").stdout.strip()

    def trunk_head(self) -> tuple[str, str]:
        """Trunk's commit id and the first line of its description (``status``)."""
        out = self._read("log", "--no-graph", "-r", self._trunk, "-T",
                         'commit_id ++ "\\x1f" ++ description.first_line()').stdout
        commit, _, subject = out.partition("\x1f")
        return commit, subject.strip()

    def trunk_checkout(self) -> Path:
        """A directory holding trunk's current files (for the verify command).

        A workspace of its own, so verifying never touches a worker's or the
        person's working copy. Whatever the verify command wrote there last time
        was snapshotted into a scratch change; that change is abandoned.
        """
        path = (self.workspace_root / f".{TRUNK_WORKSPACE}").resolve()
        listed = self._listed()
        if TRUNK_WORKSPACE in listed and not path.is_dir():
            self._workspace_forget(TRUNK_WORKSPACE)  # someone deleted it
            del listed[TRUNK_WORKSPACE]
        if TRUNK_WORKSPACE not in listed:
            if path.exists():
                shutil.rmtree(path)  # ours: a scratch checkout left by a forgotten workspace
            self._workspace_add(TRUNK_WORKSPACE, path, self._trunk).check()
            return path
        self._snapshot(path)
        scratch = f"@ ~ ::{self._trunk}"
        on_trunk = self._count(path, f"@- & {self._trunk}") and not self._count(
            path, "@ ~ empty()"
        )
        if on_trunk:
            return path
        old = self.run("log", "--no-graph", "-r", scratch, "-T", "commit_id", cwd=path).check()
        self.run("new", "-r", self._trunk, cwd=path).check()
        if old.stdout:
            # an empty scratch change is already gone (jj drops it on `new`)
            self.run("abandon", "-r", f"{old.stdout} & all()", cwd=path).check()
        return path

    def trunk_log(self, limit: int = 50) -> list[str]:
        """Descriptions on trunk, newest first (root commit excluded)."""
        out = self._read(
            "log", "--no-graph", "-r", f"::{self._trunk} ~ root()", "--limit", str(int(limit)),
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
        out = self._read("log", "--no-graph", "-r", f"::{self._trunk} ~ root()",
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
