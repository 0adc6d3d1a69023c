"""ralph-dev: a swarm of coding agents on one project, steered from an issue tracker."""

from __future__ import annotations

__version__ = "0.1.0"
