"""Properties of decide over random worlds: safety rules and idempotence.

The worlds are small (a dozen issues) but dense: random blocker DAGs and
parents, every label that steers, windows alive/dead/duplicated/foreign,
workspaces with and without unmerged or conflicted changes, worker records
in every state, a random clock, random limits.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import contract
from hypothesis import given
from hypothesis import strategies as st

from ralph_dev.core.actions import (
    SWARM,
    Complete,
    Forget,
    Hold,
    Kill,
    Merge,
    Nudge,
    PassFeedback,
    Plan,
    Restart,
    Resume,
    Spawn,
    Stop,
    VerifyMerge,
)
from ralph_dev.core.config import (
    Labels,
    Limits,
    MergeSettings,
    ProjectSettings,
    Timing,
    TrackerSettings,
)
from ralph_dev.core.decide import decide, nudge_message
from ralph_dev.core.model import (
    IDENTIFIER_RE,
    Issue,
    LaneRun,
    Observed,
    Role,
    StateType,
    Window,
    WorkerRecord,
    Workspace,
)
from ralph_dev.core.policy import retry_policy

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
KEY = "DEMO"
HOLD_LABELS = {"ralph:hold", "user-input-needed"}
LABEL_POOL = [
    "ralph:hold", "user-input-needed", "user-feedback-given", "ralph:plan", "ralph:phase",
    "ralph:review", "ralph:research", "agent-input-needed", "model:opus",
    *["bug", "docs", "ui", "backend", "chore", "infra"],  # most labels do not steer
]
STATES = [
    ("Backlog", StateType.BACKLOG),
    *[("Todo", StateType.UNSTARTED)] * 4,  # the state dispatch is about: drawn more often
    ("In Progress", StateType.STARTED),
    ("In Review", StateType.STARTED),
    ("Done", StateType.COMPLETED),
    ("Canceled", StateType.CANCELED),
    ("Duplicate", StateType.DUPLICATE),
]

# A few shared time points, so stalls, nudges and backoffs line up often enough to matter.
POINTS = [None, None, 0, 5, 12, 30, 65, 100, 333, 650, 700, 1000, 1300, 2500, 4000]
maybe_time = st.sampled_from(
    [None if s is None else NOW - timedelta(seconds=s) for s in POINTS])
mostly_true = st.sampled_from([True, True, True, False])


@st.composite
def settings_st(draw: st.DrawFn) -> ProjectSettings:
    roles = draw(st.sampled_from([
        {}, {"execute": 1}, {"execute": 0, "plan": 1}, {"plan": 1, "review": 1},
        {"resolve": 0, "execute": 2}, {"execute": 1, "research": 0, "review": 0},
    ]))
    base = draw(st.sampled_from([10.0, 30.0, 120.0]))
    return ProjectSettings(
        name="demo",
        repo=Path("/nonexistent/demo"),
        tracker=TrackerSettings(key=KEY),
        limits=Limits(max_workers=draw(st.integers(min_value=1, max_value=4)), per_role=roles),
        timing=Timing(
            stall_timeout=draw(st.sampled_from([60.0, 600.0])),
            restart_timeout=draw(st.sampled_from([60.0, 600.0])),
            retry_base=base,
            retry_cap=base * draw(st.sampled_from([1, 4, 100])),
            max_attempts=draw(st.integers(min_value=1, max_value=3)),
            poll_interval=10.0,
        ),
        merge=MergeSettings(verify_trunk=draw(st.booleans())),
        verify_command=draw(st.sampled_from([None, "make test"])),  # the verified lane
    )


LABEL_SETS = [frozenset()] * 12 + [frozenset({a}) for a in LABEL_POOL] + [
    frozenset({a, b}) for a, b in [
        ("user-input-needed", "user-feedback-given"), ("ralph:phase", "model:opus"),
        ("ralph:review", "ralph:research"), ("ralph:plan", "ralph:hold"),
    ]
]
"""Label combinations drawn as one choice each: fewer draws keep 500 worlds fast."""
PANES = [(True, None)] * 3 + [(False, None), (False, 0), (False, 1), (False, 2)]
FAILURES = [(None, None), (None, "pane died (exit 1)")] + [
    (t, "pane died (exit 1)") for t in (5, 30, 65, 100, 700, 2500)
]


def _ago(seconds: int | None) -> datetime | None:
    return None if seconds is None else NOW - timedelta(seconds=seconds)


@st.composite
def world_st(draw: st.DrawFn) -> Observed:
    n = draw(st.integers(min_value=1, max_value=10))  # the empty world is a table test
    ids = [f"{KEY}-{i}" for i in range(1, n + 1)]
    parents: dict[str, str] = {}
    issues: list[Issue] = []
    for i, ident in enumerate(ids):
        earlier = ids[:i]
        # Blockers and parents point only at earlier issues (a DAG), or at one we cannot see.
        blocker_sets = [(), (), (), (f"{KEY}-99",)] + [(e,) for e in earlier[-4:]] + [
            (a, b) for a, b in zip(earlier[-3:], earlier[-2:], strict=False) if a != b
        ]
        blockers = draw(st.sampled_from(blocker_sets))
        parent = draw(st.sampled_from([None, None, None, None, *earlier[-3:]]))
        if parent:
            parents[ident] = parent
        name, kind = draw(st.sampled_from(STATES))
        issues.append(Issue(
            identifier=ident,
            title=f"t{i}; $(rm -rf /)",
            state_name=name,
            state_type=kind,
            priority=draw(st.integers(min_value=0, max_value=4)),
            sort_order=float(draw(st.integers(min_value=0, max_value=3))),
            labels=draw(st.sampled_from(LABEL_SETS)),
            parent=parent,
            blocked_by=blockers,
            created_at=draw(maybe_time),
        ))
    # Children: sometimes listed on the parent, sometimes only known via the child's parent.
    if draw(st.booleans()):
        issues = [
            dataclasses.replace(
                iss, children=tuple(c for c, p in parents.items() if p == iss.identifier))
            for iss in issues
        ]
    names = [*ids, f"{KEY}-99", "controller", "bash", "OTHER-1"]
    windows = []
    for name in draw(st.lists(st.sampled_from(names), max_size=8)):
        alive, status = draw(st.sampled_from(PANES))
        changed = draw(maybe_time)
        windows.append(Window(
            name=name, pane_id="%1", window_id="@1", alive=alive, exit_status=status,
            last_activity=changed if draw(st.booleans()) else None,
            output_changed_at=changed if draw(mostly_true) else None,
        ))
    # Per identifier, so workspaces and records line up with windows and issues often.
    workspaces = []
    for name in [*ids, "default"]:
        kind = draw(st.integers(min_value=0, max_value=5))
        if kind >= 4:
            continue
        workspaces.append(Workspace(name=name, has_unmerged_change=kind in (1, 2),
                                    conflicted=kind == 2 or (kind == 3 and draw(st.booleans()))))
    records = {}
    for ident in ids:
        if draw(st.integers(min_value=0, max_value=2)) == 0:
            continue
        failed_ago, failure = draw(st.sampled_from(FAILURES))
        records[ident] = WorkerRecord(
            issue=ident,
            role=draw(st.sampled_from(list(Role))),
            attempts=draw(st.integers(min_value=0, max_value=4)),
            started_at=draw(maybe_time),
            last_failure_at=_ago(failed_ago),
            last_failure=failure,
            done=not draw(mostly_true),
            nudged_at=draw(maybe_time),
            merge_failures=draw(st.sampled_from([0, 0, 0, 1, 2, 3])),
            merge_failed_at=draw(maybe_time),
            sent_back=draw(st.sampled_from([None, None, None, "FAILED test_x"])),
        )
    return Observed(
        issues=tuple(issues), windows=tuple(windows), workspaces=tuple(workspaces),
        records=records, tracker_ok=draw(mostly_true), trunk_red=not draw(mostly_true),
        lane=draw(lane_st(ids)), trunk_head=draw(st.sampled_from([None, TRUNK, TRUNK, "moved"])),
    )


TRUNK = "t" * 40


@st.composite
def lane_st(draw: st.DrawFn, ids: list[str]) -> LaneRun | None:
    """The merge lane's run, in any state: a batch of some of the issues, a bisection's
    step, trunk's own verify (the facts its rules weigh)."""
    if draw(st.integers(min_value=0, max_value=2)) == 0:
        return None
    if draw(st.integers(min_value=0, max_value=4)) == 0:
        return LaneRun(id="trunk-run", kind="trunk", base=TRUNK,
                       state=draw(st.sampled_from(["running", "passed", "failed", "lost"])))
    batch = tuple(draw(st.lists(st.sampled_from(ids), min_size=1, max_size=4, unique=True)))
    bad = draw(st.integers(min_value=0, max_value=len(batch)))
    good = draw(st.integers(min_value=0, max_value=max(0, bad - 1))) if bad else 0
    size = len(batch) if not bad else draw(st.integers(min_value=good + 1, max_value=bad))
    return LaneRun(id="run-1", kind="merge", base=TRUNK, batch=batch, size=size, good=good,
                   bad=bad, bad_run="run-0" if bad else None, checkout_commit="c" * 40,
                   state=draw(st.sampled_from(["running", "passed", "failed", "lost", "void",
                                               "concluded"])))


now_st = st.sampled_from([0, 0, 0, 10, 25, 40, 100, 700, 3000]).map(
    lambda s: NOW + timedelta(seconds=s))


# --- the test's own reading of the world (independent of decide's internals) ----------------


def workers(obs: Observed) -> list[str]:
    return [w.name for w in obs.windows if IDENTIFIER_RE.fullmatch(w.name)
            and w.name.startswith(f"{KEY}-")]


def live_ids(obs: Observed) -> set[str]:
    return {w.name for w in obs.windows if w.alive and w.name in set(workers(obs))}


def finished(obs: Observed, ident: str) -> bool:
    issue = next((i for i in obs.issues if i.identifier == ident), None)
    return issue is not None and issue.state_type.finished


def is_blocked(obs: Observed, issue: Issue) -> bool:
    if any(not finished(obs, b) for b in issue.blocked_by):
        return True
    parent = next((i for i in obs.issues if i.identifier == issue.parent), None)
    return parent is not None and any(not finished(obs, b) for b in parent.blocked_by)


def issue_of(obs: Observed, ident: str) -> Issue | None:
    return next((i for i in obs.issues if i.identifier == ident), None)


# --- safety properties ----------------------------------------------------------------


@given(world_st(), settings_st(), now_st)
def test_never_two_workers_for_one_issue(obs: Observed, s: ProjectSettings, now: datetime) -> None:
    plan = decide(obs, s, now)
    starts = Counter(a.issue for a in plan.actions if isinstance(a, Spawn | Restart))
    assert all(count == 1 for count in starts.values()), plan
    window_names = {w.name for w in obs.windows}
    for action in plan.actions:
        if isinstance(action, Spawn):
            assert action.issue not in window_names, action
        if isinstance(action, Restart):
            assert action.issue in live_ids(obs), action


@given(world_st(), settings_st(), now_st)
def test_never_dispatch_a_blocked_or_held_issue(
    obs: Observed, s: ProjectSettings, now: datetime
) -> None:
    plan = decide(obs, s, now)
    spawns = [a for a in plan.actions if isinstance(a, Spawn)]
    if not obs.tracker_ok:
        assert spawns == []
    for spawn in spawns:
        issue = issue_of(obs, spawn.issue)
        assert issue is not None
        assert not (issue.labels & HOLD_LABELS), spawn
        assert "user-feedback-given" not in issue.labels, spawn
        rec = obs.records.get(spawn.issue)
        rework = rec is not None and rec.sent_back is not None and not rec.done
        if spawn.role is not Role.RESOLVE and not rework:  # reworking finished work
            assert not is_blocked(obs, issue), spawn
            assert not issue.state_type.finished, spawn


@given(world_st(), settings_st(), now_st)
def test_never_over_a_limit(obs: Observed, s: ProjectSettings, now: datetime) -> None:
    plan = decide(obs, s, now)
    spawns = [a for a in plan.actions if isinstance(a, Spawn)]
    if not spawns:
        return
    # a finished worker's window is closed in the same plan: it holds no slot
    live = live_ids(obs) - {a.issue for a in plan.actions if isinstance(a, Kill)}
    assert len(live) + len(spawns) <= s.limits.max_workers
    roles: Counter[Role] = Counter()
    for ident in live:
        rec = obs.records.get(ident)
        roles[rec.role if rec else Role.EXECUTE] += 1
    before = Counter(roles)
    for spawn in spawns:
        roles[spawn.role] += 1
    for role, count in roles.items():
        if count > before[role]:
            assert count <= s.role_limit(role), (role, count)


def _number(identifier: str) -> tuple[str, int]:
    key, n = identifier.rsplit("-", 1)
    return key, int(n)


@given(world_st(), settings_st(), now_st)
def test_never_lose_work(obs: Observed, s: ProjectSettings, now: datetime) -> None:
    plan = decide(obs, s, now)
    merges = [a for a in plan.actions if isinstance(a, Merge)]
    if s.verifies_merges:  # only a batch the lane verified on this trunk, landing at once
        lane = obs.lane
        if merges:
            assert lane is not None and lane.kind == "merge" and lane.finished, plan
            assert obs.trunk_head in (None, lane.base)
            landing = merges[0].batch
            assert all(m.batch == landing and m.run == lane.id for m in merges)
            assert [m.issue for m in merges] == list(landing)
            assert landing == lane.batch[:len(landing)]
    elif s.merge.verify_trunk:
        assert len(merges) <= 1  # trunk is verified between merges
    if merges and not s.verifies_merges:
        assert [m.issue for m in merges] == sorted({m.issue for m in merges}, key=_number)
    spaces = {w.name: w for w in obs.workspaces}
    if obs.trunk_red:
        assert merges == []
    for i, action in enumerate(plan.actions):
        if isinstance(action, Merge):
            assert not spaces[action.issue].conflicted
            issue = issue_of(obs, action.issue)
            assert issue is None or issue.state_type not in (StateType.CANCELED,
                                                             StateType.DUPLICATE)
        if isinstance(action, Forget) and not action.keep_bookmark:
            ws = spaces[action.issue]
            merged_first = any(isinstance(a, Merge) and a.issue == action.issue
                               for a in plan.actions[:i])
            assert not ws.has_unmerged_change or merged_first, plan
        if isinstance(action, Forget) and action.issue in live_ids(obs):
            # a live window is closed (killed or stopped) before its directory goes away
                assert any(isinstance(a, Kill | Stop) and a.issue == action.issue
                           for a in plan.actions[:i]), plan


def waiting_for_a_reason(obs: Observed, s: ProjectSettings, now: datetime, plan: Plan,
                        ident: str, *, needs_worker: bool) -> bool:
    """Why finished, unmerged work may get no action this tick — each a pending retry,
    a hold before a person, or a wait the world states (read independently of decide).
    ``needs_worker``: it waits for a worker (conflicted, or sent back by verify), not
    for the merge lane."""
    issue = issue_of(obs, ident)
    rec = obs.records.get(ident)
    labels = {label.casefold() for label in issue.labels} if issue else set()
    if labels & HOLD_LABELS or obs.trunk_red or not obs.tracker_ok:
        return True  # held for a person, trunk red, the tracker down: all said in status
    if not needs_worker:
        if any(isinstance(a, Merge | VerifyMerge) for a in plan.actions):
            return True  # the lane is busy: verified in the next batch
        if obs.lane is not None and (obs.lane.kind == "trunk" or obs.lane.state == "running"):
            return True  # a verify runs beside the loop (trunk's, or a batch's): it waits
        if rec is not None and rec.merge_failures and rec.merge_failed_at is not None:
            wait = timedelta(seconds=retry_policy(s).delay(rec.merge_failures))
            return now < rec.merge_failed_at + wait  # a merge retry is pending
        return False
    if obs.pauses:
        return True  # nothing starts; the status line says why
    if rec is not None and rec.last_failure_at is not None and rec.attempts and \
            (now - rec.last_failure_at).total_seconds() < retry_policy(s).delay(rec.attempts):
        return True  # a rework worker is pending after a backoff
    ws = next(w for w in obs.workspaces if w.name == ident)
    role = Role.RESOLVE if ws.conflicted else Role.EXECUTE
    busy = {w.name for w in obs.windows if w.alive and w.name.startswith(f"{KEY}-")
            and not (obs.records.get(w.name) and obs.records[w.name].done)}
    spawns = [a for a in plan.actions if isinstance(a, Spawn)]
    in_role = sum(a.role is role for a in spawns) + sum(
        (obs.records[n].role if n in obs.records else Role.EXECUTE) is role for n in busy)
    return len(spawns) + len(busy) >= s.limits.max_workers or in_role >= s.role_limit(role)


def _finish(obs: Observed) -> Observed:
    """Every issue with a workspace completed, and most of their records an editing
    role's: the worlds where finished work could be left behind."""
    spaces = {w.name for w in obs.workspaces}
    issues = tuple(dataclasses.replace(i, state_name="Done", state_type=StateType.COMPLETED)
                   if i.identifier in spaces else i for i in obs.issues)
    records = {k: r if r.role.may_edit or k.endswith("7") else
               dataclasses.replace(r, role=Role.EXECUTE) for k, r in obs.records.items()}
    return dataclasses.replace(obs, issues=issues, records=records)


@given(world_st().map(_finish), settings_st(), now_st)
def test_finished_work_never_waits_silently(obs: Observed, s: ProjectSettings,
                                            now: datetime) -> None:
    """Issue 9: no issue stays Done with its work unmerged unless something is under
    way for it, a retry is pending, or it is held for a person (with a comment)."""
    plan = decide(obs, s, now)
    acted = {ident for a in plan.actions for ident in a.issues()}
    for ws in obs.workspaces:
        issue = issue_of(obs, ws.name)
        rec = obs.records.get(ws.name)
        if issue is None or not (ws.has_unmerged_change or ws.conflicted):
            continue
        if issue.state_type is not StateType.COMPLETED and not (rec and rec.done):
            continue
        if rec is not None and not rec.role.may_edit and not ws.conflicted:
            continue  # a review/research/plan worker's workspace is never merged
        if ws.name in acted or ws.name in live_ids(obs):
            continue
        rework = ws.conflicted or bool(rec and rec.sent_back and not rec.done)
        assert waiting_for_a_reason(obs, s, now, plan, ws.name, needs_worker=rework), \
            (ws, rec, issue, plan)


@given(world_st(), settings_st(), now_st)
def test_actions_are_explained_and_carry_no_issue_text(
    obs: Observed, s: ProjectSettings, now: datetime
) -> None:
    plan = decide(obs, s, now)
    assert decide(obs, s, now) == plan  # deterministic
    for action in plan.actions:
        if action.issue == SWARM:  # the swarm's own (trunk's verify): no issue of its own
            assert action.reason and "rm -rf" not in action.reason
            continue
        assert IDENTIFIER_RE.fullmatch(action.issue)
        assert action.reason and action.issue in action.reason
        assert "rm -rf" not in action.reason
        if isinstance(action, Nudge):
            assert action.message == nudge_message(action.issue)
        if isinstance(action, Hold):
            assert "rm -rf" not in action.comment
    if not obs.tracker_ok:
        assert not [a for a in plan.actions
                    if isinstance(a, Spawn | Restart | Hold | Complete | Resume | PassFeedback)]
        # never kill a worker because the tracker is down
        for action in plan.actions:
            if isinstance(action, Kill) and action.issue in live_ids(obs):
                rec = obs.records.get(action.issue)
                issue = issue_of(obs, action.issue)
                assert (rec is not None and rec.done) or (
                    issue is not None and issue.state_type.finished
                )


@given(world_st(), settings_st(), now_st)
def test_retries_wait_for_backoff_and_stop_at_the_cap(
    obs: Observed, s: ProjectSettings, now: datetime
) -> None:
    plan = decide(obs, s, now)
    for action in plan.actions:
        if not isinstance(action, Spawn) or action.attempt == 1:
            continue
        rec = obs.records[action.issue]
        assert action.attempt == rec.attempts + 1
        assert rec.attempts < s.timing.max_attempts, action
        if rec.last_failure_at is not None:
            wait = retry_policy(s).delay(rec.attempts)
            assert (now - rec.last_failure_at).total_seconds() >= wait, action


# --- idempotence ---------------------------------------------------------------------


def apply(plan: Plan, obs: Observed, now: datetime) -> Observed:
    """What a fully successful executor leaves behind: the executor contract, played."""
    return contract.apply(plan, obs, now, Labels())


@given(world_st(), settings_st(), now_st)
def test_deciding_again_after_the_plan_repeats_nothing(
    obs: Observed, s: ProjectSettings, now: datetime
) -> None:
    first = decide(obs, s, now)
    after = apply(first, obs, now)
    second = decide(after, s, now)
    done_before = {(a.kind, a.issue) for a in first.actions}
    repeated = [a for a in second.actions if (a.kind, a.issue) in done_before]
    assert repeated == [], (first, second)
    # Spawned workers are not spawned again, and applying twice reaches a fixed point
    # for everything but new work (a later merge, a resolve, a respawn after reaping).
    spawned = {a.issue for a in first.actions if isinstance(a, Spawn | Restart)}
    assert not [a for a in second.actions if isinstance(a, Spawn) and a.issue in spawned]
