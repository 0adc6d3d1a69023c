"""``ralph-dev issue …``: a person's hands on the project's tracker.

Thin commands over the tracker Protocol. Every identifier is checked before
the tracker is opened; commands that take only an identifier find the project
by its key. Every change is one tracker transaction, so a refused command
(bad label token, blocker cycle, syntax error in an import file) writes
nothing at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ralph_dev.adapters import wake
from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tracker import open_tracker
from ralph_dev.cli import CliContext, echo_json, main, pass_ctx, project_argument, run
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.errors import TrackerInputError
from ralph_dev.core.model import Issue, NewIssue, check_identifier
from ralph_dev.core.ports import Tracker
from ralph_dev.core.text import for_terminal, terminal_line


def _issue_json(issue: Issue) -> dict[str, Any]:
    """Plain JSON-able data for ``issue list/show --json``."""
    return {
        "identifier": issue.identifier,
        "title": issue.title,
        "state": issue.state_name,
        "state_type": issue.state_type.value,
        "priority": issue.priority,
        "sort_order": issue.sort_order,
        "labels": sorted(issue.labels),
        "parent": issue.parent,
        "children": list(issue.children),
        "blocked_by": list(issue.blocked_by),
        "description": issue.description,
        "comments": [
            {
                "author": c.author,
                "body": c.body,
                "created_at": c.created_at.isoformat(),
                "by_ralph": c.by_ralph,
            }
            for c in issue.comments
        ],
        "created_at": issue.created_at.isoformat() if issue.created_at else None,
        "updated_at": issue.updated_at.isoformat() if issue.updated_at else None,
    }


def _tracker_for_issue(cli: CliContext, identifier: str, *, reading: bool = False
                       ) -> tuple[ProjectSettings, Tracker]:
    """``reading``: for a command that only reads (``CliContext.project_or_last_good``)."""
    settings = cli.project_for_issue(check_identifier(identifier), reading=reading)
    return settings, open_tracker(settings)


async def _closing(tracker: Tracker, coro: Any) -> Any:
    try:
        return await coro
    finally:
        await tracker.close()


def _write(settings: ProjectSettings, tracker: Tracker, coro: Any) -> Any:
    """A person's write to the tracker, then a poke: the running controller acts on it
    now (a new ready issue starts at once), not at its next poll."""
    result = run(_closing(tracker, coro))
    wake.poke(StateStore(settings.paths))
    return result


@main.group(name="issue")
def issue_group() -> None:
    """Add, list, show and change issues of a project's tracker."""


@issue_group.command(name="add")
@project_argument
@click.argument("title")
@click.option("--description", "-d", default="", help="Longer text (markdown).")
@click.option("--parent", help="Identifier of the parent issue.")
@click.option("--blocked-by", "blocked_by", multiple=True, metavar="ID",
              help="An issue that must finish first (repeatable).")
@click.option("--label", "labels", multiple=True, metavar="L", help="A label (repeatable).")
@click.option("--priority", type=click.IntRange(0, 4), default=0, show_default=True,
              help="0 none, 1 urgent, 2 high, 3 medium, 4 low.")
@click.option("--state", help="Initial state name (default: Todo).")
@pass_ctx
def add(
    cli: CliContext,
    project: str,
    title: str,
    description: str,
    parent: str | None,
    blocked_by: tuple[str, ...],
    labels: tuple[str, ...],
    priority: int,
    state: str | None,
) -> None:
    """Create an issue in PROJECT and print its identifier."""
    settings = cli.project(project)
    for ident in (*([parent] if parent else []), *blocked_by):
        check_identifier(ident)
    tracker = open_tracker(settings)
    entry = NewIssue(
        title=title,
        description=description,
        priority=priority,
        labels=labels,
        parent=parent,
        blocked_by=blocked_by,
        state=state,
    )
    created = _write(settings, tracker, tracker.create_issues([entry]))
    click.echo(created[0])



def _table(issues: list[Issue]) -> str:
    rows = [("ID", "STATE", "P", "LABELS", "BLOCKED BY", "TITLE")]
    for issue in issues:
        rows.append(
            (
                issue.identifier,
                terminal_line(issue.state_name),
                str(issue.priority),
                _labels(issue, ",") or "-",
                ",".join(issue.blocked_by) or "-",
                terminal_line(issue.title),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:5])) + "  " + row[5]
        for row in rows
    )


def _labels(issue: Issue, separator: str = ", ") -> str:
    """Labels as shown to people: made in Linear's UI they may hold control characters."""
    return separator.join(terminal_line(label) for label in sorted(issue.labels))


@issue_group.command(name="list")
@project_argument
@click.option("--json", "as_json", is_flag=True, help="A JSON list of issue objects.")
@pass_ctx
def list_(cli: CliContext, project: str, as_json: bool) -> None:
    """List PROJECT's issues (identifier, state, priority, labels, blockers, title)."""
    tracker = open_tracker(cli.project_or_last_good(project))
    listed = run(_closing(tracker, tracker.list_issues()))
    issues = [i for i in listed if not i.foreign]  # blockers/sub-issues of other projects
    if as_json:
        echo_json([_issue_json(i) for i in issues])
    elif issues:
        click.echo(_table(issues))
    else:
        click.echo(f"No issues in {project} yet; add one with: ralph-dev issue add {project} TITLE")


@issue_group.command(name="show")
@click.argument("identifier")
@click.option("--json", "as_json", is_flag=True, help="The issue as a JSON object.")
@pass_ctx
def show(cli: CliContext, identifier: str, as_json: bool) -> None:
    """Show one issue with its relations and comments."""
    _, tracker = _tracker_for_issue(cli, identifier, reading=True)
    issue = run(_closing(tracker, tracker.get(identifier)))
    if as_json:
        echo_json(_issue_json(issue))
        return
    lines = [
        f"{issue.identifier}  {terminal_line(issue.title)}",
        f"state:      {terminal_line(issue.state_name)} ({issue.state_type.value})",
        f"priority:   {issue.priority} (sort order {issue.sort_order:g})",
        f"labels:     {_labels(issue) or '-'}",
        f"parent:     {issue.parent or '-'}",
        f"children:   {', '.join(issue.children) or '-'}",
        f"blocked by: {', '.join(issue.blocked_by) or '-'}",
        f"created:    {issue.created_at.isoformat() if issue.created_at else '-'}",
        f"updated:    {issue.updated_at.isoformat() if issue.updated_at else '-'}",
    ]
    if issue.description:
        lines += ["", for_terminal(issue.description)]
    for comment in issue.comments:
        who = f"{terminal_line(comment.author)}{' (ralph)' if comment.by_ralph else ''}"
        lines += ["", f"--- {who}, {comment.created_at.isoformat()}", for_terminal(comment.body)]
    click.echo("\n".join(lines))


@issue_group.command(name="state")
@click.argument("identifier")
@click.argument("state")
@pass_ctx
def state(cli: CliContext, identifier: str, state: str) -> None:
    """Move an issue to STATE (a state name such as 'In Progress', any case)."""
    settings, tracker = _tracker_for_issue(cli, identifier)
    issue = _write(settings, tracker, tracker.set_state(identifier, name=state))
    click.echo(f"{issue.identifier}: {terminal_line(issue.state_name)}")


@issue_group.command(
    name="label",
    # "-h" must stay a label removal, so only --help asks for help here.
    context_settings={"ignore_unknown_options": True, "help_option_names": ["--help"]},
)
@click.argument("identifier")
@click.argument("changes", nargs=-1, required=True, type=click.UNPROCESSED)
@pass_ctx
def label(cli: CliContext, identifier: str, changes: tuple[str, ...]) -> None:
    """Add (+NAME) and remove (-NAME) labels in one change.

    Example: ralph-dev issue label ENG-3 +ralph:plan -ralph:hold
    """
    check_identifier(identifier)
    add: list[str] = []
    remove: list[str] = []
    for token in changes:
        if len(token) < 2 or token[0] not in "+-":
            raise TrackerInputError(
                f"{token!r} is not a label change: write +NAME to add or -NAME to remove"
            )
        (add if token[0] == "+" else remove).append(token[1:])
    settings, tracker = _tracker_for_issue(cli, identifier)

    async def change() -> tuple[Issue, Issue]:
        before = await tracker.get(identifier)
        return before, await tracker.change_labels(identifier, add=add, remove=remove)

    before, issue = _write(settings, tracker, change())
    for note in _unchanged_labels(before, issue, add=add, remove=remove):
        click.echo(f"{issue.identifier}: {note}")
    click.echo(f"{issue.identifier}: {_labels(issue) or '(no labels)'}")


def _unchanged_labels(before: Issue, after: Issue, *, add: list[str],
                      remove: list[str]) -> list[str]:
    """What a label change did not do, in words: removing a label that was not there (a
    typo, most likely) or adding one that was must not pass in silence."""
    had = {label.casefold() for label in before.labels}
    has = {label.casefold(): label for label in after.labels}
    notes = [f"label {terminal_line(name)!r} was already there" for name in add
             if name.casefold() in had]
    for name in remove:
        if name.casefold() not in had:
            notes.append(f"label {terminal_line(name)!r} was not there: nothing removed")
        elif name.casefold() in has:
            notes.append(f"label {terminal_line(name)!r} was not removed: the issue's label "
                         f"is spelled {terminal_line(has[name.casefold()])!r}")
    return notes


@issue_group.command(name="comment")
@click.argument("identifier")
@click.argument("text")
@click.option("--author", help="Name to sign with (default: $USER).")
@pass_ctx
def comment(cli: CliContext, identifier: str, text: str, author: str | None) -> None:
    """Add a person's comment to an issue (ralph-dev treats it as human feedback)."""
    settings, tracker = _tracker_for_issue(cli, identifier)
    _write(settings, tracker, tracker.comment(identifier, text, by_ralph=False, author=author))
    click.echo(f"Commented on {identifier}")


def _change_blockers(cli: CliContext, identifier: str, blockers: tuple[str, ...], *,
                     add: bool) -> None:
    """Add (or remove) each blocker, then show the issue's blockers as they now are."""
    for ident in (identifier, *blockers):
        check_identifier(ident)
    settings, tracker = _tracker_for_issue(cli, identifier)

    async def apply() -> Issue:
        change = tracker.add_blocker if add else tracker.remove_blocker
        issue = await tracker.get(identifier)
        for blocker in blockers:
            issue = await change(identifier, blocker)
        return issue

    issue = _write(settings, tracker, apply())
    click.echo(f"{issue.identifier}: blocked by {', '.join(issue.blocked_by) or '-'}")


@issue_group.command(name="block")
@click.argument("identifier")
@click.argument("blockers", nargs=-1, required=True)
@pass_ctx
def block(cli: CliContext, identifier: str, blockers: tuple[str, ...]) -> None:
    """Record that BLOCKERS must finish before IDENTIFIER (refuses cycles)."""
    _change_blockers(cli, identifier, blockers, add=True)


@issue_group.command(name="unblock")
@click.argument("identifier")
@click.argument("blockers", nargs=-1, required=True)
@pass_ctx
def unblock(cli: CliContext, identifier: str, blockers: tuple[str, ...]) -> None:
    """Drop BLOCKERS from IDENTIFIER's blockers."""
    _change_blockers(cli, identifier, blockers, add=False)


@issue_group.command(name="import")
@project_argument
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--parent", help="Make the plan's top-level entries children of this issue.")
@pass_ctx
def import_(cli: CliContext, project: str, file: Path, parent: str | None) -> None:
    """Create a whole plan (phases, tasks, blockers) from a .toml or .md FILE, all or nothing."""
    from ralph_dev.core.planfile import parse_plan

    settings = cli.project(project)
    if parent:
        check_identifier(parent)
    entries = parse_plan(file, parent=parent)
    tracker = open_tracker(settings)
    created = _write(settings, tracker, tracker.create_issues(entries))
    width = max(len(e.ref or "") for e in entries)
    for entry, ident in zip(entries, created, strict=True):
        ref = entry.ref or "-"
        click.echo(f"{ident}  {ref.ljust(width)}  {terminal_line(entry.title)}")
