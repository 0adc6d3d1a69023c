"""The verified merge lane's rules (issue 34), as data: batches in merge order, a run
that goes on beside the loop, landing, bisection, sending back, a lost or void run,
trunk's own verify."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from contract import apply as contract_apply
from test_decide import NOW, issue, rec, run, settings, steps, win, world

from ralph_dev.core.actions import Merge, SendBack, TrunkVerified, VerifyMerge, VerifyTrunk
from ralph_dev.core.config import Labels, Limits, MergeSettings, ProjectSettings
from ralph_dev.core.model import LaneRun, Observed, Probe, Resources, Workspace

VERIFIED = settings(verify_command="make test")
TRUNK = "t" * 40


def done(*ns: int, **kw: object) -> Observed:
    """Issues done by their workers, windows closed, changes unmerged."""
    return world(issues=[issue(n, "started", **kw) for n in ns],
                 workspaces=[Workspace(f"DEMO-{n}", has_unmerged_change=True) for n in ns],
                 records=[rec(f"DEMO-{n}", done=True) for n in ns], trunk_head=TRUNK)


def lane(batch: tuple[int, ...], state: str, *, size: int | None = None, good: int = 0,
         bad: int = 0, **kw: object) -> LaneRun:
    names = tuple(f"DEMO-{n}" for n in batch)
    return LaneRun(id="run-1", kind="merge", state=state, base=TRUNK, batch=names,
                   size=len(names) if size is None else size, good=good, bad=bad,
                   checkout_commit="c" * 40, started_at=NOW - timedelta(seconds=30),
                   **kw)  # type: ignore[arg-type]


def test_changes_ready_together_are_verified_together_in_merge_order() -> None:
    obs = done(3, 1, 2)
    obs = dataclasses.replace(obs, issues=(issue(1, "started"), issue(2, "started", priority=1),
                                           issue(3, "started")))
    plan = run(obs, VERIFIED)
    assert steps(plan) == [("verifymerge", "DEMO-2")]
    start = plan.actions[0]
    assert isinstance(start, VerifyMerge)
    assert start.batch == ("DEMO-2", "DEMO-1", "DEMO-3") and start.size == 3  # urgent first
    assert {i: w.kind for i, w in plan.waits.items()} == dict.fromkeys(start.batch, "merge")


def test_a_batch_holds_at_most_max_batch_and_the_rest_wait_behind_it() -> None:
    s = settings(verify_command="make test", merge=MergeSettings(max_batch=2))
    plan = run(done(1, 2, 3), s)
    [start] = plan.actions
    assert isinstance(start, VerifyMerge) and start.batch == ("DEMO-1", "DEMO-2")
    assert "waits behind the batch" in plan.waits["DEMO-3"].why


def test_a_done_worker_closes_its_window_before_its_change_joins_the_lane() -> None:
    obs = dataclasses.replace(done(1), windows=(win("DEMO-1"),))
    assert steps(run(obs, VERIFIED)) == [("kill", "DEMO-1")]


def test_while_the_verify_runs_the_tick_goes_on_and_the_lane_waits() -> None:
    obs = dataclasses.replace(done(1, 2, 3), lane=lane((1, 2), "running"),
                              issues=(issue(1, "started"), issue(2, "started"),
                                      issue(3, "started"), issue(4)))
    plan = run(obs, VERIFIED)
    assert steps(plan) == [("spawn", "DEMO-4")]  # a new issue starts meanwhile
    assert "being verified on top of trunk with 1 other(s)" in plan.waits["DEMO-1"].why
    assert "waits behind the batch being verified" in plan.waits["DEMO-3"].why


def test_a_green_batch_lands_at_once_and_each_issue_is_completed() -> None:
    obs = dataclasses.replace(done(1, 2, 3), lane=lane((1, 2), "passed"))
    plan = run(obs, VERIFIED)
    assert steps(plan) == [("merge", "DEMO-1"), ("merge", "DEMO-2"), ("complete", "DEMO-1"),
                           ("forget", "DEMO-1"), ("complete", "DEMO-2"), ("forget", "DEMO-2")]
    merge = plan.actions[0]
    assert isinstance(merge, Merge) and merge.batch == ("DEMO-1", "DEMO-2")
    assert merge.run == "run-1" and merge.verified == "c" * 40
    assert "waits behind the batch landing now" in plan.waits["DEMO-3"].why
    after = contract_apply(plan, obs, NOW, Labels())
    again = run(after, VERIFIED)  # trunk moved: the next batch
    assert [a.batch for a in again.actions if isinstance(a, VerifyMerge)] == [("DEMO-3",)]


def test_a_red_batch_is_bisected_by_prefix_on_the_same_trunk() -> None:
    eight = tuple(range(1, 9))
    obs = dataclasses.replace(done(*eight), lane=lane(eight, "failed"))
    [step] = run(obs, VERIFIED).actions
    assert isinstance(step, VerifyMerge)
    assert (step.size, step.good, step.bad, step.base, step.bad_run) == (4, 0, 8, TRUNK, "run-1")
    passed = dataclasses.replace(obs, lane=lane(eight, "passed", size=4, bad=8,
                                                bad_run="run-0"))
    [step] = run(passed, VERIFIED).actions
    assert isinstance(step, VerifyMerge)
    assert (step.size, step.good, step.bad, step.good_commit) == (6, 4, 8, "c" * 40)


@pytest.mark.parametrize("bad_one", range(1, 9))
def test_bisecting_a_batch_of_eight_finds_the_bad_change_in_four_verifies(bad_one: int) -> None:
    eight = tuple(range(1, 9))
    obs = done(*eight)
    verifies, run_lane = 0, None
    for _ in range(10):
        plan = run(dataclasses.replace(obs, lane=run_lane), VERIFIED)
        sent = [a for a in plan.actions if isinstance(a, SendBack)]
        if sent:
            break
        [step] = [a for a in plan.actions if isinstance(a, VerifyMerge)]
        verifies += 1
        red = bad_one <= step.size  # its prefix holds the bad change
        run_lane = LaneRun(id=f"run-{verifies}", kind="merge", state="failed" if red else
                           "passed", base=TRUNK, batch=step.batch, size=step.size,
                           good=step.good, bad=step.bad, bad_run=step.bad_run or None,
                           good_commit=step.good_commit or None,
                           checkout_commit=f"commit-{verifies}")
    assert [a.issue for a in sent] == [f"DEMO-{bad_one}"]
    landed = [a.issue for a in plan.actions if isinstance(a, Merge)]
    assert landed == [f"DEMO-{n}" for n in range(1, bad_one)]  # the ones before it land
    assert verifies <= 4


def test_two_that_pass_alone_and_fail_together_the_later_goes_back() -> None:
    obs = dataclasses.replace(done(1, 2), lane=lane((1, 2), "passed", size=1, bad=2,
                                                    bad_run="run-0"))
    plan = run(obs, VERIFIED)
    assert steps(plan)[:2] == [("sendback", "DEMO-2"), ("merge", "DEMO-1")]
    back = plan.actions[0]
    assert isinstance(back, SendBack) and back.run == "run-0"
    assert "on top of DEMO-1" in back.reason
    after = contract_apply(plan, obs, NOW, Labels())
    rec2 = after.records["DEMO-2"]
    assert not rec2.done and rec2.sent_back and rec2.last_failure_at == NOW


def test_a_change_held_under_a_running_verify_voids_it() -> None:
    obs = done(1, 2)
    held = dataclasses.replace(obs, lane=lane((1, 2), "running"),
                               issues=(issue(1, "started", labels={"ralph:hold"}),
                                       issue(2, "started")))
    [start] = [a for a in run(held, VERIFIED).actions if isinstance(a, VerifyMerge)]
    assert start.batch == ("DEMO-2",) and start.replaces == "run-1"


def test_trunk_moving_under_a_batch_has_it_verified_again() -> None:
    obs = dataclasses.replace(done(1, 2), lane=lane((1, 2), "passed"), trunk_head="m" * 40)
    [start] = run(obs, VERIFIED).actions
    assert isinstance(start, VerifyMerge) and start.batch == ("DEMO-1", "DEMO-2")
    assert start.base == ""  # a new batch, rebased onto the new trunk


def test_a_lost_verify_is_run_again_and_a_concluded_one_never_acted_on_again() -> None:
    obs = dataclasses.replace(done(1, 2), lane=lane((1, 2), "lost"))
    [again] = run(obs, VERIFIED).actions
    assert isinstance(again, VerifyMerge) and again.replaces == "run-1"
    assert again.batch == ("DEMO-1", "DEMO-2") and "without an outcome" in again.reason
    back = dataclasses.replace(obs, lane=lane((2,), "concluded", bad=1,
                                              why="DEMO-2 went back"))
    [fresh] = run(back, VERIFIED).actions  # DEMO-2 done again later: a new verify
    assert isinstance(fresh, VerifyMerge) and fresh.batch == ("DEMO-1", "DEMO-2")


def test_a_batch_whose_land_found_other_files_goes_one_at_a_time() -> None:
    obs = dataclasses.replace(done(1, 2), lane=lane((1, 2), "void", limit=1,
                                                    why="other files"))
    [start] = run(obs, VERIFIED).actions
    assert isinstance(start, VerifyMerge) and start.batch == ("DEMO-1",)


def test_trunks_own_verify_runs_beside_the_loop_and_merges_wait_for_it() -> None:
    s = settings(verify_command="make test", merge=MergeSettings(verify_trunk=True))
    due = dataclasses.replace(done(1), trunk_due=("DEMO-0",))
    plan = run(due, s)
    assert steps(plan) == [("verifytrunk", "")]
    assert isinstance(plan.actions[0], VerifyTrunk) and plan.actions[0].after == ("DEMO-0",)
    assert "trunk is being verified" in plan.waits["DEMO-1"].why
    trunk_run = LaneRun(id="t", kind="trunk", state="running", base=TRUNK)
    running = dataclasses.replace(done(1), lane=trunk_run)
    assert steps(run(running, s)) == []
    failed = dataclasses.replace(running, lane=dataclasses.replace(
        trunk_run, state="failed", exit_code=2, after=("DEMO-0",)))
    plan = run(failed, s)
    assert steps(plan) == [("trunkverified", "")]
    verdict = plan.actions[0]
    assert isinstance(verdict, TrunkVerified) and not verdict.ok and verdict.commit == TRUNK
    red = contract_apply(plan, failed, NOW, Labels())
    assert red.trunk_red and steps(run(red, s)) == []  # red: nothing merges


def test_a_bisection_step_touches_every_workspace_its_batch_rebases() -> None:
    """The lane rebases the whole batch, not only the prefix a bisection step verifies:
    the tripwires must hear of each of those workspaces as the controller's own act (a
    batch rebased while another worker was live tripped them, the later changes'
    workspaces holding the earlier ones' files)."""
    step = VerifyMerge("DEMO-2", "bisecting", batch=("DEMO-2", "DEMO-3", "DEMO-5"), size=1)
    assert step.issues() == ("DEMO-2",)  # a failure stops only the verified prefix
    assert step.touches() == ("DEMO-2", "DEMO-3", "DEMO-5")


ROOMY = Resources(free_memory_mb=64_000, free_disk_mb=64_000, load_per_cpu=0.0, cpus=8)


def parallel(count: int, **merge: object) -> ProjectSettings:
    return settings(verify_command="make test",
                    merge=MergeSettings(parallel_verifies=count, **merge))  # type: ignore[arg-type]


def outcome_of(step: VerifyMerge, number: int, bad_one: int) -> LaneRun:
    """What the lane's processes found of ``step``: a prefix fails when it holds the
    change ``bad_one`` (0: none does)."""
    def state(size: int) -> str:
        return "failed" if bad_one and bad_one <= size else "passed"

    return LaneRun(id=f"run-{number}", kind="merge", state=state(step.size), base=TRUNK,
                   batch=step.batch, size=step.size, good=step.good, bad=step.bad,
                   bad_run=step.bad_run or None, good_commit=step.good_commit or None,
                   checkout_commit=f"commit-{number}-{step.size}",
                   also=tuple(Probe(size, f"run-{number}-{size}", state(size),
                                    f"commit-{number}-{size}") for size in step.also))


def test_a_batch_is_verified_with_its_half_at_once_when_the_host_has_room() -> None:
    obs = dataclasses.replace(done(*range(1, 9)), resources=ROOMY)
    [start] = run(obs, parallel(2)).actions
    assert isinstance(start, VerifyMerge) and (start.size, start.also) == (8, (4,))
    assert "and the first 4 of them" in start.reason
    [start] = run(obs, parallel(4)).actions
    assert isinstance(start, VerifyMerge) and (start.size, start.also) == (8, (2, 4, 6))
    [one] = run(obs, VERIFIED).actions  # the default: one verify at a time
    assert isinstance(one, VerifyMerge) and one.also == ()


@pytest.mark.parametrize(("have", "room"), [
    (Resources(free_memory_mb=64_000, load_per_cpu=0.75, cpus=8), 2),  # 2 CPUs idle
    (Resources(free_memory_mb=64_000, load_per_cpu=1.5, cpus=8), 1),  # none idle
    (Resources(free_memory_mb=1024 + 2 * 1024 + 512, load_per_cpu=0.0, cpus=8), 2),
    (Resources(free_memory_mb=1500, load_per_cpu=0.0, cpus=8), 1),
    (Resources(), 4),  # figures the host cannot give bound nothing
])
def test_verifies_at_once_are_bounded_by_the_hosts_free_cpus_and_memory(
        have: Resources, room: int) -> None:
    obs = dataclasses.replace(done(*range(1, 9)), resources=have)
    [start] = run(obs, parallel(4)).actions
    assert isinstance(start, VerifyMerge) and len(start.also) + 1 == room


def test_load_is_no_bound_when_the_person_set_no_load_limit() -> None:
    busy = Resources(free_memory_mb=64_000, load_per_cpu=3.0, cpus=2)
    obs = dataclasses.replace(done(*range(1, 9)), resources=busy)
    s = dataclasses.replace(parallel(2), limits=Limits(max_workers=3, max_load_per_cpu=0))
    [start] = run(obs, s).actions
    assert isinstance(start, VerifyMerge) and start.also == (4,)


@pytest.mark.parametrize("bad_one", range(1, 9))
def test_with_room_for_three_a_bad_change_in_eight_is_found_in_two_rounds(bad_one: int
                                                                         ) -> None:
    obs = dataclasses.replace(done(*range(1, 9)), resources=ROOMY)
    rounds, verifies, run_lane = 0, 0, None
    verified_by: dict[int, str] = {}
    for _ in range(6):
        plan = run(dataclasses.replace(obs, lane=run_lane), parallel(3))
        if any(isinstance(a, SendBack) for a in plan.actions):
            break
        [step] = [a for a in plan.actions if isinstance(a, VerifyMerge)]
        rounds += 1
        verifies += 1 + len(step.also)
        run_lane = outcome_of(step, rounds, bad_one)
        verified_by.update({p.size: p.run for p in run_lane.probes})
    [back] = [a for a in plan.actions if isinstance(a, SendBack)]
    assert back.issue == f"DEMO-{bad_one}"
    assert back.run == verified_by[bad_one]  # the output of its prefix's verify goes back
    landed = [a for a in plan.actions if isinstance(a, Merge)]
    assert [a.issue for a in landed] == [f"DEMO-{n}" for n in range(1, bad_one)]
    if landed:  # what lands is what a verify checked out, of exactly those changes
        assert landed[0].verified.endswith(f"-{bad_one - 1}")
    assert rounds <= 2 < 4 and verifies <= 6


def test_a_verify_beside_the_batch_still_running_keeps_the_lane_waiting() -> None:
    eight = tuple(range(1, 9))
    running = lane(eight, "running", also=(Probe(4, "run-1-4", "running"),))
    plan = run(dataclasses.replace(done(*eight), lane=running, resources=ROOMY), parallel(2))
    assert not [a for a in plan.actions if isinstance(a, VerifyMerge | Merge | SendBack)]
    lost = lane(eight, "lost", also=(Probe(4, "run-1-4", "lost"),))
    [again] = run(dataclasses.replace(done(*eight), lane=lost, resources=ROOMY),
                  parallel(2)).actions
    assert isinstance(again, VerifyMerge) and (again.size, again.also) == (8, (4,))


def test_a_green_batch_lands_whatever_its_half_found() -> None:
    """A prefix that failed while the whole batch passed (a flaky suite): what passed
    is what lands, the batch as it was verified."""
    eight = tuple(range(1, 9))
    passed = lane(eight, "passed", also=(Probe(4, "run-1-4", "failed", "d" * 40),))
    plan = run(dataclasses.replace(done(*eight), lane=passed, resources=ROOMY), parallel(2))
    assert [a for a in plan.actions if isinstance(a, SendBack)] == []
    assert [a.issue for a in plan.actions if isinstance(a, Merge)] == \
        [f"DEMO-{n}" for n in eight]
