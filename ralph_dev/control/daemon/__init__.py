"""The daemon and what it serves beside its health loop.

The dashboard and state API, metrics and the notifier run in the daemon's process,
apart from the controller's loop: a slow page never delays a tick.
"""

from __future__ import annotations
