"""Builds the real adapters for a project; the one place that knows all of them."""

from __future__ import annotations

from ralph_dev.adapters.jj import JJ
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.adapters.tracker import open_tracker
from ralph_dev.control.controller import Controller
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.state import StateStore


def tmux_for(settings: ProjectSettings) -> Tmux:
    return Tmux.from_settings(settings)


def jj_for(settings: ProjectSettings) -> JJ:
    return JJ.from_settings(settings)


def controller_for(settings: ProjectSettings) -> Controller:
    return Controller(
        settings,
        tracker=open_tracker(settings),
        tmux=tmux_for(settings),
        jj=jj_for(settings),
        store=StateStore(settings.paths),
    )
