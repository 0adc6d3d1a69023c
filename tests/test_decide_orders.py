"""Issue 33: what the actuator used to decide while it acted is decided in ``decide``,
from observed facts, and reaches the actuator as fields of its actions: which session
a start resumes (or why it starts fresh), whether the issue moves to its started
state, whether an ended worker's work comes in, the fence on a worker from another
host, what a forget keeps, and the order the plan goes in."""

from __future__ import annotations

from test_decide import NOW, issue, rec, run, settings, steps, win, world

from ralph_dev.core.actions import Forget, Kill, Merge, Redo, Restart, Spawn
from ralph_dev.core.config import MergeSettings
from ralph_dev.core.model import Role, Workspace


def only(plan: object, kind: type) -> list:
    return [a for a in plan.actions if isinstance(a, kind)]  # type: ignore[attr-defined]


def test_a_start_moves_an_unstarted_issue_and_says_which_session_it_resumes() -> None:
    ready = run(world(issues=[issue(1)]))
    [spawn] = only(ready, Spawn)
    assert spawn.start_issue and spawn.resume is None and not spawn.fresh_why
    # an issue a worker ran on before, whose same-role session is kept: resumed
    kept = world(issues=[issue(2, "started")],
                 records=[rec("DEMO-2", session_id="sess-1", transcript="/t.jsonl")],
                 sessions_kept=frozenset({"DEMO-2"}))
    [again] = only(run(kept), Spawn | Restart)
    assert again.resume == "sess-1" and not again.start_issue
    # its transcript gone: a fresh start, and why
    gone = world(issues=[issue(2, "started")],
                 records=[rec("DEMO-2", session_id="sess-1", transcript="/t.jsonl")])
    [fresh] = only(run(gone), Spawn | Restart)
    assert fresh.resume is None and fresh.fresh_why == "the earlier session's transcript is gone"
    # a session of another role is never resumed, and nothing is said of it
    other = world(issues=[issue(2, "started")],
                  records=[rec("DEMO-2", session_id="sess-1", role=Role.PLAN)],
                  sessions_kept=frozenset({"DEMO-2"}))
    [started] = only(run(other), Spawn | Restart)
    assert started.resume is None and not started.fresh_why


def test_a_done_worker_on_another_host_is_merged_only_once_its_work_came_back() -> None:
    done = dict(done=True, node="n1", host="h1", host_attempt=2)
    ws = Workspace("DEMO-3", has_unmerged_change=True)
    # its window still open: closed (its end brings the work in), merged next tick
    live = run(world(issues=[issue(3, "done")], windows=[win("DEMO-3")], workspaces=[ws],
                     records=[rec("DEMO-3", **done, final_push=0)]))
    assert steps(live) == [("kill", "DEMO-3")]
    assert only(live, Kill)[0].bring_in
    assert live.waits["DEMO-3"].kind == "merge"
    # its final push came back: merged, its attempt's push fetched first
    back = run(world(issues=[issue(3, "done")], workspaces=[ws],
                     records=[rec("DEMO-3", **done, final_push=2)]))
    [merge] = only(back, Merge)
    assert merge.fetch_attempt == 2
    # its host was lost before the push came back: done again, from its last snapshot
    lost = run(world(issues=[issue(3, "done")], workspaces=[ws],
                     records=[rec("DEMO-3", **done, final_push=1)]))
    assert steps(lost) == [("redo", "DEMO-3")]
    assert only(lost, Redo)[0].record_changes(NOW)["done"] is False


def test_a_worker_on_this_host_is_merged_in_the_same_plan_as_its_window_closes() -> None:
    plan = run(world(issues=[issue(4, "done")], windows=[win("DEMO-4")],
                     workspaces=[Workspace("DEMO-4", has_unmerged_change=True)],
                     records=[rec("DEMO-4", done=True)]))
    assert steps(plan) == [("kill", "DEMO-4"), ("merge", "DEMO-4"), ("forget", "DEMO-4")]
    assert only(plan, Kill)[0].bring_in and only(plan, Merge)[0].fetch_attempt == 0


def test_what_a_forget_keeps_is_decided() -> None:
    canceled = world(issues=[issue(5, "canceled")], workspaces=[Workspace("DEMO-5")])
    [forget] = only(run(canceled), Forget)
    assert forget.keep_bookmark and forget.keep_newest_push
    merged = world(issues=[issue(6, "done")], workspaces=[Workspace("DEMO-6")],
                   records=[rec("DEMO-6", done=True)])
    [plain] = only(run(merged), Forget)
    assert not plain.keep_bookmark and not plain.keep_newest_push
    # in pull-request mode the change lives on under its bookmark: the PR's head
    [pr] = only(run(merged, settings(merge=MergeSettings(mode="pr"))), Forget)
    assert pr.keep_bookmark and not pr.keep_newest_push


def test_issues_being_merged_go_last_each_chain_in_its_order() -> None:
    obs = world(issues=[issue(1, "done"), issue(7)],
                workspaces=[Workspace("DEMO-1", has_unmerged_change=True)],
                windows=[win("DEMO-1")], records=[rec("DEMO-1", done=True)])
    assert steps(run(obs)) == [("spawn", "DEMO-7"), ("kill", "DEMO-1"), ("merge", "DEMO-1"),
                               ("forget", "DEMO-1")]
