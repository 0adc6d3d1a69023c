"""What a worker runs, and where it lives on this machine.

A worker's sandbox hides the host's ``/tmp`` and ``/run`` and ralph-dev's own
directories, and ralph-dev, its venv, the agent or the agent's Node may well be
installed there (a checkout under ``/tmp``, a demo whose data dir holds the
``agent-bin`` link). So the sandbox binds back, read-only and at the paths they have
outside, exactly what a worker must run: ralph-dev's interpreter and package (with
the plugin inside it: skills and hooks), its console script, the agent program and
the interpreter its ``#!`` line names. Each is bound with the tree it was installed
with (a venv, a Node prefix, an npm ``node_modules``), since a program rarely runs
from its own file alone.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

import ralph_dev


def ralph_dev_script() -> Path | None:
    """The ``ralph-dev`` console script of THIS installation (hooks and skills call it)."""
    beside = Path(sys.executable).parent / "ralph-dev"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("ralph-dev")
    return Path(found) if found else None


def install_root(program: Path) -> Path:
    """The tree ``program`` was installed with: the ``node_modules`` it lies in (an npm
    install: its ``.bin`` links point into the packages beside them), the prefix of a
    ``bin`` directory (a venv, a Node or Python prefix), else its own directory."""
    parts = program.parts
    if "node_modules" in parts:
        return Path(*parts[:parts.index("node_modules") + 1])
    if program.parent.name == "bin":
        return program.parent.parent
    return program.parent


def interpreter(program: Path, search_path: str) -> Path | None:
    """The program a script's ``#!`` line runs (``#!/usr/bin/env node``: ``node`` as the
    worker's PATH finds it); None for a binary or an unreadable file."""
    try:
        with program.open("rb") as handle:
            line = handle.readline(512)
    except OSError:
        return None
    if not line.startswith(b"#!"):
        return None
    words = line[2:].decode("utf-8", "replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        found = shutil.which(names[0], path=search_path) if names else None
        return Path(found) if found else None
    return Path(words[0])


def find_program(program: str, search_path: str) -> Path | None:
    """``program`` as the worker's exec finds it: a path as it is, a name on its PATH."""
    if os.sep in program:
        return Path(program)
    found = shutil.which(program, path=search_path)
    return Path(found) if found else None


def _with_targets(paths: Iterable[Path]) -> list[Path]:
    """Each path and, when it is or passes through a symlink, what it resolves to: the
    sandbox must show both (a venv's python links to its base interpreter)."""
    out: list[Path] = []
    for path in paths:
        out.append(path.absolute())
        out.append(path.resolve())
    return out


def program_paths(program: Path, search_path: str) -> list[Path]:
    """What running ``program`` needs to see: the file (and its link's target), the trees
    they were installed with, and the same for the interpreter of a script."""
    found: list[Path] = []
    for each in _with_targets([program]):
        found += [each, install_root(each)]
    runner = interpreter(program.resolve(), search_path)
    if runner is not None:
        for each in _with_targets([runner]):
            found += [each, install_root(each)]
    return found


def own_paths() -> list[Path]:
    """ralph-dev's own installation: its interpreter and the prefixes it imports from (a
    venv, its base Python), its package (the plugin is inside it) and its console script."""
    package = Path(ralph_dev.__file__).parent
    prefixes = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    found = [Path(p) for p in sorted(prefixes)]
    found += program_paths(Path(sys.executable), os.defpath)
    found += _with_targets([package])
    script = ralph_dev_script()
    if script is not None:
        found += program_paths(script, os.defpath)
    return found


def worker_tools(program: str, search_path: str) -> list[Path]:
    """Everything a worker runs, from ralph-dev's own installation to the agent ``program``
    (as its PATH ``search_path`` finds it), existing paths only, each once."""
    found = own_paths()
    agent = find_program(program, search_path)
    if agent is not None:
        found += program_paths(agent, search_path)
    return [p for p in dict.fromkeys(found) if p.exists()]
