"""The person's setup checks: ``doctor`` and ``init``'s look at the repository."""

from __future__ import annotations
