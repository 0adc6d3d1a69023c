"""One controller per project: every tick observe → decide → act.

Level-triggered: each tick re-reads the tracker, tmux (one call) and jj, plus
ralph-dev's own worker records, and asks the pure ``decide`` what to do.
Nothing important is kept in memory between ticks, so killing the controller
at any moment and starting it again converges to the same place.

Failures are separated the controller-runtime way: a tracker that cannot be
read skips dispatch for this tick (workers keep running); an action that
fails is recorded as an event and simply proposed again by a later tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import structlog

from ralph_dev.adapters.tracker.base import Tracker, TrackerError
from ralph_dev.control.metrics import TickHistogram
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.decide import decide
from ralph_dev.core.errors import RalphError
from ralph_dev.core.fsutil import atomic_write_text
from ralph_dev.core.model import (
    IDENTIFIER_RE,
    Action,
    Complete,
    Forget,
    Hold,
    Issue,
    Kill,
    Merge,
    Nudge,
    Observed,
    Plan,
    Reap,
    RelayFeedback,
    Restart,
    Resume,
    Spawn,
    StateType,
    Window,
    Workspace,
)
from ralph_dev.core.state import StateStore, utcnow

log = structlog.get_logger(__name__)

QUICK_TICKS = 5
"""Ticks taken at once, without waiting for the poll, after actions that unblock more."""

FEEDBACK_MESSAGE = (
    "ralph-dev: a person left feedback on your issue. Run `ralph-dev worker feedback "
    "{issue}` to read it, then carry on with it in mind."
)
"""Typed into a live worker's pane: fixed text plus the checked identifier, never issue text."""


class ControllerLocked(RalphError):
    """Another controller already runs for this project."""


class TmuxPort(Protocol):
    def list_windows(self) -> list[Window]: ...
    def open_window(self, name: str, *, cwd: Path, command: Sequence[str],
                    environment: dict[str, str], log_file: Path | None = None) -> Window: ...
    def send_text(self, target: str, text: str) -> None: ...
    def kill_window(self, target: str) -> None: ...


class JJPort(Protocol):
    def list_workspaces(self) -> list[Workspace]: ...
    def add_workspace(self, name: str) -> Path: ...
    def merge(self, name: str) -> Any: ...
    def forget(self, name: str, *, keep_bookmark: bool = False) -> None: ...


@dataclass
class TickResult:
    tick: int
    plan: Plan
    observed: Observed
    failures: list[tuple[Action, str]] = field(default_factory=list)

    @property
    def unblocked_work(self) -> bool:
        """An action succeeded that may let another one go right away (a merge frees
        dependents, a reaped or killed window or a lifted hold frees a respawn)."""
        failed = {id(a) for a, _ in self.failures}
        follow_ups = Merge | Forget | Complete | Reap | Kill | Resume | Hold
        return any(isinstance(a, follow_ups) and id(a) not in failed
                   for a in self.plan.actions)


def output_marks(windows: Sequence[Window], store: StateStore) -> tuple[Window, ...]:
    """Fill each worker window's output fingerprint from its pipe-pane log.

    The log's size and mtime change exactly when the pane prints something, so
    stuck detection needs no per-window tmux call (the tick stays at one).
    """
    marked = []
    for window in windows:
        try:
            stat = store.log_path(window.name).stat()
        except (OSError, ValueError):
            marked.append(window)
            continue
        changed = datetime.fromtimestamp(stat.st_mtime, UTC)
        marked.append(
            dataclasses.replace(
                window, output_hash=f"{stat.st_size}", output_changed_at=changed
            )
        )
    return tuple(marked)


class Controller:
    """Owns one tick; adapters are injected so tests and benchmarks can swap them."""

    def __init__(
        self,
        settings: ProjectSettings,
        *,
        tracker: Tracker,
        tmux: TmuxPort,
        jj: JJPort,
        store: StateStore | None = None,
        clock: Callable[[], datetime] = utcnow,
        launcher: Callable[..., Any] | None = None,
    ) -> None:
        self.settings = settings
        self.tracker = tracker
        self.tmux = tmux
        self.jj = jj
        self.store = store or StateStore(settings.paths)
        self.clock = clock
        self.launcher = launcher
        self.tick_number = 0
        self.stopping = False
        self.tracker_error = ""
        self.tick_seconds = TickHistogram()  # published in the heartbeat for /metrics

    # -- observe ------------------------------------------------------------

    async def observe(self) -> Observed:
        tracker_ok = True
        issues: tuple[Issue, ...] = ()
        try:
            issues = tuple(await self.tracker.list_issues())
        except TrackerError as exc:
            tracker_ok = False
            self.tracker_error = str(exc)
            log.warning("tracker_unavailable", error=str(exc))
        windows = await asyncio.to_thread(self.tmux.list_windows)
        workspaces = await asyncio.to_thread(self.jj.list_workspaces)
        return Observed(
            issues=issues,
            windows=output_marks(windows, self.store),
            workspaces=tuple(workspaces),
            records=self.store.load_records(),
            tracker_ok=tracker_ok,
            trunk_red=self.trunk_red(),
        )

    def trunk_red(self) -> bool:
        return self.store.paths.trunk_red_file.exists()

    async def recheck_red_trunk(self) -> None:
        """While trunk is red, verify it again once it has moved (a person pushed a
        fix); green again → merges resume. Costs one jj call per tick while red."""
        marker = self.store.paths.trunk_red_file
        if not marker.exists() or not self.settings.verify_command:
            return
        commit_of = getattr(self.jj, "trunk_commit", None)
        if commit_of is None:
            return
        try:
            red_at = json.loads(marker.read_text()).get("commit")
        except (OSError, ValueError, AttributeError):
            red_at = None
        now_at = await asyncio.to_thread(commit_of)
        if red_at is not None and now_at == red_at:
            return
        outcome = await self._run_trunk_verify()
        if outcome is None or not outcome.ok:
            self._mark_red(outcome, now_at)
            return
        marker.unlink(missing_ok=True)
        self.store.append_event("trunk_green", commit=now_at)

    # -- tick ---------------------------------------------------------------

    async def tick(self) -> TickResult:
        self.tick_number += 1
        started = time.monotonic()
        structlog.contextvars.bind_contextvars(tick=self.tick_number)
        try:
            try:
                await self.recheck_red_trunk()
            except (RalphError, OSError) as exc:
                self.store.append_event("trunk_recheck_failed", error=str(exc))
            observed = await self.observe()
            if not observed.tracker_ok:
                self.store.append_event("tracker_unavailable", error=self.tracker_error)
            now = self.clock()
            plan = decide(observed, self.settings, now)
            result = TickResult(self.tick_number, plan, observed)
            failed_issues: set[str] = set()
            by_id = {issue.identifier: issue for issue in observed.issues}
            for action in plan.actions:
                if self.stopping:
                    break
                if action.issue in failed_issues:
                    continue  # the rest of this issue's chain waits for a later tick
                if isinstance(action, Merge) and self.trunk_red():
                    failed_issues.add(action.issue)  # a merge earlier this tick turned trunk red
                    continue
                try:
                    self.write_heartbeat(observed, plan, acting=action.kind)
                    await self.act(action, by_id.get(action.issue), observed)
                except (RalphError, OSError) as exc:
                    failed_issues.add(action.issue)
                    result.failures.append((action, str(exc)))
                    if isinstance(action, Spawn | Restart):
                        # a half-made spawn counts as a failed attempt: back off before the next
                        self.store.update_record(action.issue, last_failure_at=self.clock(),
                                                 last_failure=str(exc)[:500])
                    log.warning("action_failed", action=action.kind, issue=action.issue,
                                error=str(exc))
                    self.store.append_event(
                        "action_failed", issue=action.issue, action=action.kind,
                        reason=action.reason, error=str(exc),
                        retryable=getattr(exc, "retryable", True),
                    )
                else:
                    self.store.append_event(action.kind, issue=action.issue, reason=action.reason,
                                            **_action_details(action))
            self.tick_seconds.observe(time.monotonic() - started)
            self.write_heartbeat(observed, plan)
            return result
        finally:
            structlog.contextvars.unbind_contextvars("tick")

    def write_heartbeat(self, observed: Observed, plan: Plan, *,
                        acting: str | None = None) -> None:
        live = [w for w in worker_windows(observed.windows) if w.alive]
        self.store.write_heartbeat(
            tick=self.tick_number,
            workers=len(live),
            issues=len(observed.issues),
            actions=len(plan.actions),
            tracker_ok=observed.tracker_ok,
            tracker_usage=self.tracker.usage() if hasattr(self.tracker, "usage") else None,
            acting=acting,
            tick_seconds=self.tick_seconds.as_json(),
        )

    # -- act ----------------------------------------------------------------

    async def act(self, action: Action, issue: Issue | None, observed: Observed) -> None:
        log.info("act", action=action.kind, issue=action.issue, reason=action.reason)
        labels = self.settings.labels
        match action:
            case Spawn() | Restart():
                if isinstance(action, Restart):
                    self._kill_windows(action.issue, observed)
                    self.store.update_record(action.issue, last_failure_at=self.clock(),
                                             last_failure=action.reason)
                await self._spawn(action, issue)
            case Nudge():
                for window in self._windows(action.issue, observed, alive=True):
                    await asyncio.to_thread(self.tmux.send_text, window.pane_id, action.message)
                self.store.update_record(action.issue, nudged_at=self.clock())
            case Reap():
                self._kill_windows(action.issue, observed)
                self.store.update_record(action.issue, last_failure_at=self.clock(),
                                         last_failure=action.reason)
            case Kill():
                self._kill_windows(action.issue, observed)
            case Merge():
                await self._merge(action, issue)
            case Forget():
                # in PR mode the change lives on under its pushed bookmark, not in trunk
                keep = action.keep_bookmark or self.settings.merge.mode == "pr"
                await asyncio.to_thread(self.jj.forget, action.issue, keep_bookmark=keep)
                self.store.delete_record(action.issue)
            case Hold():
                await self.tracker.add_labels(action.issue, [labels.user_input_needed])
                await self.tracker.comment(action.issue, action.comment or action.reason)
            case Complete():
                await self.tracker.set_state(action.issue, type=StateType.COMPLETED)
            case RelayFeedback():
                for window in self._windows(action.issue, observed, alive=True):
                    await asyncio.to_thread(self.tmux.send_text, window.pane_id,
                                            FEEDBACK_MESSAGE.format(issue=action.issue))
                await self.tracker.remove_labels(
                    action.issue, [labels.user_feedback_given, labels.user_input_needed]
                )
                held = issue is not None and labels.user_input_needed.casefold() in {
                    name.casefold() for name in issue.labels}
                if held:
                    # a person answered a hold: like Resume, the attempt count starts over,
                    # or a worker that asked on its last attempt and then died would be
                    # held again with the answer ignored
                    self.store.update_record(action.issue, blocked=False, attempts=0,
                                             last_failure_at=None, nudged_at=None)
                else:
                    self.store.update_record(action.issue, blocked=False)
            case Resume():
                await self.tracker.remove_labels(
                    action.issue, [labels.user_feedback_given, labels.user_input_needed]
                )
                self.store.update_record(action.issue, attempts=0, blocked=False,
                                         last_failure_at=None, nudged_at=None)
            case _:
                raise RalphError(f"unknown action {action!r}")

    def _windows(self, name: str, observed: Observed, *, alive: bool | None = None) -> list[Window]:
        return [w for w in observed.windows
                if w.name == name and (alive is None or w.alive == alive)]

    def _kill_windows(self, name: str, observed: Observed) -> None:
        for window in self._windows(name, observed):
            self.tmux.kill_window(window.window_id)

    async def _spawn(self, action: Spawn | Restart, issue: Issue | None) -> None:
        if issue is None:
            raise TrackerError(f"{action.issue}: not in the tracker's answer this tick")
        workspace = await asyncio.to_thread(self.jj.add_workspace, action.issue)
        feedback = human_feedback(issue)
        record = self.store.update_record(
            action.issue, role=action.role, attempts=action.attempt, started_at=self.clock(),
            done=False, blocked=False, nudged_at=None, iterations=0,
        )
        if issue.state_type in (StateType.UNSTARTED, StateType.BACKLOG, StateType.TRIAGE):
            await self.tracker.set_state(action.issue, type=StateType.STARTED)
        launch = self._launch(issue, action, workspace, feedback)
        try:
            await asyncio.to_thread(
                self.tmux.open_window,
                action.issue,
                cwd=launch.cwd,
                command=launch.argv,
                environment=launch.env,
                log_file=self.store.log_path(action.issue),
            )
        except BaseException:
            discard_secrets(launch)  # the launcher that would have deleted them never ran
            raise
        log.info("spawned", issue=action.issue, role=record.role.value, attempt=record.attempts)

    def _launch(self, issue: Issue, action: Spawn | Restart, workspace: Path,
                feedback: str | None) -> Any:
        from ralph_dev.agent.launch import build_launch

        build = self.launcher or build_launch
        model = action.model or self.settings.agent.model
        return build(self.settings, issue, action.role, workspace, model,
                     attempt=action.attempt, feedback=feedback)

    async def _merge(self, action: Merge, issue: Issue | None) -> None:
        if self.settings.merge.mode == "pr":
            result = await asyncio.to_thread(self.jj.publish, action.issue,
                                             self.settings.merge.remote)
        else:
            result = await asyncio.to_thread(self.jj.merge, action.issue)
        if result.conflicted:
            from ralph_dev.core.model import Role

            self.store.update_record(action.issue, done=False, role=Role.RESOLVE)
            self.store.append_event("merge_conflict", issue=action.issue,
                                    detail=result.detail)
            with contextlib.suppress(TrackerError):
                await self.tracker.comment(
                    action.issue,
                    f"ralph-dev: merging {action.issue} into {self.settings.trunk} conflicted; "
                    "trunk is untouched and a resolve worker will take the workspace.",
                )
            raise MergeConflict(f"{action.issue}: merge into {self.settings.trunk} conflicted")
        if not result.merged:
            log.info("nothing_to_merge", issue=action.issue, detail=result.detail)
            return
        self.store.update_record(action.issue, merged=True)
        if self.settings.merge.mode == "pr":
            await self._open_pull_request(action.issue, issue)
            return
        if self.settings.merge.verify_trunk and self.settings.verify_command:
            await self._verify_trunk(action.issue)

    async def _open_pull_request(self, name: str, issue: Issue | None) -> None:
        """``gh pr create`` for the pushed bookmark; the URL goes on the issue.

        Title and body are argv elements (never a shell line); the body is the
        worker's own summary, which ralph-dev recorded.
        """
        from ralph_dev.adapters.jj import JJ

        record = self.store.load_record(name)
        title = f"{name}: {issue.title if issue else name}"
        body = (record.summary if record and record.summary else "") + \
            f"\n\nOpened by ralph-dev for {name}."
        argv = [self.settings.merge.gh_bin, "pr", "create", "--head", JJ.bookmark(name),
                "--base", self.settings.trunk, "--title", title[:250], "--body", body]
        try:
            proc = await asyncio.to_thread(
                subprocess.run, argv, cwd=self.settings.repo, capture_output=True, text=True,
                stdin=subprocess.DEVNULL, timeout=120, check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise PullRequestFailed(f"{name}: `gh pr create` did not answer in 120 s") from exc
        if proc.returncode != 0 and "already exists" in proc.stderr:
            # a retried tick: the pull request from the first try is still there
            self.store.append_event("pull_request", issue=name, url=proc.stderr.strip()[-300:])
            return
        if proc.returncode != 0:
            raise PullRequestFailed(
                f"{name}: `gh pr create` failed (exit {proc.returncode}): "
                f"{proc.stderr.strip()[-500:]}; is gh installed and authenticated (gh auth status)?"
            )
        url = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        self.store.append_event("pull_request", issue=name, url=url)
        with contextlib.suppress(TrackerError):
            await self.tracker.comment(name, f"ralph-dev: opened a pull request for {name}: {url}")

    async def _run_trunk_verify(self) -> Any:
        """The verify command on trunk's files, beating while it runs (it may take
        longer than the daemon's heartbeat patience)."""
        from ralph_dev.adapters.verify import run_verify

        checkout = getattr(self.jj, "trunk_checkout", None)
        if checkout is None or not self.settings.verify_command:
            return None
        cwd = await asyncio.to_thread(checkout)
        work = asyncio.ensure_future(
            asyncio.to_thread(run_verify, self.settings.verify_command, cwd))
        while not work.done():
            self.store.write_heartbeat(tick=self.tick_number, acting="verify_trunk")
            await asyncio.wait([work], timeout=30)
        return work.result()

    def _mark_red(self, outcome: Any, commit: str | None) -> None:
        data = json.loads(outcome.to_json()) if outcome is not None else {}
        atomic_write_text(self.store.paths.trunk_red_file,
                          json.dumps({**data, "commit": commit}) + "\n")

    async def _verify_trunk(self, issue: str) -> None:
        outcome = await self._run_trunk_verify()
        if outcome is None or outcome.ok:
            return
        commit_of = getattr(self.jj, "trunk_commit", None)
        commit = await asyncio.to_thread(commit_of) if commit_of else None
        self._mark_red(outcome, commit)
        self.store.append_event("trunk_red", issue=issue, exit_code=outcome.exit_code)
        with contextlib.suppress(TrackerError):
            await self.tracker.comment(
                issue,
                f"ralph-dev: after merging {issue}, `{outcome.command}` failed on "
                f"{self.settings.trunk} (exit {outcome.exit_code}). Merges are paused until "
                f"trunk is green: fix {self.settings.trunk} and ralph-dev verifies it again "
                f"as soon as it moves.\n\n{outcome.output_tail}",
            )

    # -- loop ---------------------------------------------------------------

    async def run(self, *, max_ticks: int | None = None,
                  wake: asyncio.Event | None = None) -> None:
        """Tick until asked to stop (SIGTERM/SIGINT set a flag; the loop checks it)."""
        wake = wake or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: kill-window
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._request_stop, wake)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            # `ralph-dev worker done/blocked` pokes the controller: tick now, not at the poll
            loop.add_signal_handler(signal.SIGUSR1, wake.set)
        self.store.append_event("controller_started", pid=os.getpid())
        quick = 0  # ticks in a row taken at once; bounded so nothing can spin
        try:
            while not self.stopping:
                again = False
                try:
                    again = (await self.tick()).unblocked_work and quick < QUICK_TICKS
                except Exception as exc:  # the loop must outlive any bad tick
                    log.exception("tick_failed")
                    self.store.append_event("tick_failed", error=repr(exc))
                if max_ticks is not None and self.tick_number >= max_ticks:
                    break
                if again:
                    quick += 1
                    continue
                quick = 0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.settings.timing.poll_interval)
                wake.clear()
        finally:
            from ralph_dev.adapters.verify import kill_running

            kill_running()  # a trunk verify still running must not outlive us
            self.store.append_event("controller_stopped", pid=os.getpid(), tick=self.tick_number)
            with contextlib.suppress(Exception):
                await self.tracker.close()

    def _request_stop(self, wake: asyncio.Event) -> None:
        self.stopping = True
        wake.set()


class MergeConflict(RalphError):
    retryable = True


class PullRequestFailed(RalphError):
    retryable = True


def _action_details(action: Action) -> dict[str, Any]:
    details: dict[str, Any] = {}
    for f in dataclasses.fields(action):
        if f.name in ("issue", "reason"):
            continue
        value = getattr(action, f.name)
        if value not in (None, "", False):
            details[f.name] = value
    return details


def controller_lock(path: Path) -> contextlib.AbstractContextManager[None]:
    """An OS lock so only one controller runs per project."""
    from ralph_dev.core.fsutil import pid_lock

    return pid_lock(path, lambda holder: ControllerLocked(
        f"a controller already runs for this project (pid {holder}, lock {path}); "
        "stop it first with `ralph-dev stop`"
    ))


def discard_secrets(launch: Any) -> None:
    """Delete a launch's secrets file when its window never started."""
    spec = getattr(launch, "spec_file", None)
    if spec is not None:
        Path(spec).with_suffix(".secrets.json").unlink(missing_ok=True)


def poke_controller(store: StateStore) -> None:
    """Ask the running controller (pid from its heartbeat) to tick now; best effort."""
    beat = store.read_heartbeat()
    pid = beat.get("pid") if beat else None
    if not isinstance(pid, int) or pid <= 1:
        return
    # SIGUSR1 ends a process that does not handle it: make sure the pid (from a file
    # that may be stale) is still a ralph-dev controller before sending it.
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if b"ralph_dev" in cmdline and b"controller" in cmdline:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGUSR1)


def human_feedback(issue: Issue) -> str | None:
    """Comments people wrote after ralph-dev last spoke: what a resumed worker must read."""
    newest: list[str] = []
    for comment in reversed(issue.comments):
        if comment.by_ralph:
            break
        newest.append(f"{comment.author} ({comment.created_at:%Y-%m-%d %H:%M}): {comment.body}")
    return "\n\n".join(reversed(newest)) or None


def worker_windows(windows: Sequence[Window]) -> list[Window]:
    """Windows of the project's session named by an issue identifier: its workers.

    By shape, not by ``settings.key``: Linear identifiers carry their team's key.
    """
    return [w for w in windows if IDENTIFIER_RE.fullmatch(w.name)]
