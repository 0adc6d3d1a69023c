"""Builds the real adapters for a project; the one place that knows all of them."""

from __future__ import annotations

from ralph_dev.config import ProjectSettings
from ralph_dev.controller import Controller
from ralph_dev.jj import JJ
from ralph_dev.state import StateStore
from ralph_dev.tmux import Tmux
from ralph_dev.tracker import open_tracker


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
