"""Find (or install) the pinned Claude Code CLI for the tests that drive it for real.

Order: ``$RALPH_DEV_CLAUDE_BIN`` (what ``.ci/run`` exports), a ``claude`` on
PATH, the test cache (``~/.cache/ralph-dev-tests/claude-code-VERSION``), and
finally ``npm install`` into that cache. Whatever is found must report the
pinned version: the offline behaviour the tests rely on (first-run screens,
plugin format, tool names) was checked for that version.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path

CLAUDE_CODE_VERSION = "2.1.197"
NPM_PACKAGE = "@anthropic-ai/claude-code"

# Computed at import, before any fixture repoints XDG_CACHE_HOME into a tmp dir.
CACHE_DIR = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "ralph-dev-tests"
    / f"claude-code-{CLAUDE_CODE_VERSION}"
)


class ClaudeUnavailable(RuntimeError):
    pass


def version_of(binary: str) -> str | None:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"\d+\.\d+\.\d+", out.stdout)
    return found.group(0) if found else None


def _cached() -> Path:
    return CACHE_DIR / "node_modules" / ".bin" / "claude"


def install(cache_dir: Path = CACHE_DIR) -> Path:
    """``npm install`` the pinned CLI into ``cache_dir`` (once; safe in parallel)."""
    npm = shutil.which("npm")
    if npm is None:
        raise ClaudeUnavailable(
            "Claude Code CLI not found and npm is missing: install Node.js/npm, or set "
            f"RALPH_DEV_CLAUDE_BIN to a claude {CLAUDE_CODE_VERSION} binary"
        )
    cache_dir.mkdir(parents=True, exist_ok=True)
    binary = cache_dir / "node_modules" / ".bin" / "claude"
    with (cache_dir / ".install.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists() and version_of(str(binary)) == CLAUDE_CODE_VERSION:
            return binary
        result = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error",
             f"{NPM_PACKAGE}@{CLAUDE_CODE_VERSION}"],
            cwd=cache_dir, capture_output=True, text=True, timeout=600, check=False,
        )
        if result.returncode != 0 or not binary.exists():
            raise ClaudeUnavailable(
                f"npm install {NPM_PACKAGE}@{CLAUDE_CODE_VERSION} failed "
                f"(exit {result.returncode}): {result.stderr[-2000:]}"
            )
    return binary


def find_claude(*, allow_install: bool = True) -> str:
    """The pinned claude binary, installing it when allowed and missing."""
    explicit = os.environ.get("RALPH_DEV_CLAUDE_BIN")
    if explicit:
        found = version_of(explicit)
        # scripts/compat.sh (RALPH_DEV_COMPAT) tries another version on purpose
        if found != CLAUDE_CODE_VERSION and not os.environ.get("RALPH_DEV_COMPAT"):
            raise ClaudeUnavailable(
                f"RALPH_DEV_CLAUDE_BIN={explicit} reports version {found}, the tests need "
                f"{CLAUDE_CODE_VERSION}: point it at that version or unset it"
            )
        return explicit
    for candidate in (shutil.which("claude"), str(_cached())):
        if candidate and Path(candidate).exists() and version_of(candidate) == CLAUDE_CODE_VERSION:
            return candidate
    if not allow_install:
        raise ClaudeUnavailable(f"Claude Code {CLAUDE_CODE_VERSION} is not installed")
    return str(install())
