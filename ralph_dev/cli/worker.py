"""``ralph-dev worker …``: how a worker agent reports back (its skill says which command).

Each command checks that it runs inside the worker of exactly the issue it
names (its run directory says which: ``adapters.mailbox``), hands its report to
the controller and says what became of it in plain words the agent can act
on. No config file is read and no environment variable counts.
"""

from __future__ import annotations

from pathlib import Path

import click

from ralph_dev.cli import CliContext, main, pass_ctx
from ralph_dev.inpane import groom, reports
from ralph_dev.inpane import worker as w


@main.group("worker")
def worker_group() -> None:
    """Commands a ralph-dev worker agent runs to report on its own issue."""


def _said(outcome: reports.Outcome, then: str) -> str:
    return f"{outcome.message} {then}".strip()


@worker_group.command("done")
@click.argument("issue")
@click.option("--summary", required=True, help="What you did and how you checked it.")
@click.option("--timeout", type=click.FloatRange(min=1), default=reports.VERIFY_TIMEOUT,
              show_default=True, help="Seconds the verify command may run.")
@pass_ctx
def done_cmd(cli: CliContext, issue: str, summary: str, timeout: float) -> None:
    """Finish ISSUE: run the verify command, then report it done to ralph-dev."""
    outcome, verify = reports.done(w.require_worker(issue), summary, timeout=timeout)
    if verify is not None and not outcome.already:
        click.echo(f"verify passed: `{verify.command}` exited 0 in {verify.duration_s:.1f} s")
    click.echo(_said(outcome, "You can stop now."))


@worker_group.command("blocked")
@click.argument("issue")
@click.option("--question", required=True, help="Exactly what a person must decide or provide.")
@pass_ctx
def blocked_cmd(cli: CliContext, issue: str, question: str) -> None:
    """Ask a person: label ISSUE user-input-needed and comment the question."""
    outcome = reports.blocked(w.require_worker(issue), question)
    click.echo(_said(outcome, "Stop now; ralph-dev restarts work when someone answers."))


@worker_group.command("note")
@click.argument("issue")
@click.argument("text")
@pass_ctx
def note_cmd(cli: CliContext, issue: str, text: str) -> None:
    """Post a non-blocking update on ISSUE (labels it agent-feedback-given)."""
    click.echo(_said(reports.note(w.require_worker(issue), text), "Carry on."))


@worker_group.command("plan")
@click.argument("issue")
@click.option("--file", "plan_file", required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Plan file in the `issue import` format (.toml or .md).")
@pass_ctx
def plan_cmd(cli: CliContext, issue: str, plan_file: Path) -> None:
    """Create the plan's sub-issues (with blockers) under ISSUE in one go."""
    outcome, count = reports.plan(w.require_worker(issue), plan_file)
    click.echo(_said(outcome, f"({count} task(s).) Finish with `ralph-dev worker done {issue} "
                              "--summary …`."))


@worker_group.command("feedback")
@click.argument("issue")
@click.option("--all", "show_all", is_flag=True,
              help="Every comment from people, not only the new ones.")
@pass_ctx
def feedback_cmd(cli: CliContext, issue: str, show_all: bool) -> None:
    """Print comments people left on ISSUE since you last read them."""
    comments = reports.feedback(w.require_worker(issue), show_all=show_all)
    click.echo(reports.format_comments(comments, issue))


@worker_group.command("diff")
@click.argument("issue")
@pass_ctx
def diff_cmd(cli: CliContext, issue: str) -> None:
    """Print your change against trunk (git format), as of now."""
    click.echo(reports.diff(w.require_worker(issue)), nl=False)


# --- the groom worker's -----------------------------------------------------------------

REASON = click.option("--reason", required=True,
                      help="One line: why, for the person who reads the comment.")


@worker_group.command("backlog")
@click.argument("issue")
@pass_ctx
def backlog_cmd(cli: CliContext, issue: str) -> None:
    """Print the project's open issues, recently finished ones and recent events (groom)."""
    click.echo(groom.backlog(w.require_worker(issue)))


@worker_group.command("propose")
@click.argument("issue")
@click.option("--title", required=True, help="The missing work, in a few words.")
@click.option("--description", default="", help="What is to be done and how to check it.")
@click.option("--priority", type=click.IntRange(0, 4), default=0, show_default=True,
              help="0 = none, 1 = urgent … 4 = low.")
@REASON
@pass_ctx
def propose_cmd(cli: CliContext, issue: str, title: str, description: str, priority: int,
                reason: str) -> None:
    """Propose a new issue (groom): it waits in the backlog for a person."""
    outcome = groom.propose(w.require_worker(issue), title, reason, description=description,
                            priority=priority)
    click.echo(_said(outcome, "Carry on."))


@worker_group.command("prioritize")
@click.argument("issue")
@click.argument("target")
@click.option("--priority", type=click.IntRange(1, 4), required=True,
              help="1 = urgent … 4 = low; a priority a person set may only be lowered.")
@REASON
@pass_ctx
def prioritize_cmd(cli: CliContext, issue: str, target: str, priority: int, reason: str) -> None:
    """Set TARGET's priority (groom), with the reason as a comment."""
    outcome = groom.prioritize(w.require_worker(issue), target, priority, reason)
    click.echo(_said(outcome, "Carry on."))


@worker_group.command("flag")
@click.argument("issue")
@click.argument("target")
@click.option("--duplicate-of", default=None, help="The issue TARGET duplicates.")
@click.option("--stale", is_flag=True, help="TARGET looks out of date or no longer needed.")
@REASON
@pass_ctx
def flag_cmd(cli: CliContext, issue: str, target: str, duplicate_of: str | None, stale: bool,
             reason: str) -> None:
    """Flag TARGET as a likely duplicate or stale (groom), for a person to decide."""
    if bool(duplicate_of) == stale:
        raise click.UsageError("give exactly one of --duplicate-of ISSUE or --stale")
    outcome = groom.flag(w.require_worker(issue), target, reason, duplicate_of=duplicate_of,
                         stale=stale)
    click.echo(_said(outcome, "Carry on."))
