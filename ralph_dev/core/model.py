"""Plain, frozen data shared by every part of ralph-dev.

The decision core reads only these types and returns only these types, so a
test can build a whole world by hand and check what ralph-dev would do in it.
Everything is tied together by the issue *identifier* (``KEY-N``): it names
the tracker issue, the tmux window, the jj workspace and the worker record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from ralph_dev.core.errors import RalphError
from ralph_dev.core.host_share import ProjectLoad

IDENTIFIER_RE = re.compile(r"[A-Z][A-Z0-9]{0,9}-[1-9][0-9]{0,8}")
"""What an issue identifier may look like.

Identifiers become window names, workspace names and file names, so anything
else (``../x``, ``A-1; rm -rf /``, 10 kB of text) is refused at the border.
"""

CONTROLLER_WINDOW = "controller"


class InvalidIdentifier(RalphError, ValueError):
    """Raised for text that is not an issue identifier."""


class InvalidLabel(RalphError, ValueError):
    """Raised for a label name people's terminals cannot show safely."""


def check_identifier(text: str) -> str:
    """Return ``text`` if it is a well-formed identifier, else raise with the fix."""
    if not isinstance(text, str) or not IDENTIFIER_RE.fullmatch(text):
        shown = text if isinstance(text, str) else repr(text)
        if len(shown) > 40:
            shown = shown[:37] + "..."
        raise InvalidIdentifier(
            f"{shown!r} is not an issue identifier: expected KEY-N such as ENG-12 "
            "(capital letters/digits, a dash, a number)"
        )
    return text


MAX_LABEL_LENGTH = 80
"""Linear's limit; the local tracker keeps the same so a plan moves between them."""


def check_label(label: object) -> str:
    """``label`` stripped, if people's terminals can show it as it is; else raise with the fix.

    Labels are printed in ``issue list/show/label`` and ``status``: one holding an
    escape sequence could retitle a pane or clear a screen, so control characters
    are refused at the door (and blanked when shown, for labels made elsewhere).
    """
    if not isinstance(label, str) or not label.strip():
        raise InvalidLabel(f"label {label!r} is empty; give a name such as 'backend'")
    label = label.strip()
    if len(label) > MAX_LABEL_LENGTH or not label.isprintable():
        shown = label if len(label) <= 40 else label[:37] + "..."
        raise InvalidLabel(f"label {shown!r} is not usable: at most {MAX_LABEL_LENGTH} "
                           "printable characters on one line (no control characters)")
    return label


class StateType(StrEnum):
    """Workflow state categories, the same as Linear's."""

    TRIAGE = "triage"
    BACKLOG = "backlog"
    UNSTARTED = "unstarted"
    STARTED = "started"
    COMPLETED = "completed"
    CANCELED = "canceled"
    DUPLICATE = "duplicate"

    @property
    def finished(self) -> bool:
        return self in _FINISHED  # asked thousands of times a tick


_FINISHED = frozenset((StateType.COMPLETED, StateType.CANCELED, StateType.DUPLICATE))


class Role(StrEnum):
    EXECUTE = "execute"
    PLAN = "plan"
    REVIEW = "review"
    RESEARCH = "research"
    RESOLVE = "resolve"
    GROOM = "groom"
    """Grooms the backlog: proposes issues, reorders priorities, flags duplicates and
    stale issues through its own ``worker`` commands (``control.groom``)."""

    @property
    def may_edit(self) -> bool:
        """Review, research, plan and groom workers look and report; they never edit files."""
        return self in (Role.EXECUTE, Role.RESOLVE)


RALPH_AUTHOR = "ralph-dev"
"""Author name ralph-dev uses for its own comments in the local tracker."""


@dataclass(frozen=True)
class Comment:
    author: str
    body: str
    created_at: datetime
    by_ralph: bool = False
    """True when ralph-dev (or one of its workers) wrote it: never human feedback."""
    by_bot: bool = False
    """True when no person wrote it (an integration such as GitHub posting "Linked PR
    #42 opened", or an external user): never human feedback either."""


def human_feedback(issue: Issue) -> str | None:
    """Comments people wrote after ralph-dev last spoke: what a resumed worker must read."""
    newest: list[str] = []
    for comment in reversed(issue.comments):
        if comment.by_bot:
            continue  # an integration's words ("GitHub: Linked PR #42") are not a person's
        if comment.by_ralph:
            break
        newest.append(f"{comment.author} ({comment.created_at:%Y-%m-%d %H:%M}): {comment.body}")
    return "\n\n".join(reversed(newest)) or None


@dataclass(frozen=True)
class Issue:
    identifier: str
    title: str
    state_name: str
    state_type: StateType
    description: str = ""
    priority: int = 0
    """0 = none, 1 = urgent … 4 = low (Linear's scale)."""
    sort_order: float = 0.0
    labels: frozenset[str] = frozenset()
    parent: str | None = None
    children: tuple[str, ...] = ()
    blocked_by: tuple[str, ...] = ()
    comments: tuple[Comment, ...] = ()
    created_at: datetime | None = None
    updated_at: datetime | None = None
    id: str = ""
    """The tracker's own id (Linear UUID); the identifier for the local tracker."""
    team: str | None = None
    foreign: bool = False
    """Not an issue of the project: a blocker or sub-issue that lives elsewhere (another
    Linear project), listed only so its state counts. Never dispatched or acted on."""


@dataclass(frozen=True)
class NewIssue:
    """What a person or a plan worker asks the tracker to create."""

    title: str
    description: str = ""
    priority: int = 0
    labels: tuple[str, ...] = ()
    parent: str | None = None
    """Identifier of the parent, or the ``ref`` of another NewIssue in the same batch."""
    blocked_by: tuple[str, ...] = ()
    """Identifiers, or ``ref``s of other NewIssues in the same batch."""
    ref: str | None = None
    """A batch-local name so entries of one import can point at each other."""
    state: str | None = None
    state_type: StateType | None = None
    """Without a ``state`` name: the first state of this type (a groom proposal's backlog)."""


@dataclass(frozen=True)
class Placement:
    """Where a cluster worker attempt runs: Ray's node id and the host's name."""

    node: str
    host: str


@dataclass(frozen=True)
class NodeSlots:
    """One live node of a cluster and its worker slots, for ``status``."""

    node: str
    host: str
    slots: int


@dataclass(frozen=True)
class HostSlots:
    """A cluster's worker slots as one tick sees them: free now, and its live nodes."""

    free: int
    nodes: tuple[NodeSlots, ...] = ()


@dataclass(frozen=True)
class Ended:
    """What ending a worker's attempt brought back, for its record."""

    came_back: bool
    """Its work is where the merge lane takes it (a cluster worker's final push came
    back; on this host it never left)."""
    transcript: Path | None = None
    """Its agent's transcript, brought here for the issue's next attempt to resume."""
    session_kept: bool = False
    """Its agent's session can be resumed by the next start (on this host it never
    left; from another host, only with its transcript)."""


@dataclass(frozen=True)
class Window:
    """One tmux window as seen in a single ``list-panes`` call."""

    name: str
    pane_id: str
    window_id: str
    alive: bool
    exit_status: int | None = None
    command: str = ""
    pid: int | None = None
    last_activity: datetime | None = None
    output_changed_at: datetime | None = None
    """When the pane's output last changed; drives stuck detection."""
    host_lost: bool = False
    """A cluster worker whose host the cluster lost (dead or cut off): its end is no
    failure of the issue's."""
    last_words: str = ""
    """A dead pane's last lines of output (its log's end, controls removed): what the
    agent said as it ended, for the person told of the failure."""
    server_lost: bool = False
    """A cluster worker whose tmux server on its host was ended from outside, not by its
    pane's exit: no failure of the issue's, as a tmux session gone on one host."""


def worker_windows(windows: Sequence[Window]) -> list[Window]:
    """Windows of the project's session named by an issue identifier: its workers.

    By shape, not by the tracker key: Linear identifiers carry their team's key.
    """
    return [w for w in windows if IDENTIFIER_RE.fullmatch(w.name)]


@dataclass(frozen=True)
class Workspace:
    name: str
    path: str = ""
    has_unmerged_change: bool = False
    conflicted: bool = False


@dataclass(frozen=True)
class WorkerRecord:
    """What ralph-dev remembers about the worker of one issue (``state/ISSUE.json``)."""

    issue: str
    role: Role = Role.EXECUTE
    attempts: int = 0
    """Spawns so far for this issue; the cap counts these."""
    started_at: datetime | None = None
    last_failure_at: datetime | None = None
    last_failure: str | None = None
    done: bool = False
    """Done marker: the worker ran ``ralph-dev worker done`` successfully."""
    blocked: bool = False
    nudged_at: datetime | None = None
    iterations: int = 0
    last_activity: datetime | None = None
    waited_until: datetime | None = None
    """When the last swarm pause this worker waited out (a usage limit, an outage) ended:
    its stall clock starts again then, so the pause is never taken for its silence."""
    lost: str | None = None
    """Why the worker went away for a cause outside the issue (its tmux session died):
    the next spawn charges no attempt."""
    lost_at: datetime | None = None
    summary: str | None = None
    merge_failures: int = 0
    """Merges of this issue's finished work that failed in a way retrying may fix; each
    waits a backoff, and at ``timing.max_attempts`` the issue is held for a person."""
    merge_failed_at: datetime | None = None
    merged_at: datetime | None = None
    """When this worker's change was merged into trunk: what is left is to complete the
    issue (when the tracker answers) and put the workspace away."""
    agent_error: str | None = None
    """The API error the agent's last turn ended on (Claude Code's ``StopFailure``), until
    the controller has it continue after the pause that error caused."""
    agent_error_text: str | None = None
    agent_error_at: datetime | None = None
    agent_error_reset_at: datetime | None = None
    """When the API said the limit that error was lifts (read by the hook), if it said."""
    agent_error_streak: int = 0
    """API errors in a row with no answer from the model between them: each doubles the
    outage pause (a backoff), so a long outage costs one probe per step."""
    gave_up: str | None = None
    """The agent's last message when it ended ``agent.iteration_cap`` turns in a row
    without ``worker done`` and without asking anything (its Stop hook let it stop):
    restarted once, then held with this quoted. Cleared at each start."""
    hang_restarts: int = 0
    """Free restarts for a hung model call since the model last answered this worker: past
    ``HANG_RESTARTS`` the silence is the issue's own (a stall), so hangs never loop."""
    session_id: str | None = None
    """The agent's conversation (Claude Code's session id): a restart resumes it."""
    resumed: str | None = None
    """The session the current attempt's agent was started to resume (None: a fresh one).
    A resume whose agent ended before saying anything is not tried again."""
    agent_state: str | None = None
    """What the agent itself last said it is doing, from its hooks ("working", "running
    Bash", "waiting for the model", "waiting for input: …", "api error: …", "finished")."""
    agent_state_at: datetime | None = None
    sent_back: str | None = None
    """The verify command's output on this issue's change rebased onto trunk, which
    failed: the change went back to a worker of the issue (its prompt shows this),
    and is merged only once a worker reports done again."""
    transcript: str | None = None
    """The agent's transcript file (Claude Code's SessionStart hook says where): it
    grows with every message, so activity is read from it, not from the pane, where
    a spinner keeps printing while a model call hangs."""
    last_refusal: str | None = None
    """What ``worker done`` last told this worker when it refused its report (a file jj
    will not record, a failing verify): the cause a person needs if the worker then
    stops without finishing."""
    hold_reason: str | None = None
    """A failure only a person can fix, or a hold whose tracker write failed: ``decide``
    holds the issue with this comment (once the hold is written, it is cleared)."""
    host_attempt: int = 0
    """The last start of this issue's worker, counting every start, charged
    or not. It names the attempt's actor and its pushes (``core.cluster``), the fence."""
    final_push: int = 0
    """On a cluster: the attempt whose last push came back after its processes ended (the
    controller asks before it ends them; 0: none); only that push may be merged as done
    work."""
    node: str | None = None
    """On a cluster: the Ray node id and host the current attempt runs on."""
    host: str | None = None
    lease_renewed_at: datetime | None = None
    """On a cluster: when the controller sent the last call to the current attempt that
    its host answered (each renews the attempt's lease). Unless the attempt's final push
    came back (the host answered its end), the issue's next attempt waits for the lease
    to run out from here (``core.cluster.lease_ends``): never two agents on one issue."""

    @property
    def running(self) -> bool:
        """A worker was started and has neither finished, asked, nor failed since."""
        return (self.started_at is not None and not self.done and not self.blocked
                and (self.last_failure_at is None or self.last_failure_at <= self.started_at))


WORKING = "working"
"""The agent's state from the moment a prompt is handed to it (its start, a person's or
the Stop hook's text) until it uses a tool: it waits for the model's answer."""
SESSION_ENDED = "session ended"
"""The agent's state once its CLI ended its session (Claude Code's SessionEnd hook, the
exec supervisors of the others): said even by a CLI that could not start it."""
AWAITING_MODEL = "waiting for the model"
"""The agent's state after a tool's result went back to the model."""
MODEL_CALL_STATES = frozenset({WORKING, AWAITING_MODEL})
"""States in which an agent's silence is a model call that has not answered."""


SESSION_ID_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{7,63}")
"""What an agent's session id may look like before it goes on a command line (``--resume``)."""


@dataclass(frozen=True)
class Pause:
    """Dispatch is paused for a cause outside any one issue; nobody is charged for it.

    Set and cleared by the controller (``StateStore.set_pause``/``clear_pause``),
    one per ``kind``: a setup error (agent binary missing, jj missing, repository
    unusable, tracker key refused) until a check passes again; a usage limit or an
    API outage until ``until`` (the stated reset) or a probe succeeds.
    """

    kind: str
    cause: str
    """What happened, in words a person reads in ``status`` and the events."""
    fix: str = ""
    """What a person can do about it ("" when it ends by itself)."""
    since: datetime | None = None
    until: datetime | None = None
    """When it is expected to end by itself (a usage limit's stated reset), if known."""
    quiet_workers: bool = False
    """Running workers are waiting on the same cause (a usage limit): do not nudge or
    restart them while it lasts."""
    probe: str | None = None
    """The worker whose session tries the model API again while an outage pause stands
    (one probe per step): its first answer ends the pause for everyone."""
    shared_from: str = ""
    """The project on the same account whose worker met it (``adapters.accounts``): it
    lasts as long as that project's does ("": this project's own)."""


@dataclass(frozen=True)
class UsageWindow:
    """One of an account's usage windows as the model API last stated it (a subscriber's
    five-hour and seven-day windows, which every answer's headers carry): how much of
    it is used, and when it starts over."""

    name: str
    """``five_hour`` or ``seven_day`` (Claude Code's names)."""
    used: float
    """The share of the window used, 0 to 1."""
    resets_at: datetime
    seen_at: datetime
    """When a worker's agent last said it."""


@dataclass(frozen=True)
class Probe:
    """One more verify of a lane run, beside its own (``merge.parallel_verifies``): the
    first ``size`` changes of the run's batch, by a process of its own (run ``run``)."""

    size: int
    run: str
    state: str
    """As the run's own: ``running``, ``passed``, ``failed`` or ``lost``."""
    checkout_commit: str | None = None
    exit_code: int | None = None


@dataclass(frozen=True)
class LaneRun:
    """The merge lane's verify as the controller last started it (one run at a time, its
    ``also`` verifies at once beside it), and what its processes say now: a fact read
    each tick, while the verify runs beside the loop (``control.loop.merging``).

    A ``merge`` run verifies the first ``size`` changes of ``batch`` together on top of
    trunk's commit ``base`` (each rebased onto ``base`` in its own workspace; together,
    in the lane's checkout). A red batch is bisected by prefix: ``good`` changes are known
    to pass together and ``bad`` fail (0: not yet known), so the first change whose
    prefix fails is the one that broke it. A ``trunk`` run verifies trunk itself."""

    id: str
    kind: str
    """``merge`` or ``trunk``."""
    state: str
    """``running`` (while any of its verifies runs, ``also``'s too); ``passed`` or
    ``failed`` once its process wrote its exit status; ``lost`` when its process (or one
    of ``also``'s) died without one (it is run again); ``void`` when the lane
    found it no longer holds (trunk moved before it landed, a change under it changed);
    ``concluded`` once its outcome was taken (its batch landed, a change went back)."""
    base: str = ""
    """Trunk's commit the run verifies on top of (a trunk run: the commit verified)."""
    batch: tuple[str, ...] = ()
    size: int = 0
    good: int = 0
    bad: int = 0
    bad_run: str | None = None
    """The run whose failure set ``bad`` (its output goes back with the change)."""
    good_commit: str | None = None
    """What the verify of the ``good`` prefix checked out (landing compares it)."""
    checkout_commit: str | None = None
    """What this run's verify checked out."""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    why: str | None = None
    """Why a void run does not hold; what a concluded one came to."""
    limit: int | None = None
    """Batches after a void run hold at most this many changes (its land found the
    batch's files differ from what was verified: one at a time is what always lands)."""
    after: tuple[str, ...] = ()
    """A trunk run after merges: the issues whose merge moved trunk to ``base``."""
    also: tuple[Probe, ...] = ()
    """Shorter prefixes of the batch verified at once beside it (each smaller than
    ``size``): a red batch's bisection starts from what they found."""

    @property
    def finished(self) -> bool:
        return self.state in ("passed", "failed")

    @property
    def probes(self) -> tuple[Probe, ...]:
        """Every verify of the run, its own first, each as a :class:`Probe` (once all
        have finished, ``state`` is its own verify's)."""
        return (Probe(self.size, self.id, self.state, self.checkout_commit, self.exit_code),
                *self.also)

    @property
    def members(self) -> tuple[str, ...]:
        """The changes this run verifies."""
        return self.batch[:self.size]


@dataclass(frozen=True)
class Observed:
    """Everything one controller tick saw; the only input of ``decide``."""

    issues: tuple[Issue, ...] = ()
    windows: tuple[Window, ...] = ()
    workspaces: tuple[Workspace, ...] = ()
    records: Mapping[str, WorkerRecord] = field(default_factory=dict)
    tracker_ok: bool = True
    """False when the tracker could not be read this tick: dispatch is skipped."""
    tracker_error: str | None = None
    """Why the tracker could not be read this tick."""
    tracker_refuses: bool = False
    """The tracker refused ralph-dev itself (a revoked key, a project that is gone):
    a setup error, not an outage."""
    trunk_red: bool = False
    """True while trunk's verify command fails: no further merges."""
    trunk_red_at: str | None = None
    """The trunk commit that failed its verify (while red)."""
    trunk_head: str | None = None
    """Trunk's commit now (read only while trunk is red, the merge lane's run is under
    way or not yet taken, or trunk's verify is owed)."""
    lane: LaneRun | None = None
    """The merge lane's current (or last) verify run."""
    trunk_due: tuple[str, ...] = ()
    """Merges that moved trunk and whose trunk verify (``merge.verify_trunk``) has not
    started yet: merges wait for it."""
    pauses: tuple[Pause, ...] = ()
    """Active swarm-wide pauses: no worker is started (or restarted) while any lasts."""
    account_pauses: tuple[Pause, ...] = ()
    """Pauses other projects on this project's account met and still stand there
    (``Pause.shared_from`` names each one's project)."""
    account: str = ""
    """The fingerprint of the account this project's agents run on ("": unknown, a
    command runner)."""
    account_windows: tuple[UsageWindow, ...] = ()
    """That account's usage windows, as any project's worker last read them."""
    key_account: bool = False
    """The account is an API key (Anthropic's, or OpenAI's for Codex) whose per-minute
    limits its agent passes on nowhere: the controller asks the API (``ProbeAccount``)."""
    account_probed_at: datetime | None = None
    """When any project on the account last asked for its key's limits."""
    owed: tuple[OwedWrite, ...] = ()
    """Accepted worker reports whose tracker writes are still to be made."""
    setup_error: str | None = None
    """Why workers cannot start (the agent program, its sandbox), or None."""
    repository_error: str | None = None
    """Why jj cannot use the repository, or None: the tick acts on nothing then."""
    resources: Resources | None = None
    """What the host has free now (None: not sampled)."""
    cluster_slots: int | None = None
    """Free worker slots on the project's cluster now (None: workers run on this host)."""
    host_slots: int = 0
    """Worker slots the cluster's largest live host has (0: no host is up): what one more
    host the autoscaler starts is taken to bring (``cluster.max_hosts``)."""
    host_loads: Mapping[str, ProjectLoad] | None = None
    """The other projects' loads on this host, as they last published them (None: no
    ``[host] max_workers``, or this project's workers run on a cluster)."""
    sessions_kept: frozenset[str] = frozenset()
    """Issues whose record's agent session can be resumed: its transcript is kept here
    (on another host's worker, only once its end brought it back)."""
    spent_today: float = 0.0
    """Estimated dollars the agents spent this UTC day."""
    over_budget: Mapping[str, str] = field(default_factory=dict)
    """Issues whose spend is past their budget, each with the figures."""
    tripped: Mapping[str, str] = field(default_factory=dict)
    """Issues a tripwire says to stop and hold (files no worker may change changed
    while their workers ran unconfined), each with why."""
    unadopted: frozenset[str] = frozenset()
    """Live workers without a run directory (started by a release before the mailbox)."""
    config_loaded_at: datetime | None = None
    """When the controller last read its config: a pause only a config change could end
    (the workspace hook's) ends when a newer config is read."""
    egress_refused: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    """Running workers whose egress proxy refused them since they started: how often, and
    the last host:port they tried (``agent.network = "allowlist"``)."""
    retrying: Mapping[str, str] = field(default_factory=dict)
    """Agents whose panes say their CLI is retrying the model API by itself (Claude Code's
    "Retrying in 5s · attempt 3/10"), each with that line: silent, but not hung."""

    @property
    def relaying(self) -> frozenset[str]:
        """Issues whose workers' reports still owe tracker writes: the tracker's state of
        them is stale, so no new worker starts for them meanwhile."""
        return frozenset(owed.issue for owed in self.owed)


@dataclass(frozen=True)
class Resources:
    """What the host has free now; a figure it cannot read is None (never a reason to wait)."""

    free_memory_mb: float | None = None
    free_disk_mb: float | None = None
    load_per_cpu: float | None = None
    cpus: int | None = None


@dataclass(frozen=True)
class OwedWrite:
    """One accepted worker report whose tracker writes are still to be made."""

    id: str
    kind: str
    issue: str
    failures: int = 0
    """Failed tries that were the write's own (not an outage: those are not counted)."""
    failed_at: datetime | None = None
    last_error: str = ""
    blame: str = ""
    """How its last failure is blamed (``core.policy.Blame``), "" before any."""


# --- what adapters hand back ---------------------------------------------------


@dataclass(frozen=True)
class MergeResult:
    """What merging (or publishing) one workspace came to."""

    merged: bool
    conflicted: bool = False
    moved: bool = False
    """Trunk moved while the change was verified: it is rebased and verified again."""
    stale: bool = False
    """A verified batch is not what would land any more (a change under it changed, the
    stacked files differ from the verified ones): it is verified again."""
    commit: str | None = None
    """Commit id trunk (or the pushed bookmark) points at after a successful merge."""
    detail: str = ""


@dataclass(frozen=True)
class TrunkChange:
    """One change on trunk as people see it: what, when, and its diff stat."""

    commit: str
    title: str
    time: str
    added: int
    removed: int
    files: tuple[str, ...]


@dataclass(frozen=True)
class Launch:
    """What the tmux adapter needs to start one agent in a window."""

    argv: list[str]
    """The window's command: never contains issue text."""
    env: dict[str, str] = field(repr=False)
    """The pane's explicit environment, without secrets (those go through a 0600 file)."""
    cwd: Path
    prompt_file: Path | None
    spec_file: Path
    """The launch spec the pane's launcher (``ralph_dev/launcher.py``) reads."""

    def discard_secrets(self) -> None:
        """Delete the secrets file of a launch whose window never started (the launcher
        that would have read and deleted it never ran)."""
        self.spec_file.with_suffix(".secrets.json").unlink(missing_ok=True)
