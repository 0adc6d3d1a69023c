"""LinearTracker through the real gql client against the in-process fake Linear."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_linear import Clock, FakeLinear, World

from ralph_dev.adapters.tracker.linear import reading as linear_reading
from ralph_dev.adapters.tracker.linear.errors import LinearPartialCreate, LinearSetupError
from ralph_dev.adapters.tracker.linear.parse import RALPH_MARKER
from ralph_dev.core.errors import TrackerInputError, UnknownIssue
from ralph_dev.core.model import NewIssue, StateType

POLL = 30
"""The default poll interval: controller ticks in between read the cache."""


@pytest.fixture
def world() -> Iterator[World]:
    with FakeLinear() as fake:
        team = fake.add_team("ENG", "Engineering")
        project = fake.add_project("Alpha", [team], slug="a1b2c3d4e5f6")
        fake.add_project("Beta", [team])
        yield World(fake, team, project, Clock(), [])


def seed(w: World, count: int = 2) -> list[str]:
    return [w.fake.add_issue(w.team, f"issue {i}", project_id=w.project) for i in range(count)]


async def test_list_issues_carries_state_team_labels_parent_children_blockers_comments(
    world: World,
) -> None:
    fake = world.fake
    a = fake.add_issue(world.team, "parent", project_id=world.project, priority=2)
    b = fake.add_issue(world.team, "child", project_id=world.project, parent=a,
                       labels=["ralph:plan"], state="In Progress", description="body")
    c = fake.add_issue(world.team, "blocker", project_id=world.project)
    fake.add_issue(world.team, "elsewhere", project_id=None)
    fake.add_blocker(c, b)
    fake.add_comment(b, "first")
    fake.add_comment(b, RALPH_MARKER + "mine")
    issues = {i.identifier: i for i in await world.tracker().list_issues()}
    assert set(issues) == {a, b, c}
    child = issues[b]
    assert child.state_name == "In Progress" and child.state_type is StateType.STARTED
    assert child.team == "ENG" and child.parent == a and child.labels == {"ralph:plan"}
    assert child.blocked_by == (c,) and child.description == "body"
    assert [x.body for x in child.comments] == ["first", RALPH_MARKER + "mine"]
    assert [x.by_ralph for x in child.comments] == [False, True]
    assert child.comments[0].author == "Pat Person"
    assert issues[a].children == (b,) and issues[a].priority == 2
    assert len(child.id) == 36  # Linear's UUID, the identifier is TEAM-N


@pytest.mark.parametrize("ref", ["Alpha", "alpha", "a1b2c3d4e5f6", "alpha-a1b2c3d4e5f6"])
async def test_project_found_by_name_slug_or_url_slug(world: World, ref: str) -> None:
    project = await world.tracker(ref).directory.project()
    assert project.id == world.project and [t.key for t in project.teams] == ["ENG"]


async def test_project_found_by_id(world: World) -> None:
    assert (await world.tracker(world.project).directory.project()).name == "Alpha"


async def test_unknown_project_lists_closest_matches(world: World) -> None:
    with pytest.raises(LinearSetupError) as err:
        await world.tracker("Alpah").directory.project()
    assert "'Alpha'" in str(err.value) and "linear_project" in str(err.value)


async def test_pagination_across_pages(world: World) -> None:
    made = seed(world, 7)
    tracker = world.tracker(page_size=3)
    issues = await tracker.list_issues()
    assert sorted(i.identifier for i in issues) == sorted(made)
    assert world.fake.operations().count("ProjectIssues") == 3


async def test_steady_state_polls_once_per_interval_and_fetches_only_what_is_new(
    world: World,
) -> None:
    made = seed(world, 5)
    tracker = world.tracker(full_sync_interval=1800)
    await tracker.list_issues()
    for n in range(6):
        before = len(world.fake.requests)
        world.fake.update_issue(made[n % 5], title=f"renamed {n}")
        world.fake.add_comment(made[0], f"comment {n}")
        for _tick in range(3):  # a controller tick every 10 s
            world.clock.advance(10)
            issues = {i.identifier: i for i in await tracker.list_issues()}
        assert world.fake.operations()[before:] == ["ProjectChanges"]  # brought along
        assert issues[made[n % 5]].title == f"renamed {n}"
        assert issues[made[0]].comments[-1].body == f"comment {n}"
    quiet = len(world.fake.requests)
    world.clock.advance(POLL)
    await tracker.list_issues()
    assert world.fake.operations()[quiet:] == ["ProjectChanges"]  # nothing new: one request
    assert tracker.usage()["cached_reads"] == 12


async def test_incremental_poll_picks_up_change_new_comment_and_archive(world: World) -> None:
    a, b, c = seed(world, 3)
    tracker = world.tracker()
    await tracker.list_issues()
    world.fake.update_issue(a, state="Done")
    world.fake.add_comment(b, "please also fix the docs")  # does not touch b's updatedAt
    world.fake.archive(c)
    d = world.fake.add_issue(world.team, "filed by a person", project_id=world.project)
    world.clock.advance(POLL)
    issues = {i.identifier: i for i in await tracker.list_issues()}
    assert world.fake.operations()[-1] == "ProjectChanges"  # all of it in one request
    assert issues[d].title == "filed by a person"
    assert issues[a].state_type is StateType.COMPLETED
    assert [x.body for x in issues[b].comments] == ["please also fix the docs"]
    assert c not in issues
    # the overlap looks at recent changes again: nothing is duplicated or re-read
    world.clock.advance(POLL)
    again = {i.identifier: i for i in await tracker.list_issues()}
    assert len(again[b].comments) == 1
    assert world.fake.operations()[-1] == "ProjectChanges"


async def test_a_poll_that_overflows_answers_from_the_full_sync_it_made(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More changes than one poll looks at: the full sync it falls back to is what
    this very tick decides on, not the view from before it."""
    monkeypatch.setattr(linear_reading, "POLL_WINDOW", 2)
    made = seed(world, 3)
    tracker = world.tracker()
    await tracker.list_issues()
    for ident in made:
        world.fake.update_issue(ident, title=f"{ident} renamed")
    world.clock.advance(POLL)
    issues = await tracker.list_issues()
    assert world.fake.operations().count("ProjectIssues") == 2  # the overflow's full sync
    assert {i.title for i in issues} == {f"{ident} renamed" for ident in made}


async def test_full_sync_again_after_the_interval(world: World) -> None:
    seed(world, 2)
    tracker = world.tracker(full_sync_interval=300)
    await tracker.list_issues()
    world.fake.add_blocker(*seed(world, 2))
    world.clock.advance(301)
    issues = await tracker.list_issues()
    assert world.fake.operations().count("ProjectIssues") == 2
    assert any(i.blocked_by for i in issues)
    assert tracker.usage()["full_syncs"] == 2


async def test_get(world: World) -> None:
    (b,) = seed(world, 1)
    tracker = world.tracker()
    await tracker.list_issues()
    other = world.fake.add_issue(world.team, "not in the project", project_id=None)
    assert (await tracker.get(b)).identifier == b
    with pytest.raises(UnknownIssue, match="is not in it"):
        await tracker.get(other)
    with pytest.raises(UnknownIssue):
        await tracker.get("ENG-99")
    with pytest.raises(ValueError):
        await tracker.get("../etc")


async def test_a_write_back_costs_only_its_writes_where_the_view_is_kept(world: World) -> None:
    """The controller keeps the project's view (it polls every ``poll_interval``): the
    read before a write-back answers from it, so a comment and a move cost one request
    each; a read when a poll is due makes that poll, which the next tick then spares."""
    (a,) = seed(world, 1)
    tracker = world.tracker()
    await tracker.list_issues()
    world.clock.advance(10)  # a tick later
    before = len(world.fake.requests)
    issue = await tracker.get(a)
    await tracker.comment(a, "done: the evidence")
    done = await tracker.set_state(a, type=StateType.COMPLETED)
    assert world.fake.operations()[before:] == ["CommentCreate", "IssueUpdate"]
    assert issue.state_type is StateType.UNSTARTED and done.state_type is StateType.COMPLETED
    assert world.fake.state_of(a) == "Done"
    assert (await tracker.get(a)).comments[-1].body == RALPH_MARKER + "done: the evidence"
    world.fake.update_issue(a, title="renamed by a person")
    world.clock.advance(POLL)
    before = len(world.fake.requests)
    assert (await tracker.get(a)).title == "renamed by a person"
    await tracker.list_issues()
    assert world.fake.operations()[before:] == ["ProjectChanges"]


async def test_a_process_that_keeps_no_view_reads_the_issue_now(tmp_path: Path) -> None:
    """``issue show`` starts from a disk cache up to ``full_sync_interval`` old: it
    asks Linear, and sees a change the cache does not hold yet."""
    with FakeLinear() as fake:
        team = fake.add_team("ENG")
        world = World(fake, team, fake.add_project("Alpha", [team]), Clock(), [],
                      state_dir=tmp_path)
        (a,) = seed(world, 1)
        await world.tracker().list_issues()  # the controller's full sync, saved to disk
        fake.update_issue(a, title="renamed by a person")
        world.clock.advance(600)
        before = len(fake.requests)
        assert (await world.tracker().get(a)).title == "renamed by a person"
        assert fake.operations()[before:] == ["Issue"]


async def test_a_held_nothing_to_change_is_checked_on_linear_now(world: World) -> None:
    """The view may be a poll behind: when it says a write would change nothing, Linear
    is asked before nothing is done, so a person's change meanwhile is not undone by
    silence (a move back to Todo, a label taken off)."""
    a = world.fake.add_issue(world.team, "x", project_id=world.project,
                             labels=["user-input-needed"])
    tracker = world.tracker()
    await tracker.list_issues()
    world.fake.update_issue(a, state="In Progress")  # not polled yet
    world.fake.update_issue(a, label_ids=[])
    world.clock.advance(10)
    before = len(world.fake.requests)
    assert (await tracker.set_state(a, name="Todo")).state_name == "Todo"
    assert world.fake.state_of(a) == "Todo"
    assert world.fake.operations()[before:] == ["Issue", "IssueUpdate"]
    assert "user-input-needed" in (await tracker.add_labels(a, ["user-input-needed"])).labels
    assert world.fake.issue_labels(a) == {"user-input-needed"}


async def test_set_state_by_type_picks_first_by_position_and_by_name(world: World) -> None:
    (a,) = seed(world, 1)
    tracker = world.tracker()
    issue = await tracker.set_state(a, type=StateType.STARTED)
    assert issue.state_name == "In Progress" and world.fake.state_of(a) == "In Progress"
    issue = await tracker.set_state(a, name="in review")
    assert world.fake.state_of(a) == "In Review" and issue.state_type is StateType.STARTED
    before = len(world.fake.requests)
    await tracker.set_state(a, name="In Review")  # already there: no write
    assert "IssueUpdate" not in world.fake.operations()[before:]
    with pytest.raises(TrackerInputError, match="no state"):
        await tracker.set_state(a, name="Shipped")


async def test_labels_are_changed_incrementally(world: World) -> None:
    a = world.fake.add_issue(world.team, "x", project_id=world.project, labels=["keep"])
    tracker = world.tracker()
    issue = await tracker.add_labels(a, ["user-input-needed"])
    assert issue.labels == {"keep", "user-input-needed"}
    issue = await tracker.remove_labels(a, ["user-input-needed", "never-there"])
    assert issue.labels == {"keep"} == world.fake.issue_labels(a)
    for body in (r["variables"] for r in world.fake.requests
                 if r["operationName"] == "IssueUpdate"):
        assert "labelIds" not in body["input"]  # never replaces the whole set


async def test_label_in_team_and_workspace_prefers_the_team(world: World) -> None:
    (a,) = seed(world, 1)
    world.fake.add_label("bug", None)
    team_label = world.fake.add_label("bug", world.team)
    await world.tracker().add_labels(a, ["bug"])
    assert world.fake._issue(a)["label_ids"] == [team_label]


async def test_label_twice_in_one_team_is_a_clear_error(world: World) -> None:
    (a,) = seed(world, 1)
    world.fake.add_label("bug", world.team)
    world.fake.add_label("bug", world.team)
    with pytest.raises(LinearSetupError, match="'bug' exists 2 times"):
        await world.tracker().add_labels(a, ["bug"])


async def test_comments_by_ralph_are_marked_and_never_human_feedback(world: World) -> None:
    (a,) = seed(world, 1)
    tracker = world.tracker()
    await tracker.list_issues()
    await tracker.comment(a, "worker started")
    await tracker.comment(a, RALPH_MARKER + "already marked")
    await tracker.comment(a, "a person typed this", by_ralph=False)
    assert world.fake.comments_on(a) == [RALPH_MARKER + "worker started",
                                         RALPH_MARKER + "already marked",
                                         "a person typed this"]
    world.clock.advance(POLL)
    issue = {i.identifier: i for i in await tracker.list_issues()}[a]
    assert [c.by_ralph for c in issue.comments] == [True, True, False]
    assert not any(c.by_bot for c in issue.comments)
    with pytest.raises(UnknownIssue):
        await tracker.comment("ENG-404", "hello")


async def test_create_issues_with_parent_and_blockers(world: World) -> None:
    (existing,) = seed(world, 1)
    tracker = world.tracker()
    made = await tracker.create_issues([
        NewIssue("child b", ref="b", parent="phase", blocked_by=("a", existing)),
        NewIssue("phase", ref="phase", labels=("ralph:phase",)),
        NewIssue("child a", ref="a", parent="phase", priority=1),
    ])
    assert len(made) == 3
    world.clock.advance(POLL)
    issues = {i.identifier: i for i in await tracker.list_issues()}
    b, phase, a = (issues[x] for x in made)
    assert b.parent == phase.identifier and a.parent == phase.identifier
    assert set(b.blocked_by) == {a.identifier, existing}
    assert phase.labels == {"ralph:phase"} and set(phase.children) == {a.identifier,
                                                                       b.identifier}
    assert a.priority == 1


async def test_create_issues_checks_everything_before_creating_anything(world: World) -> None:
    tracker = world.tracker()
    with pytest.raises(UnknownIssue, match="ENG-77"):
        await tracker.create_issues([NewIssue("fine"), NewIssue("orphan", parent="ENG-77")])
    with pytest.raises(TrackerInputError):
        await tracker.create_issues([NewIssue("x", blocked_by=("no such ref",))])
    with pytest.raises(TrackerInputError, match="no state 'Shipped'"):
        await tracker.create_issues([NewIssue("fine"), NewIssue("odd", state="Shipped")])
    assert world.fake.issues == {}


async def test_create_issues_reports_what_was_created_on_failure(world: World) -> None:
    tracker = world.tracker()
    await tracker.directory.project()
    world.fake.faults.queue = [None, "badinput"]  # the second issueCreate is refused
    with pytest.raises(LinearPartialCreate) as err:
        await tracker.create_issues([NewIssue("fine"), NewIssue("refused")])
    assert err.value.created == ["ENG-1"] and "ENG-1" in str(err.value)
    assert not err.value.retryable
    assert len(world.fake.issues) == 1


async def test_a_plan_that_would_deadlock_is_refused_by_name(world: World) -> None:
    (existing,) = seed(world, 1)
    tracker = world.tracker()
    await tracker.list_issues()
    cases = [  # a task blocked by its phase; a sub-issue blocked by its own parent
        ([NewIssue("phase", ref="phase"), NewIssue("task", ref="t", parent="phase",
                                                   blocked_by=("phase",))], "phase → t → phase"),
        ([NewIssue("sub", ref="s", parent=existing, blocked_by=(existing,))],
         f"{existing} → s → {existing}"),
    ]
    for batch, named in cases:
        with pytest.raises(TrackerInputError, match="dependency cycle") as err:
            await tracker.create_issues(batch)
        assert named in str(err.value) and "nothing was created" in str(err.value)
    assert len(world.fake.issues) == 1  # nothing half-made
    (child,) = await tracker.create_issues([NewIssue("sub", parent=existing)])
    with pytest.raises(TrackerInputError, match="dependency cycle"):
        await tracker.add_blocker(child, existing)


async def test_add_blocker_refuses_a_cycle(world: World) -> None:
    a, b, c = seed(world, 3)
    tracker = world.tracker()
    await tracker.list_issues()
    assert (await tracker.add_blocker(b, a)).blocked_by == (a,)
    assert (await tracker.add_blocker(c, b)).blocked_by == (b,)
    before = len(world.fake.relations)
    await tracker.add_blocker(c, b)  # already so: nothing new
    with pytest.raises(TrackerInputError, match="cycle"):
        await tracker.add_blocker(a, c)
    assert len(world.fake.relations) == before == 2


async def test_only_the_newest_comments_are_kept_in_memory(world: World) -> None:
    (a,) = seed(world, 1)
    tracker = world.tracker()
    await tracker.list_issues()
    for n in range(60):
        world.fake.add_comment(a, f"note {n}")
    world.clock.advance(POLL)
    issue = (await tracker.list_issues())[0]
    assert "ProjectComments" in world.fake.operations()  # 60 new comments: paged
    assert len(issue.comments) == 50
    assert issue.comments[-1].body == "note 59" and issue.comments[0].body == "note 10"


async def test_more_changes_than_a_poll_brings_along_are_fetched_in_pages(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(linear_reading, "BY_ID_PAGE", 2)
    made = seed(world, 8)
    tracker = world.tracker()
    await tracker.list_issues()
    for ident in made:
        world.fake.update_issue(ident, title=f"{ident} renamed")
    world.clock.advance(POLL)
    before = len(world.fake.requests)
    issues = await tracker.list_issues()
    assert {i.title for i in issues} == {f"{ident} renamed" for ident in made}
    brought = linear_reading.POLL_FRESH  # the rest, two by two
    assert world.fake.operations()[before:] == ["ProjectChanges"] + ["IssuesByIds"] * (
        -(-(len(made) - brought) // 2))


async def test_fake_stamps_real_time_strictly_increasing(world: World) -> None:
    """``worker feedback`` compares comment times with a worker's (real) start time."""
    from datetime import UTC, datetime

    (a,) = seed(world, 1)
    started = datetime.now(UTC).replace(microsecond=0)
    world.fake.add_comment(a, "one")
    world.fake.add_comment(a, "two")
    comments = (await world.tracker().get(a)).comments
    assert [c.body for c in comments] == ["one", "two"]
    assert started <= comments[0].created_at < comments[1].created_at


async def test_a_webhook_or_another_process_writing_makes_the_next_tick_poll(
    tmp_path: Path,
) -> None:
    from ralph_dev.adapters.webhook import WebhookListener

    with FakeLinear() as fake:
        team = fake.add_team("ENG")
        project = fake.add_project("Alpha", [team])
        world = World(fake, team, project, Clock(), [], state_dir=tmp_path)
        (a,) = seed(world, 1)
        controller = world.tracker()
        await controller.list_issues()
        world.clock.advance(10)
        quiet = len(fake.requests)
        await controller.list_issues()
        assert len(fake.requests) == quiet  # inside the poll interval: the cache
        await world.tracker().comment(a, "worker note")  # another process writes
        world.clock.advance(10)
        issue = (await controller.list_issues())[0]
        assert "ProjectChanges" in fake.operations()[quiet:]
        assert [c.body for c in issue.comments] == [RALPH_MARKER + "worker note"]
        listener = WebhookListener("secret", asyncio.Event(), on_wake=controller.expect_changes)
        listener.poke()  # a person changed something; Linear told us
        world.clock.advance(10)
        before = len(fake.requests)
        await controller.list_issues()
        assert fake.operations()[before:] == ["ProjectChanges"]
