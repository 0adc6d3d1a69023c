"""jj's command line: the one place ralph-dev starts a ``jj`` process.

Every call goes through :meth:`JjCli.run`, on the one command runner
(``adapters.process``: never a shell, a timeout that kills jj and the git it
started), and comes back as that runner's result; its ``check()`` raises a
:class:`JJError` (:func:`jj_failure` reads which) carrying the command and jj's
own words. Finding the binary and the PATH every repo-touching process needs
(jj's own git first: colocated repos) live here too, and so do the queries every
part of the jj adapter asks (bookmarks, counts, logs). The parts themselves —
workspaces, merges, trunk, publishing — are small classes that each hold the
one ``JjCli`` of a repository (``adapters.jj`` puts them together).

The person's own checkout is theirs: any jj command run anywhere but in one of
ralph-dev's workspaces gets ``--ignore-working-copy`` here, whoever wrote the
call, so jj never snapshots their files, rewrites their ``@`` or (in a
colocated repo) resets their git index and HEAD. Only the person's explicit
``ralph-dev init --colocate`` (and the demo making its own repo) touch it.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import structlog

from ralph_dev.adapters.process import CommandResult, run_command
from ralph_dev.core.errors import CommandError

log = structlog.get_logger(__name__)

JJ_TIMEOUT = 120.0
"""Seconds before a jj command is considered hung (they normally take < 0.1 s)."""
FIELD_SEP = "\x1f"  # field separator in our templates (never in names we accept)
LIST_SEP = "\x1e"  # list separator inside a field


class JJError(CommandError):
    """A jj command failed or jj refused; carries the command for the log and the fix."""


class JJInterrupted(JJError):
    """jj was killed or timed out: nothing is known to be wrong; the next try may work."""

    retryable = True


def jj_failure(result: CommandResult, fix: str = "") -> JJError:
    """How a failed jj command reads: interrupted (killed, timed out: try again) or jj's
    own refusal, in jj's own words."""
    where = f" in {result.cwd}" if result.cwd else ""
    if result.interrupted:
        return JJInterrupted(
            f"jj {' '.join(result.argv[1:4])}… was interrupted ({result.how_it_ended}){where}; "
            "nothing is known to be wrong, the next attempt runs it again",
            command=result.argv, stderr=result.stderr, returncode=result.returncode,
        )
    return JJError(
        f"jj {' '.join(result.argv[1:])} failed (exit {result.returncode}){where}: "
        f"{result.words}" + (f"; {fix}" if fix else ""),
        command=result.argv, stderr=result.stderr, returncode=result.returncode,
    )


def is_stale(result: CommandResult) -> bool:
    """jj refused because the workspace's working copy is stale (another workspace
    rewrote its commit): ``jj workspace update-stale`` repairs it."""
    return not result.ok and "stale" in result.stderr


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


def quote_revset(text: str) -> str:
    """A revset/template string literal (names are validated, this is belt and braces)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


_REFUSED_LINE = re.compile(r"^  (.+): \S+ \(\d+ bytes\)")


def refused_paths(stderr: str) -> list[str]:
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


class JjCli:
    """jj run in one repository (or one of its workspaces) with a fixed author."""

    def __init__(
        self,
        repo: Path,
        *,
        workspace_root: Path | None = None,
        jj_bin: str | None = None,
        user: tuple[str, str] | None = ("ralph-dev", "ralph-dev@localhost"),
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.repo = Path(repo)
        self.workspace_root = Path(workspace_root) if workspace_root is not None else None
        """Where ralph-dev's own workspaces are: the only working copies jj may touch
        (None: none at all)."""
        self._jj_bin = jj_bin
        self.user = user
        """Author of the commits jj makes (None: the person's own jj settings)."""
        self.environ = environ
        """The environment jj runs in (None: this process's), PATH and author aside."""
        self.calls = 0
        """jj processes started by this instance (tests and benchmarks measure cost)."""
        self._beside: list[threading.Thread] = []
        """jj runs started by ``run_beside`` that may not have ended yet."""
        self._beside_lock = threading.Lock()

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
        env = dict(os.environ if self.environ is None else self.environ)
        env["PATH"] = self.child_path()
        if self.user is not None:
            env["JJ_USER"], env["JJ_EMAIL"] = self.user
        return env

    def op_heads(self) -> tuple[str, ...] | None:
        """The repository's operation heads (None: not readable). Every jj operation,
        a snapshot of any workspace included, changes them, and a command run with
        ``--ignore-working-copy`` reads nothing else (nor imports git refs): the same
        heads, the same answer."""
        repo = self.repo / ".jj" / "repo"
        try:
            if repo.is_file():  # a secondary workspace names the repository's store
                repo = (repo.parent / repo.read_text(encoding="utf-8").strip()).resolve()
            return tuple(sorted(p.name for p in (repo / "op_heads" / "heads").iterdir()))
        except (OSError, ValueError):
            return None

    def owns_checkout(self, where: Path) -> bool:
        """Whether jj may snapshot and update the working copy at ``where``: only in
        ralph-dev's own workspaces, below ``workspace_root``."""
        if self.workspace_root is None:
            return False
        root = self.workspace_root.resolve()
        return Path(where).resolve().is_relative_to(root) and Path(where).resolve() != root

    def run(self, *args: str, cwd: Path | None = None,
            touch_checkout: bool = False) -> CommandResult:
        """Run jj once (never through a shell); failures come back in the result.

        Outside ralph-dev's workspaces jj runs with ``--ignore-working-copy``
        unless ``touch_checkout`` says the person asked for it.
        """
        self.settle()
        return self._run(*args, cwd=cwd, touch_checkout=touch_checkout)

    def run_beside(self, *args: str, cwd: Path, why: str) -> None:
        """Run jj in a thread of its own, the caller not waiting: for a step no one needs
        at once (a new workspace's bookmark, ~15 ms of a spawn). Every later ``run`` of
        this instance waits for it first, so what jj did stays in the order it was asked,
        and this process's exit waits for it too (not a daemon thread). A failure is said
        in the log (``why``: what is then missing, and why nothing is lost)."""
        thread = threading.Thread(target=self._run_quietly, args=(args, cwd, why),
                                  name=f"jj-{args[0] if args else 'run'}")
        with self._beside_lock:  # started before anyone can see it (and join it)
            thread.start()
            self._beside.append(thread)

    def settle(self) -> None:
        """Wait for the jj runs started beside (``run_beside``) to end."""
        me = threading.current_thread()
        with self._beside_lock:
            pending = [t for t in self._beside if t is not me]
        for thread in pending:
            thread.join()
        with self._beside_lock:
            self._beside = [t for t in self._beside if t.is_alive()]

    def _run_quietly(self, args: tuple[str, ...], cwd: Path, why: str) -> None:
        result = self._run(*args, cwd=cwd)
        if not result.ok:
            log.warning("jj_beside_failed", args=list(args[:4]), cwd=str(cwd),
                        error=result.stderr.strip()[-300:], why=why)

    def _run(self, *args: str, cwd: Path | None = None,
             touch_checkout: bool = False) -> CommandResult:
        where = Path(cwd) if cwd is not None else self.repo
        if not (touch_checkout or self.owns_checkout(where) or "--ignore-working-copy" in args):
            args = ("--ignore-working-copy", *args)
        argv = (self.jj_bin, "--no-pager", "--color", "never", *args)
        self.calls += 1
        started = time.monotonic()
        result = run_command(argv, cwd=where, env=self.child_env(), timeout=JJ_TIMEOUT,
                             classify=jj_failure)
        ms = round((time.monotonic() - started) * 1000)
        log.debug("jj", args=list(args[:3]), cwd=str(where), rc=result.returncode, ms=ms)
        return result

    def read(self, *args: str) -> CommandResult:
        """A query run from the repo root, which never touches the person's working copy
        (see :meth:`run`); repo-level *writes* run in a workspace of ralph-dev's own,
        because in a colocated repo any jj transaction at the root also resets the
        person's git index."""
        return self.run("--ignore-working-copy", *args).check()

    def push_bookmark(self, bookmark: str, revision: str, remote: str, cwd: Path) -> None:
        """Point ``bookmark`` at ``revision`` (backwards too) and push it to ``remote``:
        how a change leaves this repository (a pull request's head, a cluster host's
        work, the trunk hosts start from). Run in ralph-dev's workspace ``cwd``."""
        self.run("bookmark", "set", "--allow-backwards", bookmark, "-r", revision,
                 cwd=cwd).check()
        self.run("git", "push", "--remote", remote, "--bookmark", bookmark, cwd=cwd).check()

    def count(self, revset: str, cwd: Path | None = None) -> int:
        """How many commits ``revset`` holds, asked in workspace ``cwd`` (snapshotting
        it) or, with None, from the repo root without touching any working copy."""
        args = ("log", "--no-graph", "-r", revset, "-T", '"x\\n"')
        if cwd is None:
            return len(self.read(*args).lines())
        return len(self.run(*args, cwd=cwd).check().lines())

    def init_colocated(self, *, message: str, trunk: str) -> None:
        """A new colocated repo in ``repo`` with its files committed and a trunk bookmark
        (the demo's throwaway project)."""
        self.repo.mkdir(parents=True, exist_ok=True)
        self.colocate()
        self.run("commit", "-m", message, touch_checkout=True).check()
        self.run("bookmark", "create", trunk, "-r", "@-", touch_checkout=True).check()

    def colocate(self) -> None:
        """``jj git init --colocate`` in ``repo``: git stays as it is, jj moves in beside it.

        jj snapshots the files there into the new working-copy commit (that is
        what making a jj repo means), so the person asks for it explicitly.
        """
        self.run("git", "init", "--colocate", touch_checkout=True).check()

    def local_bookmarks(self) -> list[str]:
        """The repository's own bookmarks (not remote-tracking ones)."""
        return self.read("bookmark", "list", "-T", 'if(remote, "", name ++ "\\n")').lines()

    def has_commits(self) -> bool:
        """Whether the person's working copy sits on a commit other than the root one."""
        return bool(self.read("log", "--no-graph", "-r", "@- ~ root()", "-T", '"x"').stdout)

    def missing_trunk_fix(self, trunk: str, bookmarks: list[str], choose: str) -> str:
        """What to do when bookmark ``trunk`` is missing: each suggested command works
        as written (an empty repository needs a commit before a bookmark means
        anything). ``choose`` is how the caller picks an existing bookmark instead."""
        create = f"`jj bookmark create {trunk} -r @-` in {self.repo}"
        if not self.has_commits():
            return (f"it has no commits yet; commit your files and name trunk: "
                    f"`jj commit -m 'initial commit' && jj bookmark create {trunk} -r @-` "
                    f"in {self.repo}")
        if bookmarks:
            return (f"its bookmarks are {', '.join(bookmarks[:10])}; {choose} the one merges "
                    f"should go to, or create {trunk!r} at your working copy's parent: {create}")
        return f"create it at your working copy's parent: {create}"

    def log(self, revset: str, template: str) -> str:
        """``jj log`` of ``revset`` with ``template``, read without touching any working copy."""
        return self.run("--ignore-working-copy", "log", "--no-graph", "-r", revset,
                        "-T", template).check().stdout

    def version(self) -> str:
        """``jj --version``'s first line (raises JJError when jj cannot run)."""
        return self.run("--version").check().stdout.strip().splitlines()[0]
