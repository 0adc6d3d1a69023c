"""A groom worker's commands against the controller's real end of the channel, the real
local tracker and a real jj repo: what is accepted, what is refused, what lands where."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_worker import Project, make_project

from ralph_dev.adapters.store import utcnow
from ralph_dev.adapters.writebacks import WriteBackItem
from ralph_dev.core.decide import decide
from ralph_dev.core.model import Observed, Role, StateType

GROOM_CONFIG = "[projects.demo.groom]\nproposals = 3\nauto_accept_per_day = 1\n"


@pytest.fixture
def project(xdg: Path, jj_bin: str) -> Iterator[Project]:
    made = make_project(xdg, jj_bin, extra=GROOM_CONFIG)
    yield made
    for end in made.ends:
        end.close()


def groom_run(project: Project) -> str:
    run = project.issue("Groom the backlog", labels=("ralph:groom",))
    project.spawn(run, Role.GROOM)
    return run


def propose(project: Project, run: str, title: str, role: Role = Role.GROOM):
    return project.cli(["worker", "propose", run, "--title", title, "--priority", "3",
                        "--description", "Nothing checks the config file's keys.",
                        "--reason", "phase 2 promises config validation; nothing does it"],
                       run, role)


def proposals(project: Project) -> list:
    return [i for i in project.tracker.list_issues_sync() if "ralph:proposed" in i.labels]


def test_a_proposal_lands_in_the_backlog_with_the_label_and_its_reason(project: Project) -> None:
    run = groom_run(project)
    assert propose(project, run, "Validate config keys").exit_code == 0
    second = propose(project, run, "Document config keys")

    assert second.exit_code == 0, second.output
    assert "backlog" in second.output
    made = {i.title: i for i in proposals(project)}
    assert set(made) == {"Validate config keys", "Document config keys"}
    accepted, waiting = made["Validate config keys"], made["Document config keys"]
    assert accepted.state_type is StateType.UNSTARTED  # groom.auto_accept_per_day = 1
    assert waiting.state_type is StateType.BACKLOG
    assert waiting.priority == 3
    assert waiting.description.startswith("Nothing checks the config file's keys.")
    [comment] = [c for c in waiting.comments if c.by_ralph]
    assert comment.body.startswith(f"[ralph-dev] groom run {run} (")
    assert "proposed: phase 2 promises config validation; nothing does it" in comment.body
    assert "waits in the backlog" in comment.body


def test_proposals_are_capped_per_run(project: Project) -> None:
    run = groom_run(project)
    for n in range(3):
        assert propose(project, run, f"Task {n}").exit_code == 0
    fourth = propose(project, run, "One too many")
    assert fourth.exit_code != 0 and "groom.proposals" in fourth.stderr
    assert len(proposals(project)) == 3


@pytest.mark.parametrize("role", [Role.EXECUTE, Role.PLAN, Role.REVIEW, Role.RESEARCH])
def test_groom_commands_are_refused_for_other_roles(project: Project, role: Role) -> None:
    other = project.issue("Something else", priority=3)
    worker = project.issue("A worker's own issue")
    project.spawn(worker, role)
    for args in (["propose", worker, "--title", "X", "--reason", "r"],
                 ["prioritize", worker, other, "--priority", "4", "--reason", "r"],
                 ["flag", worker, other, "--stale", "--reason", "r"]):
        result = project.cli(["worker", *args], worker, role)
        assert result.exit_code != 0 and "only a groom worker" in result.stderr, args
    assert proposals(project) == []
    assert project.tracker.get_sync(other).priority == 3
    assert not project.tracker.get_sync(other).comments


def test_an_issue_with_a_live_worker_is_not_touched(project: Project) -> None:
    busy = project.issue("Being worked on", priority=3)
    project.spawn(busy, Role.EXECUTE)
    run = groom_run(project)
    project.publish()
    listing = project.cli(["worker", "backlog", run], run, Role.GROOM)
    assert f"{busy}: Being worked on" in listing.output and "LIVE WORKER" in listing.output
    for args in (["prioritize", run, busy, "--priority", "4", "--reason", "later"],
                 ["flag", run, busy, "--stale", "--reason", "old"]):
        result = project.cli(["worker", *args], run, Role.GROOM)
        assert result.exit_code != 0 and "live execute worker" in result.stderr, args
    got = project.tracker.get_sync(busy)
    assert got.priority == 3 and not got.comments


@pytest.mark.parametrize(("before", "after", "proposed", "allowed"), [
    (2, 4, False, True),    # a person's priority may be lowered
    (2, 1, False, False),   # ... never raised
    (0, 1, False, True),    # no priority yet: any
    (4, 1, True, True),     # ralph-dev's own proposal, not accepted yet: any
])
def test_the_priority_rule(project: Project, before: int, after: int, proposed: bool,
                           allowed: bool) -> None:
    target = project.issue("Target", priority=before,
                           labels=("ralph:proposed",) if proposed else ())
    run = groom_run(project)
    result = project.cli(["worker", "prioritize", run, target, "--priority", str(after),
                          "--reason", "it blocks the release"], run, Role.GROOM)
    got = project.tracker.get_sync(target)
    if allowed:
        assert result.exit_code == 0, result.output
        assert got.priority == after
        [comment] = [c for c in got.comments if c.by_ralph]
        assert comment.body.startswith(f"[ralph-dev] groom run {run} (")
        assert "it blocks the release" in comment.body
    else:
        assert result.exit_code != 0 and "may lower it but not raise it" in result.stderr
        assert got.priority == before and not got.comments


def test_flags_comment_the_reason_and_label_for_a_person(project: Project) -> None:
    first, second = project.issue("Log rotation"), project.issue("Rotate the logs")
    run = groom_run(project)
    result = project.cli(["worker", "flag", run, second, "--duplicate-of", first,
                          "--reason", "same work, other words"], run, Role.GROOM)
    assert result.exit_code == 0, result.output
    got = project.tracker.get_sync(second)
    assert "agent-feedback-given" in got.labels
    assert got.state_type is StateType.UNSTARTED  # a person decides; nothing is canceled
    [comment] = [c for c in got.comments if c.by_ralph]
    assert f"possible duplicate of {first}: same work, other words" in comment.body


def test_a_groom_run_ends_completed(project: Project) -> None:
    run = groom_run(project)
    done = project.cli(["worker", "done", run, "--summary", "proposed nothing; all fine"], run,
                       Role.GROOM)
    assert done.exit_code == 0, done.output
    # its workspace is put away (never merged: a groom worker changes no code), and the
    # run is completed right before its record goes
    observed = Observed(issues=tuple(project.tracker.list_issues_sync()),
                        workspaces=tuple(project.jj.workspaces.list_workspaces()),
                        records=project.store.load_records())
    plan = decide(observed, project.settings, utcnow())
    assert [(a.kind, a.issue) for a in plan.actions] == [("complete", run), ("forget", run)]
    assert plan.actions[1].keep_bookmark  # type: ignore[attr-defined]


def test_a_proposal_relayed_twice_is_created_once(project: Project) -> None:
    """A controller killed after the issue was created, before the item was removed."""
    run = groom_run(project)
    item = WriteBackItem("0123abcd", "propose", run, {
        "title": "Once", "priority": 0, "ready": False, "description": "", "reason": "gap"})
    end = project.controller
    for _ in range(2):
        end.writebacks.add(item)
        assert end.call(end.write_back_due()) == []
    [made] = proposals(project)
    assert made.title == "Once" and len([c for c in made.comments if c.by_ralph]) == 1
