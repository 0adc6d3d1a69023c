"""The tmux adapter: the only place ralph-dev talks to tmux.

tmux is the source of truth for processes: which worker windows exist, whether
their command still runs, and how it ended. Every tmux command goes through one
site, :meth:`Tmux.run`, on ralph-dev's command runner (``adapters.process``), so
that timeouts, error reporting, secret redaction and tmux's own argument quirks
are handled once. A wedged tmux server makes a client hang: the runner kills
that client at the timeout, so none is left behind.

libtmux is not on this path: ralph-dev only ever used its ``Server.cmd``, one
process start it makes itself, with the timeout libtmux does not have. It is
asked one thing, at the edge: tmux's version for ``doctor`` (:func:`tmux_version`).

Traps this module exists to absorb (all checked against tmux 3.3a):

* tmux splits its argv at any argument that *ends* with ``;`` (``send-keys -l
  'ls;'`` types ``ls`` and starts a new, empty command). :func:`escape_arg`
  turns a trailing ``;`` into ``\\;``, which tmux turns back into ``;``.
* ``-t NAME`` matches session names by prefix (``ralph-a`` finds
  ``ralph-ab``); sessions are targeted as ``=NAME`` (``=NAME:`` where tmux
  expects a window, as ``list-panes -s`` does), except by ``set-option``, which
  does not understand ``=`` and gets the session's ``$id``.
* ``-c DIR`` and the ``pipe-pane`` command are format-expanded (``#{…}``), and
  a missing ``-c`` directory silently falls back to another one: ``#`` is
  doubled and the directory is checked first.
* A window whose command exits before ``remain-on-exit`` is set vanishes with
  its exit status. Windows are therefore born running a harmless placeholder,
  configured, and only then respawned with the real command.
* ``new-window``/``respawn-pane`` with several argv words exec them directly
  (no shell); a single word goes through ``default-shell -c``. Commands are
  always passed as words, and a one-word command gets ``env --`` in front, so
  no shell (sh, zsh, fish…) ever interprets any of it.
* ``send-keys -l`` sends text literally, but the bytes still reach the pane's
  terminal: a raw ``\\x03`` is Ctrl-C to the line discipline and ``ESC``
  interrupts Claude Code. :func:`sanitize_text` makes control characters
  visible instead. Text goes in chunks because one tmux command is limited to
  about 16 kB ("command too long").
* Programs may rename their window through escape sequences if a person's
  tmux.conf allows it; ralph-dev's windows get ``allow-rename off`` and
  ``automatic-rename off`` so their identifier names stay put.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ralph_dev.adapters.process import CommandResult, run_command, show_argv
from ralph_dev.adapters.tmux_args import (
    LIST_FORMAT,
    TmuxError,
    TmuxInputError,
    TmuxNotFound,
    TmuxServerGone,
    as_int,
    check_target,
    check_window_name,
    chunk_text,
    environment_args,
    escape_arg,
    escape_format,
    is_absent,
    parse_panes,
    sanitize_text,
    tmux_failure,
)
from ralph_dev.core.environment import is_secret_name
from ralph_dev.core.model import Window

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings

log = structlog.get_logger(__name__)

HOME_WINDOW = "ralph-home"
"""Name of a new session's first window: an idle shell for a person who
attaches. Lower case, so it can never be mistaken for an issue identifier."""

HISTORY_LIMIT = 50_000
DEFAULT_TIMEOUT = 15.0
"""Seconds before a tmux command counts as hung (a wedged server must not
freeze the controller forever)."""

_SESSION_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,79}")
_PLACEHOLDER = ("sleep", "86400")


# --- the adapter -------------------------------------------------------------------


class Tmux:
    """One ralph-dev session on one tmux server (the user's, or a ``-L`` socket)."""

    def __init__(
        self,
        session: str,
        socket_name: str | None = None,
        *,
        tmux_bin: str = "tmux",
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if not _SESSION_RE.fullmatch(session):
            raise TmuxInputError(
                f"{session!r} is not a usable tmux session name: "
                "use letters, digits, '-', '_' (no ':' or spaces)"
            )
        if socket_name is not None and not _SESSION_RE.fullmatch(socket_name):
            raise TmuxInputError(
                f"{socket_name!r} is not a usable tmux socket name (setting tmux_socket / "
                "RALPH_DEV_TMUX_SOCKET): use letters, digits, '-', '_', '.'"
            )
        self.session = session
        self.socket_name = socket_name
        self.tmux_bin = tmux_bin
        self.timeout = timeout

    @classmethod
    def from_settings(cls, settings: ProjectSettings) -> Tmux:
        return cls(settings.session_name, settings.tmux_socket)

    def __repr__(self) -> str:
        return f"Tmux(session={self.session!r}, socket_name={self.socket_name!r})"

    @property
    def _session_target(self) -> str:
        return f"={self.session}"

    # The one place a tmux process starts (attach aside, which becomes one).
    def run(self, *args: str, timeout: float | None = None) -> CommandResult:
        """Run one tmux command (or several joined by :meth:`run_many`); never raises
        for tmux's own failures — the result's ``check()`` does (:func:`tmux_failure`)."""
        return self._invoke([escape_arg(a) for a in args], timeout=timeout)

    def run_many(self, *commands: Sequence[str]) -> CommandResult:
        """Several tmux commands in ONE invocation: tmux runs them back to back,
        before it reaps any child, which is what makes window creation race-free."""
        argv: list[str] = []
        for command in commands:
            if argv:
                argv.append(";")
            argv += [escape_arg(a) for a in command]
        return self._invoke(argv)

    def _invoke(self, args: list[str], *, timeout: float | None = None) -> CommandResult:
        """One tmux client, bounded by a timeout after which it is killed (a wedged
        server must not freeze the controller, nor leave clients piling up)."""
        argv = [self.tmux_bin, *(["-L", self.socket_name] if self.socket_name else []), *args]
        result = run_command(argv, timeout=timeout or self.timeout, classify=tmux_failure)
        if not result.ok:
            log.debug("tmux_failed", argv=show_argv(result.argv), stderr=result.stderr[:300])
        return result

    def attach(self, window: str | None = None) -> None:
        """Replace this process with a tmux client attached to the session (at ``window``,
        a checked name, when given): what ``ralph-dev attach`` does."""
        argv = [self.tmux_bin, *(["-L", self.socket_name] if self.socket_name else [])]
        argv += ["attach-session", "-t", self._session_target]
        if window is not None:
            target = f"{self._session_target}:={check_window_name(window)}"
            argv += [";", "select-window", "-t", target]
        os.execvp(argv[0], argv)  # noqa: S606 - argv built from validated names only

    # --- liveness ------------------------------------------------------------------

    def server_alive(self) -> bool:
        result = self.run("list-sessions", "-F", "#{session_id}")
        if result.ok:
            return True
        if is_absent(result):
            return False
        result.check()
        return False  # unreachable: check() raised

    def session_exists(self) -> bool:
        result = self.run("has-session", "-t", self._session_target)
        if result.ok:
            return True
        if is_absent(result):
            return False
        result.check()
        return False

    def ensure_session(self, cwd: Path, environment: Mapping[str, str]) -> None:
        """Create the session if it is missing; an existing one is left as it is.

        Its first window, :data:`HOME_WINDOW`, is an idle shell for a person who
        attaches; ralph-dev's own windows are opened next to it.
        """
        if self.session_exists():
            return
        cwd = _check_dir(cwd)
        starts_server = not self.server_alive()
        result = self.run(
            "new-session", "-d", "-s", self.session, "-n", HOME_WINDOW,
            "-x", "200", "-y", "50", "-c", escape_format(str(cwd)),
            *environment_args(environment), "-P", "-F", "#{session_id}",
        )
        if not result.ok and "duplicate session" in result.stderr:
            return  # someone else created it meanwhile: already as wanted
        session_id = next(iter(result.check().lines()), self.session)
        # set-option does not understand `=NAME`, so the new session's $id is the target;
        # panes take the limit when they are created: every ralph-dev window gets it.
        if starts_server:  # a person's own server keeps its environment: it is theirs
            self._scrub_server_secrets()
        self.run_many(
            ["set-option", "-t", session_id, "history-limit", str(HISTORY_LIMIT)],
            # a person's tmux.conf may destroy detached sessions; this one runs detached
            ["set-option", "-t", session_id, "destroy-unattached", "off"],
        ).check()
        log.info("tmux_session_created", session=self.session, socket=self.socket_name)

    def _scrub_server_secrets(self) -> None:
        """The server keeps the environment of whoever started it (the daemon, with
        its keys) as its global environment, which any pane inherits and any client
        can list (``show-environment -g``): secrets are removed from it."""
        listed = self.run("show-environment", "-g")
        names = [line.split("=", 1)[0] for line in listed.lines() if "=" in line]
        doomed = [name for name in names if is_secret_name(name)]
        if doomed:
            self.run_many(*(["set-environment", "-g", "-u", name] for name in doomed)).check()

    def start_leashed_server(self, environment: Mapping[str, str],
                             timeout: float = 10.0) -> subprocess.Popen[bytes]:
        """Start this socket's server as a child of this process that the kernel kills
        when this process ends (``tmux -D`` keeps it from daemonizing, ``setpriv
        --pdeathsig`` asks for the kill); ``environment`` is its, and so every pane's.
        A server started the usual way daemonizes and outlives whoever started it."""
        server = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "--", self.tmux_bin,
             *(["-L", self.socket_name] if self.socket_name else []), "-D"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=dict(environment))
        deadline = time.monotonic() + timeout
        while not self.server_alive():
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise TmuxError(f"tmux -D on socket {self.socket_name!r} did not start a "
                                f"server (exit {server.poll()})")
            time.sleep(0.02)
        return server

    def kill_server(self) -> None:
        """End the whole tmux server (the demo's private one); already gone is fine."""
        result = self.run("kill-server")
        if not result.ok and not is_absent(result):
            result.check()

    def kill_session(self) -> None:
        result = self.run("kill-session", "-t", self._session_target)
        if not result.ok and not is_absent(result):
            result.check()

    # --- windows -------------------------------------------------------------------

    def list_windows(self) -> list[Window]:
        """Every window of the session with liveness, in ONE tmux call; [] if absent."""
        # `=NAME:` (with the colon): list-panes reads a bare `=NAME` as a window and
        # then falls back to prefix matching, listing `NAME-other`'s panes.
        listing = ["list-panes", "-s", "-t", f"{self._session_target}:", "-F", LIST_FORMAT]
        result = self.run(*listing)
        if is_absent(result):
            return []
        windows = parse_panes(result.check().lines())
        if any(not w.alive and w.exit_status is None for w in windows):
            # tmux 3.3a sometimes misses the SIGCHLD of a command that exits within
            # milliseconds: the pane is dead, its process a zombie, its status unknown
            # until some other child of the server exits. `run-shell true` is such a
            # child, and tmux waits for it, so the listing after it has the status.
            again = self.run_many(["run-shell", "true"], listing)
            if again.ok:
                windows = parse_panes(again.lines())
        return windows

    def find(self, name: str) -> list[Window]:
        """Windows called ``name``; a list, since a person may open a duplicate."""
        return [w for w in self.list_windows() if w.name == name]

    def open_window(
        self,
        name: str,
        *,
        cwd: Path,
        command: Sequence[str],
        environment: Mapping[str, str],
        log_file: Path | None = None,
    ) -> Window:
        """Open window ``name`` running ``command`` (argv words, never a shell line).

        The pane gets exactly ``environment`` on top of the server's (pass PATH:
        panes otherwise get the server's PATH from when it started), keeps
        showing after its command ends (``remain-on-exit``, so liveness and exit
        status stay readable), and copies its output to ``log_file``. On any
        failure the half-made window is killed before the error is raised.
        """
        check_window_name(name)
        cwd = _check_dir(cwd)
        words = [str(w) for w in command]
        if not words or not words[0]:
            raise TmuxInputError(f"window {name}: empty command")
        if len(words) == 1:
            words = ["env", "--", *words]  # one word would go through `sh -c`
        env_args = environment_args(environment)
        if log_file is not None:  # the pane prints issue text: made private before tmux appends
            log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            log_file.touch(mode=0o600)
        created = self.run(
            "new-window", "-d", "-t", f"{self._session_target}:", "-n", name,
            "-c", escape_format(str(cwd)), "-P", "-F", "#{window_id} #{pane_id}",
            "--", *_PLACEHOLDER,
        )
        if is_absent(created):
            raise TmuxServerGone(
                f"cannot open window {name}: tmux session {self.session!r} does not exist "
                "(ralph-dev creates it when the daemon starts; run `ralph-dev start`)",
                command=created.argv,
                stderr=created.stderr,
                returncode=created.returncode,
            )
        created.check()
        try:
            window_id, pane_id = [*created.stdout.split(), "", ""][:2]
            check_target(window_id)
            check_target(pane_id)
        except (IndexError, TmuxInputError) as exc:
            raise TmuxError(
                f"tmux new-window printed {created.stdout!r}, not a window and pane id",
                command=created.argv,
            ) from exc
        try:
            steps: list[list[str]] = [
                ["set-option", "-w", "-t", window_id, "remain-on-exit", "on"],
                ["set-option", "-w", "-t", window_id, "allow-rename", "off"],
                ["set-option", "-w", "-t", window_id, "automatic-rename", "off"],
                ["respawn-pane", "-k", "-t", pane_id, "-c", escape_format(str(cwd)),
                 *env_args, "--", *words],
            ]
            if log_file is not None:
                pipe = "cat >> " + shlex.quote(str(log_file))
                steps.append(["pipe-pane", "-t", pane_id, escape_format(pipe)])
            steps.append(["display-message", "-p", "-t", pane_id, "#{pane_pid}"])
            started = self.run_many(*steps)
            if is_absent(started):  # the server went away under the half-made window
                failed = tmux_failure(started)
                raise TmuxServerGone(str(failed), command=failed.command,
                                     stderr=failed.stderr, returncode=failed.returncode)
            started.check()
        except BaseException:
            self.kill_window(window_id)
            raise
        pid = as_int(started.lines()[-1]) if started.lines() else None
        log.info("tmux_window_opened", window=name, window_id=window_id, pane_id=pane_id,
                 pid=pid)
        return Window(
            name=name,
            pane_id=pane_id,
            window_id=window_id,
            alive=True,
            command=Path(str(command[0])).name,
            pid=pid,
            last_activity=datetime.now(UTC),
        )

    def kill_window(self, target: str) -> None:
        """Kill a window by id (a pane id kills its window); already gone is fine."""
        result = self.run("kill-window", "-t", check_target(target))
        if not result.ok and not is_absent(result):
            result.check()

    # --- pane I/O --------------------------------------------------------------------

    def capture(self, target: str, lines: int = 40) -> str:
        """The last ``lines`` non-blank-tail lines of the pane, as plain text."""
        lines = max(1, int(lines))
        result = self.run(
            "capture-pane", "-p", "-J", "-t", check_target(target), "-S", f"-{lines}"
        ).check()
        text = [line.rstrip() for line in result.stdout.split("\n")]
        while text and not text[-1]:
            text.pop()
        return "\n".join(text[-lines:])

    def dismiss(self, target: str) -> None:
        """Press Escape in a pane (a fixed key name: nothing from issue text)."""
        self.run("send-keys", "-t", check_target(target), "Escape").check()

    def send_text(
        self, target: str, text: str, *, submit: bool = True, submit_delay: float = 0.15
    ) -> None:
        """Type ``text`` into a pane literally, then press Enter.

        Only ``send-keys -l`` carries the text, so nothing in it is read as a
        key name; control characters are made visible first
        (:func:`sanitize_text`). A pane a person left in copy mode is taken out
        of it, or the text would drive copy mode instead. The pause before
        Enter lets agent TUIs that treat a fast burst as a paste finish it, so
        Enter submits rather than adding a line.
        """
        target = check_target(target)
        chunks = chunk_text(sanitize_text(text))
        first = ["copy-mode", "-q", "-t", target]
        if chunks:
            self.run_many(first, ["send-keys", "-t", target, "-l", "--", chunks[0]]).check()
        else:
            self.run(*first).check()
        for chunk in chunks[1:]:
            self.run("send-keys", "-t", target, "-l", "--", chunk).check()
        if submit:
            if submit_delay > 0 and chunks:
                time.sleep(submit_delay)
            self.run("send-keys", "-t", target, "Enter").check()


def _check_dir(path: Path) -> Path:
    """tmux silently starts in another directory when ``-c`` is missing: refuse instead."""
    path = Path(path)
    if not path.is_absolute():
        path = Path.cwd() / path
    if not path.is_dir():
        raise TmuxInputError(f"{path} is not a directory: a tmux window cannot start there")
    return path


def tmux_version(tmux_bin: str = "tmux") -> str:
    """tmux's version as ``tmux X.Y (what tmux said)``, read by libtmux, which knows the
    forms tmux reports (``3.3a``, ``next-3.6``, ``master``; OpenBSD's tmux has no
    ``-V``): the one thing ralph-dev asks libtmux, for ``doctor``. Raises
    :class:`TmuxNotFound` when there is no tmux."""
    from libtmux import exc as libtmux_exc
    from libtmux.common import get_version, get_version_str

    found = shutil.which(tmux_bin) or tmux_bin
    try:
        return f"tmux {get_version(found)} ({get_version_str(found)})"
    except (libtmux_exc.TmuxCommandNotFound, FileNotFoundError) as exc:
        raise TmuxNotFound(f"tmux is not installed (looked for {tmux_bin!r} on PATH): "
                           "install tmux 3.3 or newer", command=[tmux_bin, "-V"]) from exc
    except libtmux_exc.LibTmuxException as exc:
        raise TmuxError(f"`{tmux_bin} -V` did not say its version: {exc}",
                        command=[tmux_bin, "-V"]) from exc
