"""The jj adapter: the only module that runs ``jj``.

Each worker gets its own jj workspace ``<workspace_root>/ISSUE`` created from
trunk, so agents never see each other's half-done edits. This module adds,
lists, merges, repairs and forgets those workspaces. Traps it is built around
(see ``shared/notes/jj-on-debian12.md``):

* A workspace goes *stale* when another workspace rewrites its ``@`` with
  different content. So every command that rewrites a workspace's commits runs
  *inside that workspace* (jj then updates that working copy itself), and the
  merge only ever moves the trunk bookmark: no other workspace's ``@`` is
  touched, and no merge commit sits on top of anybody's ``@``.
* Colocated repos need a git >= 2.42 on PATH of every process touching the
  repo (jj, and agents in panes): :func:`child_path`.
* ``jj new``/``jj rebase`` succeed on conflicts; conflicts are found with the
  ``conflicts()`` revset.
* ``jj workspace forget`` leaves the directory; we remove it, but only once
  the work is safe.
* Read-only queries from the repository root use ``--ignore-working-copy`` so
  the person's own (default) working copy is never snapshotted behind their
  back.

Merge strategy (linear history): the workspace's change(s) are rebased onto
trunk inside the workspace, checked for conflicts, then the trunk bookmark is
moved forward to the newest non-empty change. Trunk therefore contains every
merged change exactly once, one after another, with no merge commits. On a
conflict, trunk stays where it was and the workspace holds the conflicted
(rebased) change so a resolve worker can fix it there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ralph_dev.core.errors import RalphError
from ralph_dev.core.model import Workspace

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings

log = structlog.get_logger(__name__)

WORKSPACE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
BOOKMARK_PREFIX = "ralph/"
TRUNK_WORKSPACE = "ralph-trunk"
"""jj workspace where trunk is checked out to verify it after merges.

It lives at ``<root>/.ralph-trunk``: the dot keeps it apart from every valid
worker workspace name, and list_workspaces leaves it out.
"""
JJ_TIMEOUT = 120.0
"""Seconds before a jj command is considered hung (they normally take < 0.1 s)."""

_FS = "\x1f"  # field separator in our templates (never in names we accept)
_RS = "\x1e"  # list separator inside a field


class JJError(RalphError):
    """A jj command failed or jj refused; carries the command for the log and the fix."""

    def __init__(
        self,
        message: str,
        *,
        command: Iterable[str] = (),
        stderr: str = "",
        returncode: int = 0,
    ) -> None:
        super().__init__(message)
        self.command = list(command)
        self.stderr = stderr
        self.returncode = returncode


class InvalidWorkspaceName(JJError, ValueError):
    """A workspace name that is not a plain ``[A-Za-z0-9._-]`` word inside the root."""


@dataclass(frozen=True)
class JJResult:
    argv: tuple[str, ...]
    cwd: str
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def check(self) -> JJResult:
        """Return self, or raise JJError with jj's own explanation."""
        if self.returncode != 0:
            detail = self.stderr.strip() or self.stdout.strip() or "no output"
            raise JJError(
                f"jj {' '.join(self.argv[1:])} failed (exit {self.returncode}) in {self.cwd}: "
                f"{detail}",
                command=self.argv,
                stderr=self.stderr,
                returncode=self.returncode,
            )
        return self

    def lines(self) -> list[str]:
        return [line for line in self.stdout.split("\n") if line]


@dataclass(frozen=True)
class TrunkChange:
    """One change on trunk as the dashboard shows it: what, when, and its diff stat."""

    commit: str
    title: str
    time: str
    added: int
    removed: int
    files: tuple[str, ...]


@dataclass(frozen=True)
class MergeResult:
    merged: bool
    conflicted: bool = False
    commit: str | None = None
    """Commit id trunk points at after a successful merge."""
    detail: str = ""


# --- binary discovery and PATH --------------------------------------------------


def find_jj() -> str | None:
    """The jj binary without reading settings: $RALPH_DEV_JJ, PATH, ~/.local/bin/jj."""
    for candidate in (
        os.environ.get("RALPH_DEV_JJ"),
        shutil.which("jj"),
        str(Path.home() / ".local/bin/jj"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def child_path(jj_bin: str | None = None, base: str | None = None) -> str:
    """PATH for every process that touches the repo (jj itself, agents in panes).

    A colocated workspace is also a git worktree using options the system git
    may not know (after ``jj workspace add`` git 2.39 cannot open the repo at
    all). Where jj was installed next to a git that works with it (its real
    directory, symlinks followed), that directory goes first.
    """
    base = os.environ.get("PATH", os.defpath) if base is None else base
    jj_bin = jj_bin or find_jj()
    if not jj_bin:
        return base
    entries: list[str] = []
    for directory in (Path(jj_bin).parent, Path(os.path.realpath(jj_bin)).parent):
        git = directory / "git"
        if git.is_file() and os.access(git, os.X_OK) and str(directory) not in entries:
            entries.append(str(directory))
    rest = [p for p in base.split(os.pathsep) if p and p not in entries]
    return os.pathsep.join(entries + rest)


def _q(text: str) -> str:
    """A revset/template string literal (names are validated, this is belt and braces)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _checkout_op_id(workspace_dir: Path) -> str | None:
    """The operation a working copy was last updated at (``.jj/working_copy/checkout``).

    That file is a small protobuf (field 2: operation id bytes). Reading it
    avoids one jj call per workspace per tick; anything unexpected returns
    None and the caller asks jj instead.
    """
    try:
        data = (workspace_dir / ".jj" / "working_copy" / "checkout").read_bytes()
    except OSError:
        return None
    i = 0
    try:
        while i < len(data):
            key, i = _varint(data, i)
            field, wire = key >> 3, key & 7
            if wire == 2:
                length, i = _varint(data, i)
                value = data[i : i + length]
                i += length
                if field == 2 and value:
                    return value.hex()
            elif wire == 0:
                _, i = _varint(data, i)
            else:
                return None
    except IndexError:
        return None
    return None


_REFUSED_LINE = re.compile(r"^  (.+): \S+ \(\d+ bytes\)")


def _refused_paths(stderr: str) -> list[str]:
    """Paths from jj's "Refused to snapshot some files:" warning."""
    refused: list[str] = []
    inside = False
    for line in stderr.splitlines():
        if "Refused to snapshot some files" in line:
            inside = True
        elif inside and (found := _REFUSED_LINE.match(line)):
            if found.group(1) not in refused:
                refused.append(found.group(1))
        else:
            inside = False
    return refused


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i
        shift += 7


# --- the adapter ----------------------------------------------------------------


class JJ:
    """One project's repository and its ralph-dev workspaces."""

    def __init__(
        self,
        repo: Path,
        workspace_root: Path,
        trunk: str = "main",
        *,
        jj_bin: str | None = None,
        user: tuple[str, str] = ("ralph-dev", "ralph-dev@localhost"),
    ) -> None:
        self.repo = Path(repo)
        self.workspace_root = Path(workspace_root)
        self.trunk = trunk
        self._jj_bin = jj_bin
        self.user = user
        self.calls = 0
        """jj processes started by this instance (tests measure cost with it)."""
        self._wc_at_op: dict[str, dict[str, str]] = {}
        """op id → {workspace: @ commit at that op}; operations are immutable."""

    @classmethod
    def from_settings(cls, settings: ProjectSettings, **kwargs: object) -> JJ:
        return cls(settings.repo, settings.workspaces, settings.trunk, **kwargs)  # type: ignore[arg-type]

    # -- the one subprocess site --

    @property
    def jj_bin(self) -> str:
        found = self._jj_bin = self._jj_bin or find_jj()
        if not found:
            raise JJError(
                "jj is not installed (looked at $RALPH_DEV_JJ, PATH and ~/.local/bin/jj): "
                "install jj >= 0.46 or set RALPH_DEV_JJ to its path"
            )
        return found

    def child_path(self) -> str:
        return child_path(self.jj_bin)

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = self.child_path()
        env["JJ_USER"], env["JJ_EMAIL"] = self.user
        return env

    def run(self, *args: str, cwd: Path | None = None) -> JJResult:
        """Run jj once (never through a shell); failures come back in the result."""
        argv = (self.jj_bin, "--no-pager", "--color", "never", *args)
        where = Path(cwd) if cwd is not None else self.repo
        self.calls += 1
        started = time.monotonic()
        try:
            proc = subprocess.run(
                argv,
                cwd=where,
                env=self.child_env(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=JJ_TIMEOUT,
                check=False,
            )
        except FileNotFoundError as exc:
            missing = exc.filename or where
            return JJResult(argv, str(where), 127, "", f"{missing}: does not exist")
        except subprocess.TimeoutExpired:
            return JJResult(argv, str(where), 124, "", f"timed out after {JJ_TIMEOUT:.0f}s")
        except OSError as exc:
            return JJResult(argv, str(where), 126, "", str(exc))
        ms = round((time.monotonic() - started) * 1000)
        log.debug("jj", args=list(args[:3]), cwd=str(where), rc=proc.returncode, ms=ms)
        return JJResult(argv, str(where), proc.returncode, proc.stdout, proc.stderr)

    def _read(self, *args: str) -> JJResult:
        """A repo-level command (queries, bookmarks, forget) run from the repo root
        with ``--ignore-working-copy``: the person's own working copy is never
        snapshotted or updated by it."""
        return self.run("--ignore-working-copy", *args).check()

    # -- names and paths --

    @property
    def _trunk(self) -> str:
        return _q(self.trunk)

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
        found = self._read(
            "bookmark", "list", "-T", f'if(name == {self._trunk}, name ++ "\\n")'
        ).lines()
        if self.trunk not in found:
            raise JJError(
                f"{self.repo} has no trunk bookmark {self.trunk!r}: run "
                f"`jj bookmark create {self.trunk} -r @-` in {self.repo} (or set `trunk` in "
                "ralph-dev's config to your main bookmark)"
            )

    # -- workspaces --

    def _listed(self) -> dict[str, Path]:
        out = self._read("workspace", "list", "-T", f'name ++ "{_FS}" ++ root ++ "\\n"')
        found: dict[str, Path] = {}
        for line in out.lines():
            name, _, root = line.partition(_FS)
            found[name] = Path(root)
        return found

    def add_workspace(self, name: str) -> Path:
        """Create workspace NAME from trunk (or reuse it) and bookmark its change.

        A reused workspace is snapshotted (and repaired if stale) so the new
        agent starts from what is on disk. When ``ralph/NAME`` still holds
        unmerged work (a canceled issue that came back), the new workspace
        starts on top of that work instead of trunk.
        """
        path = self.workspace_path(name)
        if not path.exists():
            created = self._add_new_workspace(name, path)
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
            self._ensure_bookmark(name)
            return path
        if path.exists() and any(path.iterdir()):
            raise JJError(
                f"{path} exists and is not a jj workspace of {self.repo}: move it away "
                "(it may hold someone's work) and try again"
            )
        created = self._add_new_workspace(name, path)
        if created is None:
            raise JJError(f"jj already has a workspace named {name!r}: run `jj workspace "
                          f"forget {name}` in {self.repo} if it is no longer used")
        return created

    def _add_new_workspace(self, name: str, path: Path) -> Path | None:
        """``jj workspace add`` from trunk (or a kept ``ralph/NAME``) and bookmark it.

        The common case of every spawn, so it costs three jj calls. Returns None
        when jj already knows a workspace of that name (the caller sorts it out).
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        bookmark = self.bookmark(name)
        base = self._trunk
        kept = f"present({_q(bookmark)}) ~ ::{self._trunk}"
        if self._count(None, kept):
            base = _q(bookmark)
            log.info("jj_workspace_resumes_kept_change", workspace=name, bookmark=base)
        add = ("workspace", "add", "--name", name, "-r", base, str(path))
        result = self.run(*add, cwd=self.repo)
        if not result.ok and "already registered worktree" in result.stderr:
            self._prune_git_worktrees()
            result = self.run(*add, cwd=self.repo)
        if not result.ok and "already exists" in result.stderr:
            return None
        result.check()
        if base != _q(bookmark):  # a kept bookmark already points at the work
            self._read("bookmark", "set", "--allow-backwards", bookmark, "-r", f"{_q(name)}@")
        log.info("jj_workspace_added", workspace=name, path=str(path))
        return path

    def _ensure_bookmark(self, name: str) -> None:
        """Keep the worker's change reachable under ``ralph/NAME`` (follows rewrites)."""
        bookmark = self.bookmark(name)
        if not self._count(None, f"present({_q(bookmark)})"):
            self._read(
                "bookmark", "set", "--allow-backwards", bookmark, "-r", f"{_q(name)}@"
            )

    def _prune_git_worktrees(self) -> None:
        """Drop git's record of worktrees whose directory is gone (colocated repos).

        ``jj workspace forget`` cannot unregister the git worktree of a
        directory someone already deleted, and git then refuses a new worktree
        at that path. Run through ``jj util exec`` so jj stays the one tool
        this module starts, with the same PATH (and so the same git).
        """
        if (self.repo / ".git").exists():
            self.run("--ignore-working-copy", "util", "exec", "--", "git", "worktree", "prune")

    def list_workspaces(self) -> list[Workspace]:
        """ralph-dev's workspaces (those under the root) with what decide needs.

        Costs one ``jj log`` over every workspace's ``@`` and its non-trunk
        ancestors, plus one ``jj --at-op`` query per workspace whose working
        copy was updated at an operation not seen before (cached forever:
        operations are immutable).
        """
        template = (
            f'commit_id ++ "{_FS}" ++ parents.map(|c| c.commit_id()).join(",") ++ "{_FS}" '
            f'++ empty ++ "{_FS}" ++ conflict ++ "{_FS}" '
            f'++ self.contained_in({_q("::" + self._trunk)}) ++ "{_FS}" '
            f'++ working_copies.map(|w| w.name() ++ "=" ++ w.root()).join("{_RS}") ++ "\\n"'
        )
        revset = f"working_copies() | ({self._trunk}..working_copies())"
        out = self._read("log", "--no-graph", "-r", revset, "-T", template)
        commits: dict[str, tuple[list[str], bool, bool, bool]] = {}
        heads: dict[str, tuple[str, str]] = {}
        for line in out.lines():
            parts = line.split(_FS)
            if len(parts) != 6:
                continue
            commit, parents, empty, conflict, in_trunk, wcs = parts
            commits[commit] = (
                [p for p in parents.split(",") if p],
                empty == "true",
                conflict == "true",
                in_trunk == "true",
            )
            for wc in filter(None, wcs.split(_RS)):
                wname, _, root = wc.partition("=")
                heads[wname] = (commit, root)
        root = self.workspace_root.resolve()
        result: list[Workspace] = []
        for wname, (commit, wroot) in sorted(heads.items()):
            if wname in ("default", TRUNK_WORKSPACE):
                continue
            if Path(os.path.realpath(wroot)).parent != root:
                continue
            unmerged = conflicted = False
            todo, seen = [commit], set()
            while todo:
                c = todo.pop()
                if c in seen or c not in commits:
                    continue
                seen.add(c)
                parents, empty, conflict, in_trunk = commits[c]
                if in_trunk:
                    continue
                unmerged = unmerged or not empty
                conflicted = conflicted or conflict
                todo.extend(parents)
            result.append(
                Workspace(
                    name=wname,
                    path=wroot,
                    has_unmerged_change=unmerged,
                    conflicted=conflicted,
                    stale=self._is_stale(wname, Path(wroot), commit),
                )
            )
        return result

    def _is_stale(self, name: str, path: Path, current: str) -> bool:
        """True when jj would refuse to work in the workspace until update-stale.

        jj calls a working copy stale when its ``@`` was rewritten (with other
        content) since the operation the working copy was last updated at. We
        compare ``@`` now with ``@`` at that operation. A rewrite with the same
        content counts as stale here too; repairing it is harmless.
        """
        op = _checkout_op_id(path)
        if op is None:
            return self._probe_stale(name)
        if op not in self._wc_at_op:
            result = self.run(
                "--ignore-working-copy", "--at-op", op, "workspace", "list",
                "-T", f'name ++ "{_FS}" ++ target.commit_id() ++ "\\n"',
            )
            if not result.ok:
                return self._probe_stale(name)
            if len(self._wc_at_op) >= 1000:  # a long night: keep the newest ones
                self._wc_at_op.pop(next(iter(self._wc_at_op)))
            self._wc_at_op[op] = dict(line.split(_FS, 1) for line in result.lines())
        return self._wc_at_op[op].get(name, current) != current

    def _probe_stale(self, name: str) -> bool:
        path = self.workspace_path(name)
        result = self.run("log", "--no-graph", "-r", "@", "-T", "commit_id", cwd=path)
        return not result.ok and "stale" in result.stderr

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

    def update_stale(self, name: str) -> None:
        """Repair a stale workspace (a no-op when it is not stale).

        Edits made on disk while the workspace was stale are not lost: jj
        snapshots them into a sibling ("divergent") commit of the same change.
        """
        path = self._require(name)
        self.run("workspace", "update-stale", cwd=path).check()

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
        refused = _refused_paths(result.check().stderr)
        if refused:
            log.warning("jj_snapshot_refused", workspace=path.name, paths=refused[:10])
        return refused

    def _refuse_if_unrecorded(self, name: str, refused: list[str], doing: str) -> None:
        if refused:
            shown = ", ".join(refused[:5]) + (" …" if len(refused) > 5 else "")
            raise JJError(
                f"refusing to {doing} workspace {name}: jj did not record {shown} (too large "
                f"for snapshot.max-new-file-size), so it would be lost; add it to .gitignore, "
                f"remove it, or raise the limit with `jj config set --repo "
                f"snapshot.max-new-file-size SIZE` in {self.repo}"
            )

    def describe(self, name: str, message: str) -> None:
        """Set the description of the workspace's working change (snapshotting first)."""
        path = self._require(name)
        self._snapshot(path)
        # `--message=…` so a message starting with '-' is never read as an option;
        # NUL cannot pass through argv at all.
        text = message.replace("\x00", "")
        self.run("describe", "-r", "@", f"--message={text}", cwd=path).check()

    def _work_heads(self, path: Path) -> list[str]:
        """Commit ids of the newest changes in the workspace that are not in trunk."""
        revset = f"heads(({self._trunk}..@) ~ (empty() & description(exact:\"\")))"
        return self.run(
            "log", "--no-graph", "-r", revset, "-T", 'commit_id ++ "\\n"', cwd=path
        ).check().lines()

    def _count(self, path: Path | None, revset: str) -> int:
        """How many commits ``revset`` holds, asked in workspace ``path`` (snapshotting
        it) or, with None, from the repo root without touching any working copy."""
        args = ("log", "--no-graph", "-r", revset, "-T", '"x\\n"')
        if path is None:
            return len(self._read(*args).lines())
        return len(self.run(*args, cwd=path).check().lines())

    def in_trunk(self, name: str) -> bool:
        """True when every non-empty change of the workspace is in trunk (nothing to merge)."""
        path = self._require(name)
        self._snapshot(path)
        return self._count(path, f"({self._trunk}..@) ~ empty()") == 0

    def _rebased_head(self, name: str, path: Path, verb: str) -> MergeResult | str:
        """Rebase the workspace's work onto trunk; its single head, or why not.

        Everything that rewrites commits runs inside the workspace, so its
        working copy follows and no other workspace goes stale. A conflict
        leaves the conflicted change in the workspace and trunk untouched.
        """
        self._refuse_if_unrecorded(name, self._snapshot(path), verb)
        work = self._trunk + "..@"
        if self._count(path, f"({work}) ~ empty()") == 0:
            return MergeResult(
                merged=False,
                detail=f"nothing to {verb}: {name} has no changes outside {self.trunk}",
            )
        if self._count(path, f"conflicts() & ({work})") == 0:
            self.run("rebase", "-b", "@", "-o", self._trunk, cwd=path).check()
        conflicted = self._count(path, f"conflicts() & ({work})")
        if conflicted:
            log.info("jj_merge_conflict", workspace=name, commits=conflicted)
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
        # no nameless commits leave the workspace (they cannot be pushed): name them
        nameless = f'({work}) & description(exact:"") ~ empty()'
        if self._count(path, nameless):
            self.run("describe", "-r", nameless, "-m", name, cwd=path).check()
        head = self._work_heads(path)[0]
        if self._count(path, f"@ & {head}"):
            # @ is about to be published: give the workspace a fresh change first,
            # so later edits there (a hook's snapshot) never rewrite it.
            self.run("new", "-r", "@", cwd=path).check()
        return head

    def merge(self, name: str) -> MergeResult:
        """Rebase the workspace's change(s) onto trunk and move trunk forward to them."""
        path = self._require(name)
        head = self._rebased_head(name, path, "merge")
        if isinstance(head, MergeResult):
            return head
        self.run("bookmark", "set", self.trunk, "-r", head, cwd=path).check()
        self.run("bookmark", "delete", self.bookmark(name), cwd=path)
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
        log.info("jj_published", workspace=name, commit=head[:12], remote=remote)
        return MergeResult(
            merged=True, commit=head, detail=f"{name} pushed as {bookmark} to {remote}"
        )

    def forget(self, name: str, *, keep_bookmark: bool = False) -> None:
        """Forget the workspace and remove its directory once its work is safe.

        Safe means: every non-empty change is in trunk, or ``keep_bookmark``
        (a canceled issue) and the newest change is kept under ``ralph/NAME``.
        Already forgotten is fine. A directory that jj does not know is left
        alone: it may hold edits nobody snapshotted.
        """
        path = self.workspace_path(name)
        if name not in self._listed():
            if path.exists():
                log.warning("jj_orphan_workspace_dir_kept", workspace=name, path=str(path))
            return
        bookmark = self.bookmark(name)
        if path.is_dir():
            self._refuse_if_unrecorded(name, self._snapshot(path), "forget")
        revset_ws = f"{_q(name)}@"
        unmerged = self._count(None, f"({self._trunk}..{revset_ws}) ~ empty()")
        if unmerged and not keep_bookmark:
            raise JJError(
                f"refusing to forget workspace {name}: it would lose work ({unmerged} change(s) "
                f"not in {self.trunk}); merge it first, or forget it as canceled to keep the "
                f"change under bookmark {bookmark}"
            )
        if unmerged:
            heads = self._read(
                "log", "--no-graph", "-r",
                f'heads(({self._trunk}..{revset_ws}) ~ (empty() & description(exact:"")))',
                "-T", 'commit_id ++ "\\n"',
            ).lines()
            self._read("bookmark", "set", "--allow-backwards", bookmark, "-r", heads[0])
            if len(heads) > 1:
                for i, extra in enumerate(heads[1:], start=2):
                    extra_bookmark = f"{bookmark}-{i}"
                    self._read("bookmark", "set", "--allow-backwards", extra_bookmark, "-r", extra)
            log.info("jj_change_kept", workspace=name, bookmark=bookmark)
        else:
            self.run("--ignore-working-copy", "bookmark", "delete", bookmark)
        self._read("workspace", "forget", name)
        if path.exists():
            shutil.rmtree(path)
        else:
            self._prune_git_worktrees()
        log.info("jj_workspace_forgotten", workspace=name, kept=bool(unmerged))

    # -- trunk --

    def trunk_commit(self) -> str:
        """The commit trunk points at (read without touching any working copy)."""
        return self._read("log", "--no-graph", "-r", self._trunk, "-T", "commit_id").stdout.strip()

    def trunk_checkout(self) -> Path:
        """A directory holding trunk's current files (for the verify command).

        A workspace of its own, so verifying never touches a worker's or the
        person's working copy. Whatever the verify command wrote there last time
        was snapshotted into a scratch change; that change is abandoned.
        """
        path = (self.workspace_root / f".{TRUNK_WORKSPACE}").resolve()
        listed = self._listed()
        if TRUNK_WORKSPACE in listed and not path.is_dir():
            self._read("workspace", "forget", TRUNK_WORKSPACE)  # someone deleted it
            self._prune_git_worktrees()
            del listed[TRUNK_WORKSPACE]
        if TRUNK_WORKSPACE not in listed:
            if path.exists():
                shutil.rmtree(path)  # ours: a scratch checkout left by a forgotten workspace
            path.parent.mkdir(parents=True, exist_ok=True)
            self.run(
                "workspace", "add", "--name", TRUNK_WORKSPACE, "-r", self._trunk, str(path),
                cwd=self.repo,
            ).check()
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
            f'commit_id ++ "{_FS}" ++ description.first_line() ++ "{_FS}" '
            f'++ committer.timestamp().format("%Y-%m-%dT%H:%M:%S%:z") ++ "{_FS}" '
            f'++ {stat}.total_added() ++ "{_FS}" '
            f'++ {stat}.total_removed() ++ "{_FS}" '
            f'++ self.diff().files().map(|f| f.path()).join("{_RS}") ++ "\\n"'
        )
        out = self._read("log", "--no-graph", "-r", f"::{self._trunk} ~ root()",
                         "--limit", str(max(1, int(limit))), "-T", template)
        changes = []
        for line in out.lines():
            parts = line.split(_FS)
            if len(parts) != 6:
                continue
            commit, title, when, added, removed, files = parts
            changes.append(TrunkChange(
                commit=commit, title=title, time=when,
                added=int(added) if added.isdigit() else 0,
                removed=int(removed) if removed.isdigit() else 0,
                files=tuple(f for f in files.split(_RS) if f),
            ))
        return changes
