"""The tool fence: which Claude Code tools each role is offered and pre-approved.

Tool names as Claude Code 2.1 offers them (seen in its requests). Every role
may read, run commands (its `ralph-dev worker …` reports need Bash), load
skills, keep a task list and look things up on the web; only execute and
resolve workers edit files; nobody gets subagents or tools that wait for a
person or schedule work outside ralph-dev. ``AskUserQuestion`` is offered but
never run: ralph-dev's PreToolUse hook denies it and posts its question on the
issue (``inpane.asking``), and ``dontAsk`` denies it should the hook not answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ralph_dev.core.model import Role

# Tool names as Claude Code 2.1 offers them (seen in its requests). Every role
# may read, run commands (its `ralph-dev worker …` reports need Bash), load
# skills, keep a task list and look things up on the web.
COMMON_TOOLS = (
    "Bash", "Read", "Skill", "WebFetch", "WebSearch",
    "TaskCreate", "TaskGet", "TaskList", "TaskUpdate", "TaskOutput", "TaskStop",
)


EDIT_TOOLS = ("Edit", "Write", "NotebookEdit")


ASK_TOOLS = ("AskUserQuestion",)
"""Offered, never pre-approved: a model asks with it the way it was trained to, with
options, and the PreToolUse hook turns the call into a question on the issue. Hidden,
a model asks in prose instead, and its options are whatever it happened to write."""


# Never for a worker: subagents (a worker does not orchestrate) and tools that
# wait for a person (but AskUserQuestion, above) or schedule work outside ralph-dev.
NEVER_TOOLS = (
    "Agent", "SendMessage", "Workflow", "CronCreate", "CronDelete",
    "CronList", "ScheduleWakeup", "EnterWorktree", "ExitWorktree", "EnterPlanMode",
    "ExitPlanMode",
)


@dataclass(frozen=True)
class ToolFence:
    tools: tuple[str, ...]
    """What the session offers the model at all (``--tools``)."""
    allowed: tuple[str, ...]
    """Pre-approved, so ``dontAsk`` runs them without asking (``--allowedTools``)."""
    disallowed: tuple[str, ...]
    """Denied outright (``--disallowedTools``), belt and braces."""


def tool_fence(role: Role, workspace: Path | None = None) -> ToolFence:
    """Review, research and plan workers get no edit tools; nobody gets subagents.

    The edit tools are pre-approved only inside the worker's ``workspace`` and its own
    ``/tmp`` (a bare ``Write`` would allow any absolute path; Claude Code 2.1 needs
    ``//`` for a filesystem-absolute rule, and ``Edit(…)`` covers Write too). A fence
    for the model, not a jail: Bash can still write, which is what the sandbox
    (``agent.sandbox``) is for.
    """
    tools = COMMON_TOOLS + ASK_TOOLS + (EDIT_TOOLS if role.may_edit else ())
    disallowed = NEVER_TOOLS + (() if role.may_edit else EDIT_TOOLS)
    allowed: tuple[str, ...] = COMMON_TOOLS
    if role.may_edit:
        allowed += tuple(f"{tool}({where})" for tool in EDIT_TOOLS
                         for where in edit_scopes(workspace))
    return ToolFence(tools=tools, allowed=allowed, disallowed=disallowed)


def edit_scopes(workspace: Path | None) -> tuple[str, ...]:
    """Claude Code path patterns for the worker's own files (``//`` = absolute)."""
    own = ("//tmp/**",)
    return own if workspace is None else (f"/{workspace}/**", *own)


SUPERVISOR_READS = ("status", "doctor", "events", "plan", "logs", "issue list", "issue show")
SUPERVISOR_ACTS = ("stop", "start")
"""Restarting the daemon and controller is the supervisor's one repair (workers keep
running and are adopted)."""
SUPERVISOR_ALLOWED = (
    "Read", "Skill",
    *(f"Bash(ralph-dev {command}:*)" for command in SUPERVISOR_READS + SUPERVISOR_ACTS),
    "Bash(jj workspace list:*)", "Bash(jj log:*)", "Bash(jj status:*)",
    "Bash(tmux list-windows:*)", "Bash(tmux list-panes:*)",
)
"""The supervisor reads through ralph-dev's own commands and may stop/start it; any
other command (``init``, issue writes, ``--config``, ``service``…) is denied by
``dontAsk`` (never asked about): it runs on a project whose issues anyone may write."""
SUPERVISOR_DENIED = ("Bash(ralph-dev stop --workers:*)",)
"""Belt and braces: denial wins over the allowed prefix above."""
