"""The stable entry point of every pane: ``python -I -S …/ralph_dev/launcher.py SPEC.json``
(``adapters.processes.launcher_argv``), or, as windows opened by an older ralph-dev
still run it, ``python -m ralph_dev.launcher SPEC.json``.

This file's path and module path are in the argv of live worker and controller windows
(a respawned pane runs its argv again), so neither ever moves: a swarm started by an
older ralph-dev keeps working across an upgrade. The code lives in
:mod:`ralph_dev.inpane.exec_launch` (stdlib only).

Run by its path, isolated (``-I``: no PYTHON* variables, neither the current directory
nor this one on ``sys.path``) and without ``site`` (``-S``: the install's import hooks
cost a pane ~15 ms of its start): the package is found beside this file, after the
standard library, so nothing in a workspace is ever imported.
"""

from __future__ import annotations

import os
import sys

if not __package__:  # run by its path: find the package this file is in
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ralph_dev.inpane.exec_launch import exec_spec, main

__all__ = ["exec_spec", "main"]

if __name__ == "__main__":
    sys.exit(main())
