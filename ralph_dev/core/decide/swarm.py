"""The rules for the swarm as a whole: pauses and their ends, agents that go on after a
pause, trunk's second verify, workers a budget or a tripwire stops, holds a failure
asked for, the tracker writes workers' reports owe, and old workers to adopt.

Each rule reads facts observe gathered (what the host has free, what the agent check
said, what the tracker answered, what was spent…) and emits actions; none of them
looks at anything else, so a pause, its cause and its end are all visible in the
plan and its events.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ralph_dev.core.actions import (
    SWARM,
    Action,
    Adopt,
    Continue,
    EndPause,
    Hold,
    PauseSwarm,
    Stop,
    Tell,
    TrunkVerified,
    VerifyTrunk,
    Waited,
    WriteBack,
)
from ralph_dev.core.agent_faults import (
    API_ACCESS,
    API_OUTAGE,
    RATE_LIMIT,
    USAGE_LIMIT,
    AgentFault,
    classify_stop_failure,
)
from ralph_dev.core.config import Limits, ProjectSettings
from ralph_dev.core.decide.world import World, aware
from ralph_dev.core.model import Observed, OwedWrite, Pause, Resources, WorkerRecord
from ralph_dev.core.policy import HOOK_LOST, Blame, hold_comment, retry_policy
from ralph_dev.core.writeback import said

SHARED_RECHECK = timedelta(seconds=1)
"""How soon a pause another project met is looked at again once its end has passed:
that project ends it there (or probes on) at its own next tick."""
SETUP_PAUSE = "setup"
"""Workers cannot start (the agent program, its sandbox): ends once the check passes."""
REPO_PAUSE = "repository"
"""jj cannot use the repository: the tick acts on nothing until it can."""
TRACKER_PAUSE = "tracker"
"""The tracker refuses ralph-dev (a revoked key): ends once it answers."""
HOOK_PAUSE = "hook"
"""The after_create hook cannot run: ends when the config is read again."""
RESOURCES_PAUSE = "resources"
BUDGET_PAUSE = "budget"
AGENT_PAUSES = (USAGE_LIMIT, RATE_LIMIT, API_OUTAGE, API_ACCESS)
PROBE_DEADLINE = timedelta(minutes=10)
"""How long an outage's probe may go unanswered (Claude Code retries by itself meanwhile)
before the next step tries another worker's session."""

RESOURCES_MARGIN = 1.1
"""A resources pause lifts only once every figure is back with this margin (no flapping)."""
def shortage(have: Resources, limits: Limits, margin: float = 1.0) -> str | None:
    """Why a new worker must wait (every figure short of its floor), or None."""
    short = []
    if have.free_memory_mb is not None and have.free_memory_mb < limits.min_free_memory_mb * margin:
        short.append(f"{have.free_memory_mb:.0f} MB of memory available, below "
                     f"limits.min_free_memory_mb = {limits.min_free_memory_mb}")
    if have.free_disk_mb is not None and have.free_disk_mb < limits.min_free_disk_mb * margin:
        short.append(f"{have.free_disk_mb:.0f} MB free for workspaces, below "
                     f"limits.min_free_disk_mb = {limits.min_free_disk_mb}")
    ceiling = limits.max_load_per_cpu
    if ceiling > 0 and have.load_per_cpu is not None and have.load_per_cpu > ceiling / margin:
        short.append(f"load {have.load_per_cpu:.1f} per CPU, above "
                     f"limits.max_load_per_cpu = {ceiling:g}")
    return "; ".join(short) or None


def agent_fault(record: WorkerRecord, settings: ProjectSettings) -> AgentFault | None:
    """The pause the API error a worker's agent last stopped on calls for."""
    if record.agent_error is None or record.agent_error_at is None:
        return None
    return classify_stop_failure(record.agent_error, record.agent_error_text or "",
                                 aware(record.agent_error_at),
                                 outage_wait=timedelta(seconds=settings.timing.outage_wait),
                                 streak=record.agent_error_streak,
                                 reset_at=aware(record.agent_error_reset_at)
                                 if record.agent_error_reset_at else None)


@dataclass
class SwarmRules:
    """The swarm-wide part of one plan; ``pauses`` is what is in force once it is done."""

    world: World
    now: datetime
    actions: list[Action] = field(default_factory=list)
    pauses: dict[str, Pause] = field(default_factory=dict)

    @property
    def observed(self) -> Observed:
        return self.world.observed

    @property
    def settings(self) -> ProjectSettings:
        return self.world.settings

    def run(self) -> list[Action]:
        self.pauses = {p.kind: p for p in self.observed.pauses}
        self.pause_ends()
        self.repository()
        if self.observed.repository_error is not None:
            return self.actions  # nothing else is seen: nothing else is acted on
        self.setup()
        self.tracker()
        self.hook()
        self.resources()
        self.day_budget()
        self.agent_pauses()
        self.account()
        self.agents_go_on()
        self.trunk()
        self.write_backs()
        self.adoption()
        return self.actions

    # -- pauses --------------------------------------------------------------------------

    def start(self, kind: str, cause: str, fix: str, *, until: datetime | None = None,
              quiet_workers: bool = False, probe: str | None = None,
              shared_from: str = "") -> None:
        self.pauses[kind] = Pause(kind=kind, cause=cause, fix=fix, since=self.now, until=until,
                                  quiet_workers=quiet_workers, probe=probe,
                                  shared_from=shared_from)
        doing = f"probing the model API through {probe}'s session: " if probe else ""
        self.actions.append(PauseSwarm(SWARM, f"pausing the swarm: {doing}{cause}",
                                       pause_kind=kind, cause=cause, fix=fix, until=until,
                                       quiet_workers=quiet_workers, probe=probe,
                                       shared_from=shared_from,
                                       share_account=kind in AGENT_PAUSES and not shared_from))

    def end(self, kind: str, why: str) -> None:
        ended = self.pauses.pop(kind, None)
        if ended is not None:
            self.actions.append(EndPause(
                SWARM, f"the {kind} pause ends: {why}", pause_kind=kind,
                share_account=kind in AGENT_PAUSES and not ended.shared_from))

    def account(self) -> None:
        """A pause another project on the same account met (its usage limit, an outage)
        is this project's too, at once and for as long as it lasts there: no start here
        meets it again. This project's own, longer pause of the kind stands."""
        shared = {p.kind: p for p in self.observed.account_pauses}
        for kind, pause in shared.items():
            current = self.pauses.get(kind)
            if current is not None and not current.shared_from and (
                    current.until is None or pause.until is None
                    or aware(current.until) >= aware(pause.until)):
                continue
            if current is not None and current.shared_from == pause.shared_from \
                    and current.until == pause.until:
                continue
            self.start(kind, f"{pause.cause} (met by project {pause.shared_from}, on the "
                             "same account)", pause.fix, until=pause.until, quiet_workers=True,
                       shared_from=pause.shared_from)
        for kind, current in list(self.pauses.items()):
            if current.shared_from and kind not in shared:
                self.end(kind, f"project {current.shared_from}'s pause on the same account "
                               "is over")

    def pause_ends(self) -> None:
        """A pause with a stated end (an API-stated reset, a day's budget) ends then. One
        whose end was a guess (an outage's step, a reset stated to the minute, a limit
        that refused at its reset) sends one probe instead: the first worker its error
        stopped goes on in its own session while the others keep waiting, and the pause
        stands until the model answers that worker (then everyone goes on) or it fails
        again (the next step). Guessing costs the API one worker's calls, not every
        worker's."""
        for pause in list(self.pauses.values()):
            if pause.until is None or aware(pause.until) > self.now or pause.shared_from:
                continue  # (another project's lasts as long as it does there: ``account``)
            probe = self.probe_for(pause)
            if probe is None:
                self.end(pause.kind, "its stated end has passed")
                continue
            self.start(pause.kind, pause.cause, pause.fix, until=self.now + PROBE_DEADLINE,
                       quiet_workers=True, probe=probe.issue)
            self.actions.append(Continue(
                probe.issue, f"{probe.issue}: probing the model API: it goes on in its own "
                             "session while the other workers wait", after=probe.agent_error
                or "", typed=True))

    def probe_for(self, pause: Pause) -> WorkerRecord | None:
        """The live worker that tries the API first at the pause's end, if its end was a
        guess (``AgentFault.probe``: an outage's step, a reset stated to the minute, a
        limit that refused at its reset)."""
        for record in sorted(self.world.records.values(), key=lambda r: r.issue):
            fault = agent_fault(record, self.settings)
            if fault is not None and fault.kind == pause.kind and fault.probe \
                    and self.world.live(record.issue):
                return record
        return None

    def probe_answered(self) -> bool:
        """The outage's probe was answered (the model answered its worker: a tool call or
        a turn sent on, which clears its error streak), or it is gone: the pause ends."""
        answered = False
        for pause in [p for p in self.pauses.values() if p.probe is not None]:
            record = self.world.records.get(pause.probe or "")
            if record is None or not self.world.live(pause.probe or ""):
                self.end(pause.kind, f"its probe {pause.probe} is gone, so the others try again")
                answered = True
            elif record.agent_error is None and record.agent_error_streak == 0:
                self.end(pause.kind, f"the model API answered {pause.probe} again")
                answered = True
        return answered

    def repository(self) -> None:
        error = self.observed.repository_error
        if error is not None and REPO_PAUSE not in self.pauses:
            self.start(REPO_PAUSE, f"the repository is unusable: {error}",
                       "see the cause; ralph-dev resumes by itself once it is fixed "
                       "(running workers are left alone)")
        elif error is None:
            self.end(REPO_PAUSE, "jj can read the repository again")

    def setup(self) -> None:
        error = self.observed.setup_error
        if error is not None and SETUP_PAUSE not in self.pauses:
            self.start(SETUP_PAUSE, f"workers cannot start: {error}",
                       "see the cause; dispatch resumes by itself once the agent starts")
        elif error is None:
            self.end(SETUP_PAUSE, "the agent program is found again")

    def tracker(self) -> None:
        """A tracker that refuses ralph-dev is a setup error, said once; an outage is
        only reported (nothing starts while the tracker cannot be read anyway)."""
        obs = self.observed
        if obs.tracker_refuses and obs.tracker_error and TRACKER_PAUSE not in self.pauses:
            self.start(TRACKER_PAUSE, f"the tracker refuses ralph-dev: {obs.tracker_error}",
                       "fix the tracker's key or settings named in the cause; ralph-dev "
                       "resumes by itself once it answers")
        elif obs.tracker_ok:
            self.end(TRACKER_PAUSE, "the tracker answers again")

    def hook(self) -> None:
        """A workspace hook that cannot run fails every spawn the same way, and only a
        config change fixes it: nobody's attempt, a pause until the config is read again."""
        loaded = self.observed.config_loaded_at
        pause = self.pauses.get(HOOK_PAUSE)
        if pause is not None and loaded is not None and pause.since is not None \
                and aware(loaded) > aware(pause.since):
            self.end(HOOK_PAUSE, "the controller read its config again")
        failed = [r for r in self.world.records.values()
                  if r.lost == HOOK_LOST and r.lost_at is not None
                  and (loaded is None or aware(r.lost_at) >= aware(loaded))]
        if failed and HOOK_PAUSE not in self.pauses:
            self.start(HOOK_PAUSE, f"workspaces cannot be prepared: {failed[0].last_failure}",
                       "fix hooks.after_create in ralph-dev's config, then restart ralph-dev "
                       "(the pause ends when the controller reads its config again)")

    def resources(self) -> None:
        have = self.observed.resources
        if have is None:
            return
        paused = RESOURCES_PAUSE in self.pauses
        why = shortage(have, self.settings.limits, RESOURCES_MARGIN if paused else 1.0)
        if why is not None and not paused:
            self.start(RESOURCES_PAUSE, f"the host is short: {why}",
                       "free memory or disk, or wait for the load to drop; or change the "
                       "floor named in the cause")
        elif why is None:
            self.end(RESOURCES_PAUSE, "the host has room again")

    def day_budget(self) -> None:
        cap, spent = self.settings.costs.day_usd, self.observed.spent_today
        if cap > 0 and spent >= cap and BUDGET_PAUSE not in self.pauses:
            midnight = (self.now + timedelta(days=1)).replace(hour=0, minute=0, second=0,
                                                              microsecond=0)
            self.start(BUDGET_PAUSE, f"the swarm has spent ${spent:.2f} today, "
                                     f"costs.day_usd is ${cap:.2f}",
                       "raise costs.day_usd, or wait: dispatch resumes at midnight UTC",
                       until=midnight)

    def agent_pauses(self) -> None:
        """An agent that stopped on an API error pauses everyone (the cause is the API's),
        for as long as its error says; a later error may lengthen it, never shorten it."""
        for record in sorted(self.world.records.values(), key=lambda r: r.issue):
            fault = agent_fault(record, self.settings)
            if fault is None or fault.until <= self.now:
                continue
            current = self.pauses.get(fault.kind)
            if current is not None and current.probe is None and current.until is not None \
                    and aware(current.until) >= fault.until:
                continue  # (a probe's deadline is no wait: a new error sets the next step)
            self.start(fault.kind, fault.cause, fault.fix, until=fault.until,
                       quiet_workers=True)

    def agents_go_on(self) -> None:
        """Once no agent pause is in force, each agent that waited goes on in its session:
        one whose own turn ended on the API error is told to continue, every other live
        worker starts its stall clock again (the pause was nobody's silence)."""
        answered = self.probe_answered()
        if any(kind in self.pauses for kind in AGENT_PAUSES):
            return
        ended = any(p.quiet_workers for p in self.observed.pauses) and \
            not any(p.quiet_workers for p in self.pauses.values())
        for record in sorted(self.world.records.values(), key=lambda r: r.issue):
            fault = agent_fault(record, self.settings)
            live = self.world.live(record.issue)
            if fault is not None and (fault.until <= self.now or answered):
                self.actions.append(Continue(
                    record.issue, f"{record.issue}: the pause its agent's API error caused is "
                                  "over; " + ("it goes on in its own session" if live else
                                              "its window is gone, so there is nobody to tell"),
                    after=record.agent_error or "", typed=live))
            elif ended and live and fault is None:
                self.actions.append(Waited(
                    record.issue, f"{record.issue}: the swarm's pause is over; its stall "
                                  "clock starts again"))

    # -- trunk, stops, write-backs -------------------------------------------------------

    def trunk(self) -> None:
        """Trunk's own verify, beside the loop: a red trunk is verified again once it has
        moved (a person pushed a fix), and with ``merge.verify_trunk`` trunk is verified
        after merges moved it; an ended verify says trunk is red or green, a lost one is
        run again."""
        obs = self.observed
        run = obs.lane
        if run is not None and run.kind == "trunk":
            if run.finished:
                ok = run.state == "passed"
                self.actions.append(TrunkVerified(
                    SWARM, f"trunk's verify at {run.base[:12]} "
                           f"{'passed' if ok else f'failed (exit {run.exit_code})'}",
                    run=run.id, commit=run.base, ok=ok, after=run.after))
            elif run.state != "running":
                self.actions.append(VerifyTrunk(
                    SWARM, f"the process verifying trunk at {run.base[:12]} ended without an "
                           "outcome: verifying it again",
                    commit=run.base, after=run.after, replaces=run.id))
            return
        if not self.settings.verify_command or obs.trunk_head is None:
            return
        if obs.trunk_red and obs.trunk_head != obs.trunk_red_at:
            self.actions.append(VerifyTrunk(SWARM, f"trunk is red and moved to "
                                                   f"{obs.trunk_head[:12]}: verifying it again",
                                            commit=obs.trunk_head,
                                            replaces=run.id if run is not None else ""))
        elif obs.trunk_due and not obs.trunk_red:
            merged = [a for a in obs.trunk_due if a]
            self.actions.append(VerifyTrunk(
                SWARM, f"merges moved trunk to {obs.trunk_head[:12]}"
                       f"{' (' + ', '.join(merged) + ')' if merged else ''}: verifying it "
                       "(merge.verify_trunk)", commit=obs.trunk_head, after=tuple(merged),
                replaces=run.id if run is not None else ""))

    def write_backs(self) -> None:
        self.actions += write_backs(self.observed.owed, self.observed.tracker_ok,
                                    self.settings, self.now,
                                    config_loaded_at=self.observed.config_loaded_at)

    def adoption(self) -> None:
        for name in sorted(self.observed.unadopted):
            self.actions.append(Adopt(name, f"{name}: its worker was started before the "
                                            "worker mailbox existed; giving it one"))


def write_backs(owed: Iterable[OwedWrite], tracker_ok: bool, settings: ProjectSettings,
                now: datetime, *, config_loaded_at: datetime | None = None
                ) -> list[WriteBack]:
    """Each accepted report's tracker writes, when due: at once when new or when the
    tracker answers again after an outage (an outage is nobody's failure and costs no
    wait of its own), after the retry policy's wait when the write itself failed. One the
    tracker refused for good (its configuration, a validation, a permission) waits for
    a person (``status`` says what to fix) and is tried again once the config is read
    again after the refusal: a config edit is how most such causes are fixed."""
    policy, out = retry_policy(settings), []
    for item in owed:
        if not tracker_ok:
            continue
        if item.blame == Blame.PERMANENT and (
                config_loaded_at is None or item.failed_at is None
                or aware(config_loaded_at) <= aware(item.failed_at)):
            continue
        if item.blame == Blame.OWN and not policy.due(item.failures, item.failed_at, now):
            continue
        again = f", try {item.failures + 1}" if item.failures else ""
        out.append(WriteBack(item.issue, f"{item.issue}: its worker's {item.kind} report owes "
                                         f"tracker writes{again}", report=item.id,
                             report_kind=item.kind))
    return out


def stops(world: World) -> list[Action]:
    """Workers a person's limit stops: over budget, or suspected by a tripwire. Each is
    stopped (its work stays in its workspace) and held with the figures or the files;
    once, since a held issue is left alone."""
    settings = world.settings
    out: list[Action] = []
    feedback = settings.labels.user_feedback_given
    why_stopped: dict[str, tuple[str, str]] = {}
    for name, why in sorted(world.observed.over_budget.items()):
        why_stopped[name] = ("budget", f"{name} is over its budget: {why}. Its worker was "
                                       "stopped; its work stays in its workspace. Raise the "
                                       "budget in ralph-dev's config first")
    for name, why in sorted(world.observed.tripped.items()):
        why_stopped.setdefault(name, ("tripwire", why))
    for name, (cause, why) in why_stopped.items():
        if name not in world.issues or world.held(name):
            continue
        if name in world.windows:
            out.append(Stop(name, f"{name}: stopping its worker ({cause})", cause=cause,
                            why=why))
        out.append(Hold(name, f"{name}: stopped and held for a person",
                        comment=hold_comment(name, why, feedback)))
    return out


EGRESS_FLAG_AT = 5
"""Refused connections of one worker's run after which a person is told (a worker that
keeps trying hosts it may not reach: a task that needs one more allowed host, or an
agent talked into sending something out)."""


def egress_flags(world: World) -> list[Action]:
    """Tell the person, once per worker start, about a worker its egress proxy keeps
    refusing: where it tried, and how to allow a host it needs. The worker goes on."""
    out: list[Action] = []
    for name, (count, last) in sorted(world.observed.egress_refused.items()):
        record = world.records.get(name)
        issue = world.issues.get(name)
        if count < EGRESS_FLAG_AT or record is None or issue is None:
            continue
        mark = f"[ralph-dev] {name} keeps trying hosts it may not reach (start " \
               f"{record.host_attempt or record.attempts})"
        if said(issue, mark) is not None:
            continue
        out.append(Tell(name, f"{name}: its egress proxy refused it {count} times, last "
                              f"{last}: telling the person", mark=mark,
                        comment=f"{mark}: {count} connections refused so far, the last to "
                                f"{last} (`ralph-dev events` lists them: egress_refused). "
                                "If its task needs that host, add it to agent.allow_hosts "
                                "in ralph-dev's config (it applies to the next start); if "
                                "not, look at what the agent was asked to do."))
    return out
