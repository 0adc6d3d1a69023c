"""Which environment variables are secrets, kept out of command lines and of
processes that run agent-written code."""

from __future__ import annotations

import re
from collections.abc import Mapping

SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|AUTH", re.IGNORECASE)


def public_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that may appear on a command line (``tmux -e``) or reach code an
    agent wrote (verify commands): no secrets."""
    return {k: v for k, v in env.items() if not SECRET_ENV.search(k)}
