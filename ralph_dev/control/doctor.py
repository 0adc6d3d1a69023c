"""`ralph-dev doctor`: each dependency OK, or exactly what to do about it."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from ralph_dev.core.config import ConfigError, project_names
from ralph_dev.core.errors import RalphError

MIN_TMUX = (3, 0)
MIN_JJ = (0, 30)
MIN_GIT_FOR_JJ = (2, 42)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _version(argv: list[str]) -> tuple[str | None, tuple[int, ...]]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None, ()
    text = (out.stdout or out.stderr).strip().splitlines()
    first = text[0] if text else ""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", first)
    numbers = tuple(int(x) for x in match.groups() if x is not None) if match else ()
    return first, numbers


def check_tool(name: str, argv: list[str], minimum: tuple[int, ...], fix: str) -> Check:
    if shutil.which(argv[0]) is None and "/" not in argv[0]:
        return Check(name, False, f"not found on PATH; {fix}")
    text, version = _version(argv)
    if text is None:
        return Check(name, False, f"{argv[0]} does not run; {fix}")
    if version and version < minimum:
        need = ".".join(map(str, minimum))
        return Check(name, False, f"{text} is older than {need}; {fix}")
    return Check(name, True, text)


async def run_checks(cli: Any, project: str | None) -> list[Check]:
    from ralph_dev.adapters.jj import JJ, child_path, find_jj

    checks = [
        check_tool("tmux", ["tmux", "-V"], MIN_TMUX, "install tmux >= 3.0 (apt install tmux)"),
        check_tool("jj", [find_jj() or "jj", "--version"], MIN_JJ,
                   "install jj >= 0.30 (https://jj-vcs.github.io/jj/latest/install-and-setup/)"),
    ]
    git = shutil.which("git", path=child_path())
    checks.append(
        check_tool("git (for jj)", [git or "git", "--version"], MIN_GIT_FOR_JJ,
                   "colocated jj workspaces need git >= 2.42 first on PATH")
    )
    names = [project] if project else project_names(cli.config_path)
    if not names:
        checks.append(Check("config", False, f"no projects in {cli.config_path}; "
                                             "run ralph-dev init PROJECT --repo PATH"))
    for name in names:
        try:
            settings = cli.project(name)
        except ConfigError as exc:
            checks.append(Check(f"config {name}", False, str(exc)))
            continue
        checks.append(Check(f"config {name}", True, f"repo {settings.repo}"))
        if settings.agent.runner == "claude":
            checks.append(check_tool(
                f"claude ({name})", [settings.agent.claude_bin, "--version"], (1, 0),
                "install Claude Code: npm install -g @anthropic-ai/claude-code "
                "(or set agent.claude_bin)",
            ))
        if settings.merge.mode == "pr":
            checks.append(check_tool(
                f"gh ({name}, pull-request mode)", [settings.merge.gh_bin, "--version"], (2, 0),
                "install the GitHub CLI and run `gh auth login` (or set merge.gh_bin)",
            ))
        try:
            JJ.from_settings(settings).check_repo()
            checks.append(Check(f"repo {name}", True, f"{settings.repo} is a jj repo with "
                                                     f"bookmark {settings.trunk}"))
        except RalphError as exc:
            checks.append(Check(f"repo {name}", False, str(exc)))
        checks.append(await _check_tracker(settings))
    return checks


async def _check_tracker(settings: Any) -> Check:
    from ralph_dev.adapters.tracker import open_tracker

    name = f"tracker {settings.name} ({settings.tracker.kind})"
    try:
        tracker = open_tracker(settings)
        try:
            issues = await tracker.list_issues()
        finally:
            await tracker.close()
    except RalphError as exc:
        return Check(name, False, str(exc))
    return Check(name, True, f"{len(issues)} issues readable")
