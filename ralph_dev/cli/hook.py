"""``ralph-dev hook …``: the Claude Code hooks of a ralph-dev worker.

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

from ralph_dev.cli import CliContext, main, pass_ctx
from ralph_dev.inpane import hooks
from ralph_dev.inpane.worker import WorkerEnv

HookBody = Callable[[Any, WorkerEnv, dict[str, Any]], str | None]


def _run(cli: CliContext, name: str, body: HookBody) -> None:
    out: str | None = None
    with contextlib.suppress(Exception):
        hooks.configure_logging(hooks.hook_log_path())

        def inside(env: WorkerEnv) -> str | None:
            payload = hooks.read_payload()
            return body(cli.project(env.project), env, payload)

        out = hooks.run_hook(name, inside)
    if out:
        click.echo(out)


@main.group("hook")
def hook_group() -> None:
    """Claude Code hooks for ralph-dev workers (no-ops outside a worker; always exit 0)."""


@hook_group.command("session-start")
@pass_ctx
def session_start_cmd(cli: CliContext) -> None:
    """Print the issue's context, the role's rules and how to finish."""

    def body(settings: Any, env: WorkerEnv, payload: dict[str, Any]) -> str:
        hooks.note_session(settings, env, payload)
        return hooks.session_start(settings, env)

    _run(cli, "session-start", body)


@hook_group.command("post-tool-use")
@pass_ctx
def post_tool_use_cmd(cli: CliContext) -> None:
    """Snapshot the workspace with jj and record the worker's last activity."""

    def body(settings: Any, env: WorkerEnv, _payload: dict[str, Any]) -> None:
        hooks.post_tool_use(settings, env)

    _run(cli, "post-tool-use", body)


@hook_group.command("stop-failure")
@pass_ctx
def stop_failure_cmd(cli: CliContext) -> None:
    """Record that the agent's turn ended on an API error (the controller pauses)."""

    def body(settings: Any, env: WorkerEnv, payload: dict[str, Any]) -> None:
        hooks.stop_failure(settings, env, payload)

    _run(cli, "stop-failure", body)


@hook_group.command("stop")
@pass_ctx
def stop_cmd(cli: CliContext) -> None:
    """Let the agent stop only after it reported (or hit the iteration cap)."""
    _run(cli, "stop", lambda settings, env, payload: hooks.stop(settings, env, payload).output())
