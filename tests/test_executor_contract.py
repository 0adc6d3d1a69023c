"""The real actuator keeps the executor contract decide relies on.

For every action kind, a scenario on a real tmux server, a real jj repo and
the local tracker: ``Actuator.act`` runs the action, then the world and the
worker record are compared with the action's own ``record_changes`` and with
tests/contract.py's ``EXECUTOR_CONTRACT`` — the same table the property tests
play plans with.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import retry_until
from contract import EXECUTOR_CONTRACT, Effect
from test_worker import Project, make_project

from ralph_dev.adapters.gh import Gh
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.adapters.writebacks import WriteBackItem
from ralph_dev.agent.launch import build_launch
from ralph_dev.control.loop.controller import Controller
from ralph_dev.control.loop.observe import observe
from ralph_dev.control.loop.wiring import host_for
from ralph_dev.core.actions import (
    SWARM,
    Action,
    Adopt,
    Complete,
    Continue,
    EndPause,
    Forget,
    Hold,
    Kill,
    Merge,
    Nudge,
    OpenGroom,
    PassFeedback,
    PauseSwarm,
    ProbeAccount,
    Reap,
    Redo,
    Restart,
    Resume,
    SendBack,
    Spawn,
    Stop,
    Tell,
    TrunkVerified,
    VerifyMerge,
    VerifyTrunk,
    Waited,
    WriteBack,
)
from ralph_dev.core.config import load_project
from ralph_dev.core.decide.orders import fill
from ralph_dev.core.model import NewIssue, Observed, Role, StateType

pytestmark = pytest.mark.slow

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
ECHO = "import sys; [print('got:', line.strip(), flush=True) for line in sys.stdin]"
AGENT = f'{sys.executable} -c "{ECHO}"'
"""The worker's "agent": echoes every line typed into its pane."""


@dataclass
class World:
    project: Project
    ctl: Controller
    tmux: Tmux

    def observe(self) -> Observed:
        return asyncio.run(observe(self.ctl.tracker, self.tmux, self.ctl.jj.workspaces,
                                   self.project.store))[0]

    def act(self, action: Action) -> None:
        observed = self.observe()
        issue = next((i for i in observed.issues if i.identifier == action.issue), None)
        # as ``decide`` hands it over: with how it is carried out filled in
        [filled] = fill((action,), observed, self.ctl.settings)
        asyncio.run(self.ctl.actuator.act(filled, issue, observed))

    def live(self, ident: str) -> list:
        return [w for w in self.tmux.list_windows() if w.name == ident and w.alive]

    def spawned(self, ident: str) -> None:
        self.act(Spawn(ident, "contract test", role=Role.EXECUTE, attempt=1))
        retry_until(lambda: self.live(ident), what=f"{ident}'s window")


@pytest.fixture
def world(xdg: Path, jj_bin: str, tmux_socket: str) -> Iterator[World]:
    agent = json.dumps(AGENT)
    project = make_project(xdg, jj_bin, verify=None, extra=(
        f'tmux_socket = "{tmux_socket}"\n[projects.demo.agent]\n'
        f'runner = "command"\ncommand = {agent}\n'))
    settings = load_project("demo", path=xdg / "config" / "ralph-dev" / "config.toml")
    tmux = Tmux.from_settings(settings)
    tmux.ensure_session(project.jj.cli.repo, {"PATH": os.environ["PATH"]})
    ctl = Controller(settings, tracker=project.tracker,
                     host=host_for(settings, project.jj, project.store), jj=project.jj,
                     launcher=build_launch,
                     pull_requests=Gh(settings.merge.gh_bin, settings.repo),
                     store=project.store, clock=lambda: NOW)
    yield World(project, ctl, tmux)
    tmux.kill_server()


def check(world: World, action: Action, before: Observed) -> None:
    """Compare what ``act`` left with the action's Effect in the contract."""
    effect: Effect = EXECUTOR_CONTRACT[type(action)]
    ident = action.issue
    after = world.observe()
    store = world.project.store
    if effect.pause == "started":
        assert isinstance(action, PauseSwarm)
        assert [p.cause for p in store.load_pauses() if p.kind == action.pause_kind] == [
            action.cause]
    if effect.pause == "ended":
        assert isinstance(action, EndPause)
        assert not [p for p in store.load_pauses() if p.kind == action.pause_kind]
    lane = world.ctl.merges.load_run()
    if effect.lane in ("merge", "trunk"):
        assert lane is not None and lane["kind"] == effect.lane
        if effect.lane == "merge":
            assert isinstance(action, VerifyMerge) and lane["batch"] == list(action.batch)
    if effect.lane == "over":
        assert isinstance(action, TrunkVerified)
        assert lane is None and store.paths.trunk_red_file.exists() is not action.ok
    if effect.account_probed:
        key_probe = world.ctl.actuator.key_probe
        assert key_probe is not None and key_probe.windows.last_probe()[0] == NOW
    if effect.issue_created:
        groom = world.ctl.settings.labels.groom
        assert [i for i in after.issues if groom in i.labels and i not in before.issues]
    if not ident:
        return  # the swarm's own action: nothing of an issue to compare
    record = store.load_record(ident)
    if action.record_deleted:
        assert record is None
    for name, value in action.record_changes(NOW).items():
        assert record is not None and getattr(record, name) == value, (name, record)
    if effect.written_back:
        assert isinstance(action, WriteBack)
        assert world.ctl.writebacks.get(action.report) is None
    old_windows = {w.window_id for w in before.windows if w.name == ident}
    windows = [w for w in after.windows if w.name == ident]
    if effect.windows_killed:
        assert not windows, windows
    if effect.window_opened:
        assert len(windows) == 1 and windows[0].alive
        assert windows[0].window_id not in old_windows  # a new window, not the old one
    issue = next(i for i in after.issues if i.identifier == ident)
    if effect.started:
        assert issue.state_type == StateType.STARTED
    if effect.issue_state is not None:
        assert issue.state_type == effect.issue_state
    labels = world.ctl.settings.labels
    folded = {label.casefold() for label in issue.labels}
    for name in effect.labels_added:
        assert getattr(labels, name).casefold() in folded
    for name in effect.labels_removed:
        assert getattr(labels, name).casefold() not in folded
    if effect.comments:
        assert issue.comments and issue.comments[-1].by_ralph
    if effect.sent_back:
        assert record is not None and record.sent_back
    spaces = {w.name: w for w in after.workspaces}
    if effect.workspace == "present":
        assert ident in spaces and Path(spaces[ident].path).is_dir()
    if effect.workspace == "merged":
        assert not spaces[ident].has_unmerged_change and not spaces[ident].conflicted
    if effect.workspace == "gone":
        assert ident not in spaces
        assert not world.project.jj.workspaces.workspace_path(ident).exists()


# --- one scenario per action kind ----------------------------------------------------


def spawn(w: World, ident: str) -> Action:
    return Spawn(ident, "ready", role=Role.EXECUTE, attempt=2, model="m")


def restart(w: World, ident: str) -> Action:
    w.spawned(ident)
    w.project.store.update_record(ident, nudged_at=NOW, iterations=4, done=True)
    return Restart(ident, "silent after a nudge", role=Role.EXECUTE, attempt=3)


def nudge(w: World, ident: str) -> Action:
    w.spawned(ident)
    return Nudge(ident, "silent", message=f"ralph-dev: continue {ident}")


def reap(w: World, ident: str) -> Action:
    w.spawned(ident)
    w.project.store.update_record(ident, done=False)
    for window in w.live(ident):
        w.tmux.run("send-keys", "-t", window.pane_id, "C-d").check()  # the agent exits
    retry_until(lambda: not w.live(ident), what="the pane to die")
    return Reap(ident, "pane died (exit 0)")


def kill(w: World, ident: str) -> Action:
    w.spawned(ident)
    w.act(Spawn(ident, "a duplicate a person opened", attempt=1))  # names may repeat
    retry_until(lambda: len(w.live(ident)) == 2, what="two windows with one name")
    return Kill(ident, "zombie")


def stop(w: World, ident: str) -> Action:
    w.spawned(ident)
    return Stop(ident, "a person's hold", cause="hold", why="a person set ralph:hold")


def merge(w: World, ident: str) -> Action:
    path = w.project.jj.workspaces.add_workspace(ident)
    (path / f"{ident}.txt").write_text("work\n")
    w.project.jj.workspaces.describe(ident, f"{ident}: work")
    return Merge(ident, "done")


def forget(w: World, ident: str) -> Action:
    w.act(merge(w, ident))
    w.project.store.update_record(ident, done=True)
    return Forget(ident, "merged")


def hold(w: World, ident: str) -> Action:
    return Hold(ident, "attempt cap", comment=f"ralph-dev stopped retrying {ident}")


def complete(w: World, ident: str) -> Action:
    w.project.tracker.create_issues_sync([NewIssue(title="child", parent=ident)])
    return Complete(ident, "all children finished")


def pass_feedback(w: World, ident: str) -> Action:
    w.spawned(ident)
    w.project.tracker.change_labels_sync(ident, add=["user-feedback-given", "user-input-needed"])
    w.project.store.update_record(ident, blocked=True)
    return PassFeedback(ident, "a person answered")


def resume(w: World, ident: str) -> Action:
    w.project.tracker.change_labels_sync(ident, add=["user-feedback-given", "user-input-needed"])
    w.project.store.update_record(ident, attempts=3, blocked=True, last_failure_at=NOW,
                                  nudged_at=NOW)
    return Resume(ident, "a person answered")


def tell(w: World, ident: str) -> Action:
    return Tell(ident, "a person completed it", mark=f"[ralph-dev] {ident} note",
                comment=f"[ralph-dev] {ident} note: its change is kept.")


def continue_(w: World, ident: str) -> Action:
    w.spawned(ident)
    w.project.store.update_record(ident, agent_error="rate_limit", agent_error_text="limit",
                                  agent_error_at=NOW, nudged_at=NOW)
    return Continue(ident, "the pause is over", after="rate_limit")


def waited(w: World, ident: str) -> Action:
    w.spawned(ident)
    w.project.store.update_record(ident, nudged_at=NOW)
    return Waited(ident, "the pause is over")


def redo(w: World, ident: str) -> Action:
    w.spawned(ident)
    w.project.store.update_record(ident, done=True)
    return Redo(ident, "its host was lost before its final push came back")


def adopt(w: World, ident: str) -> Action:
    w.spawned(ident)
    gone = w.ctl.dirs.worker_dir(ident)  # a worker from before the mailbox
    # its live worker may still write there (seen in CI: "Directory not empty")
    retry_until(lambda: (shutil.rmtree(gone, ignore_errors=True), not gone.exists())[1], 10,
                what="the worker's directory removed")
    return Adopt(ident, "no run dir")


def write_back(w: World, ident: str) -> Action:
    w.ctl.writebacks.add(WriteBackItem("c0ffee00", "note", ident,
                                       {"text": "An FYI for a person.", "since": None}))
    return WriteBack(ident, "owed", report="c0ffee00", report_kind="note")


def pause_swarm(w: World, ident: str) -> Action:
    return PauseSwarm(SWARM, "test", pause_kind="setup", cause="no agent", fix="install it")


def end_pause(w: World, ident: str) -> Action:
    w.act(pause_swarm(w, ident))
    return EndPause(SWARM, "test", pause_kind="setup")


def verifying(w: World, command: str) -> None:
    """The lane verifies with ``command`` from now on."""
    w.ctl.merges.settings = dataclasses.replace(w.ctl.settings, verify_command=command)


def verify_trunk(w: World, ident: str) -> Action:
    verifying(w, "true")
    commit = w.project.jj.trunk.trunk_commit()
    w.ctl.store.paths.trunk_red_file.write_text(json.dumps({"commit": "0" * 12}))
    return VerifyTrunk(SWARM, "trunk moved", commit=commit)


def verify_merge(w: World, ident: str) -> Action:
    verifying(w, "true")
    merge(w, ident)
    w.project.store.update_record(ident, done=True)
    return VerifyMerge(ident, "done", batch=(ident,), size=1)


def verified_run(w: World) -> str:
    """The lane's run, once its verify has ended."""
    run = w.ctl.merges.observe()
    assert run is not None
    retry_until(lambda: w.ctl.merges.observe().finished, 30, what="the verify to end")
    return run.id


def send_back(w: World, ident: str) -> Action:
    w.act(verify_merge(w, ident))
    verifying(w, "echo the tests fail; false")
    w.act(VerifyMerge(ident, "done", batch=(ident,), size=1))
    return SendBack(ident, "its change fails the verify command", run=verified_run(w))


def trunk_verified(w: World, ident: str) -> Action:
    w.act(verify_trunk(w, ident))
    return TrunkVerified(SWARM, "trunk's verify passed", run=verified_run(w),
                         commit=w.project.jj.trunk.trunk_commit(), ok=True)


def open_groom(w: World, ident: str) -> Action:
    return OpenGroom(SWARM, "the swarm is idle")


def probe_account(w: World, ident: str) -> Action:
    """An API key's account whose limits were asked for before (for a model it keeps);
    the API does not answer: the probe's claim is what the next tick observes."""
    from ralph_dev.adapters.accounts import AccountWindows, KeyProbe

    windows = AccountWindows("claude-contract", w.project.store.paths.state_dir / "accounts")
    windows.probed("claude-sonnet-4-5")
    w.ctl.actuator.key_probe = KeyProbe(
        windows, w.project.store, {"ANTHROPIC_API_KEY": "sk-ant-api03-contract-0123456789",
                                   "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"},
        cli="claude", model="sonnet")
    return ProbeAccount(SWARM, "issues wait to start")


SCENARIOS: dict[type[Action], Callable[[World, str], Action]] = {
    Spawn: spawn, Restart: restart, Nudge: nudge, Reap: reap, Kill: kill, Stop: stop, Merge: merge,
    Forget: forget, Hold: hold, Complete: complete, PassFeedback: pass_feedback,
    Resume: resume, Tell: tell, Continue: continue_, Waited: waited, Redo: redo, Adopt: adopt,
    WriteBack: write_back, PauseSwarm: pause_swarm, EndPause: end_pause, VerifyTrunk: verify_trunk,
    OpenGroom: open_groom, VerifyMerge: verify_merge, SendBack: send_back,
    TrunkVerified: trunk_verified, ProbeAccount: probe_account,
}
TYPED = {Nudge: "got: ralph-dev:", PassFeedback: "got: ralph-dev:",
         Continue: "model API is available again"}
"""What the echoing agent prints back of the text each kind types (Continue's Escape,
typed first to close a menu, eats its first letter)."""


def test_every_action_kind_has_a_contract_and_a_scenario() -> None:
    kinds = set(Action.__subclasses__())
    assert kinds == set(EXECUTOR_CONTRACT) == set(SCENARIOS)


@pytest.mark.parametrize("kind", list(SCENARIOS), ids=lambda k: k.__name__)
def test_the_real_controller_keeps_the_contract(world: World, kind: type[Action]) -> None:
    ident = world.project.issue(f"contract for {kind.__name__}")
    action = SCENARIOS[kind](world, ident)
    before = world.observe()
    world.act(action)
    check(world, action, before)
    effect = EXECUTOR_CONTRACT[kind]
    if effect.typed:
        window = world.live(ident)[0]
        retry_until(lambda: TYPED[kind] in world.tmux.capture(window.pane_id, 200),
                    what="the typed text in the pane")
    if kind is Adopt:
        assert (world.ctl.dirs.run_dir(ident) / "worker.json").is_file()
    if kind is VerifyTrunk:  # it runs beside the loop: passed, it makes trunk green again
        verified_run(world)
        assert world.ctl.merges.observe().state == "passed"
    if kind is SendBack:
        assert "the tests fail" in world.project.store.load_record(ident).sent_back


def test_an_event_keeps_an_exit_status_of_zero() -> None:
    """Issue 25: `reap` events dropped `exit_status` 0 (taken for an unset field)."""
    from ralph_dev.control.loop.act import event_details

    details = event_details(Reap("DEMO-1", "pane died", exit_status=0, charged=False))
    assert details == {"exit_status": 0}
    assert event_details(Reap("DEMO-1", "pane died"))["charged"] is True


def test_a_start_the_tmux_server_dies_under_is_charged_nothing(world: World) -> None:
    """Seen in CI (tests/test_recovery.py): the tmux server was killed while a worker's
    window was being made; the start failed as the issue's own failure, and with one
    attempt allowed the issue was held. The server's end is a cause outside the issue:
    the start is lost, not failed, and the next one is free."""
    from ralph_dev.core.actions import Plan
    from ralph_dev.core.decide import decide

    ident = world.project.issue("started as the server dies")
    observed = world.observe()
    [spawn] = fill((Spawn(ident, "ready", role=Role.EXECUTE, attempt=1),), observed,
                   world.ctl.settings)
    world.tmux.kill_server()  # a person's `tmux kill-server`, between the tick's look and act
    failures = asyncio.run(world.ctl.actuator.carry_out(Plan((spawn,)), observed))
    assert [a.kind for a, _ in failures] == ["spawn"]
    record = world.project.store.load_record(ident)
    assert record is not None and record.lost and "tmux session went away" in record.lost
    assert record.last_failure_at is None  # nothing charged
    again = decide(dataclasses.replace(observed, records={ident: record}),
                   world.ctl.settings, NOW)
    (start,) = [a for a in again.actions if isinstance(a, Spawn)]
    assert start.attempt == 1 and "no attempt charged" in start.reason
