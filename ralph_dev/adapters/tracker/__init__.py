"""Issue trackers behind one port (``core.ports.Tracker``): the local one and Linear."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings
    from ralph_dev.core.ports import Tracker


def open_tracker(settings: ProjectSettings) -> Tracker:
    """The tracker a project is configured with (``tracker.kind``)."""
    from ralph_dev.core.errors import ConfigError

    if settings.tracker.kind == "local":
        from ralph_dev.adapters.tracker.local import LocalTracker

        return LocalTracker(settings.paths.tracker_db, settings.key)
    if settings.tracker.kind == "linear":
        try:
            from ralph_dev.adapters.tracker.linear.tracker import LinearTracker
        except ImportError as exc:
            raise ConfigError(
                f"project {settings.name!r} uses tracker.kind = 'linear', but the Linear "
                "backend is not installed in this build; use tracker.kind = 'local'"
            ) from exc
        return LinearTracker.from_settings(settings)
    raise ConfigError(f"project {settings.name!r}: unknown tracker.kind {settings.tracker.kind!r}")
