"""The verified merge lane's rules: batches verified beside the loop, landed or bisected.

Changes ready to merge (done, their windows closed, nothing holding them) are verified
together on top of trunk, up to ``merge.max_batch`` of them, in merge order (the
person's priority, then identifier). The verify runs as a process of its own; each
tick reads its run (``Observed.lane``) and these rules say what comes next:

* while it runs, every change under it and behind it waits (and says so); a change
  under it that stops being ready (held, canceled, moved out of the active states), or
  trunk moving under it, voids it: a new batch is verified instead;
* a run whose process died without an outcome is run again, the same step;
* green: the batch lands (``Merge`` each, trunk moved once, then each issue completed
  and its workspace forgotten like any merge);
* red: bisected by prefix on the same trunk — the first changes known green together
  (``good``), the first known red (``bad``) — until the one change whose prefix turns
  red is found: the changes before it land, it goes back to a worker of its issue
  (``SendBack``), the ones after it wait for the next batch. Of two changes that pass
  alone and fail together, the later one goes back; a batch of 8 with one bad change
  costs 4 verifies;
* with ``merge.parallel_verifies`` above 1, shorter prefixes are verified at once beside
  each step, each by a process of its own, as far as the host has a CPU and memory free
  for them: a batch's first verify is its own and its half's, a bisection step splits
  what is not yet known into more parts, and a red batch of 8 is bisected in 2 rounds,
  not 4.

A batch of one is the one-change-at-a-time lane. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ralph_dev.core.actions import Forget, Merge, SendBack, VerifyMerge
from ralph_dev.core.decide.world import aware, id_key
from ralph_dev.core.model import Issue, LaneRun

if TYPE_CHECKING:
    from ralph_dev.core.decide.issues import Decider


def merge_key(issue: Issue | None, ident: str) -> tuple[int, tuple[str, int]]:
    """Merge order: the person's priority (1 urgent … 4 low, then none), then identifier."""
    rank = issue.priority if issue is not None and 1 <= issue.priority <= 4 else 5
    return (rank, id_key(ident))


def probe_sizes(good: int, bad: int, count: int) -> list[int]:
    """Up to ``count`` prefix sizes strictly between ``good`` and ``bad``, splitting what
    is not yet known into equal parts (one: the half, as a bisection does)."""
    return sorted({good + (bad - good) * k // (count + 1) for k in range(1, count + 1)}
                  - {good, bad})


def sizes_said(sizes: Sequence[int]) -> str:
    """``5``; ``5 and 6``; ``2, 4 and 6``."""
    return str(sizes[0]) if len(sizes) == 1 else \
        f"{', '.join(map(str, sizes[:-1]))} and {sizes[-1]}"


def bisecting_said(sizes: Sequence[int], total: int, good: int, bad: int) -> str:
    """A bisection step as a person reads it (``status``, the lane's events)."""
    return (f"bisecting: the first {sizes_said(sizes)} of {total}"
            f"{' at once' if len(sizes) > 1 else ''} (the first {good} pass together, "
            f"the first {bad} fail)")


def since(run: LaneRun) -> str:
    return f" since {aware(run.started_at).isoformat(timespec='seconds')}" \
        if run.started_at else ""


class Lane:
    """One plan's lane decisions over the changes the per-issue rules found ready."""

    def __init__(self, decider: Decider, ready: list[str]) -> None:
        self.d = decider
        issues = decider.world.issues
        self.ready = sorted(ready, key=lambda ident: merge_key(issues.get(ident), ident))
        self.eligible = set(self.ready)
        self.start: VerifyMerge | None = None
        """The verify to start, emitted after the plan's spawns (its rebases take a
        while; a start need not wait for them)."""

    @property
    def limit(self) -> int:
        return max(1, self.d.settings.merge.max_batch)

    @property
    def room(self) -> int:
        """Verifies the lane runs at once now: ``merge.parallel_verifies``, as far as the
        host has a CPU free for each (unless ``limits.max_load_per_cpu`` is 0: load is
        no limit) and ``merge.verify_memory_mb`` free for each above the memory floor.
        A figure the host cannot give bounds nothing; one verify always runs."""
        settings = self.d.settings
        room = max(1, settings.merge.parallel_verifies)
        have = self.d.world.observed.resources
        if room == 1 or have is None:
            return room
        if settings.limits.max_load_per_cpu > 0 and have.cpus and have.load_per_cpu is not None:
            room = min(room, int(have.cpus * (1 - have.load_per_cpu)))
        each = settings.merge.verify_memory_mb
        if each > 0 and have.free_memory_mb is not None:
            room = min(room, int((have.free_memory_mb - settings.limits.min_free_memory_mb)
                                 // each))
        return max(1, room)

    def decide(self) -> None:
        run = self.d.world.observed.lane
        limit = self.limit
        if run is not None and run.kind == "merge":
            if run.state not in ("void", "concluded") and self.step(run):
                return
            if run.state == "void" and run.limit:
                limit = min(limit, run.limit)
        if self.ready:
            self.new_batch(run, self.ready[:limit])

    # -- a new batch ------------------------------------------------------------------

    def new_batch(self, run: LaneRun | None, batch: list[str]) -> None:
        first = batch[0]
        whom = first if len(batch) == 1 else f"{first} and {len(batch) - 1} more " \
                                                f"({', '.join(batch[1:])})"
        why = ""
        if run is not None and run.kind == "merge" and run.state == "void" and run.why:
            why = f" (the last batch's verify no longer holds: {run.why[:200]})"
        what = "its change" if len(batch) == 1 else "their changes together"
        also = probe_sizes(0, len(batch), self.room - 1)
        ahead = f" (and the first {sizes_said(also)} of them at once, should the batch " \
                "fail)" if also else ""
        self.start = VerifyMerge(
            first, f"{whom}: done; verifying {what} on top of trunk beside the loop"
                   f"{ahead}{why}",
            batch=tuple(batch), size=len(batch), replaces=run.id if run is not None else "",
            also=tuple(also))
        for ident in batch:
            self.d.wait(ident, "merge", "done; its change is being verified on top of trunk"
                        + (f" with {len(batch) - 1} other(s)" if len(batch) > 1 else ""))
        self.behind(set(batch), "the batch that starts now")

    def behind(self, under: set[str], what: str) -> None:
        ahead = len(under)
        for ident in self.ready:
            if ident not in under:
                self.d.wait(ident, "merge", f"done; waits behind {what} ({ahead} change(s) "
                                            "ahead): verified in the next batch")

    # -- the run under way ------------------------------------------------------------

    def holds(self, run: LaneRun, names: tuple[str, ...]) -> bool:
        """The run still stands for ``names``: trunk has not moved under it and every
        one of them is still ready to merge."""
        moved = self.d.world.observed.trunk_head is not None \
            and self.d.world.observed.trunk_head != run.base
        return not moved and all(n in self.eligible for n in names)

    def step(self, run: LaneRun) -> bool:
        """What the run calls for; False when it no longer holds (a new batch then)."""
        if run.state == "running":
            if not self.holds(run, run.members):
                return False  # the new batch's start stops it
            for ident in run.members:
                self.d.wait(ident, "merge", f"its change is being verified on top of trunk"
                                            f"{self.with_others(run)}{since(run)}")
            self.behind(set(run.members), "the batch being verified")
            return True
        if run.state == "lost":
            if not self.holds(run, run.members):
                return False
            self.start = VerifyMerge(
                run.members[0], f"{run.members[0]}: the process verifying its batch "
                                f"({len(run.members)} change(s)) ended without an outcome; "
                                "verifying it again",
                batch=run.batch, size=run.size, good=run.good, bad=run.bad,
                base=run.base if run.bad else "", bad_run=run.bad_run or "",
                good_commit=run.good_commit or "", replaces=run.id,
                also=tuple(p.size for p in run.also))
            self.behind(set(run.members), "the batch being verified")
            return True
        good, bad = run.good, run.bad
        good_commit, bad_run = run.good_commit, run.bad_run
        if run.state == "passed":  # what it verified lands, whatever a prefix found
            good, good_commit = run.size, run.checkout_commit
        else:
            probes = sorted(run.probes, key=lambda p: p.size)
            for probe in probes:  # the shortest prefix that fails holds what broke it
                if probe.state == "failed" and (not bad or probe.size < bad):
                    bad, bad_run = probe.size, probe.run
            for probe in probes:  # and the longest that passes short of it lands
                if probe.state == "passed" and good < probe.size < bad:
                    good, good_commit = probe.size, probe.checkout_commit
        if bad and bad - good > 1:
            return self.bisect(run, good, bad, good_commit, bad_run)
        return self.conclude(run, good, bad, good_commit, bad_run)

    def with_others(self, run: LaneRun) -> str:
        n = len(run.members)
        return f" with {n - 1} other(s) (batch of {n})" if n > 1 else ""

    def bisect(self, run: LaneRun, good: int, bad: int, good_commit: str | None,
               bad_run: str | None) -> bool:
        """Verify the first changes up to halfway between what is known green and red (more
        cuts at once, as the lane has room)."""
        sizes = probe_sizes(good, bad, self.room)
        size = sizes[-1]
        if not self.holds(run, run.batch[:size]):
            return False
        first = run.batch[0]
        self.start = VerifyMerge(
            first, f"{first}: its batch of {len(run.batch)} failed the verify command "
                   f"together (the first {good} pass, the first {bad} fail); bisecting: "
                   f"verifying the first {sizes_said(sizes)}"
                   f"{' at once' if len(sizes) > 1 else ''}",
            batch=run.batch, size=size, good=good, bad=bad, base=run.base,
            bad_run=bad_run or "", good_commit=good_commit or "", replaces=run.id,
            also=tuple(sizes[:-1]))
        for ident in run.batch:
            if ident in self.eligible:
                self.d.wait(ident, "merge", f"its batch of {len(run.batch)} failed the verify "
                                            "command together; bisecting it to the change "
                                            "that broke it")
        self.behind(set(run.batch), "the batch being bisected")
        return True

    def conclude(self, run: LaneRun, good: int, bad: int, good_commit: str | None,
                 bad_run: str | None) -> bool:
        """The first ``good`` changes land; the ``bad``-th goes back to its worker."""
        landing = run.batch[:good]
        if landing and not self.holds(run, landing):
            return False
        culprit = run.batch[bad - 1] if bad else None
        acted = False
        if culprit is not None and culprit in self.eligible and bad_run:
            whom = "" if bad == 1 else f" on top of {', '.join(run.batch[:bad - 1])} (which " \
                                       "pass together without it)"
            self.d.emit(SendBack(culprit, f"{culprit}: its change fails the verify command "
                                          f"on top of trunk{whom}; sending it back to a "
                                          "worker of its own", run=bad_run))
            acted = True
        if landing:
            self.land(run, landing, good_commit or "")
            acted = True
        if acted:
            self.behind(set(run.batch[:bad] if bad else landing), "the batch landing now")
        return acted

    def land(self, run: LaneRun, landing: tuple[str, ...], verified: str) -> None:
        """The batch lands (its first ``Merge`` moves trunk once, the others find their
        change landed), then like any merge each issue is completed and its workspace
        forgotten."""
        d = self.d
        together = f" with {len(landing) - 1} other(s) verified together" \
            if len(landing) > 1 else ""
        for ident in landing:
            ws = d.world.workspaces.get(ident)
            change = "its change" if ws is None or ws.has_unmerged_change \
                else "whatever it holds"
            d.emit(Merge(ident, f"{ident}: worker reported done: {change} passed the verify "
                                f"command on top of trunk; merging it into trunk{together}",
                         batch=landing, run=run.id, verified=verified))
        for ident in landing:
            why = f"{ident}: worker reported done"
            rec = d.world.records.get(ident)
            if rec is not None and not d.complete_after(ident, rec, why):
                continue
            d.emit(Forget(ident, f"{why}: forgetting its workspace (after the merge)"))
