"""``ralph-dev worker …``: how a worker agent reports back (its skill says which command).

Each command checks that it runs inside the worker of exactly the issue it
names, opens the project's tracker, does one idempotent thing and says what
it did in plain words the agent can act on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import click

from ralph_dev.cli import CliContext, main, pass_ctx
from ralph_dev.core.state import StateStore
from ralph_dev.inpane import reports
from ralph_dev.inpane import worker as w

T = TypeVar("T")


def _with_worker(cli: CliContext, issue: str, action: Callable[[w.Worker], Awaitable[T]]) -> T:
    env = w.require_worker(issue)
    settings = cli.project(env.project)

    async def go() -> T:
        tracker = w.open_tracker(settings)
        try:
            return await action(w.Worker(settings, env, tracker, StateStore(settings.paths)))
        finally:
            await tracker.close()

    # asyncio.run, not ralph_dev.cli.run: the `run` command module shadows that helper
    # once it is imported as the package attribute ralph_dev.cli.run.
    return asyncio.run(go())


@main.group("worker")
def worker_group() -> None:
    """Commands a ralph-dev worker agent runs to report on its own issue."""


@worker_group.command("done")
@click.argument("issue")
@click.option("--summary", required=True, help="What you did and how you checked it.")
@click.option("--timeout", type=click.FloatRange(min=1), default=reports.VERIFY_TIMEOUT,
              show_default=True, help="Seconds the verify command may run.")
@pass_ctx
def done_cmd(cli: CliContext, issue: str, summary: str, timeout: float) -> None:
    """Finish ISSUE: run the verify command, then close (or hand to review) the issue."""
    result = _with_worker(cli, issue, lambda wk: reports.done(wk, summary, timeout=timeout))
    if result.already:
        click.echo(f"{issue} was already reported done ({result.state}); nothing changed. "
                   "You can stop now.")
        return
    if result.verify is not None:
        click.echo(f"verify passed: `{result.verify.command}` exited 0 "
                   f"in {result.verify.duration_s:.1f} s")
    where = f"moved to {result.state}" if result.state else "state left as it is"
    click.echo(f"{issue} reported done ({where}); summary and evidence are on the issue. "
               "You can stop now.")


@worker_group.command("blocked")
@click.argument("issue")
@click.option("--question", required=True, help="Exactly what a person must decide or provide.")
@pass_ctx
def blocked_cmd(cli: CliContext, issue: str, question: str) -> None:
    """Ask a person: label ISSUE user-input-needed and comment the question."""
    fresh = _with_worker(cli, issue, lambda wk: reports.blocked(wk, question))
    already = "" if fresh else " (this question was already on the issue)"
    click.echo(f"{issue} is waiting for a person{already}. Stop now; ralph-dev restarts work "
               "when someone answers.")


@worker_group.command("note")
@click.argument("issue")
@click.argument("text")
@pass_ctx
def note_cmd(cli: CliContext, issue: str, text: str) -> None:
    """Post a non-blocking update on ISSUE (labels it agent-feedback-given)."""
    fresh = _with_worker(cli, issue, lambda wk: reports.note(wk, text))
    click.echo(f"note posted on {issue}; carry on." if fresh
               else f"this note was already on {issue}; carry on.")


@worker_group.command("plan")
@click.argument("issue")
@click.option("--file", "plan_file", required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Plan file in the `issue import` format (.toml or .md).")
@pass_ctx
def plan_cmd(cli: CliContext, issue: str, plan_file: Path) -> None:
    """Create the plan's sub-issues (with blockers) under ISSUE in one go."""
    created = _with_worker(cli, issue, lambda wk: reports.plan(wk, plan_file))
    click.echo(f"created {len(created)} sub-issue(s) of {issue}: {', '.join(created)}")
    click.echo(f"Finish with `ralph-dev worker done {issue} --summary …`.")


@worker_group.command("feedback")
@click.argument("issue")
@click.option("--all", "show_all", is_flag=True,
              help="Every comment from people, not only the new ones.")
@pass_ctx
def feedback_cmd(cli: CliContext, issue: str, show_all: bool) -> None:
    """Print comments people left on ISSUE since you last read them."""
    comments = _with_worker(cli, issue, lambda wk: reports.feedback(wk, show_all=show_all))
    click.echo(reports.format_comments(comments, issue))
