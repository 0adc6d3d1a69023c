"""Observe: everything one tick's ``decide`` needs, read now.

One tmux call, one jj call, the tracker's issue list and ralph-dev's own records; a
renumbered issue keeps the name its worker started with (:func:`observe`, shared
with ``ralph-dev plan``, which observes but never acts). The controller's
:class:`Observer` adds the facts its rules need beyond the world itself: whether
workers can start, whether jj can use the repository, what the tracker said, what
the host has free, what the agents spent, what the tripwires saw, the merge lane's
verify run (running beside the loop, or what it came to), trunk's commit while it is
red or the lane has a run, and the tracker writes workers' reports still owe. Observing
decides nothing and writes nothing a person sees; it only keeps ralph-dev's own
files in order (pane logs rotated, spend counted, the workers' views refreshed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import structlog

from ralph_dev.adapters import host
from ralph_dev.adapters.accounts import AccountPauses, AccountWindows, KeyProbe
from ralph_dev.adapters.files import read_tail
from ralph_dev.adapters.pattern_store import settle_safely
from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.writebacks import WriteBackQueue
from ralph_dev.control.loop.costs import Spending
from ralph_dev.control.loop.egress import EgressWatch
from ralph_dev.control.loop.merging import MergeLane, read_lane, read_trunk_due
from ralph_dev.control.loop.tripwires import Tripwires
from ralph_dev.control.loop.worker_dirs import WorkerDirs
from ralph_dev.core.agent_profiles import aware_roles
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.decide.swarm import REPO_PAUSE
from ralph_dev.core.errors import RalphError, TrackerError
from ralph_dev.core.model import (
    MODEL_CALL_STATES,
    HostSlots,
    Issue,
    Observed,
    Role,
    Window,
    WorkerRecord,
    worker_windows,
)
from ralph_dev.core.ports import (
    Repository,
    ScreenReader,
    TrackerReader,
    WindowLister,
    WorkerHost,
    WorkspaceLister,
)
from ralph_dev.core.renumber import keep_local_names, local_aliases
from ralph_dev.core.text import last_words, strip_ansi

log = structlog.get_logger(__name__)

SetupCheck = Callable[[ProjectSettings], None]
"""Raises a :class:`RalphError` naming the problem and its fix when workers cannot start
(``agent.probe.WorkerSetupCheck``: the agent program, checked on the spot, and the last
answer of a real probe in a worker's sandbox, which runs beside the loop). It must
return at once: the tick never waits for a probe."""


def _mtime(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except (OSError, ValueError):
        return None


def _pane_log(store: StateStore, window: Window) -> Path | None:
    try:
        return store.log_path(window.name)
    except ValueError:
        return None  # not a worker's window: no log of its own


def output_marks(windows: Sequence[Window], store: StateStore,
                 records: Mapping[str, WorkerRecord], *,
                 agent_aware: Collection[Role] = frozenset()) -> tuple[Window, ...]:
    """Stamp each window with when its worker last did something.

    For a CLI whose profile reports its state (Claude Code; ``agent_aware`` names the
    roles running one) that is the agent's own account: its hooks
    (``last_activity``) and its transcript's growth. Its pane is no witness: the
    spinner keeps printing while a model call hangs. For the ``command`` runner it
    is the pane: the pipe-pane log's mtime changes exactly when the pane prints.
    Either way no per-window tmux call is needed (the tick stays at one).
    """
    marked = []
    for window in windows:
        record = records.get(window.name)
        if record is not None and record.role in agent_aware:
            stamps = [t for t in (record.last_activity, record.started_at,
                                  _mtime(Path(record.transcript)) if record.transcript else None)
                      if t is not None]
            changed = max(stamps) if stamps else None
        else:
            log_file = _pane_log(store, window)
            changed = _mtime(log_file) if log_file is not None else None
        if changed is not None:
            window = dataclasses.replace(window, output_changed_at=changed)
        if not window.alive and (log_file := _pane_log(store, window)) is not None:
            said, _ = read_tail(log_file, limit=LAST_WORDS_BYTES)
            window = dataclasses.replace(window, last_words=last_words(
                said.decode(errors="replace")))
        marked.append(window)
    return tuple(marked)


LAST_WORDS_BYTES = 4096
"""Of a dead pane's log, the end read for its last words."""


RETRY_LINE = re.compile(r"Retrying in (\S+)(?: \([^)]{0,80}\))? · attempt (\d{1,3})/(\d{1,3})")
"""Claude Code's status line while it retries a refused or failed model call by itself
(its screen redraws only what changes, so the line is read from the screen, not the
pane's log)."""


RETRY_LINES = 12
"""Screen lines read for it: the status line sits just above the prompt box."""


WAIT_PART = re.compile(r"(\d{1,6}(?:\.\d{1,3})?)(ms|s|m|h)")
WAIT_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
RETRY_WAIT_CAP = 900.0
"""The longest announced wait believed (a garbled screen never hides a hang for long)."""


@dataclasses.dataclass(frozen=True)
class RetrySeen:
    said: str
    """In a few words: "retrying in 8s, attempt 5/10"."""
    wait_s: float
    """How long the CLI said it waits before its next call."""


def read_retry(screen: str) -> RetrySeen | None:
    """The retry a pane's screen shows, or None."""
    said = RETRY_LINE.findall(strip_ansi(screen))
    if not said:
        return None
    wait, attempt, of = said[-1]
    seconds = sum(float(n) * WAIT_UNITS[unit] for n, unit in WAIT_PART.findall(wait))
    return RetrySeen(f"retrying in {wait[:12]}, attempt {attempt}/{of}",
                     min(seconds, RETRY_WAIT_CAP))


async def observe(tracker: TrackerReader, tmux: WindowLister, jj: WorkspaceLister,
                  store: StateStore, *, agent_aware: Collection[Role] = frozenset()
                  ) -> tuple[Observed, TrackerError | None]:
    """The world: issues, windows, workspaces and records, read now; and the tracker's
    error when it could not be read."""
    async def read_issues() -> tuple[tuple[Issue, ...], TrackerError | None]:
        try:
            return tuple(await tracker.list_issues()), None
        except TrackerError as exc:
            log.warning("tracker_unavailable", error=str(exc))
            return (), exc

    # at once: each waits on another process (the tracker, tmux, jj), and a tick is as
    # long as the slowest of them, not their sum
    (issues, tracker_error), windows, workspaces = await asyncio.gather(
        read_issues(), asyncio.to_thread(tmux.list_windows),
        asyncio.to_thread(jj.list_workspaces))
    records = store.load_records()
    local = {*records, *(w.name for w in windows), *(w.name for w in workspaces)}
    renamed = tracker.renamed()
    if aliases := local_aliases(renamed, local):
        log.info("issues_renumbered", kept_as=aliases)  # its one worker keeps its name
    issues = keep_local_names(issues, renamed, local)
    observed = Observed(
        issues=issues,
        windows=output_marks(windows, store, records, agent_aware=agent_aware),
        workspaces=tuple(workspaces),
        records=records,
        tracker_ok=tracker_error is None,
        tracker_error=str(tracker_error) if tracker_error is not None else None,
        tracker_refuses=tracker_error is not None and not tracker_error.retryable,
        trunk_red=store.paths.trunk_red_file.exists(),
        pauses=store.load_pauses(),
        lane=read_lane(store.paths.lane_dir),
        trunk_due=read_trunk_due(store.paths.lane_dir),
    )
    return observed, tracker_error


class RetryWatch:
    """Claude Code workers silent in a model call for longer than ``hang_timeout`` whose
    screens say the CLI retries by itself. Only those few panes are read (one tmux call
    each), since only they could be taken for hung. Seen retrying is seen alive
    (``last_activity``), and the call it announced is counted from when it is due: while
    that call is under way the screen no longer says "Retrying", and a tick that lands
    then must not take it for hung."""

    def __init__(self, settings: ProjectSettings, screens: ScreenReader,
                 store: StateStore) -> None:
        self.settings = settings
        self.screens = screens
        self.store = store
        self.seen: dict[str, tuple[datetime, RetrySeen]] = {}
        """The retry each silent worker's screen last showed, and when it was read."""

    def read(self, observed: Observed, now: datetime) -> dict[str, str]:
        """Worker → its retry in a few words."""
        aware = aware_roles(self.settings)
        if not aware:
            return {}
        timeout = timedelta(seconds=self.settings.timing.hang_timeout)
        quiet_since = now - timeout
        found = {}
        for window in observed.windows:
            record = observed.records.get(window.name)
            changed = window.output_changed_at
            if not window.alive or record is None or changed is None \
                    or record.role not in aware or record.agent_state not in MODEL_CALL_STATES \
                    or changed.replace(tzinfo=changed.tzinfo or UTC) > quiet_since:
                continue
            try:
                retry = read_retry(self.screens.capture(window.pane_id, RETRY_LINES))
            except RalphError:
                continue  # the window went away meanwhile: nothing to read
            if retry is not None:
                found[window.name] = retry.said
                self.seen[window.name] = (now, retry)
                # a sign of life: its silence counts from here, so the gap between a
                # retry that got through and the answer's first hook is no hang
                self.store.note_facts(window.name, "observer", last_activity=now)
            elif (seen := self.seen.get(window.name)) is not None \
                    and now < seen[0] + timedelta(seconds=seen[1].wait_s) + timeout:
                found[window.name] = seen[1].said  # its announced call is under way
        for name in set(self.seen) - {w.name for w in observed.windows}:
            del self.seen[name]
        return found


class Observer:
    """The controller's look at the world and at everything its rules weigh."""

    def __init__(self, settings: ProjectSettings, *, tracker: TrackerReader,
                 host: WorkerHost, jj: Repository, store: StateStore,
                 writebacks: WriteBackQueue, dirs: WorkerDirs, merges: MergeLane,
                 tripwires: Tripwires, spending: Spending, setup_check: SetupCheck | None,
                 clock: Callable[[], datetime], accounts: AccountPauses | None = None,
                 windows: AccountWindows | None = None,
                 key_probe: KeyProbe | None = None) -> None:
        self.settings = settings
        self.tracker = tracker
        self.host = host
        self.jj = jj
        self.store = store
        self.writebacks = writebacks
        self.dirs = dirs
        self.merges = merges
        self.tripwires = tripwires
        self.spending = spending
        self.setup_check = setup_check
        self.clock = clock
        self.accounts = accounts
        """The pauses of the account this project's agents run on."""
        self.windows = windows
        """That account's usage windows."""
        self.key_probe = key_probe
        """Reads them for an API key (``ProbeAccount``)."""
        self.config_loaded_at = clock()
        """When this controller read its config."""
        self.retries = RetryWatch(settings, host, store)
        self.egress = EgressWatch(settings, store)

    async def observe(self) -> Observed:
        pauses = self.store.load_pauses()
        setup_error = self._setup_error()
        blind = Observed(tracker_ok=False, pauses=pauses, setup_error=setup_error,
                         config_loaded_at=self.config_loaded_at)
        if any(p.kind == REPO_PAUSE for p in pauses) \
                and (error := self._repository_error()) is not None:
            return dataclasses.replace(blind, repository_error=error)
        try:
            observed, _ = await observe(self.tracker, self.host, self.jj.workspaces, self.store,
                                        agent_aware=aware_roles(self.settings))
        except RalphError:  # jj could not list the workspaces: is it the repository?
            if (error := self._repository_error()) is not None:
                return dataclasses.replace(blind, repository_error=error)
            raise
        if observed.tracker_ok:
            self.dirs.publish(observed.issues)
            settle_safely(self.settings, self.store, observed, self.clock())
        over, spent_today = self._spend(observed)
        trunk_head, red_at = None, None
        lane, due = observed.lane, observed.trunk_due
        if observed.trunk_red:
            red_at = self.merges.red_at()
        lane_acts = lane is not None and lane.state not in ("void", "concluded")
        if observed.trunk_red or lane_acts or due:  # one jj call, only when a rule weighs it
            trunk_head = await asyncio.to_thread(self.jj.trunk.trunk_commit)
        slots = await self._cluster_slots(observed)
        return dataclasses.replace(
            observed, setup_error=setup_error, config_loaded_at=self.config_loaded_at,
            owed=tuple(item.owed() for item in self.writebacks.items()),
            resources=host.sample(self.settings.workspaces),
            spent_today=spent_today, over_budget=over,
            tripped=await self._tripped(observed),
            egress_refused=self._egress(observed),
            retrying=await asyncio.to_thread(self.retries.read, observed, self.clock()),
            trunk_head=trunk_head, trunk_red_at=red_at,
            unadopted=self._unadopted(observed),
            cluster_slots=slots.free if slots is not None else None,
            host_slots=max((node.slots for node in slots.nodes), default=0) if slots else 0,
            host_loads=self.host.shared_with(),
            account_pauses=self.accounts.read(self.clock()) if self.accounts else (),
            account=self.accounts.account if self.accounts else "",
            account_windows=self.windows.read(self.clock()) if self.windows else (),
            key_account=self.key_probe is not None and self.key_probe.possible,
            account_probed_at=self.key_probe.windows.last_probe()[0]
            if self.key_probe is not None and self.key_probe.possible else None,
            sessions_kept=self._sessions_kept(observed))

    async def _cluster_slots(self, observed: Observed) -> HostSlots | None:
        """Worker slots where workers run beyond this host, with what runs there kept
        for ``status`` (None: on this host only)."""
        slots = await asyncio.to_thread(self.host.slots)
        if slots is not None:
            self.store.write_cluster(observed.windows, slots.free, list(slots.nodes))
        return slots

    def _sessions_kept(self, observed: Observed) -> frozenset[str]:
        """Issues whose agent session a new start can resume: its transcript is here (a
        worker on another host's only once its end brought it back: the kept copy)."""
        kept = set()
        for name, record in observed.records.items():
            if record.session_id is None or record.transcript is None:
                continue
            transcript = Path(record.transcript)
            if record.node and transcript != self.dirs.kept_transcript(name, record.session_id):
                continue
            if transcript.is_file():
                kept.add(name)
        return frozenset(kept)


    def _setup_error(self) -> str | None:
        if self.setup_check is None:
            return None
        try:
            self.setup_check(self.settings)
        except RalphError as exc:
            return str(exc)
        return None

    def _repository_error(self) -> str | None:
        """Whether jj can use the repository at all (one jj call): jj missing, the
        repository gone or not a jj repository, the trunk bookmark deleted."""
        try:
            self.jj.trunk.check_repo()
        except RalphError as exc:
            return str(exc)
        return None

    def _spend(self, observed: Observed) -> tuple[dict[str, str], float]:
        """Pane logs kept small and spend counted; a failure here never fails the tick."""
        for window in observed.windows:
            if window.alive and window.name in observed.records:
                self.store.rotate_log(window.name)
        try:
            return self.spending.account(observed.records)
        except (RalphError, OSError) as exc:
            log.warning("spend_unread", error=str(exc))
            return {}, 0.0

    def _egress(self, observed: Observed) -> dict[str, tuple[int, str]]:
        try:
            return self.egress.read(observed.records, (w.name for w in observed.windows))
        except (RalphError, OSError) as exc:
            log.warning("egress_unread", error=str(exc))
            return {}

    async def _tripped(self, observed: Observed) -> dict[str, str]:
        try:
            return await self.tripwires.check(observed)
        except (RalphError, OSError) as exc:
            log.warning("tripwires_unread", error=str(exc))
            return {}

    def _unadopted(self, observed: Observed) -> frozenset[str]:
        """Live workers with a record and a workspace but no run directory: started by a
        release before the worker mailbox."""
        workspaces = {w.name: w for w in observed.workspaces}
        issues = {i.identifier for i in observed.issues}
        return frozenset(
            w.name for w in worker_windows(observed.windows)
            if w.alive and w.name in observed.records and w.name in issues
            and (ws := workspaces.get(w.name)) is not None and ws.path
            and not self.dirs.worker_dir(w.name).is_dir())
