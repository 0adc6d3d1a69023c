"""What the daemon serves over HTTP: the dashboard page, the state API (``/api/v1``),
Prometheus ``/metrics`` and ``/healthz``.

A package of its own, beside ``cli``: another way in for people and programs,
over the same state document (``control/state/status.py``). Its page is plain
HTML/CSS/JS in ``static/``, shipped in the wheel: no build step.
"""

from __future__ import annotations
