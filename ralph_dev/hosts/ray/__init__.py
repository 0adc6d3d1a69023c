"""The controller's side of workers on a Ray cluster: placing attempts, asking them,
carrying their mailboxes, and fetching what they pushed. Only ``plane`` and ``warm`` import Ray."""

from __future__ import annotations
