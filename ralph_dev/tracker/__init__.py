"""Issue trackers behind one Protocol (``base.Tracker``)."""

from __future__ import annotations
