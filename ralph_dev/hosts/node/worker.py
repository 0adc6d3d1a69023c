"""One worker attempt on the host a cluster placed it on: its clone, workspace and window.

A host shares nothing with the controller but the git remote. So the attempt keeps
the project in a jj clone of the host's own (one per node, so two nodes on one
machine never share one; the attempts on a node share it under a lock), makes its
workspace there from trunk, or from the last snapshot an earlier attempt pushed,
runs the worker's command in a tmux server of its own, and sends its change back
as bookmark ``ralph/ISSUE/aN`` — a name that carries the attempt, so the controller
can tell the current attempt's push from a stale one's (``core.cluster``).

This module knows nothing of Ray: ``hosts.ray.plane`` makes it an actor, and
tests drive it as a plain object. Each method is one call the controller makes
through the plane; none is started by anything an issue says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from ralph_dev.adapters.files import (
    atomic_write_bytes,
    flocked,
    private_dir,
    read_lines_from,
    read_tail,
)
from ralph_dev.adapters.jj_cli import JjCli, child_path, find_jj, quote_revset
from ralph_dev.adapters.jj_home import JjHome
from ralph_dev.adapters.jj_workspaces import JjWorkspaces
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.agent.claude import AgentError
from ralph_dev.agent.egress import LEDGER
from ralph_dev.agent.launch import LAUNCH_SPEC, sandbox_fit_here
from ralph_dev.agent.sandbox import try_host_sandbox
from ralph_dev.core import cluster
from ralph_dev.core.cluster import session_folder
from ralph_dev.core.environment import RUN_DIR_VAR, is_secret_name
from ralph_dev.core.errors import HostUnavailable, RalphError
from ralph_dev.core.model import SESSION_ID_RE, Placement, Window
from ralph_dev.core.paths import data_home
from ralph_dev.hosts import bundle as launch_bundle
from ralph_dev.hosts.bundle import SESSIONS, SHIPPED_ROOT, Bundle
from ralph_dev.hosts.hooks import Hooks
from ralph_dev.hosts.node.mailbox import NodeMailbox

log = structlog.get_logger(__name__)

SERVER_EXIT_WAIT = 2.0
"""How long a tmux server without windows is given to finish exiting before the
attempt's window is said to be gone by itself, not lost with its server."""

REMOTE = "origin"
"""What a node's clone calls the cluster's remote (``jj git clone`` names it so)."""


class AttemptRunning(HostUnavailable):
    """A start asked of an attempt that runs already: refused, and the attempt left as
    it is."""


@dataclass(frozen=True)
class WorkerSpec:
    """What a host needs to run one worker attempt: all of it from the controller's
    config, none of it from an issue's text."""

    project: str
    issue: str
    """Empty for a process started before it is wanted: it becomes an attempt by
    ``NodeWorker.bind``."""
    attempt: int
    remote: str
    """The git URL every host fetches from and pushes to."""
    trunk: str = "main"
    root: str | None = None
    """Where hosts keep their clones (None: ralph-dev's data directory on each host)."""
    snapshot_interval: float = 0.0
    """Seconds between work-in-progress pushes while the window lives (0: only when
    asked)."""
    rebase: bool = False
    """Start from the earlier push rebased onto trunk: a resolve worker meets the
    conflicts the controller's merge met, in its own workspace."""
    hooks: Hooks | None = None
    """The project's workspace hooks, run here in the attempt's workspace (their output
    goes to the attempt's log on this host)."""
    lease: float = 0.0
    """Seconds the attempt runs on without a call from the controller (``cluster.lease``;
    0: for as long as it likes). It stops its agent itself at ``LEASE_STOP`` of them."""
    trunk_commit: str | None = None
    """The commit of ``trunk`` the controller last pushed for hosts to start from: a
    clone that fetched it already (kept warm) need not fetch again."""
    idle_exit: float = 0.0
    """Seconds a process started before it is wanted (no ``issue`` yet) waits to become
    an attempt before it ends (0: for ever)."""

    @property
    def bookmark(self) -> str:
        return cluster.attempt_bookmark(self.issue, self.attempt)

    @property
    def workspace_name(self) -> str:
        return f"{self.issue}-a{self.attempt}"


LEASE_STOP = 0.75
"""The share of its lease after which an attempt that heard nothing from the controller
stops its agent: well before the controller, counting from the last call it made that
came back, may start the issue's next attempt elsewhere."""


SUPERSEDED_WAIT = 2.0
"""Seconds at most an attempt whose lease ran out gives its worker's waiting commands to
read that it is superseded, before its agent is stopped (half of what is left of the
lease, if less)."""


WORKER_TOOLS = ("jj", "git", "tmux", "setpriv", "bwrap")
"""What a host runs a worker with: jj (and a git beside it or on PATH that works with
it), tmux, setpriv (the worker's leash to its node) and bubblewrap (its sandbox)."""


def host_tools(agent: str | None = None) -> dict[str, str | None]:
    """Where this host has each of :data:`WORKER_TOOLS` (None: missing), found the way a
    worker here finds them; and the agent program the controller's launches run
    (``agent``: its path or name), if named."""
    jj = find_jj()
    path = child_path(jj) if jj else os.environ.get("PATH", os.defpath)
    found: dict[str, str | None] = {name: shutil.which(name, path=path)
                                    for name in WORKER_TOOLS}
    found["jj"] = jj
    if agent:
        found[f"the agent ({agent})"] = shutil.which(agent, path=path)
    return found


def host_sandbox() -> str | None:
    """Why this host cannot start a worker's sandbox as a launch sent here gets it, with
    the path and the fix; None when it can (``doctor``, asked on each node)."""
    try:
        try_host_sandbox(Path.home())
    except AgentError as exc:
        return str(exc)
    return None


class NodeWorker:
    """One attempt on this host. ``locate`` tells which node this is (Ray's node id on
    a cluster): the clone is per node, not per machine."""

    def __init__(self, spec: WorkerSpec, locate: Callable[[], Placement]) -> None:
        self.spec = spec
        self.placement = locate()
        root = Path(spec.root) if spec.root else data_home() / "nodes"
        self.home = root / self.placement.node[:16]
        self.jj = JjCli(self.home / "clones" / spec.project,
                        workspace_root=self.home / "workspaces" / spec.project)
        self._binding = threading.Lock()
        if spec.issue:
            self._bound_to(spec)
        self._stopped = threading.Event()
        self._server: subprocess.Popen[bytes] | None = None
        self._seen = False
        """Its window was seen: a server without it since has ended, or is ending."""
        self._bundle: Bundle | None = None
        self._mailbox: NodeMailbox | None = None
        self._agent_home: Path | None = None
        self._fresh = False
        """The workspace was made by this attempt and its ``after_create`` has not run."""
        self._lease_ran_out = False
        self._fetched: str | None = None
        """The trunk commit this process's ``warm`` fetch found on the remote."""
        self._renewed = time.monotonic()
        """When the controller last called (this host's monotonic clock: no clock is
        shared between hosts)."""
        if not spec.issue and spec.idle_exit > 0:
            threading.Thread(target=self._exit_unbound, name="idle-exit", daemon=True).start()

    def _bound_to(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.workspace = self.home / "workspaces" / spec.project / spec.workspace_name
        # the worker's change as the controller's reports see it: the same checks as on
        # one host, against the trunk this host started from
        self.changes = JjWorkspaces(JjHome(self.jj, self.workspace.parent), spec.trunk)
        # a server per attempt: ending the attempt ends every process it started
        self.tmux = Tmux(f"ralph-{spec.project}",
                         f"ralph-{spec.project}-{spec.issue}-a{spec.attempt}")

    def bind(self, issue: str, attempt: int, *, rebase: bool = False,
             hooks: Hooks | None = None, trunk_commit: str | None = None) -> Placement:
        """This process, started before it was wanted (``warm``), becomes attempt
        ``attempt`` of ``issue``: once, and never after it gave up waiting."""
        with self._binding:
            if self.spec.issue:
                raise AttemptRunning(
                    f"{cluster.actor_name(self.spec.project, issue, attempt)}: this process "
                    f"on {self.placement.host} is attempt {self.spec.attempt} of "
                    f"{self.spec.issue} already; one process runs one attempt")
            if self._stopped.is_set():
                raise HostUnavailable(f"{issue}: the process kept warm for it on "
                                      f"{self.placement.host} has ended")
            self._bound_to(dataclasses.replace(self.spec, issue=issue, attempt=attempt,
                                               rebase=rebase, hooks=hooks,
                                               trunk_commit=trunk_commit))
        return self.placement

    def warm(self) -> None:
        """The node's clone made or fetched while nothing waits for it: the attempt this
        process becomes fetches only what trunk gained since."""
        with self._clone_locked():
            self._fetched_clone()
            self._fetched = self.jj.read(
                "log", "--no-graph", "-r", f"{quote_revset(self.spec.trunk)}@{REMOTE}",
                "-T", "commit_id").stdout.strip()

    def _exit_unbound(self) -> None:
        """A process kept warm that no attempt took within ``idle_exit`` ends, holding no
        slot for a controller that is gone (the controller that kept it starts another)."""
        if self._stopped.wait(self.spec.idle_exit):
            return
        with self._binding:
            if self.spec.issue:
                return
            self._stopped.set()
        log.info("warm_process_idle", host=self.placement.host, waited_s=self.spec.idle_exit)
        os._exit(0)

    def where(self) -> Placement:
        return self.placement

    @property
    def own_dir(self) -> Path:
        """Where the attempt's launch files and run directory lie on this host."""
        return self.home / "runs" / self.spec.project / self.spec.workspace_name

    @property
    def log_file(self) -> Path:
        """What the worker's pane printed, on this host."""
        return self.home / "logs" / f"{self.spec.workspace_name}.log"

    def read_log(self, position: int, limit: int) -> tuple[bytes, int]:
        """The log from ``position`` (at most its last ``limit`` bytes; from the start
        again when it is shorter than ``position``), and where it ends now."""
        return read_tail(self.log_file, position, limit)

    def read_ledger(self, position: int, limit: int) -> tuple[bytes, int]:
        """What the attempt's egress proxy wrote here from ``position`` on, whole lines of
        at most ``limit`` bytes, and where they end (``hosts.ray.ledger`` brings them to
        the controller)."""
        lines, end = read_lines_from(self.own_dir / SHIPPED_ROOT / LEDGER, position, limit)
        return b"".join(line + b"\n" for line in lines), end

    # -- the code -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _clone_locked(self) -> Iterator[None]:
        """The node's clone, one attempt at a time: a clone, a fetch, a new workspace and
        a push each write its operation log."""
        self.home.mkdir(parents=True, exist_ok=True)
        with flocked(self.home / f"{self.spec.project}.lock"):
            yield

    def _fetched_clone(self) -> None:
        repo = self.jj.repo
        if not (repo / ".jj").is_dir():
            shutil.rmtree(repo, ignore_errors=True)  # a clone cut short last time
            repo.parent.mkdir(parents=True, exist_ok=True)
            self.jj.run("git", "clone", "--no-colocate", "--", self.spec.remote, str(repo),
                        cwd=repo.parent, touch_checkout=True).check()
        else:
            self.jj.read("git", "fetch", "--remote", REMOTE)
        # the trunk this host starts from, as a local name its checks can use
        self.jj.read("bookmark", "set", self.spec.trunk, "-r",
                     f"{quote_revset(self.spec.trunk)}@{REMOTE}", "--allow-backwards")

    def _bookmarks(self) -> list[str]:
        """The remote's bookmarks as this clone last fetched them."""
        return self.jj.read("bookmark", "list", "--all-remotes", "-T",
                            f'if(remote == "{REMOTE}", name ++ "\\n")').lines()

    def _make_workspace(self) -> str:
        """The attempt's workspace, from the last earlier attempt's push when there is
        one (a lost host's snapshot), else from trunk, prepared by the project's
        ``after_create`` hook; the revision it started from. A hook that fails takes the
        workspace away again, as on one host."""
        spec = self.spec
        # a first attempt has no earlier push to go on from
        base = (cluster.resume_point(spec.issue, spec.attempt, self._bookmarks())
                if spec.attempt > 1 else None) or spec.trunk
        if not self.workspace.is_dir():
            # made as every workspace of ralph-dev's is (``JjHome.add``)
            self.changes.home.add(spec.workspace_name, self.workspace,
                                  f"{quote_revset(base)}@{REMOTE}").check()
            if base != spec.trunk:
                self._folded_into_one(rebase=spec.rebase)
            self._fresh = True
        return base

    def _prepared_by_hook(self) -> None:
        """The project's ``after_create`` in a workspace this attempt made (outside the
        clone's lock: an `npm ci` must not hold up the node's other attempts). A hook
        that fails takes the workspace away again, as on one host."""
        prepare = self._hooks.after_create() if self._hooks is not None else None
        if not self._fresh or prepare is None:
            return
        try:
            prepare(self.workspace)
        except BaseException:
            with self._clone_locked():
                self._remove_workspace()
            raise
        finally:
            self._fresh = False

    @property
    def _hooks(self) -> Hooks | None:
        """The project's hooks, their output in this attempt's log here."""
        if self.spec.hooks is None:
            return None
        return dataclasses.replace(self.spec.hooks, log_path=self.log_file)

    def _remove_workspace(self) -> None:
        with contextlib.suppress(RalphError):
            self.changes.home.forget(self.spec.workspace_name)
        shutil.rmtree(self.workspace, ignore_errors=True)

    def _folded_into_one(self, *, rebase: bool) -> None:
        """The earlier attempt's work folded into the working copy, so what the issue
        lands is one change, not one per attempt (and no snapshot's stand-in message
        reaches trunk). ``rebase``: onto trunk first, so a resolve worker's conflicts
        are its working copy's own and its edits resolve them."""
        trunk = quote_revset(self.spec.trunk)
        if rebase:
            # the earlier push is a remote bookmark, immutable to jj: its commits are
            # copied by the rebase, and the remote's bookmark stays where the remote has it
            self.jj.run("--ignore-immutable", "rebase", "-b", "@", "-o", trunk,
                        cwd=self.workspace).check()
        if self.jj.count(f"{trunk}..@-", self.workspace):
            self.jj.run("--ignore-immutable", "squash", "--from", f"{trunk}..@-", "--into", "@",
                        "-m", f"{self.spec.issue}: work in progress, continued by attempt "
                              f"{self.spec.attempt}", cwd=self.workspace).check()

    # -- the process ------------------------------------------------------------------------

    def prepare(self) -> str:
        """Clone or fetch, and make the attempt's workspace: its path on this host, which
        the controller builds the worker's launch (and its sandbox) around."""
        with self._clone_locked():
            if self.spec.trunk_commit is None or self.spec.trunk_commit != self._fetched:
                self._fetched_clone()
            base = self._make_workspace()
        self._prepared_by_hook()
        log.info("cluster_worker_placed", issue=self.spec.issue, attempt=self.spec.attempt,
                 host=self.placement.host, started_from=base)
        return str(self.workspace)

    def start(self, command: Sequence[str], environment: Mapping[str, str]) -> Window:
        """Open the worker's window in its workspace (made first, if ``prepare`` was not
        asked).

        A tmux server by this attempt's name on this machine is a leftover (Ray lets
        only one actor hold the name, and a tmux server outlives the node that started
        it): it is ended first, so the window found later is this start's."""
        if self._server is not None:
            raise AttemptRunning(
                f"{cluster.actor_name(self.spec.project, self.spec.issue, self.spec.attempt)}: "
                f"already started on {self.placement.host}; one attempt never runs twice")
        if self._bundle is not None:
            try:
                return self._started(*self._unpacked(self._bundle, command, environment))
            except BaseException:
                self._discard_secrets()  # the launcher that deletes them never ran
                raise
        return self._started(command, environment)

    def _started(self, command: Sequence[str], environment: Mapping[str, str]) -> Window:
        run_dir = environment.get(RUN_DIR_VAR)
        if run_dir is not None and not Path(run_dir).is_dir():  # this host's setup
            raise HostUnavailable(
                f"{self.spec.issue}: host {self.placement.host} has no run directory "
                f"{run_dir}, and the controller sent no launch files to make one: start "
                "cluster workers through the controller, which sends them")
        self.tmux.kill_server()
        if not self.workspace.is_dir():
            self.prepare()
        env = {**environment, "RALPH_DEV_WORKSPACE": str(self.workspace),
               "PATH": self._path(environment.get("PATH", os.defpath))}
        # the server is this process's child, killed with it: a daemonized one would keep
        # the agent running after its node died, a second live agent on the issue once
        # the controller starts the next attempt elsewhere
        self._server = self.tmux.start_leashed_server(
            {k: v for k, v in os.environ.items() if not is_secret_name(k)})
        self.tmux.ensure_session(self.workspace, {"PATH": env["PATH"]})
        log_file = self.log_file
        # a pane gets its tmux client's PATH whatever `-e PATH=` says (tmux 3.3a): set
        # it in the command itself
        window = self.tmux.open_window(self.spec.issue, cwd=self.workspace,
                                       command=["env", "--", f"PATH={env['PATH']}", *command],
                                       environment=env, log_file=log_file)
        if self.spec.snapshot_interval > 0:
            threading.Thread(target=self._snapshots, name="snapshots", daemon=True).start()
        self.renew()
        if self.spec.lease > 0:
            threading.Thread(target=self._keep_lease, name="lease", daemon=True).start()
        return window

    def renew(self) -> None:
        """The controller called: the lease runs from now."""
        self._renewed = time.monotonic()

    def _keep_lease(self) -> None:
        """Stop the agent once the controller has not called for ``LEASE_STOP`` of the
        lease (a cut-off host, a lost controller): the controller may then start the
        issue's next attempt, and two agents never work on one issue. Its work is pushed
        once more if the remote can still be reached."""
        limit = self.spec.lease * LEASE_STOP
        while not self._stopped.wait(min(1.0, limit / 10)):
            silent = time.monotonic() - self._renewed
            if silent < limit:
                continue
            log.warning("lease_expired", issue=self.spec.issue, attempt=self.spec.attempt,
                        silent_s=round(silent, 1), lease_s=self.spec.lease)
            self._lease_ran_out = True
            if self._mailbox is not None:  # a `worker done` waiting learns it is over
                self._mailbox.refuse_waiting(
                    f"{self.spec.issue}: attempt {self.spec.attempt} is superseded: the "
                    f"controller has not reached this host for {silent:.0f}s, so the "
                    "attempt stops itself before its lease runs out. Its work is pushed "
                    f"as {self.spec.bookmark}, and the issue's next attempt goes on from "
                    "it. Nothing more to do here.",
                    min(SUPERSEDED_WAIT, self.spec.lease * (1 - LEASE_STOP) / 2))
            self._stopped.set()
            self.tmux.kill_server()
            if self._server is not None:
                self._server.kill()
            try:
                self.push()
            except RalphError as exc:
                log.warning("lease_push_failed", issue=self.spec.issue, error=str(exc))
            return

    def receive(self, bundle: Bundle) -> None:
        """The worker's launch files, from the controller's host: unpacked here by
        ``start``."""
        self._bundle = bundle

    def _unpacked(self, bundle: Bundle, command: Sequence[str], environment: Mapping[str, str]
                  ) -> tuple[list[str], dict[str, str]]:
        """The launch files written under :attr:`own_dir`, the command and environment
        moved to name them there, the run directory's mailbox open, and the session the
        launch resumes put where the agent looks for it."""
        moves = launch_bundle.unpack(bundle, self.own_dir)
        command = [launch_bundle.moved(part, moves) for part in command]
        for part in command:  # the sandbox hides what this host has, not the controller's
            if part.endswith(LAUNCH_SPEC) and Path(part).is_file():
                sandbox_fit_here(Path(part), Path.home())
        environment = {k: launch_bundle.moved(v, moves) for k, v in environment.items()}
        if RUN_DIR_VAR in environment:
            self._mailbox = NodeMailbox(Path(environment[RUN_DIR_VAR]))
            self._mailbox.open()
        home = environment.get("HOME")
        if home:
            self._agent_home = Path(home)
            self._place_sessions(Path(home))
        return command, environment

    def _place_sessions(self, home: Path) -> None:
        """Each shipped transcript (``SESSIONS``) where Claude Code looks for the
        sessions of this workspace: a resumed session continues here."""
        folder = session_folder(self.workspace)
        for transcript in sorted((self.own_dir / SHIPPED_ROOT / SESSIONS).glob("*.jsonl")):
            if folder is None:
                log.warning("session_not_placed", issue=self.spec.issue,
                            why="the workspace's path is too long for Claude Code's folder")
                return
            target = home / ".claude" / "projects" / folder
            private_dir(target)
            atomic_write_bytes(target / transcript.name, transcript.read_bytes())

    def exchange(self, files: Mapping[str, bytes], answers: Mapping[str, bytes],
                 taken: list[str], wait: float) -> dict[str, bytes]:
        """The carrier's call (``hosts.node.mailbox``); nothing before the window
        started. Every call renews the attempt's lease; one that ran out is refused (the
        controller counts no renewal from it: the issue's next attempt may start)."""
        if self._lease_ran_out:
            raise HostUnavailable(f"{self.spec.issue}: attempt {self.spec.attempt} stopped "
                                  "itself: its lease ran out")
        self.renew()
        if self._mailbox is None:
            self._stopped.wait(min(wait, 1.0))
            return {}
        return self._mailbox.exchange(files, answers, taken, wait)

    def transcript(self, session_id: str) -> bytes | None:
        """The agent session's transcript on this host (None: none here), for the
        controller to keep and send to the issue's next attempt."""
        if self._agent_home is None or not SESSION_ID_RE.fullmatch(session_id):
            return None
        for path in (self._agent_home / ".claude" / "projects").glob(f"*/{session_id}.jsonl"):
            return path.read_bytes()
        return None

    def _snapshots(self) -> None:
        """Push what the worker has every interval while its window lives, and once
        more when it has ended: a host lost later loses at most one interval of work."""
        while not self._stopped.wait(self.spec.snapshot_interval):
            window = self.window()
            try:
                self.push()
            except RalphError as exc:  # the remote is away: the next interval tries again
                log.warning("snapshot_push_failed", issue=self.spec.issue,
                            attempt=self.spec.attempt, error=str(exc))
            if window is None or not window.alive:
                return

    def _path(self, given: str) -> str:
        """The worker's PATH on this host: this host's jj (and a git that works with it)
        first, whatever the controller's host has where."""
        jj_dir = str(Path(self.jj.jj_bin).parent)
        return os.pathsep.join([jj_dir, *(p for p in child_path(self.jj.jj_bin, given)
                                          .split(os.pathsep) if p != jj_dir)])

    def window(self) -> Window | None:
        """The attempt's window as tmux sees it now; None once its server is gone: ended
        by this attempt, or not started; one ended from outside (its pane never exited)
        is said as such (``server_lost``), no failure of the issue's."""
        if not self.spec.issue:
            return None
        found = self.tmux.find(self.spec.issue)
        if found:
            self._seen = True
            return found[0]
        if self._lease_ran_out:  # stopped by its host, for no failure of the issue's
            return Window(name=self.spec.issue, pane_id="", window_id="", alive=False,
                          server_lost=True)
        if self._server is not None and not self._stopped.is_set():
            if self._seen:  # its window went: a server killed from outside may be exiting
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._server.wait(timeout=SERVER_EXIT_WAIT)
            if self._server.poll() is not None:
                return Window(name=self.spec.issue, pane_id="", window_id="", alive=False,
                              server_lost=True)
        return None

    def capture(self, lines: int = 40) -> str:
        return self.tmux.capture(self._pane(), lines)

    def send_text(self, text: str) -> None:
        self.tmux.send_text(self._pane(), text)

    def dismiss(self) -> None:
        self.tmux.dismiss(self._pane())

    # -- the change, as the worker's reports see it ------------------------------------------

    def snapshot(self) -> list[str]:
        return self.changes.snapshot(self.spec.workspace_name)

    def describe(self, message: str, require_change: bool) -> None:
        self.changes.describe(self.spec.workspace_name, message, require_change=require_change)

    def change_diff(self) -> str:
        return self.changes.change_diff(self.spec.workspace_name)

    def conflicted_files(self) -> list[str]:
        return self.changes.conflicted_files(self.spec.workspace_name)

    def _pane(self) -> str:
        window = self.window()
        if window is None:
            raise LookupError(f"{self.spec.issue}: its window on {self.placement.host} is gone")
        return window.pane_id

    def stop(self, *, remove: bool = False) -> None:
        """End the attempt's processes. ``remove``: its work came back (its final push),
        so its workspace here goes too, after the project's ``before_remove`` hook;
        otherwise it stays (its work may be only there)."""
        self._stopped.set()
        if not self.spec.issue:  # kept warm, never an attempt: nothing of one to end
            return
        self.tmux.kill_server()
        if self._server is not None:
            self._server.kill()
            self._server.wait(timeout=10)
        if self._mailbox is not None:
            self._mailbox.close()
        self._discard_secrets()
        if remove and self.workspace.is_dir():
            tidy = self._hooks.before_remove(self._hook_failed) if self._hooks else None
            with self._clone_locked():
                if tidy is not None:
                    tidy(self.workspace)
                self._remove_workspace()

    def _hook_failed(self, issue: str, exit_code: int, log_path: Path) -> None:
        log.warning("workspace_hook_failed", issue=issue, hook="before_remove",
                    exit_code=exit_code, log=str(log_path))

    def _discard_secrets(self) -> None:
        """The launch's secrets file, if its launcher did not read (and delete) it."""
        for path in self.own_dir.glob("*/*.secrets.json"):
            path.unlink(missing_ok=True)

    # -- code back --------------------------------------------------------------------------

    def push(self) -> str:
        """Push the attempt's change as ``ralph/ISSUE/aN``; returns the bookmark.

        The change is the workspace's working copy, or its parent when the worker
        committed and left an empty working copy on top. A change without a
        description gets one: git cannot push it otherwise.
        """
        spec = self.spec
        with self._clone_locked():
            here = self.jj.run("log", "--no-graph", "-r", "@", "-T",
                               'if(empty && !description, "empty")', cwd=self.workspace)
            revision = "@-" if here.check().stdout.strip() == "empty" else "@"
            described = self.jj.run("log", "--no-graph", "-r", revision, "-T",
                                    'if(description, "yes")', cwd=self.workspace).check()
            if described.stdout.strip() != "yes":
                self.jj.run("describe", "-r", revision, "-m",
                            f"{spec.issue}: work in progress (attempt {spec.attempt})",
                            cwd=self.workspace).check()
            self.jj.push_bookmark(spec.bookmark, revision, REMOTE, self.workspace)
        return spec.bookmark
