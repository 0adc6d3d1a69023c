"""The real controller keeps the executor contract decide relies on.

For every action kind, a scenario on a real tmux server, a real jj repo and
the local tracker: ``Controller.act`` runs the action, then the world and the
worker record are compared with ``core.contract.EXECUTOR_CONTRACT`` — the same
table the property tests play plans with.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import retry_until
from test_worker import Project, make_project

from ralph_dev.adapters.gh import Gh
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.control.controller import Controller
from ralph_dev.control.observe import observe
from ralph_dev.control.wiring import launcher_for
from ralph_dev.core.config import load_project
from ralph_dev.core.contract import EXECUTOR_CONTRACT, Effect, record_changes
from ralph_dev.core.model import (
    Action,
    Complete,
    Forget,
    Hold,
    Kill,
    Merge,
    NewIssue,
    Nudge,
    Observed,
    Reap,
    RelayFeedback,
    Restart,
    Resume,
    Role,
    Spawn,
    StateType,
)

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
        asyncio.run(self.ctl.act(action, issue, observed))

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
    ctl = Controller(settings, tracker=project.tracker, tmux=tmux, jj=project.jj,
                     launcher=launcher_for(settings),
                     pull_requests=Gh(settings.merge.gh_bin, settings.repo),
                     store=project.store, clock=lambda: NOW)
    yield World(project, ctl, tmux)
    tmux.kill_server()


def check(world: World, action: Action, before: Observed) -> None:
    """Compare what ``act`` left with the action's Effect in the contract."""
    effect: Effect = EXECUTOR_CONTRACT[type(action)]
    ident = action.issue
    after = world.observe()
    record = world.project.store.load_record(ident)
    if effect.record_deleted:
        assert record is None
    for name, value in record_changes(action, NOW).items():
        assert record is not None and getattr(record, name) == value, (name, record)
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


def relay_feedback(w: World, ident: str) -> Action:
    w.spawned(ident)
    w.project.tracker.change_labels_sync(ident, add=["user-feedback-given", "user-input-needed"])
    w.project.store.update_record(ident, blocked=True)
    return RelayFeedback(ident, "a person answered")


def resume(w: World, ident: str) -> Action:
    w.project.tracker.change_labels_sync(ident, add=["user-feedback-given", "user-input-needed"])
    w.project.store.update_record(ident, attempts=3, blocked=True, last_failure_at=NOW,
                                  nudged_at=NOW)
    return Resume(ident, "a person answered")


SCENARIOS: dict[type[Action], Callable[[World, str], Action]] = {
    Spawn: spawn, Restart: restart, Nudge: nudge, Reap: reap, Kill: kill, Merge: merge,
    Forget: forget, Hold: hold, Complete: complete, RelayFeedback: relay_feedback,
    Resume: resume,
}


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
        retry_until(lambda: "got: ralph-dev:" in world.tmux.capture(window.pane_id, 200),
                    what="the typed text in the pane")
