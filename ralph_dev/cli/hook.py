"""``ralph-dev hook …``: the Claude Code hooks of a ralph-dev worker, and the supervisors
of Codex (``codex-exec``) and Gemini CLI (``gemini-exec``).

Claude Code runs these with a JSON payload on stdin. They always exit 0: the
output (context text, or a Stop ``decision``) is the only signal, and a hook
that fails says nothing and lets the agent go on. Logs go to the project's
hook log, never to stdout/stderr, which belong to Claude Code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import click

from ralph_dev.cli import main
from ralph_dev.inpane import asking, hooks
from ralph_dev.inpane.worker import Worker

HookBody = Callable[[Worker, dict[str, Any]], str | None]


def _run(name: str, body: HookBody) -> None:
    out: str | None = None
    with contextlib.suppress(Exception):
        hooks.configure_logging(hooks.hook_log_path())
        out = hooks.run_hook(name, lambda worker: body(worker, hooks.read_payload()))
    if out:
        click.echo(out)


@main.group("hook")
def hook_group() -> None:
    """Claude Code hooks for ralph-dev workers (no-ops outside a worker; always exit 0)."""


@hook_group.command("session-start")
def session_start_cmd() -> None:
    """Print the issue's context, the role's rules and how to finish."""
    _run("session-start", hooks.session_start)


@hook_group.command("post-tool-use")
def post_tool_use_cmd() -> None:
    """Tell the controller the agent is active (it snapshots the workspace with jj)."""
    _run("post-tool-use", lambda worker, _payload: hooks.post_tool_use(worker))


@hook_group.command("state")
def state_cmd() -> None:
    """Tell the controller what the agent does now (prompt, tool, notification, end)."""
    _run("state", lambda worker, payload: hooks.state(worker, payload))


@hook_group.command("ask-user-question")
def ask_user_question_cmd() -> None:
    """Deny AskUserQuestion (nobody in a worker can answer it) and post its question."""
    _run("ask-user-question", asking.ask_user_question)


@hook_group.command("stop-failure")
def stop_failure_cmd() -> None:
    """Record that the agent's turn ended on an API error (the controller pauses)."""
    _run("stop-failure", lambda worker, payload: hooks.stop_failure(worker, payload))


@hook_group.command("stop")
def stop_cmd() -> None:
    """Let the agent stop only after it reported (or hit the iteration cap)."""
    _run("stop", lambda worker, payload: hooks.stop(worker, payload).output())


@hook_group.command("status-line")
def status_line_cmd() -> None:
    """Claude Code's status line: the issue, and the account's usage windows told to the
    controller when they change."""
    _run("status-line", hooks.status_line)


@hook_group.command("codex-exec", context_settings={"ignore_unknown_options": True,
                                                   "allow_interspersed_args": False})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def codex_exec_cmd(argv: tuple[str, ...]) -> None:
    """Run Codex's `exec --json` in this pane, read its events for the controller, and
    exit with its status (not a hook that always exits 0: the pane's end is Codex's)."""
    from ralph_dev.inpane import codex_exec

    raise SystemExit(codex_exec.run(argv))


@hook_group.command("gemini-exec", context_settings={"ignore_unknown_options": True,
                                                    "allow_interspersed_args": False})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def gemini_exec_cmd(argv: tuple[str, ...]) -> None:
    """Run Gemini CLI headless in this pane (its prompt on stdin), read its stream-json
    events for the controller, and exit with its status."""
    from ralph_dev.inpane import gemini_exec

    raise SystemExit(gemini_exec.run(argv))
