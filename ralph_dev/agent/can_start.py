"""Whether a program can be started, found out without starting it.

``python -m ralph_dev.agent.can_start PROGRAM`` is what the workers' setup probe
(``agent.probe``) runs inside a worker's sandbox, and :func:`problem` is what the
controller's every tick and ``start`` ask on the host. The agent itself is never run:
an agent program may do real work whatever its arguments (there is no ``--version``
every program knows), and a probe must cost nothing. Standard library only, like the
launcher: it runs inside the sandbox with nothing else imported.

What ``execve`` needs is checked in turn, as the kernel walks it: the program is found
(a name on ``PATH``), a regular file and executable; a script (``#!``) has an
interpreter that passes the same checks (``#!/usr/bin/env NAME``: ``env`` there, then
NAME on ``PATH``), down to the kernel's own limit of nested interpreters; an ELF
program's dynamic loader (``PT_INTERP``) exists. Nothing it names is executed. As a
command it prints nothing and exits 0 when the program can be started, else one JSON
line ``{"path", "what", "fix"}`` on stdout and exits 1.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

MAX_INTERPRETERS = 4
"""The kernel runs a script's interpreter that is itself a script this deep, no deeper
(``BINPRM_MAX_RECURSION``)."""

_HEAD = 512
"""Bytes read of a file: a ``#!`` line (the kernel reads 256) or an ELF header."""

_PT_INTERP = 3


@dataclass(frozen=True)
class Problem:
    """Why a program cannot be started: the file at fault, what is wrong, the fix."""

    path: str
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}; {self.fix}"


def _shebang(head: bytes) -> list[str] | None:
    """The words of a ``#!`` line (the interpreter and its argument), None for no script."""
    if not head.startswith(b"#!"):
        return None
    return head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()


def _elf_loader(handle: BinaryIO, head: bytes) -> str | None:
    """The dynamic loader an ELF program names (``PT_INTERP``), None for a static one,
    another format, or a header that cannot be read."""
    if not head.startswith(b"\x7fELF") or len(head) < 0x38 or head[4] not in (1, 2):
        return None
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    try:
        if wide:
            (table,), (size, count) = (struct.unpack_from(order + "Q", head, 0x20),
                                       struct.unpack_from(order + "HH", head, 0x36))
        else:
            (table,), (size, count) = (struct.unpack_from(order + "I", head, 0x1C),
                                       struct.unpack_from(order + "HH", head, 0x2A))
        for index in range(min(count, 64)):
            handle.seek(table + index * size)
            header = handle.read(size)
            if len(header) < (40 if wide else 20) or \
                    struct.unpack_from(order + "I", header, 0)[0] != _PT_INTERP:
                continue
            offset, length = struct.unpack_from(order + "Q16xQ", header, 8) if wide else \
                struct.unpack_from(order + "I8xI", header, 4)
            handle.seek(offset)
            return handle.read(min(length, 4096)).split(b"\0", 1)[0].decode("utf-8", "replace")
    except (OSError, struct.error, ValueError):
        return None
    return None


def _missing(path: Path, role: str, fix: str) -> Problem | None:
    """Why ``path`` cannot be executed (not there, not a file, not executable), naming it
    as ``role``; ``fix``: what to do when it is not there. None when it is fine."""
    if not path.exists():
        link = f" (a link to {path.readlink()}, which does not exist)" \
            if path.is_symlink() else ""
        return Problem(str(path), f"{role} {path} does not exist{link}", fix)
    if path.is_dir():
        return Problem(str(path), f"{role} {path} is a directory, not a program",
                       "name the program file itself")
    if not os.access(path, os.X_OK):
        return Problem(str(path), f"{role} {path} is not executable",
                       f"make it executable: `chmod +x {path}`")
    return None


def _absolute(path: str, cwd: str | None) -> Path:
    """``path`` as an exec from ``cwd`` (None: this process's) finds it."""
    return Path(os.path.normpath(Path(cwd or Path.cwd()) / path))


def problem(program: str, search_path: str | None = None, *, cwd: str | None = None,
            ) -> Problem | None:
    """Why ``program`` (a path, or a name on ``search_path``, default ``$PATH``) cannot be
    started, or None; reads files, never runs one. The message names the file at fault
    and, for an interpreter, the scripts that lead to it."""
    search_path = os.environ.get("PATH", os.defpath) if search_path is None else search_path
    if os.sep not in program:
        found = shutil.which(program, path=search_path)
        if found is None:
            return Problem(program, f"the program {program!r} is not on the workers' PATH "
                                    f"({search_path})",
                           "install it on that PATH, or name it by its full path")
        program = found
    path, role, chain = _absolute(program, cwd), "the program", ""
    fix = "install it there, or name the path it has"
    for _ in range(MAX_INTERPRETERS + 1):
        bad = _missing(path, role, fix)
        if bad is not None:
            return Problem(bad.path, chain + bad.what, bad.fix)
        here = f"{chain}{role} {path}"
        try:
            with path.open("rb") as handle:
                head = handle.read(_HEAD)
                loader = _elf_loader(handle, head)
        except PermissionError:
            return None  # executable but not readable: a binary runs so (a script would not)
        except OSError as exc:
            return Problem(str(path), f"{here} cannot be read ({exc.strerror})",
                           f"see why {path} cannot be read")
        if loader is not None:
            bad = _missing(Path(loader), "its dynamic loader",
                           "install the libraries it was built for, or a build of it for "
                           "this system")
            return None if bad is None else Problem(bad.path, f"{here}: {bad.what}", bad.fix)
        words = _shebang(head)
        if words is None:
            return None
        if not words:
            return Problem(str(path), f"{here} is a script with an empty `#!` line",
                           f"name its interpreter on the first line of {path}")
        fix = f"install it, or change the `#!` line of {path}"
        interpreter = _absolute(words[0], cwd)
        if interpreter.name == "env":
            bad = _missing(interpreter, "its `#!` interpreter", fix)
            if bad is not None:
                return Problem(bad.path, f"{here}: {bad.what}", bad.fix)
            names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
            line = f"`#!{' '.join(words)}`"
            if not names:
                return Problem(str(path), f"{here}: its {line} names no program",
                               f"name its interpreter on the first line of {path}")
            found = shutil.which(names[0], path=search_path)
            if found is None:
                return Problem(names[0], f"{here}: its {line} finds no {names[0]!r} on the "
                                         f"workers' PATH ({search_path})",
                               f"install {names[0]} on that PATH, or name the interpreter by "
                               f"its full path in the `#!` line of {path}")
            interpreter = _absolute(found, cwd)
        chain, path, role = f"{here}: ", interpreter, "its `#!` interpreter"
    return Problem(str(path), f"{chain}interpreters nest deeper than the kernel follows "
                              f"({MAX_INTERPRETERS})",
                   "name the last interpreter in the first script's `#!` line")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m ralph_dev.agent.can_start PROGRAM", file=sys.stderr)
        return 2
    found = problem(args[0])
    if found is None:
        return 0
    print(json.dumps(asdict(found)), flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
