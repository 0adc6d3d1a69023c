"""JSON from outside (webhook bodies, hook payloads) parsed without letting its shape
crash the reader.

``json.loads`` raises ``RecursionError`` on deeply nested input (a 100,000-deep
array is a few hundred kilobytes), which is not a ``ValueError``: callers that
catch only bad JSON turned it into an HTTP 500 or a hook that failed open.
"""

from __future__ import annotations

import json
from typing import Any


class TooDeep(ValueError):
    """Nested deeper than the parser can follow: bad input like any other."""


def parse_json(text: str | bytes) -> Any:
    """``json.loads``, with too-deep nesting reported as a ``ValueError`` (``TooDeep``)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise TooDeep("JSON nested too deeply") from None
