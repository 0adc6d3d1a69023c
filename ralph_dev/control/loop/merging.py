"""Carrying out the merge lane: into trunk here, or as a pull request, and keeping trunk green.

Local mode rebases the worker's change onto trunk and moves trunk to it
(``adapters.jj``); a conflict leaves trunk untouched and hands the workspace
to a resolve worker. Pull-request mode pushes ``ralph/ISSUE`` and opens a pull
request instead.

With a verify command (``merge.verified``, the default) the lane is verified, and its
verifies run beside the controller's loop, never in its tick:

* ``VerifyMerge`` rebases each change of a batch (up to ``merge.max_batch`` ready
  together) onto trunk in its own workspace, checks them out together (one change: in
  its own workspace; more: a merge of them in the lane's checkout) and starts the verify
  command there as a process of its own (``adapters.verify_runs``). The run is written
  down (``lane/run.json``) before it starts, so any controller, this one or the next,
  reads its outcome;
* each tick observes the run (:meth:`MergeLane.observe`) and ``decide`` takes it from
  there: a green batch lands (``Merge``: each change rebased onto the one before it,
  trunk moved once), a red one is bisected (more ``VerifyMerge`` steps on the same
  trunk), the change that broke it goes back to a worker of its issue (``SendBack``);
* with ``merge.verify_trunk`` the verify command also runs on trunk after merges
  (``VerifyTrunk``, beside the loop too); while it fails trunk is "red" (a marker file,
  ``TrunkVerified``) and no further merge happens until trunk moves and verifies green.

The lane changes jj, its own files, trunk's red marker and the events; what it has to
tell a person on an issue and what the worker records become it hands back
(:class:`MergeOutcome`) for the actuator, their one writer, to post and write.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from ralph_dev.adapters import verify_runs
from ralph_dev.adapters.files import atomic_write_text, private_dir
from ralph_dev.adapters.processes import launcher_argv
from ralph_dev.adapters.store import StateStore, from_iso, utcnow
from ralph_dev.agent.egress import LEDGER, refused_in, verify_network
from ralph_dev.agent.launch import LAUNCH_SPEC, verify_env
from ralph_dev.agent.sandbox import verify_wrapper
from ralph_dev.core.actions import Merge, SendBack, TrunkVerified, VerifyMerge, VerifyTrunk
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.decide.lane import bisecting_said, sizes_said
from ralph_dev.core.environment import public_env
from ralph_dev.core.errors import LaneStale, RalphError
from ralph_dev.core.model import Issue, LaneRun, MergeResult, Probe, Role
from ralph_dev.core.ports import PullRequests, Repository, work_bookmark
from ralph_dev.core.text import output_block

log = structlog.get_logger(__name__)

RUN_FILE = "run.json"
DUE_FILE = "trunk-due.json"
PREPARE_RACES = 3
"""Preparations of a batch on a trunk that moved meanwhile before the try is given up
(a person pushing in a loop must not hold the controller's tick forever)."""


class MergeConflict(RalphError):
    retryable = True


class TrunkKeepsMoving(RalphError):
    """Trunk moved under every preparation of a batch: the merge is tried again later."""

    retryable = True


@dataclass
class MergeOutcome:
    """What one lane action came to: comments to post for the people on the issue, what
    the worker record now says (the actuator, its one writer, writes it), and the error
    that ends the action once they are posted (a conflict, a change sent back).
    ``others``: the same for the other issues of a batch."""

    comments: list[str] = field(default_factory=list)
    error: RalphError | None = None
    record: dict[str, Any] = field(default_factory=dict)
    others: dict[str, MergeOutcome] = field(default_factory=dict)


def new_run_id() -> str:
    return f"{utcnow().strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


class MergeLane:
    """One project's merge lane: one verify run at a time, and the state of trunk."""

    def __init__(self, settings: ProjectSettings, *, jj: Repository,
                 store: StateStore, pull_requests: PullRequests) -> None:
        self.settings = settings
        self.jj = jj
        self.store = store
        self.pull_requests = pull_requests
        self._landed: tuple[str, frozenset[str]] | None = None
        """The run whose batch this controller landed last, and its issues: their other
        ``Merge`` actions need not ask jj again (after a restart, they do)."""

    # -- the lane's files -------------------------------------------------------

    @property
    def dir(self) -> Path:
        return self.store.paths.lane_dir

    def run_dir(self, run: str) -> Path:
        if not run_id_ok(run):
            raise RalphError(f"not a lane run: {run!r}")
        return self.dir / "runs" / run

    def load_run(self) -> dict[str, Any] | None:
        try:
            data = json.loads((self.dir / RUN_FILE).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("id"), str) else None

    def _write_run(self, data: dict[str, Any]) -> None:
        private_dir(self.dir)
        atomic_write_text(self.dir / RUN_FILE, json.dumps(data) + "\n")

    def _end_run(self, run: str) -> None:
        data = self.load_run()
        if data is not None and data["id"] == run:
            (self.dir / RUN_FILE).unlink(missing_ok=True)

    def _void(self, run: str, why: str, *, limit: int | None = None) -> None:
        data = self.load_run()
        if data is not None and data["id"] == run:
            self._write_run({**data, "void": why, "limit": limit})

    def _conclude(self, what: str) -> None:
        """The current run's outcome is taken (its batch landed, a change went back):
        it is history, shown in ``status``, never acted on again."""
        data = self.load_run()
        if data is not None and not data.get("void"):
            said = [*data.get("concluded", []), what]
            self._write_run({**data, "concluded": said})

    def _stop_current(self) -> None:
        data = self.load_run()
        if data is not None:
            for run in run_ids(data):
                verify_runs.stop(self.run_dir(run))

    def _prune(self, keep: set[str]) -> None:
        """Run directories no run refers to any more go (their outcome was taken)."""
        runs = self.dir / "runs"
        if not runs.is_dir():
            return
        for child in runs.iterdir():
            if child.name not in keep:
                verify_runs.stop(child)
                shutil.rmtree(child, ignore_errors=True)

    def trunk_due(self) -> tuple[str, ...]:
        return read_trunk_due(self.dir)

    def _owe_trunk_verify(self, after: list[str], commit: str | None) -> None:
        private_dir(self.dir)
        atomic_write_text(self.dir / DUE_FILE, json.dumps({"after": after, "commit": commit}))

    # -- what each tick observes -------------------------------------------------

    def observe(self) -> LaneRun | None:
        """The lane's run as written down, with what its process says now."""
        return read_lane(self.dir)


    # -- red trunk ------------------------------------------------------------

    def trunk_red(self) -> bool:
        return self.store.paths.trunk_red_file.exists()

    def red_at(self) -> str | None:
        """The trunk commit whose verify failed, while trunk is red."""
        try:
            commit = json.loads(self.store.paths.trunk_red_file.read_text()).get("commit")
        except (OSError, ValueError, AttributeError):
            return None
        return commit if isinstance(commit, str) else None

    # -- starting a verify ------------------------------------------------------

    def _start(self, data: dict[str, Any],
               verifies: Sequence[tuple[str, Path, str | None]]) -> None:
        """Write the run down, then start each of its verifies beside the loop (``run``,
        in ``checkout``, for ``issue``: the run's own first, then any at once beside it)."""
        command = self.settings.verify_command
        assert command, "the lane verifies only with a verify command configured"
        data = {**data, "command": command, "checkout": str(verifies[0][1]),
                "started_at": utcnow().isoformat()}
        self._write_run(data)
        self._prune({*run_ids(data), data.get("bad_run") or ""})
        for run, checkout, issue in verifies:
            self._launch(command, run, checkout, issue)

    def _launch(self, command: str, run: str, checkout: Path, issue: str | None) -> None:
        """Start the verify command as run ``run``: the command from the controller's own
        config, with the variables ``worker done``'s verify had for ``issue``
        (``agent.launch.verify_env``), in the workers' sandbox (it runs code workers
        wrote)."""
        record = self.store.load_record(issue) if issue else None
        env = verify_env(self.settings, checkout, issue=issue,
                         role=record.role if record else Role.EXECUTE,
                         attempt=record.attempts if record else 0)
        run_dir = self.run_dir(run)
        network = verify_network(self.settings, run_dir=run_dir, issue=issue, env=env)
        wrapper = verify_wrapper(self.settings, checkout, home=Path(env["HOME"]),
                                 network=network.bwrap_args if network else ())
        argv = [*wrapper, *(network.argv_prefix if network else ()), "/bin/sh", "-c", command]
        if network is not None and network.egress is not None:
            # behind an egress proxy of its own, started as a worker's is: by the launcher
            env = {**env, **network.env}
            private_dir(run_dir)
            spec = run_dir / f"verify{LAUNCH_SPEC}"
            atomic_write_text(spec, json.dumps({"argv": argv, "cwd": str(checkout),
                                                "env": public_env(env), "quiet": True,
                                                "egress": network.egress}))
            argv = launcher_argv(str(spec))
        verify_runs.start(run_dir, argv, cwd=checkout, env=env,
                          wake=self.store.paths.heartbeat_file)

    async def verify_merge(self, action: VerifyMerge,
                           bring_in: Callable[[str, int], Awaitable[None]] | None = None
                           ) -> MergeOutcome:
        """Start the verify of the batch ``action`` names (a new one, or a step of a red
        one's bisection), the run it replaces stopped first. ``bring_in``: how work done
        on another host comes into its workspace first (``action.fetch``)."""
        await asyncio.to_thread(self._stop_current)
        previous = self.load_run()
        heads: dict[str, str] = {}
        batch = list(action.batch)
        size, good, bad = action.size, action.good, action.bad
        trunk = await asyncio.to_thread(self.jj.trunk.trunk_commit)
        outcome = MergeOutcome()
        if action.base and action.base == trunk and previous is not None \
                and previous.get("id") == action.replaces \
                and all(n in (previous.get("heads") or {}) for n in batch[:size]):
            heads = {n: previous["heads"][n] for n in batch}  # a step on the same trunk
            base = trunk
        else:
            for name, attempt in action.fetch:
                if bring_in is not None:
                    try:
                        await bring_in(name, attempt)
                    except RalphError as exc:
                        outcome.others[name] = MergeOutcome(error=exc)
            batch, heads, base = await self._prepare(batch, outcome)
            size, good, bad = len(batch), 0, 0
        if not batch:
            return self._only(outcome, action.issue)
        members = batch[:size]
        run = new_run_id()
        data: dict[str, Any] = {
            "id": run, "kind": "merge", "batch": batch, "size": size,
            "heads": heads, "base": base, "good": good, "bad": bad,
            "bad_run": action.bad_run if bad else "",
            "good_commit": action.good_commit if good else ""}
        # a change the preparation left out only shortens the batch: a prefix as long
        # as what is left is the batch itself
        sizes = [size, *sorted({n for n in action.also if 0 < n < size}, reverse=True)]
        verifies, also = [], []
        for slot, each in enumerate(sizes):
            probe = run if slot == 0 else f"{run}-p{each}"
            checkout, commit = await self._checkout(
                [heads[n] for n in batch[:each]], batch[each - 1], slot)
            verifies.append((probe, checkout, batch[each - 1]))
            if slot == 0:
                data["checkout_commit"] = commit
            else:
                also.append({"size": each, "run": probe, "checkout_commit": commit})
        data["also"] = also
        await asyncio.to_thread(self._start, data, verifies)
        shown = sorted(sizes)
        if bad:
            step = bisecting_said(shown, len(batch), good, bad)
        else:
            step = f"a batch of {size}" + (f", its first {sizes_said(shown[:-1])} beside it"
                                           if len(shown) > 1 else "")
        self.store.append_event("merge_verify_started", issue=members[0], run=run,
                                batch=members, of=batch if bad else None, step=step,
                                at_once=shown if len(shown) > 1 else None,
                                base=base[:12], reason=action.reason)
        return self._only(outcome, action.issue)

    async def _checkout(self, heads: list[str], last: str, slot: int) -> tuple[Path, str]:
        """Where the first changes of a batch (``heads``, the last one ``last``'s) are
        verified together, and the commit checked out there: one change in its own
        workspace, more merged in the lane's checkout for ``slot``."""
        if len(heads) == 1:
            return self.jj.workspaces.workspace_path(last), heads[0]
        return await asyncio.to_thread(self.jj.trunk.lane_checkout, heads, slot)

    @staticmethod
    def _only(outcome: MergeOutcome, issue: str) -> MergeOutcome:
        """The action's own issue's part at the top, every other issue's in ``others``."""
        own = outcome.others.pop(issue, None)
        if own is not None:
            outcome.comments, outcome.error, outcome.record = own.comments, own.error, own.record
        return outcome

    async def _prepare(self, names: list[str], outcome: MergeOutcome
                       ) -> tuple[list[str], dict[str, str], str]:
        """Each change rebased onto trunk in its own workspace, in order; those that
        cannot be (a conflict, nothing to merge, a failure) are left out, each with what
        it came to in ``outcome.others``. The batch, its heads, and trunk's commit."""
        for _ in range(PREPARE_RACES):
            base = await asyncio.to_thread(self.jj.trunk.trunk_commit)
            batch: list[str] = []
            heads: dict[str, str] = {}
            for name in names:
                if name in outcome.others:
                    continue  # left out already (on an earlier race)
                try:
                    head = await asyncio.to_thread(self.jj.merger.prepare_merge, name)
                except RalphError as exc:
                    outcome.others[name] = MergeOutcome(error=exc)
                    continue
                if isinstance(head, MergeResult):
                    outcome.others[name] = self._not_prepared(name, head)
                    continue
                batch.append(name)
                heads[name] = head
            now = await asyncio.to_thread(self.jj.trunk.trunk_commit)
            if now == base:
                return batch, heads, base
            self.store.append_event("merge_reverify", issue=batch[0] if batch else None,
                                    batch=batch, detail=f"{self.settings.trunk} moved to "
                                                        f"{now[:12]} while the batch was "
                                                        "rebased onto it: rebasing it again")
            names = batch
        raise TrunkKeepsMoving(f"{', '.join(names)}: {self.settings.trunk} moved during each "
                               f"of {PREPARE_RACES} preparations of their merge; tried again "
                               "after a wait")

    def _not_prepared(self, name: str, result: MergeResult) -> MergeOutcome:
        if result.conflicted:
            self.store.append_event("merge_conflict", issue=name, detail=result.detail)
            return MergeOutcome(
                [f"ralph-dev: merging {name} into {self.settings.trunk} conflicted; trunk is "
                 "untouched and a resolve worker will take the workspace."],
                MergeConflict(f"{name}: merge into {self.settings.trunk} conflicted"),
                {"done": False, "role": Role.RESOLVE})
        log.info("nothing_to_merge", issue=name, detail=result.detail)
        self.store.append_event("nothing_to_merge", issue=name, detail=result.detail)
        return MergeOutcome(record={"merged_at": utcnow()})

    async def verify_trunk(self, action: VerifyTrunk) -> None:
        """Start the verify command on trunk's files beside the loop. Trunk is no
        worker's: the worker variables (``RALPH_DEV_ISSUE``…) are unset."""
        await asyncio.to_thread(self._stop_current)
        checkout = await asyncio.to_thread(self.jj.trunk.trunk_checkout)
        commit = await asyncio.to_thread(self.jj.trunk.trunk_commit)
        data: dict[str, Any] = {"id": new_run_id(), "kind": "trunk", "base": commit,
                                "after": [a for a in action.after if a]}
        await asyncio.to_thread(self._start, data, [(data["id"], checkout, None)])
        (self.dir / DUE_FILE).unlink(missing_ok=True)
        self.store.append_event("trunk_verify_started", run=data["id"], commit=commit,
                                after=data["after"] or None, reason=action.reason)

    # -- a verify's outcome -------------------------------------------------------

    def _outcome(self, run: str) -> dict[str, Any]:
        """What the run's verify came to, for the people and the red marker."""
        run_dir = self.run_dir(run)
        status = verify_runs.status(run_dir)
        data = self.load_run() or {}
        tail = verify_runs.output_tail(run_dir)
        if refused := refused_in(run_dir / LEDGER):
            tail += (f"\n[ralph-dev: the verify's network refused {', '.join(refused[:10])}: "
                     "a host it needs goes in agent.allow_hosts]")
        return {"command": self.settings.verify_command or "", "exit_code": status.exit_code,
                "started_at": data.get("started_at") if run in run_ids(data) else None,
                "duration_s": status.duration_s, "output_tail": tail}

    def send_back(self, action: SendBack) -> MergeOutcome:
        """A red change never moves trunk: the issue goes back to a worker of its own,
        which finds the failure's output in its prompt (``sent_back``); other merges go
        on. The failure itself is charged like any other (``SendBack.record_changes``):
        the worker that redoes it is the next attempt, after the retry policy's wait."""
        name = action.issue
        found = self._outcome(action.run)
        command, code, tail = found["command"], found["exit_code"], found["output_tail"]
        self.jj.trunk.release_lane()
        record = {"sent_back": tail[-8000:] or "(no output)"}  # the rest: the action's own
        self.store.append_event("merge_sent_back", issue=name, run=action.run, exit_code=code,
                                reason=action.reason)
        self._conclude(f"{name} went back to its worker (exit {code})")
        comment = (f"ralph-dev: `{command}` failed (exit {code}) on {name}'s change rebased "
                   f"onto {self.settings.trunk}{self._with_whom(action)}; "
                   f"{self.settings.trunk} is untouched. A worker of {name} gets the "
                   f"workspace back with this output:\n\n{output_block(tail)}")
        return MergeOutcome([comment], record=record)

    def _with_whom(self, action: SendBack) -> str:
        """Which changes it was verified with (a batch's bisection found it)."""
        data = self.load_run() or {}
        batch = list(data.get("batch") or ())
        if name_at := (batch.index(action.issue) if action.issue in batch else 0):
            before = ", ".join(batch[:name_at])
            return (f" together with {before} (which pass without it: the verify of the "
                    "batch was bisected to it)")
        return ""

    async def trunk_verified(self, action: TrunkVerified) -> MergeOutcome:
        """Trunk's verify ended: red (a marker, the people whose merges it checked told)
        or green again (merges resume); either way the run is over."""
        outcome = MergeOutcome()
        marker = self.store.paths.trunk_red_file
        if action.ok:
            if marker.exists():
                marker.unlink(missing_ok=True)
                self.store.append_event("trunk_green", commit=action.commit)
        else:
            found = self._outcome(action.run)
            atomic_write_text(marker, json.dumps({**found, "commit": action.commit}) + "\n")
            self.store.append_event("trunk_red", issue=action.after[0] if action.after else None,
                                    commit=action.commit, exit_code=found["exit_code"])
            for issue in action.after:
                outcome.others[issue] = MergeOutcome([
                    f"ralph-dev: after merging {issue}, `{found['command']}` failed on "
                    f"{self.settings.trunk} (exit {found['exit_code']}). Merges are paused "
                    f"until trunk is green: fix {self.settings.trunk} and ralph-dev verifies "
                    f"it again as soon as it moves.\n\n{found['output_tail']}"])
        self._end_run(action.run)
        return outcome

    # -- a merge ----------------------------------------------------------------

    async def merge(self, action: Merge, issue: Issue | None) -> MergeOutcome:
        name = action.issue
        outcome = MergeOutcome()
        pr_mode = self.settings.merge.mode == "pr"
        if pr_mode:
            result = await asyncio.to_thread(self.jj.publisher.publish, name,
                                             self.settings.merge.remote)
        elif self.settings.verifies_merges:
            return await self._land(action)
        else:
            result = await asyncio.to_thread(self.jj.merger.merge, name)
        if result.conflicted:
            return self._not_prepared(name, result)
        if not result.merged:
            log.info("nothing_to_merge", issue=name, detail=result.detail)
            return outcome
        if pr_mode:
            outcome.comments += await self._open_pull_request(name, issue)
        elif self.settings.merge.verify_trunk and self.settings.verify_command:
            self._owe_trunk_verify([name], result.commit)
        return outcome

    async def _land(self, action: Merge) -> MergeOutcome:
        """Land the batch the lane's run verified, trunk moved once (idempotent: a batch
        landed already is a success); when it cannot land as verified, the run is void
        and the lane verifies again (nothing charged)."""
        data = self.load_run()
        batch = list(action.batch or (action.issue,))
        if data is None or data.get("id") != action.run \
                or not all(n in (data.get("heads") or {}) for n in batch):
            raise LaneStale(f"{action.issue}: the merge lane's run {action.run or '(none)'} "
                            "is not the current one; it is verified again")
        if self._landed is not None and self._landed[0] == action.run \
                and action.issue in self._landed[1]:
            self.store.append_event("merge_verified", issue=action.issue, run=action.run,
                                    batch=batch)
            return MergeOutcome()  # its batch landed with the first of its merges
        before = await asyncio.to_thread(self.jj.trunk.trunk_commit)
        await asyncio.to_thread(self.jj.trunk.release_lane)
        result = await asyncio.to_thread(
            self.jj.merger.land, [(n, data["heads"][n]) for n in batch], str(data["base"]),
            action.verified)
        if not result.merged:
            limit = 1 if result.stale and "files" in result.detail else None
            self._void(action.run, result.detail, limit=limit)
            self.store.append_event("merge_reverify", issue=action.issue, run=action.run,
                                    detail=result.detail)
            raise LaneStale(f"{action.issue}: {result.detail}; it is verified again")
        self._landed = (action.run, frozenset(batch))
        if before != result.commit:
            self._conclude(f"{', '.join(batch)} landed at {str(result.commit)[:12]}")
        started = from_iso(data.get("started_at"))
        self.store.append_event("merge_verified", issue=action.issue, commit=result.commit,
                                run=action.run, batch=batch,
                                seconds=round((utcnow() - started).total_seconds(), 1)
                                if started else None)
        if before != result.commit and self.settings.merge.verify_trunk:
            self._owe_trunk_verify(batch, result.commit)
        return MergeOutcome()

    async def _open_pull_request(self, name: str, issue: Issue | None) -> list[str]:
        """The body is the worker's own summary, which ralph-dev recorded."""
        record = self.store.load_record(name)
        title = f"{name}: {issue.title if issue else name}"
        body = (record.summary if record and record.summary else "") + \
            f"\n\nOpened by ralph-dev for {name}."
        url, opened = await asyncio.to_thread(
            self.pull_requests.open_pull_request, head=work_bookmark(name),
            base=self.settings.trunk, title=title, body=body)
        self.store.append_event("pull_request", issue=name, url=url)
        if not opened:
            return []  # a retried tick: the pull request and its comment are already there
        return [f"ralph-dev: opened a pull request for {name}: {url}"]


def read_lane(lane_dir: Path) -> LaneRun | None:
    """The merge lane's run under ``lane_dir`` as written down, with what its process
    says now (what each tick observes, and what ``status`` shows)."""
    try:
        data = json.loads((lane_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not run_id_ok(data.get("id")):
        return None
    status = verify_runs.status(lane_dir / "runs" / data["id"])
    also = tuple(_probe(lane_dir, each) for each in _beside(data))
    states = {status.state, *(p.state for p in also)}
    state = "void" if data.get("void") else "concluded" if data.get("concluded") \
        else "running" if "running" in states else "lost" if "lost" in states \
        else status.state
    return LaneRun(
        id=data["id"], kind=str(data.get("kind", "merge")), state=state,
        base=str(data.get("base", "")), batch=tuple(data.get("batch", ())),
        size=int(data.get("size", 0)), good=int(data.get("good", 0)),
        bad=int(data.get("bad", 0)), bad_run=data.get("bad_run") or None,
        good_commit=data.get("good_commit") or None,
        checkout_commit=data.get("checkout_commit") or None,
        started_at=from_iso(data.get("started_at")),
        finished_at=from_iso(status.finished_at), exit_code=status.exit_code,
        why=data.get("void") or "; ".join(data.get("concluded") or ()) or None,
        limit=data.get("limit"),
        after=tuple(data.get("after") or ()), also=also)


def run_id_ok(run: object) -> bool:
    """A lane run's id, never a path out of the lane's runs."""
    return isinstance(run, str) and bool(run) and "/" not in run and not run.startswith(".")


def _probe(lane_dir: Path, each: dict[str, Any]) -> Probe:
    status = verify_runs.status(lane_dir / "runs" / each["run"])
    return Probe(size=int(each.get("size", 0)), run=each["run"], state=status.state,
                 checkout_commit=each.get("checkout_commit") or None,
                 exit_code=status.exit_code)


def run_ids(data: dict[str, Any]) -> list[str]:
    """The run's own verify and each one beside it (``merge.parallel_verifies``)."""
    return [data["id"], *(each["run"] for each in _beside(data))]


def _beside(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The verifies written down beside the run's own (none that could name a path out
    of the lane's runs)."""
    return [each for each in data.get("also") or ()
            if isinstance(each, dict) and run_id_ok(each.get("run"))]


def stop_lane(lane_dir: Path) -> bool:
    """Stop the merge lane's verify if it runs (``ralph-dev stop --workers``): the next
    controller finds it lost and runs it again. Whether one ran."""
    run = read_lane(lane_dir)
    if run is None or run.state != "running":
        return False
    for probe in run.probes:
        verify_runs.stop(lane_dir / "runs" / probe.run)
    return True


def read_trunk_due(lane_dir: Path) -> tuple[str, ...]:
    """The merges whose trunk verify is owed (``merge.verify_trunk``), ``("",)`` when
    one is owed for merges it does not name; () when none is."""
    try:
        data = json.loads((lane_dir / DUE_FILE).read_text())
    except (OSError, ValueError):
        return ()
    after = data.get("after") if isinstance(data, dict) else None
    return tuple(str(a) for a in after) if isinstance(after, list) and after else ("",)
