"""The state document: one versioned picture of a project.

``status``, the dashboard and ``/api/v1/state`` all read it, so what a person sees is
said in one place.
"""

from __future__ import annotations
