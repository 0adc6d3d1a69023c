"""The pane-side half of a launch: read the spec, restore the environment, exec.

Runs inside every worker's and the controller's tmux pane (``ralph_dev/launcher.py``),
so it imports only the standard library, and at start only what every launch needs (os,
sys, time and ``_json``'s scanner; not json, pathlib, contextlib, subprocess or typing,
which together cost a spawn more than the rest of its Python start-up): each spawn pays
Python's start-up and little more before the agent runs.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # typing's own import costs a pane's start ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any


JSON_SPACE = " \t\n\r"
"""What JSON counts as white space around a value (``str.strip`` would take more)."""


class _Decoding:
    """What ``json``'s C scanner asks of its decoder: plain JSON, no hooks."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # NaN, Infinity, -Infinity: float reads them as they are
    memo: dict[str, str] = {}  # noqa: RUF012 - the scanner's own cache of keys


def _scanner() -> Callable[[str], Any]:
    """JSON decoding at the cost of ``_json`` alone: importing ``json`` imports ``re`` and
    ``enum``, ~8 ms of every pane's start, for the decoder that ``_json``'s scanner
    already is (``json.scanner`` uses it just so). Where there is no ``_json`` (not
    CPython), ``json.loads``."""
    try:
        import _json
    except ImportError:  # pragma: no cover - CPython has it
        import json

        return json.loads
    scan = _json.make_scanner(_Decoding())  # type: ignore[arg-type]  # typeshed: a JSONDecoder

    def loads(text: str) -> Any:
        start = len(text) - len(text.lstrip(JSON_SPACE))
        try:
            value, end = scan(text, start)
        except StopIteration as stop:
            raise ValueError(f"no JSON value at character {stop.value}") from None
        if text[end:].strip(JSON_SPACE):
            raise ValueError(f"extra data at character {end}")
        return value

    return loads


_loads = _scanner()


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return file.read()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _take_secrets(path: str | None) -> dict[str, str]:
    """Read the launch's secrets and delete the file: they now live only in the process."""
    if not path:
        return {}
    try:
        data = _loads(_read(path))
    except FileNotFoundError:
        return {}  # a respawn of the same pane: the secrets were taken already
    finally:
        _remove(path)
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


EGRESS_START = 15.0
"""How long the egress proxy may take to listen before the worker's start fails."""

PANE_VARS = ("TERM", "COLORTERM", "TMUX", "TMUX_PANE")
"""What tmux sets for the pane it starts (its terminal, its server); kept from the
inherited environment."""


def exec_spec(spec_file: str | os.PathLike[str], environ: Mapping[str, str] | None = None
              ) -> int:
    """Replace this process with the agent: argv from the spec, prompt from its file.

    Returns (only on failure, having said why on stderr) the exit code for the pane.
    """
    spec_file = os.fspath(spec_file)
    try:
        spec = _loads(_read(spec_file))
        argv = [str(a) for a in spec["argv"]]
        prompt = _read(spec["prompt_file"]) if spec.get("prompt_file") else ""
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
            _start_egress(spec_file, env, str(spec["egress"]["socket"]))
        except (OSError, KeyError, TypeError) as exc:
            said = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            print(f"ralph-dev: cannot start the egress proxy: {said}",
                  file=sys.stderr)
            return 2
    if not spec.get("quiet"):  # a verify's output is the project's command's alone
        print(f"ralph-dev: starting {os.path.basename(argv[0])} for "
              f"{spec.get('issue') or 'the project'} ({spec.get('role')}, "
              f"attempt {spec.get('attempt')}"
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


def _start_egress(spec_file: str, env: Mapping[str, str], socket: str) -> None:
    """The worker's egress proxy (``inpane.egress``), on the host beside its sandbox, once
    it listens; it ends with this process, which becomes the sandbox. Raises OSError
    when it could not start."""
    import subprocess  # only a worker with an egress proxy pays for it

    _remove(socket)  # a former start's: its proxy is gone with that start
    proxy = subprocess.Popen(  # -P: ralph-dev's own module, never one in the workspace
        [sys.executable, "-P", "-m", "ralph_dev.inpane.egress", spec_file],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        env={k: v for k, v in env.items() if k in ("PATH", "LANG", "TZ", *PANE_VARS)})
    deadline = time.monotonic() + EGRESS_START
    while not os.path.exists(socket):
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
        print("usage: ralph_dev/launcher.py LAUNCH_SPEC.json", file=sys.stderr)
        return 2
    return exec_spec(args[0])


if __name__ == "__main__":
    sys.exit(main())
