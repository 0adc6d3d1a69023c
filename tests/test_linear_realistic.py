"""Linear as it really is (issue 10): a realistic workspace in the fake, which executes
Linear's real schema — two teams with different state names, cross-project relations
and children, archived and trashed issues, more relations than one page, integration
comments, rate limits, a revoked key, several ralph-dev processes at once.

Each test names the defect it pins down (the numbers of issue 10's findings).
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_jj_repo
from fake_linear import OPS_STATES, Clock, FakeLinear, Workspace, World, populate_workspace

from ralph_dev.adapters.tracker.linear import client as linear_client
from ralph_dev.adapters.tracker.linear.apikey import KEY_ENV
from ralph_dev.adapters.tracker.linear.client import URL_ENV
from ralph_dev.adapters.tracker.linear.errors import (
    LinearAuthError,
    LinearSetupError,
    LinearUnavailable,
)
from ralph_dev.cli import main
from ralph_dev.core.actions import Complete, Spawn
from ralph_dev.core.config import ConfigError, ProjectSettings, build_project
from ralph_dev.core.decide import decide, ready_issues
from ralph_dev.core.model import Issue, NewIssue, Observed, StateType, human_feedback

POLL = 30


@pytest.fixture
def real(tmp_path: Path) -> Iterator[tuple[World, Workspace]]:
    """Alpha (teams ENG and OPS) in a workspace of 371 issues, on a simulated clock."""
    with FakeLinear() as fake:
        world = World(fake, "", "", Clock(), [], state_dir=tmp_path / "state")
        fake.clock = world.clock
        ws = populate_workspace(fake, 371)
        world.team, world.project = ws.eng, ws.alpha
        yield world, ws


def settings_for(tmp_path: Path, **tracker: object) -> ProjectSettings:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    return build_project("alpha", {
        "repo": str(repo), "limits": {"max_workers": 64},
        "tracker": {"kind": "linear", "linear_project": "Alpha", **tracker}})


def by_id(issues: list[Issue]) -> dict[str, Issue]:
    return {i.identifier: i for i in issues}


def ready(issues: list[Issue], tmp_path: Path) -> set[str]:
    return {i.identifier for i in ready_issues(Observed(issues=tuple(issues)),
                                               settings_for(tmp_path))}


# --- 1: created issues must be dispatchable, in the right team ----------------------------


async def test_1_created_issues_land_in_todo_not_in_linears_default_backlog(
    real: tuple[World, Workspace], tmp_path: Path,
) -> None:
    world, _ws = real
    tracker = world.tracker(default_team="ENG")
    made = await tracker.create_issues([NewIssue("phase", ref="p"),
                                        NewIssue("step", parent="p")])
    assert [world.fake.state_of(x) for x in made] == ["Todo", "Todo"]
    world.clock.advance(POLL)
    issues = by_id(await tracker.list_issues())
    assert issues[made[1]].state_type is StateType.UNSTARTED
    assert made[1] in ready(list(issues.values()), tmp_path)


async def test_1_new_issues_go_to_the_parents_team_else_the_configured_one(
    real: tuple[World, Workspace],
) -> None:
    world, ws = real
    ops_parent = world.fake.add_issue(ws.ops, "ops parent", project_id=ws.alpha, state="Doing")
    tracker = world.tracker()
    (child,) = await tracker.create_issues([NewIssue("ops child", parent=ops_parent)])
    assert child.startswith("OPS-") and world.fake.state_of(child) == "Ready"
    before = len(world.fake.issues)
    with pytest.raises(LinearSetupError, match=r"2 teams, ENG \(Engineering\) and OPS "
                       r"\(Operations\).*set tracker\.linear_team to ENG or OPS"):
        await tracker.create_issues([NewIssue("no parent, two teams")])
    assert len(world.fake.issues) == before  # refused before anything was created
    (ops,) = await world.tracker(default_team="OPS").create_issues([NewIssue("to OPS")])
    assert ops.startswith("OPS-") and world.fake.state_of(ops) == "Ready"


async def test_1_configured_new_state_and_the_lowest_unstarted_state(tmp_path: Path) -> None:
    states = [("Backlog", "backlog"), ("Ready for dev", "unstarted"), ("Todo", "unstarted"),
              ("Doing", "started"), ("Done", "completed")]
    with FakeLinear() as fake:
        team = fake.add_team("ENG", states=states)
        fake.add_project("Alpha", [team])
        world = World(fake, team, "", Clock(), [])
        (first,) = await world.tracker().create_issues([NewIssue("default")])
        assert fake.state_of(first) == "Ready for dev"  # the unstarted state by position
        (named,) = await world.tracker(new_state="Todo").create_issues([NewIssue("named")])
        assert fake.state_of(named) == "Todo"
        with pytest.raises(LinearSetupError, match="no such state"):
            project = await world.tracker().directory.project()
            world.tracker(new_state="Shipped").directory.check_states(project)
    settings = settings_for(tmp_path, linear_team="OPS", linear_new_state="Ready")
    assert (settings.tracker.linear_team, settings.tracker.linear_new_state) == ("OPS", "Ready")
    with pytest.raises(ConfigError, match="linear_team"):
        settings_for(tmp_path, linear_team="ops team")


# --- 3: blockers in other projects, archived or trashed ------------------------------------


async def test_3_a_blocker_in_another_project_counts_with_its_own_state(
    real: tuple[World, Workspace], tmp_path: Path,
) -> None:
    world, ws = real
    tracker = world.tracker()
    issues = await tracker.list_issues()
    listed = by_id(issues)
    assert listed[ws.foreign_blocked].blocked_by == (ws.foreign_blocker,)
    outside = listed[ws.foreign_blocker]
    assert outside.foreign and outside.state_name == "Todo"
    assert ws.foreign_blocked not in ready(issues, tmp_path)
    world.fake.update_issue(ws.foreign_blocker, state="Done")  # done in the other project
    world.clock.advance(POLL)
    issues = await tracker.list_issues()
    assert by_id(issues)[ws.foreign_blocker].state_type is StateType.COMPLETED
    assert ws.foreign_blocked in ready(issues, tmp_path)


async def test_3_an_archived_or_trashed_blocker_never_blocks(
    real: tuple[World, Workspace], tmp_path: Path,
) -> None:
    world, ws = real
    tracker = world.tracker()
    issues = await tracker.list_issues()
    listed = by_id(issues)
    assert listed[ws.archived_blocked].blocked_by == ()
    assert listed[ws.trashed_blocked].blocked_by == ()
    assert {ws.archived_blocked, ws.trashed_blocked} <= ready(issues, tmp_path)
    world.fake.archive(ws.foreign_blocker)  # archived later, in its own project
    world.clock.advance(POLL)
    issues = await tracker.list_issues()
    assert by_id(issues)[ws.foreign_blocked].blocked_by == ()
    assert ws.foreign_blocker not in by_id(issues)
    assert ws.foreign_blocked in ready(issues, tmp_path)


# --- 4: connections are read to the end; only "blocks" counts -----------------------------


async def test_4_one_blocker_among_22_duplicates_still_blocks(
    real: tuple[World, Workspace], tmp_path: Path,
) -> None:
    world, ws = real
    issues = await world.tracker().list_issues()
    listed = by_id(issues)
    assert listed[ws.many_relations].blocked_by == (ws.real_blocker,)
    assert listed[ws.real_blocker].state_name == "Backlog"
    assert ws.many_relations not in ready(issues, tmp_path)
    assert len(listed[ws.many_labels].labels) == 25
    assert len(listed[ws.epic].children) == 12


async def test_4_only_blocks_relations_count(real: tuple[World, Workspace]) -> None:
    world, ws = real
    target = ws.members[-1]
    for kind in ("related", "duplicate", "similar"):
        world.fake.add_relation(ws.members[-2], target, kind)
    tracker = world.tracker()
    before = by_id(await tracker.list_issues())[target].blocked_by
    pages = world.fake.operations().count("ProjectIssues")
    world.fake.add_relation(ws.members[-3], target, "blocks")
    world.clock.advance(POLL)
    after = by_id(await tracker.list_issues())[target].blocked_by
    assert set(after) - set(before) == {ws.members[-3]}  # seen by the poll, no full sync
    assert world.fake.operations().count("ProjectIssues") == pages


# --- 5: children come from Linear, other projects included ----------------------------------


async def test_5_a_child_in_another_project_keeps_its_parent_open_and_undispatched(
    real: tuple[World, Workspace], tmp_path: Path,
) -> None:
    world, ws = real
    issues = await world.tracker().list_issues()
    listed = by_id(issues)
    parent = listed[ws.parent_with_foreign_child]
    assert ws.foreign_child in parent.children and len(parent.children) == 2
    assert listed[ws.foreign_child].foreign
    assert listed[ws.foreign_child].parent == ws.parent_with_foreign_child
    plan = decide(Observed(issues=tuple(issues)), settings_for(tmp_path),
                  world.clock() + timedelta(hours=1))
    assert not [a for a in plan.actions
                if a.issue == ws.parent_with_foreign_child and isinstance(a, Complete)]
    lonely = listed[ws.only_child_elsewhere]
    assert len(lonely.children) == 1
    assert ws.only_child_elsewhere not in ready(issues, tmp_path)
    assert not [a for a in plan.actions
                if a.issue == ws.only_child_elsewhere and isinstance(a, Spawn)]


# --- 7: rate limits: Retry-After and both buckets, a cap, shared by every process ---------


async def test_7_ratelimited_waits_as_asked_not_until_the_bucket_is_full(
    real: tuple[World, Workspace],
) -> None:
    world, _ws = real
    tracker = world.tracker()
    await tracker.list_issues()
    world.clock.advance(POLL)
    world.fake.drain("requests")  # the hour's requests are spent
    with pytest.raises(LinearUnavailable, match="rate limited") as err:
        await tracker.list_issues()
    assert err.value.retryable
    wait = (tracker.client.backoff_until - world.clock()).total_seconds()
    assert 2 <= wait <= 2.2  # Retry-After: 2 s (the requests reset is an hour away)
    sent = len(world.fake.requests)
    with pytest.raises(LinearUnavailable, match="backing off"):
        await tracker.list_issues()  # at once, no request, no sleep
    assert len(world.fake.requests) == sent and not world.sleeps
    world.clock.advance(3)
    await tracker.list_issues()


async def test_7_without_retry_after_the_dry_bucket_decides_and_the_cap_holds(
    real: tuple[World, Workspace],
) -> None:
    world, _ws = real
    world.fake.send_retry_after = False
    tracker = world.tracker()
    await tracker.list_issues()
    world.clock.advance(POLL)
    world.fake.drain("complexity", 100)  # points spent, requests plenty
    with pytest.raises(LinearUnavailable, match="rate limited"):
        await tracker.list_issues()
    wait = (tracker.client.backoff_until - world.clock()).total_seconds()
    cost = world.fake.requests[-1]["complexity"]  # what the refused query needed
    assert cost > 100
    assert wait >= (cost - 100) * 3600 / 3_000_000  # until the refill covers the query
    world.fake.rate_headers = {"X-RateLimit-Requests-Remaining": "0",
                               "X-RateLimit-Requests-Limit": "0",
                               "X-RateLimit-Requests-Reset": str(int(
                                   (world.clock().timestamp() + 3600) * 1000))}
    world.fake.faults.queue = ["ratelimited"]
    world.clock.advance(wait + 1)
    with pytest.raises(LinearUnavailable):
        await tracker.list_issues()
    wait = (tracker.client.backoff_until - world.clock()).total_seconds()
    assert 300 <= wait <= 330  # an hour-long reset is capped at 300 s (+ jitter)


async def test_7_every_process_of_the_project_honours_the_backoff(
    real: tuple[World, Workspace],
) -> None:
    world, ws = real
    controller = world.tracker()
    await controller.list_issues()
    worker = world.tracker()  # another process: a worker command
    world.clock.advance(POLL)
    world.fake.drain("requests")
    with pytest.raises(LinearUnavailable):
        await controller.list_issues()
    sent = len(world.fake.requests)
    with pytest.raises(LinearUnavailable, match="backing off"):
        await worker.get(ws.members[0])
    assert len(world.fake.requests) == sent
    shared = world.state_dir / "linear-rate.json"
    assert stat.S_IMODE(shared.stat().st_mode) == 0o600
    assert world.fake.api_key not in shared.read_text()


# --- 8: short-lived processes start from the disk cache ------------------------------------


async def test_8_status_plan_doctor_reuse_the_last_full_sync(
    real: tuple[World, Workspace],
) -> None:
    world, ws = real
    controller = world.tracker()
    await controller.list_issues()
    full = len(world.fake.requests)
    assert full <= 14
    cache = world.state_dir / "linear-cache.json"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    world.fake.update_issue(ws.members[5], title="changed by a person")
    world.clock.advance(60)
    status = world.tracker()  # a new process
    issues = by_id(await status.list_issues())
    assert world.fake.operations()[full:] == ["ProjectChanges"]  # the change came along
    assert issues[ws.members[5]].title == "changed by a person"
    assert issues[ws.foreign_blocker].foreign  # the foreign ones came along
    await status.close()
    again = len(world.fake.requests)
    assert len(await world.tracker().list_issues()) == len(issues)
    assert world.fake.operations()[again:] == ["ProjectChanges"]  # status saved what it saw
    world.clock.advance(1800)  # older than full_sync_interval: not trusted any more
    late = len(world.fake.requests)
    await world.tracker().list_issues()
    assert "ProjectIssues" in world.fake.operations()[late:]


async def test_8_a_corrupt_or_foreign_cache_is_ignored(real: tuple[World, Workspace]) -> None:
    world, ws = real
    world.state_dir.mkdir(parents=True)
    (world.state_dir / "linear-cache.json").write_text("{not json")
    issues = await world.tracker().list_issues()
    assert ws.members[0] in by_id(issues)
    other = world.tracker("Beta")  # another project with the same state dir: not reused
    beta = by_id(await other.list_issues())
    assert ws.foreign_blocker in beta and not beta[ws.foreign_blocker].foreign


# --- 9: identifiers of every team of the project -------------------------------------------


def test_9_issue_commands_accept_every_team_key_of_the_project(
    real: tuple[World, Workspace], xdg: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    world, ws = real
    world.fake.clock = lambda: __import__("datetime").datetime.now(
        __import__("datetime").UTC)  # the CLI runs on the real clock
    ops_issue = world.fake.add_issue(ws.ops, "ops work", project_id=ws.alpha, state="Ready")
    monkeypatch.setenv(KEY_ENV, world.fake.api_key)
    monkeypatch.setenv(URL_ENV, world.fake.url)
    make_jj_repo(xdg / "repo")
    runner = CliRunner()
    result = runner.invoke(main, ["init", "alpha", "--repo", str(xdg / "repo"),
                                  "--tracker", "linear", "--linear-project", "Alpha",
                                  "--linear-team", "ENG"])
    assert result.exit_code == 0, result.output
    for ident in (ops_issue, ws.members[0]):
        shown = runner.invoke(main, ["issue", "show", ident])
        assert shown.exit_code == 0, shown.output
        assert ident in shown.output
    result = runner.invoke(main, ["issue", "state", ops_issue, "Doing"])
    assert result.exit_code == 0, result.output
    assert world.fake.state_of(ops_issue) == "Doing"
    unknown = runner.invoke(main, ["issue", "show", "XYZ-1"])
    assert unknown.exit_code != 0 and "'XYZ'" in unknown.output


# --- 10: a revoked key, re-downloads, integration comments ----------------------------------


class Recorder:
    """Stands in for a module's structlog logger (whatever logging other tests set up)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, object]]] = []

    def __getattr__(self, level: str) -> object:
        return lambda event, **kw: self.events.append((event, kw))


async def test_10_a_revoked_key_backs_off_and_is_logged_once(
    real: tuple[World, Workspace], monkeypatch: pytest.MonkeyPatch,
) -> None:
    world, _ws = real
    tracker = world.tracker()
    await tracker.list_issues()
    world.fake.revoked = True
    start = len(world.fake.requests)
    errors = []
    logs = Recorder()
    monkeypatch.setattr(linear_client, "log", logs)
    for _tick in range(30):  # a tick every 10 s for 5 minutes
        world.clock.advance(10)
        try:
            await tracker.list_issues()
        except LinearAuthError as exc:
            errors.append(exc)
    assert len(errors) >= 25 and not any(e.retryable for e in errors)
    assert len(world.fake.requests) - start <= 3  # 60 s, then 120 s, then 240 s apart
    assert [event for event, _ in logs.events].count("linear_auth_failed") == 1
    assert world.fake.api_key not in repr(logs.events)
    world.fake.revoked = False
    world.clock.advance(1800)
    await tracker.list_issues()
    assert tracker.usage()["backoff"] is None


async def test_10_polls_do_not_download_unchanged_issues_again(
    real: tuple[World, Workspace],
) -> None:
    world, ws = real
    tracker = world.tracker()
    await tracker.list_issues()
    world.fake.update_issue(ws.members[3], title="Renamed once")
    start = len(world.fake.requests)
    for _poll in range(4):  # all within the 2-minute overlap
        world.clock.advance(POLL)
        await tracker.list_issues()
    assert world.fake.operations()[start:] == ["ProjectChanges"] * 4
    answers = list(world.fake.bodies)[-4:]  # the answers to those four polls
    assert "Renamed once" in answers[0]  # the first poll brought the change along
    assert max(len(body) for body in answers[1:]) < 6_000  # then ids and stamps only
    assert not any("Renamed once" in body for body in answers[1:])


async def test_10_integration_comments_are_not_human_feedback(
    real: tuple[World, Workspace],
) -> None:
    world, ws = real
    issue = by_id(await world.tracker().list_issues())[ws.bot_commented]
    authors = {c.body: (c.author, c.by_bot, c.by_ralph) for c in issue.comments}
    assert authors["GitHub: Linked PR #42 opened"] == ("GitHub", True, False)
    assert authors["From Slack: any news on this?"][1:] == (True, False)
    assert authors["Please keep the old fixture."] == ("Pat Person", False, False)
    feedback = human_feedback(issue) or ""
    assert "old fixture" in feedback and "GitHub" not in feedback and "Slack" not in feedback


# --- the fake itself misbehaves like Linear ------------------------------------------------


async def test_fake_moves_renumber_and_the_tracker_follows_by_uuid(
    real: tuple[World, Workspace],
) -> None:
    world, ws = real
    tracker = world.tracker()
    await tracker.list_issues()
    blocker = world.fake.add_issue(ws.eng, "to be moved", project_id=ws.alpha)
    blocked = world.fake.add_issue(ws.eng, "waits for it", project_id=ws.alpha)
    world.fake.add_blocker(blocker, blocked)
    world.clock.advance(POLL)
    await tracker.list_issues()
    moved = world.fake.move_issue(blocker, "OPS")
    assert moved.startswith("OPS-") and world.fake.state_of(moved) == "Ready"
    world.clock.advance(POLL)
    issues = by_id(await tracker.list_issues())
    assert blocker not in issues and issues[blocked].blocked_by == (moved,)
    assert tracker.renamed()[blocker] == moved
    assert (await tracker.get(blocker)).identifier == moved  # Linear resolves the old name


async def test_fake_refuses_queries_over_10000_points(real: tuple[World, Workspace]) -> None:
    world, _ws = real
    tracker = world.tracker(page_size=200)
    with pytest.raises(Exception, match="too complex"):
        await tracker.list_issues()


def test_workspace_has_the_awkward_cases() -> None:
    with FakeLinear() as fake:
        ws = populate_workspace(fake, 1_070)
        assert len(ws.members) > 1_000
        assert {s["name"] for s in fake.states.values()} >= {n for n, _ in OPS_STATES}
        assert any(i["description"] is None for i in fake.issues.values())
        assert any(i["trashed"] for i in fake.issues.values())
        kinds = {r["type"] for r in fake.relations.values()}
        assert kinds == {"blocks", "related", "duplicate", "similar"}
