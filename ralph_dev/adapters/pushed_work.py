"""What cluster workers pushed, as the controller's repository fetches it, fenced.

A worker on another host sends its change back only through the git remote, as
``ralph/ISSUE/aN``. The controller fetches those bookmarks into its own repository and
takes, for an issue, only its current attempt's (``core.cluster.mergeable_push``): an
earlier attempt's host may be cut off and still pushing, and what it pushes is kept
for a new attempt to start from, never merged.

:class:`ClusterWork` is the controller's side of a cluster (the ``Cluster`` port): it
pushes trunk where hosts start from, places attempts, and brings a pushed change into
the issue's workspace here, where the merge lane takes it as it takes any other.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import structlog

from ralph_dev.adapters import launch_bundle, mailbox
from ralph_dev.adapters.files import atomic_write_bytes
from ralph_dev.adapters.jj_cli import JjCli, JJError, quote_revset
from ralph_dev.adapters.launch_bundle import SESSIONS, SHIPPED_ROOT
from ralph_dev.core import cluster
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.model import Launch, NodeSlots, Placement
from ralph_dev.core.ports import WORK_BOOKMARK_PREFIX

log = structlog.get_logger(__name__)


class PushedWork:
    """The attempt bookmarks on ``remote``, read through the controller's jj."""

    def __init__(self, jj: JjCli, remote: str = "origin") -> None:
        self.jj = jj
        self.remote = remote

    def fetch(self, cwd: Path | None = None) -> dict[str, str]:
        """Fetch the workers' bookmarks (in ``cwd``, a workspace of ralph-dev's own: a
        jj write at a colocated repository's root resets the person's git index);
        bookmark → commit id as the remote has them."""
        args = ("git", "fetch", "--remote", self.remote,
                "--branch", f"glob:{WORK_BOOKMARK_PREFIX}*")
        if cwd is None:
            self.jj.read(*args)
        else:
            self.jj.run(*args, cwd=cwd).check()
        listed = self.jj.read(
            "bookmark", "list", "--all-remotes", "-T",
            f'if(remote == "{self.remote}" && normal_target, '
            'name ++ " " ++ normal_target.commit_id() ++ "\\n")').lines()
        return dict(line.split(" ", 1) for line in listed if " " in line)


class AttemptPlane(Protocol):
    """What of a cluster plane the controller's side uses beyond the process port."""

    project: str
    remote: str

    def place(self, name: str, attempt: int, *, rebase: bool = False) -> Path: ...

    def push(self, target: str) -> str: ...

    def where(self, target: str) -> Placement: ...

    def free_slots(self) -> int: ...

    def nodes(self) -> list[NodeSlots]: ...

    def ask(self, target: str, method: str, *args: Any) -> Any: ...


def remote_named(jj: JjCli, url: str, preferred: str) -> str:
    """The controller repository's git remote whose URL is the cluster's ``url``
    (``preferred`` first); the fix when there is none."""
    listed = jj.read("git", "remote", "list").lines()
    found = dict(line.split(" ", 1) for line in listed if " " in line)
    if found.get(preferred) == url:
        return preferred
    for name, where in sorted(found.items()):
        if where == url:
            return name
    raise ConfigError(
        f"cluster.remote: {url} is none of {jj.repo}'s git remotes, and the controller "
        f"fetches workers' pushes through one: add it (`jj git remote add cluster {url}` "
        "in the repository), or leave cluster.remote out to use merge.remote's")


class ClusterWork:
    """The controller's side of a cluster: what hosts start from, and what comes back.

    Every jj write runs in the issue's own workspace here (``path``), never at the
    repository's root."""

    def __init__(self, plane: AttemptPlane, jj: JjCli, *, trunk: str,
                 attempt_of: Callable[[str], int], merge_remote: str = "origin",
                 agent_bin: Path | None = None) -> None:
        self.plane = plane
        self.attempt_of = attempt_of
        """The issue's current cluster attempt (its worker record's)."""
        self.agent_bin = agent_bin
        """The directory of the ``ralph-dev`` link workers' PATH starts with
        (``agent.launch.agent_bin_dir``): its link travels, to the same program on each
        host."""
        self.jj = jj
        self.trunk = quote_revset(trunk)
        self._merge_remote = merge_remote
        self._remote: str | None = None
        self._base_pushed: str | None = None

    @property
    def remote(self) -> str:
        if self._remote is None:
            self._remote = remote_named(self.jj, self.plane.remote, self._merge_remote)
        return self._remote

    # -- out --------------------------------------------------------------------------

    def place(self, issue: str, attempt: int, path: Path, *, rebase: bool = False) -> Path:
        """Push trunk where hosts start from (when it moved), then place the attempt;
        its workspace on its host (``rebase``: a resolve worker's, rebased onto
        trunk)."""
        trunk = self.jj.read("log", "--no-graph", "-r", self.trunk, "-T", "commit_id").stdout
        if trunk.strip() != self._base_pushed:
            self.jj.run("bookmark", "set", cluster.BASE_BOOKMARK, "-r", self.trunk,
                        "--allow-backwards", cwd=path).check()
            self.jj.run("git", "push", "--remote", self.remote, "--bookmark",
                        cluster.BASE_BOOKMARK, cwd=path).check()
            self._base_pushed = trunk.strip()
        return self.plane.place(issue, attempt, rebase=rebase)

    def free_slots(self) -> int:
        return self.plane.free_slots()

    def nodes(self) -> list[NodeSlots]:
        return self.plane.nodes()

    def where(self, issue: str, attempt: int) -> Placement:
        return self.plane.where(cluster.actor_name(self.plane.project, issue, attempt))

    def push(self, issue: str, attempt: int) -> None:
        """The attempt's final push, asked before its processes end."""
        self.plane.push(cluster.actor_name(self.plane.project, issue, attempt))

    def save(self, issue: str) -> None:
        self.push(issue, self.attempt_of(issue))

    # -- the change where its worker works (``WorkerChanges``) ---------------------------

    def _ask(self, name: str, method: str, *args: Any) -> Any:
        return self._ask_attempt(name, self.attempt_of(name), method, *args)

    def screen(self, issue: str, lines: int = 200) -> str:
        return str(self._ask(issue, "capture", lines))

    def type_line(self, issue: str, text: str) -> None:
        self._ask(issue, "send_text", text)

    def read_log(self, issue: str, position: int, limit: int) -> tuple[bytes, int]:
        data, end = self._ask(issue, "read_log", position, limit)
        return bytes(data), int(end)

    def snapshot(self, name: str) -> list[str]:
        return list(self._ask(name, "snapshot"))

    def describe(self, name: str, message: str, *, require_change: bool = False) -> None:
        self._ask(name, "describe", message, require_change)

    def change_diff(self, name: str) -> str:
        return str(self._ask(name, "change_diff"))

    def conflicted_files(self, name: str) -> list[str]:
        return list(self._ask(name, "conflicted_files"))

    # -- the worker's files and reports, carried to and from its host -------------------

    def ship(self, issue: str, attempt: int, launch: Launch, worker_dir: Path,
             session: str | None = None) -> None:
        """The attempt's launch files to its host: the worker's own directory (not its
        run directory's reports and answers, which the relay carries, nor the
        transcripts kept here but ``session``'s, the one the launch resumes), the
        launch's spec, prompt and secrets, and the agent-bin its PATH starts with."""
        run = worker_dir / "run"
        launch_files = [p for p in (launch.spec_file, launch.prompt_file) if p is not None]
        if launch.spec_file is not None:
            launch_files.append(launch.spec_file.with_suffix(".secrets.json"))
        transcript = worker_dir / SESSIONS / f"{session}.jsonl" if session else None
        roots = {SHIPPED_ROOT: worker_dir}
        if launch_files:
            roots["launch"] = launch_files[0].parent
        if self.agent_bin is not None:
            roots["agent-bin"] = self.agent_bin
        bundle = launch_bundle.pack(
            roots, trees=[worker_dir],
            leave_out=[run / mailbox.OUTBOX, run / mailbox.ANSWERS, run / mailbox.SOCKET,
                       worker_dir / SESSIONS],
            files=[*launch_files, *([transcript] if transcript else [])],
            links_in=[self.agent_bin] if self.agent_bin is not None else [])
        self._ask_attempt(issue, attempt, "receive", bundle)

    def exchange(self, issue: str, attempt: int, files: dict[str, bytes],
                 answers: dict[str, bytes], taken: list[str], wait: float
                 ) -> dict[str, bytes]:
        """One round of the relay with the attempt's run directory on its host
        (``adapters.cluster_relay``)."""
        got = self._ask_attempt(issue, attempt, "exchange", files, answers, taken, wait)
        return {str(k): bytes(v) for k, v in dict(got).items()}

    def keep_transcript(self, issue: str, attempt: int, session: str, to: Path
                        ) -> Path | None:
        """The attempt's agent transcript, copied here (``to``) from its host, where the
        next attempt's launch takes it from; None when its host has none."""
        data = self._ask_attempt(issue, attempt, "transcript", session)
        if data is None:
            return None
        atomic_write_bytes(to, bytes(data))
        return to

    def _ask_attempt(self, issue: str, attempt: int, method: str, *args: Any) -> Any:
        return self.plane.ask(cluster.actor_name(self.plane.project, issue, attempt), method,
                              *args)

    # -- back -------------------------------------------------------------------------

    def bring_in(self, issue: str, attempt: int, path: Path) -> str | None:
        """The current attempt's push, as the issue's work in its workspace here (whatever
        an earlier bring-in left there is replaced); the commit, or None when the attempt
        pushed nothing."""
        return self._bring(path, lambda pushed: cluster.mergeable_push(issue, attempt, pushed))

    def keep(self, issue: str, path: Path) -> str | None:
        """The newest attempt's push, fenced or not, into the workspace: a canceled
        issue's work stays under its bookmark here, as on one host."""
        return self._bring(path, lambda pushed: cluster.latest_push(issue, pushed))

    def _bring(self, path: Path, choose: Callable[[dict[str, str]], str | None]) -> str | None:
        pushed = PushedWork(self.jj, self.remote).fetch(path)
        bookmark = choose(pushed)
        if bookmark is None:
            return None
        self._replace_work(path, pushed[bookmark])
        return pushed[bookmark]

    def _replace_work(self, path: Path, commit: str) -> None:
        """The workspace holds exactly the pushed commits not in trunk, on the trunk
        commit they started from (the merge lane rebases them onto trunk as it is)."""
        cli, trunk = self.jj, self.trunk
        work = f"(::{commit}) ~ (::{trunk})"
        cli.run("abandon", f"{trunk}..@", cwd=path).check()
        cli.run("new", f"heads(::{commit} & ::{trunk})", cwd=path).check()
        if cli.count(work, path):
            cli.run("duplicate", work, "--insert-before", "@", cwd=path).check()

    def discard(self, issue: str, path: Path) -> None:
        """Delete the issue's attempt bookmarks on the remote once its work is merged: a
        reopened issue starts afresh, not from work trunk holds already. Best effort (a
        remote that refuses keeps a stale name, which the fence ignores)."""
        try:
            pushed = PushedWork(self.jj, self.remote).fetch(path)
            names = sorted(cluster.pushed_attempts(issue, pushed).values())
            if not names:
                return
            at_remote = [f"{name}@{self.remote}" for name in names]
            self.jj.run("bookmark", "track", *at_remote, cwd=path).check()
            self.jj.run("bookmark", "delete", *names, cwd=path).check()
            pushes = [arg for name in names for arg in ("--bookmark", name)]
            self.jj.run("git", "push", "--remote", self.remote, *pushes, cwd=path).check()
        except JJError as exc:
            log.warning("cluster_pushes_kept", issue=issue, error=str(exc))
