"""``python -m ralph_dev``: the same CLI, used to start children with this interpreter."""

from __future__ import annotations

from ralph_dev.cli import main

main()
