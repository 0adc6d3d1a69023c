"""Bringing a worker's change into trunk (merge) or onto its pushed bookmark (publish).

Merge strategy (linear history): the workspace's change(s) are rebased onto
trunk inside the workspace, checked for conflicts, then the trunk bookmark is
moved forward to the newest non-empty change. Trunk therefore contains every
merged change exactly once, one after another, with no merge commits, and no
other workspace's ``@`` is touched (none goes stale). On a conflict, trunk
stays where it was and the workspace holds the conflicted (rebased) change so
a resolve worker can fix it there.

Both ways start with the same guarded rebase (:class:`JjRebase`): the merge
guard (``jj_guard``) checks the rebased head before anything leaves the
workspace.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import structlog

from ralph_dev.adapters.jj_cli import JJError, quote_revset
from ralph_dev.adapters.jj_guard import MergeIntent, MergeRefused, foreign_paths, refusal
from ralph_dev.adapters.jj_home import JjHome
from ralph_dev.adapters.jj_trunk import JjTrunk
from ralph_dev.adapters.jj_workspaces import refuse_if_unrecorded
from ralph_dev.core.model import MergeResult
from ralph_dev.core.ports import work_bookmark

log = structlog.get_logger(__name__)


class JjRebase:
    """A workspace's work rebased onto trunk, checked by the merge guard: the one step
    the merger and the publisher share."""

    def __init__(self, home: JjHome, trunk: JjTrunk) -> None:
        self.home = home
        self.cli = home.cli
        self.trunk = trunk

    def onto_trunk(self, name: str, path: Path, verb: str) -> MergeResult | str:
        """Rebase the workspace's work onto trunk; its single head, or why not.

        Everything that rewrites commits runs inside the workspace, so its
        working copy follows and no other workspace goes stale. A conflict
        leaves the conflicted change in the workspace and trunk untouched. The
        head is returned only once the merge guard (``jj_guard``) has checked it.
        """
        intents, cli, trunk = self.home.intents, self.cli, self.trunk.revset
        intent = intents.load(name)
        fork = intent.fork if intent else self._fork_point(name)
        refuse_if_unrecorded(name, self.home.snapshot(path), verb, self.cli.repo)
        if intent is None:
            # recorded before anything is rewritten: what the issue's own work touches
            own = self._changed(fork, f"{quote_revset(name)}@")
            intent = MergeIntent(name=name, fork=fork, trunk=self.trunk.trunk_commit(),
                                 paths=tuple(sorted(own)))
            intents.save(intent)
        work = trunk + "..@"
        if cli.count(f"({work}) ~ empty()", path) == 0:
            intents.clear(name)
            return MergeResult(
                merged=False,
                detail=f"nothing to {verb}: {name} has no changes outside {self.trunk.name}",
            )
        if cli.count(f"conflicts() & ({work})", path) == 0:
            cli.run("rebase", "-b", "@", "-o", trunk, cwd=path).check()
        conflicted = cli.count(f"conflicts() & ({work})", path)
        if conflicted:
            log.info("jj_merge_conflict", workspace=name, commits=conflicted)
            intents.clear(name)  # the rebase is done; a resolve worker's edits are its own
            return MergeResult(
                merged=False,
                conflicted=True,
                detail=(
                    f"{name} conflicts with {self.trunk.name}: {conflicted} conflicted "
                    f"change(s) left in workspace {name} for resolution; {self.trunk.name} "
                    "not moved"
                ),
            )
        heads = self.work_heads(path)
        if len(heads) != 1:
            raise JJError(
                f"cannot {verb} workspace {name}: it has {len(heads)} separate lines of work "
                f"({', '.join(h[:12] for h in heads)}); join them into one change in "
                f"{path} (e.g. `jj new {' '.join(h[:12] for h in heads)}`) and try again"
            )
        self.guard(name, path, intent, heads[0])
        # no nameless commits leave the workspace (they cannot be pushed): name them,
        # now that the guard has checked they hold only this work
        nameless = f'({work}) & description(exact:"") ~ (empty() ~ merges())'
        if cli.count(nameless, path):
            cli.run("describe", "-r", nameless, "-m", name, cwd=path).check()
        head = self.work_heads(path)[0]
        if cli.count(f"@ & {head}", path):
            # @ is about to be published: give the workspace a fresh change first,
            # so later edits there (a hook's snapshot) never rewrite it.
            cli.run("new", "-r", "@", cwd=path).check()
        return head

    def work_heads(self, path: Path) -> list[str]:
        """Commit ids of the newest changes in the workspace that are not in trunk."""
        # an empty nameless change on top is the agent's scratch @, not work; an empty
        # merge (`jj new h1 h2`) is what joins two lines of work, so it counts
        revset = (f"heads(({self.trunk.revset}..@) ~ "
                  "(empty() & description(exact:\"\") ~ merges()))")
        return self.cli.run(
            "log", "--no-graph", "-r", revset, "-T", 'commit_id ++ "\\n"', cwd=path
        ).check().lines()

    def _fork_point(self, name: str) -> str:
        """Where the workspace's work left trunk's history, from jj's committed view
        (``--ignore-working-copy``: nothing on disk is adopted by asking)."""
        out = self.cli.read("log", "--no-graph", "-r",
                            f"heads(::{self.trunk.revset} & ::{quote_revset(name)}@)",
                            "-T", "commit_id")
        return out.stdout.strip()

    def _changed(self, old: str, new: str) -> set[str]:
        """Paths whose content differs between two revisions."""
        out = self.cli.read("diff", "--from", old, "--to", new, "--name-only")
        return set(out.lines())

    def guard(self, name: str, path: Path, intent: MergeIntent, head: str,
              below: str | None = None) -> None:
        """Trunk moves only forward, and only by the issue's own paths; else refuse.
        ``below``: the change the issue's work sits on in a batch (the one before it,
        itself guarded): the issue's own step is from there."""
        trunk = self.trunk.trunk_commit()
        if not self.cli.count(f"{trunk} & ::{head}"):
            raise MergeRefused(
                f"refusing to move trunk for {name}: its rebased work ({head[:12]}) does not "
                f"descend from trunk ({trunk[:12]}); trunk is untouched")
        extra = foreign_paths(self._changed(below or trunk, head), intent)
        if extra:
            log.error("jj_merge_refused", workspace=name, trunk=trunk[:12], head=head[:12],
                      foreign=extra[:20])
            raise refusal(name, trunk_name=self.trunk.name, trunk=trunk, head=head, extra=extra,
                          repo=self.cli.repo, workspace=path)


class JjMerger:
    """Merges into trunk (the ``Merger`` port): rebase, guard, move trunk forward."""

    def __init__(self, rebase: JjRebase) -> None:
        self.rebase = rebase
        self.home = rebase.home
        self.cli = rebase.cli
        self.trunk = rebase.trunk

    def merge(self, name: str) -> MergeResult:
        """Rebase the workspace's change(s) onto trunk and move trunk forward to them."""
        head = self.prepare_merge(name)
        if isinstance(head, MergeResult):
            return head
        return self._move_trunk(name, head)

    def prepare_merge(self, name: str) -> MergeResult | str:
        """Rebase the workspace's work onto current trunk: its single head, checked out
        in the workspace (for the verify command), or why there is nothing to move."""
        path = self.home.require(name)
        self.home.import_from_git(path)  # trunk may have moved in the person's git
        self.home.export_to_git(path)  # and a merge killed before it told git is told now
        head = self.rebase.onto_trunk(name, path, "merge")
        if isinstance(head, MergeResult):
            return head
        if not self.cli.count(f"@- & {head}", path) or self.cli.count("@ ~ empty()", path):
            self.cli.run("new", "-r", head, cwd=path).check()
        return head

    def land(self, batch: Sequence[tuple[str, str]], base: str, verified: str = ""
             ) -> MergeResult:
        """Move trunk once to a batch of changes verified together, each keeping its own
        commit(s): ``batch`` is each issue with its head as prepared onto trunk's commit
        ``base`` (:meth:`prepare_merge`), in merge order. Each is rebased onto the one
        before it in its own workspace, guarded, and trunk moves to the last. ``verified``:
        what the verify of the batch checked out (a merge of the heads): trunk must get
        exactly its files.

        Each head is followed by its change id, so what lands is what was prepared and
        verified, never what a verify command left in a workspace's working copy, and a
        land killed part-way (some changes rebased already) is finished by the next one.
        Nothing moves when trunk is not at ``base`` any more (``moved``), when a change is
        not the one verified (``stale``), or when the stacked files differ from the
        verified ones (``stale``); a batch already in trunk is a success."""
        names = [name for name, _ in batch]
        paths = {name: self.home.require(name) for name in names}
        first = paths[names[0]]
        self.home.import_from_git(first)
        self.home.export_to_git(first)  # a land killed before it told git is told now
        trunk = self.trunk.trunk_commit()
        changes = {name: self._change(head) for name, head in batch}
        if all(self.cli.count(f"{changes[n]} & ::{quote_revset(trunk)}") for n in names):
            return self._landed_result(names, trunk)
        if trunk != base:
            return MergeResult(merged=False, moved=True,
                               detail=f"{self.trunk.name} moved to {trunk[:12]} since the "
                                      f"batch was verified on {base[:12]}")
        previous = base
        for name, head in batch:  # all checked before any is touched
            now = self._commit(changes[name])
            if now is None:
                return MergeResult(merged=False, stale=True,
                                   detail=f"{name}'s verified change is gone or divergent")
            stacked = previous != base and self._sits_on(previous, now)  # a killed land's
            if now != head and not stacked:
                return MergeResult(merged=False, stale=True,
                                   detail=f"{name}'s change is not the one verified "
                                          f"({now[:12]}, verified {head[:12]})")
            previous = now
        below = base
        for name, head in batch:
            path, change = paths[name], changes[name]
            now = self._commit(change) or ""
            if not self._sits_on(below, now):  # else in place, or stacked by a killed land
                if now != head or not self._sits_on(base, now):
                    return MergeResult(merged=False, stale=True,
                                       detail=f"{name}'s change is not the one verified "
                                              f"({now[:12]}, verified {head[:12]})")
                self.home.run_fresh("rebase", "-s", f"roots({quote_revset(base)}..{now})",
                                    "-o", below, cwd=path).check()
                now = self._commit(change) or ""
            intent = self.home.intents.load(name)
            if intent is not None:
                self.rebase.guard(name, path, intent, now, below=below)
            below = now
        if verified and len(batch) > 1 and self._differ(verified, below):
            return MergeResult(merged=False, stale=True,
                               detail="the changes stacked one on another hold other files "
                                      "than their verified merge")
        last = names[-1]
        self.cli.run("bookmark", "set", self.trunk.name, "-r", below, cwd=paths[last]).check()
        for name in names:
            self.home.intents.clear(name)
            self.cli.run("bookmark", "delete", work_bookmark(name), cwd=paths[name])
        self.home.export_to_git(paths[last])
        log.info("jj_landed", batch=names, commit=below[:12], trunk=self.trunk.name)
        return self._landed_result(names, below)

    def _change(self, commit: str) -> str:
        """The change id of ``commit`` (hidden ones too: a land killed part-way)."""
        return self.cli.read("log", "--no-graph", "-r", commit, "-T",
                             "change_id").stdout.strip()

    def _commit(self, change: str) -> str | None:
        """The one visible commit of ``change`` now, or None (abandoned, divergent)."""
        out = self.cli.run("--ignore-working-copy", "log", "--no-graph", "-r",
                           f"change_id({change})", "-T", 'commit_id ++ "\\n"')
        lines = out.lines() if out.ok else []
        return lines[0] if len(lines) == 1 else None

    def _sits_on(self, below: str, head: str) -> bool:
        """``head``'s own commits start right on ``below``."""
        parents = self.cli.read("log", "--no-graph", "-r",
                                f"roots({quote_revset(below)}..{head})-", "-T",
                                'commit_id ++ "\\n"').lines()
        return parents == [below]

    def _landed_result(self, names: Sequence[str], commit: str) -> MergeResult:
        return MergeResult(merged=True, commit=commit,
                           detail=f"{', '.join(names)} merged into {self.trunk.name} at "
                                  f"{commit[:12]}")

    def _differ(self, old: str, new: str) -> bool:
        return bool(self.cli.read("diff", "--from", old, "--to", new, "--name-only").lines())

    def _move_trunk(self, name: str, head: str) -> MergeResult:
        path = self.home.require(name)
        self.cli.run("bookmark", "set", self.trunk.name, "-r", head, cwd=path).check()
        self.home.intents.clear(name)
        self.cli.run("bookmark", "delete", work_bookmark(name), cwd=path)
        self.home.export_to_git(path)
        log.info("jj_merged", workspace=name, commit=head[:12], trunk=self.trunk.name)
        return MergeResult(
            merged=True, commit=head, detail=f"{name} merged into {self.trunk.name} at {head[:12]}"
        )


class JjPublisher:
    """Pull-request mode (the ``Publisher`` port): the rebased work pushed under
    ``ralph/NAME``; trunk does not move, the pull request merges that bookmark."""

    def __init__(self, rebase: JjRebase) -> None:
        self.rebase = rebase
        self.home = rebase.home
        self.cli = rebase.cli

    def publish(self, name: str, remote: str = "origin") -> MergeResult:
        """Rebase the work onto trunk, point ``ralph/NAME`` at it and push it."""
        path = self.home.require(name)
        head = self.rebase.onto_trunk(name, path, "publish")
        if isinstance(head, MergeResult):
            return head
        bookmark = work_bookmark(name)
        self.cli.push_bookmark(bookmark, head, remote, path)
        self.home.intents.clear(name)
        log.info("jj_published", workspace=name, commit=head[:12], remote=remote)
        return MergeResult(
            merged=True, commit=head, detail=f"{name} pushed as {bookmark} to {remote}"
        )
