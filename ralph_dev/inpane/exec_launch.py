"""The pane-side half of a launch: read the spec, restore the environment, exec.

Runs as ``python -m ralph_dev.launcher SPEC.json`` inside every worker's and
the controller's tmux pane, so it imports only the standard library: each
spawn pays Python's start-up and nothing more before the agent runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def _take_secrets(path: str | None) -> dict[str, str]:
    """Read the launch's secrets and delete the file: they now live only in the process."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}  # a respawn of the same pane: the secrets were taken already
    finally:
        with contextlib.suppress(OSError):
            Path(path).unlink()
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


EGRESS_START = 15.0
"""How long the egress proxy may take to listen before the worker's start fails."""

PANE_VARS = ("TERM", "COLORTERM", "TMUX", "TMUX_PANE")
"""What tmux sets for the pane it starts (its terminal, its server); kept from the
inherited environment."""


def exec_spec(spec_file: Path, environ: Mapping[str, str] | None = None) -> int:
    """Replace this process with the agent: argv from the spec, prompt from its file.

    Returns (only on failure, having said why on stderr) the exit code for the pane.
    """
    try:
        spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
        argv = [str(a) for a in spec["argv"]]
        prompt = Path(spec["prompt_file"]).read_text(encoding="utf-8") \
            if spec.get("prompt_file") else ""
        cwd = spec.get("cwd")
        secrets = _take_secrets(spec.get("secrets_file"))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"ralph-dev: cannot start the agent: launch spec {spec_file} unusable ({exc})",
              file=sys.stderr)
        return 2
    inherited = os.environ if environ is None else environ
    # Only what the pane itself is: everything else comes from the spec, so nothing of
    # the tmux server's environment (the daemon's keys, a person's shell) leaks in.
    env = {name: inherited[name] for name in PANE_VARS if name in inherited}
    for name in spec.get("unset", ()):
        env.pop(str(name), None)
    for name, value in {**(spec.get("env") or {}), **secrets}.items():
        env[str(name)] = str(value)
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            print(f"ralph-dev: cannot enter the workspace {cwd}: {exc.strerror}", file=sys.stderr)
            return 2
    if spec.get("prompt_arg"):
        argv = [*argv, prompt.replace("\x00", "")]
    sandbox = spec.get("sandbox")
    if spec.get("egress"):
        try:
            _start_egress(spec_file, env, Path(spec["egress"]["socket"]))
        except (OSError, KeyError, TypeError) as exc:
            said = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            print(f"ralph-dev: cannot start the egress proxy: {said}",
                  file=sys.stderr)
            return 2
    if not spec.get("quiet"):  # a verify's output is the project's command's alone
        print(f"ralph-dev: starting {Path(argv[0]).name} for {spec.get('issue') or 'the project'} "
              f"({spec.get('role')}, attempt {spec.get('attempt')}"
              f"{', sandboxed' if sandbox else ''})", file=sys.stderr, flush=True)
    if sandbox:
        try:
            argv = _sandboxed(sandbox, argv)
        except (OSError, KeyError, TypeError) as exc:
            print(f"ralph-dev: cannot set up the worker's sandbox: {exc}", file=sys.stderr)
            return 2
    try:
        os.execvpe(argv[0], argv, env)  # noqa: S606 - an argv list, no shell
    except OSError as exc:
        print(f"ralph-dev: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvpe does not return


def _start_egress(spec_file: Path, env: Mapping[str, str], socket: Path) -> None:
    """The worker's egress proxy (``inpane.egress``), on the host beside its sandbox, once
    it listens; it ends with this process, which becomes the sandbox. Raises OSError
    when it could not start."""
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()  # a former start's: its proxy is gone with that start
    proxy = subprocess.Popen(  # -P: ralph-dev's own module, never one in the workspace
        [sys.executable, "-P", "-m", "ralph_dev.inpane.egress", str(spec_file)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        env={k: v for k, v in env.items() if k in ("PATH", "LANG", "TZ", *PANE_VARS)})
    deadline = time.monotonic() + EGRESS_START
    while not socket.exists():
        if proxy.poll() is not None or time.monotonic() > deadline:
            raise OSError(0, f"it did not listen on {socket} (exit status {proxy.poll()})")
        time.sleep(0.02)


def _sandboxed(sandbox: Mapping[str, object], argv: list[str]) -> list[str]:
    """bubblewrap's argv around ``argv`` (``agent.sandbox``), its seccomp program handed
    over as an open file descriptor that the exec keeps."""
    words = [str(sandbox["bwrap"])]
    seccomp = sandbox.get("seccomp")
    if seccomp:
        fd = os.open(str(seccomp), os.O_RDONLY)
        os.set_inheritable(fd, True)
        words += ["--seccomp", str(fd)]
    args = sandbox["args"]
    if not isinstance(args, list):
        raise TypeError("sandbox args are not a list")
    return [*words, *(str(a) for a in args), "--", *argv]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m ralph_dev.launcher LAUNCH_SPEC.json", file=sys.stderr)
        return 2
    return exec_spec(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
