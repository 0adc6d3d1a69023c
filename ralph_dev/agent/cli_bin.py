"""Where an agent CLI's program is: the one lookup every profile's install check uses.

A person names the program in config (``agent.codex_bin``…: a path, or a name looked up
on the workers' PATH); left at its default, the copy ``scripts/setup.sh`` installed
under ``~/.cache/ralph-dev/NAME-VERSION`` counts too, so a fresh machine runs the
demo and the tests without a global npm install.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ralph_dev.agent.claude import AgentError, setup_dirs
from ralph_dev.core.agent_profiles import AgentProfile
from ralph_dev.core.config import ProjectSettings


def _runnable(candidate: str | None) -> bool:
    return bool(candidate) and Path(str(candidate)).is_file() and os.access(str(candidate),
                                                                            os.X_OK)


def find_cli(profile: AgentProfile, path: str | None = None) -> str | None:
    """The CLI as a person (or the demo) has it: its ``RALPH_DEV_*_BIN``, its program on
    ``path`` (None: this process's PATH), else the set-up copy, newest first."""
    for candidate in (os.environ.get(profile.bin_variable),
                      shutil.which(profile.program, path=path),
                      *(str(d / "node_modules/.bin" / profile.program)
                        for d in setup_dirs(profile.name))):
        if _runnable(candidate):
            return candidate
    return None


def resolve_cli_bin(profile: AgentProfile, settings: ProjectSettings, path: str) -> str:
    """The program workers run: ``agent.<bin_setting>`` as configured; left at its
    default, also the set-up copy. Raises, naming the fix, when there is none."""
    configured = str(getattr(settings.agent, profile.bin_setting))
    install = f"npm install -g {profile.package}@{profile.pinned}"
    if os.sep in configured:
        if _runnable(configured):
            return configured
        raise AgentError(f"agent.{profile.bin_setting} {configured!r} is not an executable "
                         f"file; install {profile.title} ({install}) or fix "
                         f"agent.{profile.bin_setting}")
    found = find_cli(profile, path) if configured == profile.program \
        else shutil.which(configured, path=path)
    if not found:
        raise AgentError(f"{profile.title} ({configured!r}) is not on the worker's PATH nor "
                         f"installed by scripts/setup.sh; install it (scripts/setup.sh, or "
                         f"{install}) or set agent.{profile.bin_setting} to its full path")
    return found
