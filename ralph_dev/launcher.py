"""The stable entry point of every pane: ``python -m ralph_dev.launcher SPEC.json``.

This module path is in the argv of every live worker and controller window,
so it never moves: a swarm started by an older ralph-dev keeps working across
an upgrade. The code lives in :mod:`ralph_dev.inpane.exec_launch` (stdlib only).
"""

from __future__ import annotations

import sys

from ralph_dev.inpane.exec_launch import exec_spec, main

__all__ = ["exec_spec", "main"]

if __name__ == "__main__":
    sys.exit(main())
