"""The worker's sandbox: bubblewrap around the agent, its hooks and its commands.

An agent reads text anyone can write in the tracker, so it is treated as possibly
hostile. ``agent.sandbox = "bwrap"`` (the default) starts it inside bubblewrap
(Debian/Ubuntu package ``bubblewrap``; the same mechanism Flatpak uses) with:

* the whole filesystem **read-only**, and writable only: its own workspace, its own
  ``/tmp`` (``workers/ISSUE/tmp``), its agent HOME (``isolated``: its own
  ``workers/ISSUE/home``; ``user``: the person's ``~/.claude`` and ``~/.claude.json``,
  which Claude Code keeps its sessions in) and its run directory at
  ``/run/ralph-dev`` (its reports: ``adapters.mailbox``);
* **hidden** (an empty tmpfs over them): ralph-dev's config, state and data dirs (every
  project's tracker, records, events, other workers' run dirs and workspaces, the
  dashboard's token and login key), ``web.token_file`` wherever it lies, the
  workspace root when it lies elsewhere, the host's ``/run`` (tmux's, systemd's and
  docker's sockets) and ``/tmp`` (tmux's socket), the person's well-known
  credential files (``~/.ssh``, ``~/.aws``, ``~/.config/gh``…) and the files holding
  the controller's secrets (the tracker's key file, the dashboard's token file);
* **bound back** read-only at their own paths, even from a hidden place: what the
  worker runs (ralph-dev's venv and package, the agent and its interpreter:
  ``agent.toolchain``);
* no capabilities (``--cap-drop ALL``: as root a read-only bind is otherwise undone by
  a remount), no new user namespaces, its own pid, ipc and uts namespaces (it sees no
  other process, so not the daemon's environment), killed with its pane;
* a seccomp filter refusing ``TIOCSTI``/``TIOCLINUX`` (typing into the pane's
  terminal, which the shell behind it would run), x86-64 only.

The network is shared: the agent must reach its model API (and so can reach
anything the machine can, including abstract unix sockets). It runs as the person's
uid. The argv is computed here; ``inpane.exec_launch`` (stdlib only) opens the seccomp
program and execs bubblewrap with it.
"""

from __future__ import annotations

import platform
import shutil
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

from ralph_dev.adapters.files import atomic_write_bytes
from ralph_dev.adapters.mailbox import RUN_MOUNT
from ralph_dev.adapters.process import run_command
from ralph_dev.agent.claude import AgentError
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.paths import config_home, data_home, state_home

CREDENTIALS = (".ssh", ".aws", ".azure", ".gnupg", ".docker", ".kube", ".config/gh",
               ".config/gcloud", ".config/hub", ".netrc", ".git-credentials", ".pypirc",
               ".npmrc", ".config/ralph-dev")
"""Under the person's HOME: hidden from every worker (dirs by a tmpfs, files by
/dev/null), whatever its agent HOME."""

SECCOMP_FILE = "tiocsti.bpf"

SANDBOX_TMP = "/tmp"  # noqa: S108 - inside the sandbox: the worker's own, private dir
"""Where the worker's own ``workers/ISSUE/tmp`` appears: the host's /tmp stays hidden."""


def bwrap_path() -> str:
    """bubblewrap, or an error naming the package and the way to run without it."""
    found = shutil.which("bwrap")
    if found is None:
        raise AgentError(
            "bubblewrap (bwrap) is not installed, and workers run inside it "
            "(agent.sandbox = \"bwrap\"): install it (`sudo apt-get install bubblewrap`, or "
            "your distribution's bubblewrap package), or set agent.sandbox = \"off\" to run "
            "workers unconfined")
    return found


def try_sandbox() -> str:
    """Run ``true`` in the smallest sandbox of the same kind (doctor): bubblewrap may be
    installed yet refused (user namespaces disabled, e.g. by an AppArmor policy).
    Returns bubblewrap's version; raises AgentError naming the fix."""
    bwrap = bwrap_path()
    result = run_command([bwrap, "--unshare-user", "--disable-userns", "--cap-drop", "ALL",
                          "--unshare-pid", "--ro-bind", "/", "/", "--dev", "/dev",
                          "--proc", "/proc", "true"], timeout=30)
    if not result.ok:
        raise AgentError(
            f"bubblewrap cannot make a sandbox here ({result.first_line}"
            "): allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; "
            "on Ubuntu 24.04 an AppArmor profile for bwrap), or set agent.sandbox = \"off\"")
    return run_command([bwrap, "--version"], timeout=30).first_line


def try_host_sandbox(person_home: Path) -> None:
    """Run ``true`` in a sandbox as a cluster worker's launch gets it on this host
    (:func:`on_this_host`: ralph-dev's dirs here made and hidden, the credentials in
    ``person_home`` hidden) — ``doctor`` asks it on each node. Raises AgentError with
    the path and the fix."""
    bwrap = bwrap_path()
    smallest = ["--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--unshare-pid",
                "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/run"]
    try:
        args = on_this_host(smallest, person_home)
    except OSError as exc:
        raise AgentError(
            f"{exc.filename}: ralph-dev cannot make its directory here ({exc.strerror}), "
            "and a worker's sandbox hides it: make it a writable directory, or start this "
            "host's Ray (`ray start`) with XDG_CONFIG_HOME, XDG_STATE_HOME and "
            "XDG_DATA_HOME naming writable directories") from exc
    result = run_command([bwrap, *args, "true"], timeout=30)
    if not result.ok:
        raise AgentError(
            f"bubblewrap cannot start a worker's sandbox here ({result.first_line}; its "
            f"options: {' '.join(args)}): allow unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 an AppArmor "
            "profile for bwrap) and make each path it names a directory or file this "
            "host has, or set agent.sandbox = \"off\"")


def no_tiocsti_filter() -> bytes | None:
    """A classic-BPF seccomp program: ``ioctl(TIOCSTI|TIOCLINUX)`` fails with EPERM, every
    other call is allowed; any other architecture's calls fail. None off x86-64."""
    if platform.machine() != "x86_64":
        return None
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, eperm = 0x7FFF0000, 0x00050001
    program = [(ld, 0, 0, 4), (jeq, 0, 7, 0xC000003E),  # arch must be x86-64
               (ld, 0, 0, 0), (jge, 5, 0, 0x40000000),   # no x32 calls
               (jeq, 0, 3, 16),                          # ioctl?
               (ld, 0, 0, 24), (jeq, 2, 0, 0x5412), (jeq, 1, 0, 0x541C),  # TIOCSTI/TIOCLINUX
               (ret, 0, 0, allow), (ret, 0, 0, eperm)]
    return b"".join(struct.pack("HBBI", *insn) for insn in program)


def _under(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == root or _below(path, root) for root in roots)


def _below(path: Path, root: Path) -> bool:
    """``root in path.parents`` for absolute paths, from their text: every spawn asks it of
    each tool against each secret, and ``parents`` makes a ``Path`` of every parent."""
    inside = str(root).rstrip("/") + "/"
    return str(path).startswith(inside) and path != root


def host_secrets(person_home: Path) -> list[Path]:
    """What no worker may read on this host, whoever's launch it runs: ralph-dev's own
    dirs here (every tracker, record and event, other workers' run dirs and
    workspaces) and the credentials in ``person_home``."""
    return [*(p.resolve() for p in (config_home(), state_home(), data_home())),
            *(person_home / name for name in CREDENTIALS)]


def _secrets(settings: ProjectSettings, person_home: Path) -> list[Path]:
    """What no worker may read: :func:`host_secrets`, the workspace root, and the files
    holding the controller's secrets (the tracker's key, the dashboard's token)."""
    files = [settings.tracker.linear_api_key_file, settings.web.token_file]
    return [*host_secrets(person_home), settings.workspaces.resolve(),
            *(Path(f).expanduser().resolve() for f in files if f is not None)]


BWRAP_ARITY = {"--tmpfs": 1, "--ro-bind": 2, "--bind": 2, "--ro-bind-try": 2, "--bind-try": 2,
         "--setenv": 2, "--unsetenv": 1, "--chdir": 1, "--dev": 1, "--proc": 1,
         "--seccomp": 1}
"""bubblewrap's options that take arguments, and how many: what :func:`on_this_host`
walks a sandbox's argv by."""


class SandboxPathMissing(AgentError):
    """A path a worker's sandbox binds is missing on the host it was sent to: the
    path, and what to do."""


def on_this_host(args: Sequence[str], person_home: Path) -> list[str]:
    """A sandbox's bubblewrap options, made on another host (a cluster's controller),
    fit for this one: a host shares nothing with the controller but the git remote.

    What is hidden is what this host has: a hide of a path that does not exist here
    names the other host's (bubblewrap cannot make its mount point in the read-only
    root: ``Can't mkdir``) and goes; this host's own secrets (:func:`host_secrets`:
    ralph-dev's dirs here, made if missing, and the credentials in ``person_home``) are
    hidden, before anything is bound back. A path bound in (a tool, the workspace) that
    this host lacks raises :class:`SandboxPathMissing` naming it: the worker would only
    fail in its pane."""
    for ralph_dir in (config_home(), state_home(), data_home()):
        ralph_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    kept: list[str] = []
    hidden: set[str] = set()
    index = 0
    while index < len(args):
        word = args[index]
        taken = list(args[index + 1:index + 1 + BWRAP_ARITY.get(word, 0)])
        index += 1 + len(taken)
        if word == "--tmpfs" or (word == "--ro-bind" and taken[0] == "/dev/null"):
            target = taken[-1]
            if not Path(target).exists():
                continue  # the other host's: nothing here to hide
            hidden.add(target)
        elif word in ("--bind", "--ro-bind") and not Path(taken[0]).exists():
            raise SandboxPathMissing(
                f"{taken[0]}: the worker's sandbox binds it, and this host has no such "
                "path: install the tool there at the same path as on the controller's "
                "host (or fix the path the project names)")
        kept += [word, *taken]
    own = [word for p in sorted(host_secrets(person_home), key=lambda p: len(p.parts))
           if p.exists() and str(p) not in hidden
           for word in (["--tmpfs", str(p)] if p.is_dir() else ["--ro-bind", "/dev/null", str(p)])]
    # a mount's source is read from the host's tree, so hiding first hides no source; the
    # binds after it (the workspace, what a worker runs) show through
    at = _first_mount_after_root(kept)
    return [*kept[:at], *own, *kept[at:]]


def _first_mount_after_root(args: list[str]) -> int:
    """Where in ``args`` the mounts over the read-only root begin (after ``--proc``)."""
    for index, word in enumerate(args):
        if word == "--proc":
            return index + 2
    return len(args)


def _bindable(tool: Path, hidden: list[Path], secrets: list[Path]) -> bool:
    """Whether ``tool`` must be bound back (it lies where the sandbox hides it) and may
    be (inside ralph-dev's own dirs or a credentials dir: a single file only)."""
    if any(_below(tool, secret) for secret in secrets):
        return tool.is_file()
    return any(_below(tool, root) for root in hidden)


def _tools_and_secrets(tools: Iterable[Path], secrets: list[Path]) -> list[str]:
    """Bind back what a worker runs from a hidden place (read-only, at its own path) and
    hide the secrets, the shallower path first: a tool inside a hidden dir (ralph-dev's
    ``agent-bin`` link, a venv under /tmp) shows through it, and a secret inside a tool's
    tree (a config dir inside a checkout) stays hidden. Inside ralph-dev's own dirs
    only single files are bound (a directory there may hold a tracker or a record)."""
    hidden = [Path(SANDBOX_TMP), Path("/run")]
    bound = [t for t in dict.fromkeys(tools) if _bindable(t, hidden, secrets)]
    mounts: list[tuple[int, list[str]]] = []
    for path in secrets:
        if not path.exists() or (_under(path, hidden) and not _under(path, bound)):
            continue
        mounts.append((len(path.parts), ["--tmpfs", str(path)] if path.is_dir()
                       else ["--ro-bind", "/dev/null", str(path)]))
        if path.is_dir():
            hidden.append(path)
    for tool in bound:
        if tool in secrets:  # a secret named as a tool stays hidden
            continue
        # inside another tool's tree it shows already, unless a secret hides it there
        outer = [b for b in bound if _below(tool, b)]
        if outer and not any(_under(tool, [s]) and any(_below(s, b) for b in outer)
                             for s in hidden):
            continue
        mounts.append((len(tool.parts), ["--ro-bind", str(tool), str(tool)]))
    return [word for _, words in sorted(mounts, key=lambda m: m[0]) for word in words]


def _confined(settings: ProjectSettings, *, workspace: Path, person_home: Path,
              private_tmp: list[str], tool_dirs: Iterable[Path] = ()) -> list[str]:
    """The part every sandbox shares: read-only everything, secrets hidden, its own
    /tmp (``private_tmp``), what a worker runs bound back (``tool_dirs``: see
    ``agent.toolchain``), ``agent.shared_paths`` and the workspace writable."""
    workspace = workspace.resolve()
    args = ["--die-with-parent", "--unshare-user", "--disable-userns", "--cap-drop", "ALL",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/run", "--ro-bind-try", "/run/systemd/resolve", "/run/systemd/resolve",
            *private_tmp, *_tools_and_secrets(tool_dirs, _secrets(settings, person_home))]
    for shared in settings.agent.shared_paths:
        if not Path(shared).is_absolute():
            raise AgentError(f"agent.shared_paths: {shared!r} is not an absolute path; "
                             "name the directory in full")
        if Path(shared).exists():
            args += ["--bind", shared, shared]
    return [*args, "--bind", str(workspace), str(workspace)]


def _leave(workspace: Path) -> list[str]:
    return ["--unsetenv", "TMUX", "--unsetenv", "TMUX_PANE", "--setenv", "TMPDIR", SANDBOX_TMP,
            "--chdir", str(workspace.resolve())]


def sandbox_args(settings: ProjectSettings, *, workspace: Path, worker_dir: Path,
                 agent_home: Path, person_home: Path, tool_dirs: Iterable[Path] = ()
                 ) -> list[str]:
    """bubblewrap's options for one worker (without the program and the seccomp fd)."""
    worker_dir = worker_dir.resolve()
    args = _confined(settings, workspace=workspace, person_home=person_home,
                     private_tmp=["--bind", str(worker_dir / "tmp"), SANDBOX_TMP],
                     tool_dirs=tool_dirs)
    if settings.agent.home == "isolated":
        args += ["--bind", str(agent_home), str(agent_home)]
    else:  # the person's HOME: only Claude Code's own state is writable
        for name in (".claude", ".claude.json"):
            if (agent_home / name).exists():
                args += ["--bind", str(agent_home / name), str(agent_home / name)]
    return [*args, "--bind", str(worker_dir / "run"), str(RUN_MOUNT), *_leave(workspace)]


def verify_wrapper(settings: ProjectSettings, checkout: Path, *, home: Path | None = None,
                   network: Sequence[str] = ()) -> list[str]:
    """The argv prefix the controller runs the verify command under: the code it runs
    was written by workers, so it gets the workers' sandbox (its checkout writable, an
    empty /tmp, nothing of ralph-dev's) — or nothing with ``agent.sandbox = "off"``.

    ``home``: the HOME its environment names. A worker's own (``agent.home =
    "isolated"``) lies in ralph-dev's hidden state, and what the worker left there
    (a ``usercustomize.py``, a tool's config) must not steer the controller's check: it
    gets an empty, writable one at the same path, as a first run of the worker had.

    ``network``: bubblewrap's options for ``agent.network`` (``agent.egress``)."""
    if settings.agent.sandbox != "bwrap":
        return []
    fresh_home = ["--tmpfs", str(home)] if home is not None and \
        settings.agent.home == "isolated" else []
    return [bwrap_path(), *_confined(settings, workspace=checkout, person_home=Path.home(),
                                     private_tmp=["--tmpfs", SANDBOX_TMP]),
            *fresh_home, *network, *_leave(checkout)]


def write_filter(worker_dir: Path) -> Path | None:
    """The seccomp program in the worker's dir (outside its sandbox), for the launcher."""
    program = no_tiocsti_filter()
    if program is None:
        return None
    path = worker_dir / SECCOMP_FILE
    atomic_write_bytes(path, program)
    return path
