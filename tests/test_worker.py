"""``ralph-dev worker …`` against a real jj repo, the real local tracker, real files and the
controller's real end of the channel (its sockets, report acceptance and tracker relay)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from channel_kit import ControllerEnd
from click.testing import CliRunner, Result

from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.jj_cli import child_path
from ralph_dev.adapters.mailbox import RUN_DIR_VAR
from ralph_dev.adapters.pattern_store import ledger_path, load_ledger
from ralph_dev.adapters.store import StateStore, utcnow
from ralph_dev.adapters.tracker.local import LocalTracker
from ralph_dev.adapters.writebacks import WriteBackItem
from ralph_dev.cli import main
from ralph_dev.core.config import ProjectSettings, load_project
from ralph_dev.core.model import NewIssue, Role, StateType

VERIFY = (
    "echo checking; test -f ok.txt || { echo 'ok.txt is missing' >&2; exit 3; }; echo verify-ok"
)

@dataclass
class Project:
    settings: ProjectSettings
    tracker: LocalTracker
    jj: JjRepository
    store: StateStore
    jj_bin: str
    tmp: Path
    ends: list[ControllerEnd] = field(default_factory=list)

    @property
    def controller(self) -> ControllerEnd:
        if not self.ends:
            self.ends.append(ControllerEnd(self.settings, store=self.store,
                                           tracker=self.tracker, jj=self.jj.workspaces))
        return self.ends[0]

    def issue(self, title: str = "Add the thing", description: str = "Do it well.", **kw) -> str:
        return self.tracker.create_issues_sync([NewIssue(title=title, description=description,
                                                          **kw)])[0]

    def spawn(self, issue: str, role: Role = Role.EXECUTE, *, listen: bool = True) -> Path:
        """What the controller does before starting an agent: workspace, fresh record, the
        worker's run dir, and a listener on its socket."""
        workspace = self.jj.workspaces.add_workspace(issue)
        self.store.update_record(issue, role=role, attempts=1, started_at=utcnow(), done=False,
                                 blocked=False, iterations=0)
        self.tracker.set_state_sync(issue, type=StateType.STARTED)
        dirs = self.controller.dirs
        dirs.publish(tuple(self.tracker.list_issues_sync()))
        dirs.prepare(self.tracker.get_sync(issue), role, workspace, 1)
        if listen:
            self.controller.listen()
        return workspace

    def respawn(self, issue: str, role: Role) -> None:
        """The next worker of the same issue (say, its review): a fresh start."""
        self.store.update_record(issue, role=role, started_at=utcnow(), done=False,
                                 blocked=False)
        self.publish()
        self.controller.dirs.prepare(self.tracker.get_sync(issue), role,
                                        self.jj.workspaces.workspace_path(issue), 1)

    def publish(self) -> None:
        """The controller's next tick: its view of every issue, refreshed."""
        self.controller.dirs.publish(tuple(self.tracker.list_issues_sync()))

    def run_dir(self, issue: str) -> Path:
        return self.settings.paths.worker_dir(issue) / "run"

    def env(self, issue: str, role: Role = Role.EXECUTE) -> dict[str, str]:
        """An unconfined worker's environment: its run dir (and nothing that counts more)."""
        return {RUN_DIR_VAR: str(self.run_dir(issue))}

    def cli(self, args: list[str], issue: str, role: Role = Role.EXECUTE, **kw):
        return CliRunner().invoke(main, args, env=self.env(issue, role), catch_exceptions=False,
                                  **kw)

    def description(self, issue: str) -> str:
        out = subprocess.run(
            [self.jj_bin, "log", "--no-graph", "--ignore-working-copy", "-r", f"{issue}@",
             "-T", "description"],
            cwd=self.settings.repo, capture_output=True, text=True, check=True,
        )
        return out.stdout


def make_project(root: Path, jj_bin: str, *, verify: str | None = VERIFY,
                 extra: str = "") -> Project:
    repo = root / "repo"
    env = {"JJ_USER": "t", "JJ_EMAIL": "t@example.com", "PATH": child_path()}
    subprocess.run([jj_bin, "git", "init", str(repo)], check=True, capture_output=True, env=env)
    (repo / "README").write_text("hello\n")
    for args in (["commit", "-m", "init"], ["bookmark", "create", "main", "-r", "@-"]):
        subprocess.run([jj_bin, *args], cwd=repo, check=True, capture_output=True, env=env)
    config = root / "config" / "ralph-dev" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    lines = ["[projects.demo]", f"repo = {json.dumps(str(repo))}", 'trunk = "main"']
    if verify is not None:
        lines.append(f"verify_command = {json.dumps(verify)}")
    config.write_text("\n".join([*lines, extra, "[projects.demo.tracker]", 'key = "DEMO"', ""]))
    settings = load_project("demo", path=config)
    return Project(settings, LocalTracker(settings.paths.tracker_db, "DEMO"),
                   JjRepository.from_settings(settings), StateStore(settings.paths), jj_bin, root)


@pytest.fixture
def project(xdg: Path, jj_bin: str) -> Iterator[Project]:
    made = make_project(xdg, jj_bin)
    yield made
    for end in made.ends:
        end.close()


# --- done ---------------------------------------------------------------------------


def test_done_with_passing_verify_closes_the_issue_with_evidence(project: Project) -> None:
    issue = project.issue("Add ok file")
    workspace = project.spawn(issue)
    (workspace / "ok.txt").write_text("fine\n")

    result = project.cli(["worker", "done", issue, "--summary", "Added ok.txt; verify passes."],
                         issue)

    assert result.exit_code == 0, result.output
    assert "verify passed" in result.output
    got = project.tracker.get_sync(issue)
    # Done means in trunk: the controller completes the issue after its merge
    assert got.state_type is StateType.STARTED
    ralph = [c for c in got.comments if c.by_ralph]
    assert len(ralph) == 1
    body = ralph[0].body
    assert body.startswith(f"[ralph-dev] {issue} done (execute worker)")
    assert "Added ok.txt; verify passes." in body
    assert "exited 0" in body and "verify-ok" in body and VERIFY in body
    assert " UTC after " in body
    record = project.store.load_record(issue)
    assert record is not None and record.done and record.summary == "Added ok.txt; verify passes."
    assert project.description(issue).strip() == f"{issue}: Add ok file"
    events = [e for e in project.store.iter_events() if e["event"] == "worker_done"]
    assert events and events[-1]["issue"] == issue and events[-1]["verify_exit"] == 0


def test_done_to_a_controller_that_just_started_keeps_the_title_in_trunk(
        project: Project) -> None:
    """A worker reports done while the controller it reports to has just started (killed
    and restarted): it has not read the tracker yet, and the trunk commit must still
    carry the issue's title (it read the issue there)."""
    issue = project.issue("Add ok file")
    (project.spawn(issue) / "ok.txt").write_text("fine\n")
    first = project.ends.pop()
    first.close()  # the controller dies; a new one starts and listens before its first tick
    project.controller.listen()
    assert project.controller.dirs.issues == {}
    assert done(project, issue).exit_code == 0
    assert project.description(issue).strip() == f"{issue}: Add ok file"


def test_done_twice_does_not_double_comment(project: Project) -> None:
    issue = project.issue()
    workspace = project.spawn(issue)
    (workspace / "ok.txt").write_text("fine\n")
    for _ in range(2):
        result = project.cli(["worker", "done", issue, "--summary", "done"], issue)
        assert result.exit_code == 0, result.output
    assert "already reported done" in result.output
    assert len([c for c in project.tracker.get_sync(issue).comments if c.by_ralph]) == 1


def test_done_retry_after_partial_failure_does_not_double_comment(project: Project) -> None:
    """A crash after the comment but before the done marker: the retry finishes the rest."""
    issue = project.issue()
    workspace = project.spawn(issue)
    (workspace / "ok.txt").write_text("fine\n")
    assert project.cli(["worker", "done", issue, "--summary", "done"], issue).exit_code == 0
    project.store.update_record(issue, done=False)
    project.tracker.set_state_sync(issue, type=StateType.STARTED)

    result = project.cli(["worker", "done", issue, "--summary", "done"], issue)

    assert result.exit_code == 0, result.output
    got = project.tracker.get_sync(issue)
    assert got.state_type is StateType.STARTED  # completed after its merge
    assert len([c for c in got.comments if c.by_ralph]) == 1
    assert project.store.load_record(issue).done


def test_done_with_failing_verify_refuses_and_keeps_the_issue_open(project: Project) -> None:
    issue = project.issue()
    project.spawn(issue)

    result = CliRunner().invoke(main, ["worker", "done", issue, "--summary", "x"],
                                env=project.env(issue))

    assert result.exit_code != 0
    assert "verify failed" in result.stderr
    assert "exited with code 3" in result.stderr
    assert "ok.txt is missing" in result.stderr  # the output tail reaches the agent
    assert VERIFY in result.stderr
    got = project.tracker.get_sync(issue)
    assert got.state_type is StateType.STARTED
    assert not got.comments
    record = project.store.load_record(issue)
    assert record is not None and not record.done
    assert record.last_failure and "exit 3" in record.last_failure
    assert any(e["event"] == "verify_failed" for e in project.store.iter_events())


def test_done_without_verify_command_still_closes(xdg: Path, jj_bin: str) -> None:
    project = make_project(xdg, jj_bin, verify=None)
    issue = project.issue()
    (project.spawn(issue) / "ok.txt").write_text("ok\n")
    result = project.cli(["worker", "done", issue, "--summary", "trivial"], issue)
    assert result.exit_code == 0, result.output
    got = project.tracker.get_sync(issue)
    assert got.state_type is StateType.STARTED  # completed after its merge
    assert "no verify command is configured" in got.comments[-1].body


def test_done_of_execute_goes_to_review_when_configured(xdg: Path, jj_bin: str) -> None:
    project = make_project(xdg, jj_bin, extra="review_after_execute = true")
    issue = project.issue()
    (project.spawn(issue) / "ok.txt").write_text("ok\n")
    result = project.cli(["worker", "done", issue, "--summary", "ready for review"], issue)
    assert result.exit_code == 0, result.output
    assert project.tracker.get_sync(issue).state_name == "In Review"
    # the review worker then finishes it
    project.respawn(issue, Role.REVIEW)
    result = project.cli(["worker", "done", issue, "--summary", "looks right"], issue)
    assert result.exit_code == 0, result.output
    got = project.tracker.get_sync(issue)
    assert got.state_type is StateType.STARTED  # completed after its merge


def test_done_for_another_issue_is_refused(project: Project) -> None:
    mine, other = project.issue("mine"), project.issue("other")
    project.spawn(mine)
    result = CliRunner().invoke(main, ["worker", "done", other, "--summary", "x"],
                                env=project.env(mine))
    assert result.exit_code != 0
    assert f"works on {mine}, not {other}" in result.stderr
    assert project.tracker.get_sync(other).state_type is StateType.UNSTARTED
    assert not project.tracker.get_sync(other).comments


def test_worker_commands_outside_a_worker_are_refused(project: Project) -> None:
    issue = project.issue()
    # the variables that once made a worker do not make one now
    env = {"RALPH_DEV_ISSUE": issue, "RALPH_DEV_PROJECT": "demo", "RALPH_DEV_ROLE": "execute"}
    for args in (["done", issue, "--summary", "x"], ["note", issue, "hi"],
                 ["blocked", issue, "--question", "q"], ["feedback", issue]):
        result = CliRunner().invoke(main, ["worker", *args], env=env)
        assert result.exit_code != 0, args
        assert "run inside a ralph-dev worker" in result.stderr
    assert not project.tracker.get_sync(issue).comments


@pytest.mark.parametrize("bad", ["../x", "DEMO-1; rm -rf ~", "", "A" * 10_000])
def test_worker_commands_refuse_malformed_identifiers(project: Project, bad: str) -> None:
    issue = project.issue()
    result = CliRunner().invoke(main, ["worker", "note", bad, "hi"], env=project.env(issue))
    assert result.exit_code != 0
    assert "not an issue identifier" in result.stderr


# --- blocked, note, feedback ---------------------------------------------------------------


def test_blocked_labels_comments_and_records(project: Project) -> None:
    issue = project.issue()
    project.spawn(issue)
    result = project.cli(["worker", "blocked", issue, "--question", "Which database, A or B?"],
                         issue)
    assert result.exit_code == 0, result.output
    got = project.tracker.get_sync(issue)
    assert "user-input-needed" in got.labels
    assert got.comments[-1].by_ralph
    assert "Which database, A or B?" in got.comments[-1].body
    assert project.store.load_record(issue).blocked
    # asking the same again changes nothing
    again = project.cli(["worker", "blocked", issue, "--question", "Which database, A or B?"],
                        issue)
    assert again.exit_code == 0, again.output
    assert len(project.tracker.get_sync(issue).comments) == 1


def test_note_comments_and_labels(project: Project) -> None:
    issue = project.issue()
    project.spawn(issue)
    result = project.cli(["worker", "note", issue, "FYI: the API is slower than expected"],
                         issue)
    assert result.exit_code == 0, result.output
    got = project.tracker.get_sync(issue)
    assert "agent-feedback-given" in got.labels
    assert got.comments[-1].by_ralph and "slower than expected" in got.comments[-1].body
    assert not project.store.load_record(issue).blocked


def test_feedback_prints_only_new_human_comments(project: Project) -> None:
    issue = project.issue()
    project.tracker.comment_sync(issue, "old remark before the worker started", by_ralph=False,
                                 author="alice")
    project.spawn(issue)
    project.tracker.comment_sync(issue, "ralph's own words", by_ralph=True)
    project.tracker.comment_sync(issue, "Please use SQLite, not files.", by_ralph=False,
                                 author="bob")
    project.publish()

    first = project.cli(["worker", "feedback", issue], issue)

    assert first.exit_code == 0, first.output
    assert "Please use SQLite, not files." in first.output
    assert "bob" in first.output
    assert "old remark" not in first.output
    assert "ralph's own words" not in first.output
    assert "BEGIN COMMENTS" in first.output and "END COMMENTS" in first.output
    second = project.cli(["worker", "feedback", issue], issue)
    assert "No new comments" in second.output
    every = project.cli(["worker", "feedback", issue, "--all"], issue)
    assert "old remark" in every.output and "SQLite" in every.output
    assert "ralph's own words" not in every.output


# --- plan --------------------------------------------------------------------------------


PLAN = """
[[task]]
ref = "schema"
title = "Design the schema"

[[task]]
ref = "api"
title = "Build the API"
blocked_by = ["schema"]
"""


def test_plan_creates_children_with_blockers_then_done(project: Project, tmp_path: Path) -> None:
    parent = project.issue("Big feature")
    project.spawn(parent, Role.PLAN)
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(PLAN)

    early = CliRunner().invoke(main, ["worker", "done", parent, "--summary", "planned"],
                               env=project.env(parent, Role.PLAN))
    assert early.exit_code != 0 and "worker plan" in early.stderr

    result = project.cli(["worker", "plan", parent, "--file", str(plan_file)], parent, Role.PLAN)

    assert result.exit_code == 0, result.output
    got = project.tracker.get_sync(parent)
    assert len(got.children) == 2
    by_title = {project.tracker.get_sync(c).title: project.tracker.get_sync(c)
                for c in got.children}
    schema, api = by_title["Design the schema"], by_title["Build the API"]
    assert schema.parent == parent and api.parent == parent
    assert api.blocked_by == (schema.identifier,)
    # running it again does not duplicate the plan
    again = CliRunner().invoke(main, ["worker", "plan", parent, "--file", str(plan_file)],
                               env=project.env(parent, Role.PLAN))
    assert again.exit_code != 0 and "already has sub-issues" in again.stderr
    assert len(project.tracker.get_sync(parent).children) == 2

    done = project.cli(["worker", "done", parent, "--summary", "planned in 2 steps"], parent,
                       Role.PLAN)
    assert done.exit_code == 0, done.output
    assert project.store.load_record(parent).done
    # the parent completes when its children do (the controller's job), not now
    assert project.tracker.get_sync(parent).state_type is StateType.STARTED


def test_a_plan_is_remembered_for_pattern_learning_once(project: Project,
                                                        tmp_path: Path) -> None:
    parent = project.issue("Big feature")
    project.spawn(parent, Role.PLAN)
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text("# How: split by component.\n" + PLAN)

    result = project.cli(["worker", "plan", parent, "--file", str(plan_file)], parent, Role.PLAN)

    assert result.exit_code == 0, result.output
    path = ledger_path(project.settings)
    pending = load_ledger(path).phases[parent]
    assert pending.strategies == ("split-by-component",)  # from the file's comment
    assert pending.children == project.tracker.get_sync(parent).children
    # the write-back is made again (the controller died before removing it): the
    # sub-issues exist, and the phase is still remembered once, as first planned
    project.controller.writebacks.add(WriteBackItem("ab" * 8, "plan", parent, {
        "entries": [{"title": "Shared types first"}], "text": "# parallelize everything"}))
    assert project.controller.call(project.controller.write_back_due()) == []
    assert load_ledger(path).phases == {parent: pending}
    remembered = [e for e in project.store.iter_events() if e["event"] == "patterns_remembered"]
    assert [(e["issue"], e["strategies"]) for e in remembered] == [
        (parent, ["split-by-component"])]
    assert len(project.tracker.get_sync(parent).children) == 2


def test_plan_is_refused_for_an_execute_worker(project: Project, tmp_path: Path) -> None:
    issue = project.issue()
    project.spawn(issue)
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(PLAN)
    result = CliRunner().invoke(main, ["worker", "plan", issue, "--file", str(plan_file)],
                                env=project.env(issue))
    assert result.exit_code != 0 and "only a plan worker" in result.stderr
    assert not project.tracker.get_sync(issue).children


def test_done_refuses_a_file_jj_would_not_record(project: Project) -> None:
    """Issue 9: the merge would refuse it (the work would be lost), so `worker done`
    does, while the agent is still there to fix it; the advice works as written."""
    issue = project.issue("Build it")
    workspace = project.spawn(issue)
    (workspace / "ok.txt").write_text("fine\n")
    (workspace / "build.bin").write_bytes(b"x" * (2 * 1024 * 1024))  # a 2 MiB build output
    refused = project.cli(["worker", "done", issue, "--summary", "built"], issue)
    assert refused.exit_code != 0
    assert "did not record build.bin" in refused.stderr and ".gitignore" in refused.stderr
    assert not project.store.load_record(issue).done
    (workspace / ".gitignore").write_text("build.bin\n")  # the first fix it names
    done = project.cli(["worker", "done", issue, "--summary", "built"], issue)
    assert done.exit_code == 0, done.output
    assert project.store.load_record(issue).done


def jj_in(project: Project, cwd: Path, *args: str) -> str:
    """jj as an unconfined agent (or a person) runs it in a workspace."""
    env = {**os.environ, "JJ_USER": "a", "JJ_EMAIL": "a@example.com"}
    return subprocess.run([project.jj_bin, *args], cwd=cwd, env=env, check=True,
                          capture_output=True, text=True).stdout


def done(project: Project, issue: str) -> Result:
    return project.cli(["worker", "done", issue, "--summary", "did it"], issue)


def test_done_refuses_an_execute_worker_that_changed_nothing(xdg: Path, jj_bin: str) -> None:
    """Issue 9: the merge would find nothing and the issue would close with no work."""
    project = make_project(xdg, jj_bin, verify=None)
    try:
        issue = project.issue("Build it")
        workspace = project.spawn(issue)
        refused = done(project, issue)
        assert refused.exit_code != 0 and "holds no change" in refused.stderr
        assert "worker blocked" in refused.stderr  # the way out when nothing is needed
        assert not project.store.load_record(issue).done
        (workspace / "ok.txt").write_text("the change\n")  # the fix it names
        assert done(project, issue).exit_code == 0
    finally:
        for end in project.ends:
            end.close()


def test_done_refuses_a_conflicted_change_until_the_markers_are_gone(project: Project) -> None:
    issue = project.issue("Build it")
    workspace = project.spawn(issue)
    (workspace / "ok.txt").write_text("mine\n")
    jj_in(project, workspace, "describe", "-m", "mine")
    repo = project.settings.repo  # meanwhile trunk got its own ok.txt
    jj_in(project, repo, "new", "main")
    (repo / "ok.txt").write_text("theirs\n")
    jj_in(project, repo, "bookmark", "set", "main", "-r", "@")
    jj_in(project, workspace, "rebase", "-b", "@", "-o", "main")  # the conflict is here now
    refused = done(project, issue)
    assert refused.exit_code != 0 and "hold conflicts, in: ok.txt" in refused.stderr
    assert "<<<<<<<" in (workspace / "ok.txt").read_text()
    # jj cannot run in the sandbox: `worker diff` says what is still conflicted
    shown = project.cli(["worker", "diff", issue], issue).output
    assert shown.startswith("# Still conflicted: ok.txt."), shown
    (workspace / "ok.txt").write_text("mine and theirs\n")  # the fix: no markers
    assert "Still conflicted" not in project.cli(["worker", "diff", issue], issue).output
    assert done(project, issue).exit_code == 0, "resolved in the conflicted change itself"


def plan_text(count: int, labels: str = "") -> str:
    return "".join(f'[[task]]\nref = "t{i}"\ntitle = "Task {i}"\n{labels}\n' for i in range(count))


def test_plans_are_capped_and_cannot_speak_for_a_person(xdg: Path, jj_bin: str,
                                                        tmp_path: Path) -> None:
    project = make_project(xdg, jj_bin, extra="[projects.demo.limits]\n"
                                               "plan_issues = 3\nplan_issues_per_hour = 5")
    first, second, third = (project.issue(f"Phase {n}") for n in range(3))
    for issue in (first, second, third):
        project.spawn(issue, Role.PLAN)
    plan_file = tmp_path / "plan.toml"

    def plan(issue: str, text: str) -> Result:
        plan_file.write_text(text)
        return CliRunner().invoke(main, ["worker", "plan", issue, "--file", str(plan_file)],
                                  env=project.env(issue, Role.PLAN))

    too_big = plan(first, plan_text(4))
    assert too_big.exit_code != 0 and "at most 3 may be created by one plan" in too_big.stderr
    steering = plan(first, plan_text(1, 'labels = ["user-feedback-given"]'))
    assert steering.exit_code != 0 and "only a person may set" in steering.stderr
    assert not project.tracker.get_sync(first).children  # nothing half-made
    assert plan(first, plan_text(3, 'labels = ["ralph:research"]')).exit_code == 0
    assert plan(second, plan_text(2)).exit_code == 0  # 5 this hour: the cap
    over = plan(third, plan_text(1))
    assert over.exit_code != 0 and "at most 5 an hour" in over.stderr
    refused = [e for e in project.store.iter_events() if e["event"] == "plan_refused"]
    assert len(refused) == 3 and refused[-1]["issue"] == third


def test_a_report_too_large_is_refused_at_the_command(project: Project,
                                                      tmp_path: Path) -> None:
    """Issue 27: a 269 KB plan went into the outbox, the agent was told it would be
    applied, and the controller dropped it unread as malformed. Now the command refuses
    it, says the limit and what to do, exits non-zero, and writes nothing."""
    from ralph_dev.adapters import mailbox as ch

    parent = project.issue("Big feature")
    project.spawn(parent, Role.PLAN)
    plan_file = tmp_path / "plan.toml"
    body = "Explain every step in detail. " * 220  # ~6.6 KB each, 40 tasks: ~269 KB
    plan_file.write_text("".join(f'[[task]]\nref = "t{i}"\ntitle = "Task {i}"\n'
                                 f'description = """\n{body}\n"""\n' for i in range(40)))
    written = plan_file.read_text()
    assert 260_000 < len(written.encode()) < 280_000
    outbox = project.run_dir(parent) / "outbox"

    result = project.cli(["worker", "plan", parent, "--file", str(plan_file)], parent, Role.PLAN)

    assert result.exit_code != 0, result.output
    assert "256 KiB" in result.stderr and "Split the plan into phases" in result.stderr
    assert "nothing was sent" in result.stderr and "ralph:phase" in result.stderr
    assert not list(outbox.iterdir())  # nothing written, nothing half-written
    assert plan_file.read_text() == written  # the agent's file is as it was
    assert not project.tracker.get_sync(parent).children
    assert not [e for e in project.store.iter_events() if e["event"] == "report_refused"]

    huge_note = project.cli(["worker", "note", parent, "x" * (ch.REPORT_LIMIT + 1)], parent,
                            Role.PLAN)
    assert huge_note.exit_code != 0 and "Shorten the note" in huge_note.stderr
    assert not list(outbox.iterdir())

    # split as told: the first phase's tasks now, the rest as one phase task
    plan_file.write_text(
        "".join(f'[[task]]\nref = "t{i}"\ntitle = "Task {i}"\n'
                f'description = """\n{body}\n"""\n' for i in range(20))
        + '[[task]]\ntitle = "The rest"\nlabels = ["ralph:phase"]\n'
          'description = "Tasks 20 to 39."\n')
    again = project.cli(["worker", "plan", parent, "--file", str(plan_file)], parent, Role.PLAN)
    assert again.exit_code == 0, again.output
    assert len(project.tracker.get_sync(parent).children) == 21


def test_a_report_that_is_not_utf8_text_is_refused_at_the_command(project: Project) -> None:
    """Bytes that are not UTF-8 (an argument decoded with surrogate escapes) would reach
    the tracker as a report it cannot store: refused at the command, nothing written."""
    issue = project.issue()
    project.spawn(issue)
    result = project.cli(["worker", "note", issue, "caf\udce9 au lait"], issue)
    assert result.exit_code != 0 and "UTF-8" in result.stderr, result.output
    assert not list((project.run_dir(issue) / "outbox").iterdir())
    assert not project.tracker.get_sync(issue).comments


def test_files_holding_issue_text_are_private(project: Project) -> None:
    """Tracker, events and records hold issue text: 0600 in 0700 dirs, even where an
    older version had left them open."""
    from ralph_dev.core.paths import data_home, state_home

    issue = project.issue("Private matters")
    project.spawn(issue)
    project.store.append_event("probe", issue=issue)
    paths = project.settings.paths
    for path in (paths.tracker_db, paths.events_file, project.store.record_path(issue)):
        assert path.stat().st_mode & 0o777 == 0o600, path
    for directory in (state_home(), data_home(), paths.state_dir, paths.data_dir):
        assert directory.stat().st_mode & 0o777 == 0o700, directory
    paths.state_dir.chmod(0o755)  # as an older version left it
    StateStore(paths)
    assert paths.state_dir.stat().st_mode & 0o777 == 0o700


# --- hostile issue text --------------------------------------------------------------------


def hostile_text(marker: Path) -> tuple[str, str]:
    title = (f"$(touch {marker}) `touch {marker}` ; rm -rf ~ C-c Enter "
             "\x1b[31mred\x1b[0m \x1b]0;pwned\x07 end")
    description = (f"$(touch {marker})\n`touch {marker}`\n; rm -rf ~\nC-c\nEnter\n"
                   "\x1b[2J\x1b[31mred\x1b[0m\n") + "x" * 10_000
    return title, description


def test_hostile_issue_text_is_data_through_done(project: Project, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    title, description = hostile_text(marker)
    issue = project.issue(title, description)
    (project.spawn(issue) / "ok.txt").write_text("ok\n")

    result = project.cli(["worker", "done", issue, "--summary",
                          f"$(touch {marker}) `touch {marker}` \x1b[31m"], issue)

    assert result.exit_code == 0, result.output
    assert not marker.exists()
    described = project.description(issue)
    # the title, verbatim as data (the description keeps its first 200 characters)
    assert described.startswith(f"{issue}: $(touch {marker})")
    assert "\x1b" not in described
    body = project.tracker.get_sync(issue).comments[-1].body
    assert f"$(touch {marker})" in body and "\x1b" not in body


def test_done_with_a_hanging_verify_times_out_and_refuses(xdg: Path, jj_bin: str) -> None:
    # `exec`: verify kills only the shell on timeout, so a forked child would linger
    project = make_project(xdg, jj_bin, verify="echo started; exec sleep 30")
    issue = project.issue()
    project.spawn(issue)
    result = CliRunner().invoke(main, ["worker", "done", issue, "--summary", "x",
                                       "--timeout", "1"], env=project.env(issue))
    assert result.exit_code != 0
    assert "verify failed" in result.stderr and "timed out" in result.stderr
    assert project.tracker.get_sync(issue).state_type is StateType.STARTED


def test_done_on_a_canceled_issue_is_refused(project: Project) -> None:
    issue = project.issue()
    (project.spawn(issue) / "ok.txt").write_text("ok\n")
    project.tracker.set_state_sync(issue, type=StateType.CANCELED)
    project.publish()
    result = CliRunner().invoke(main, ["worker", "done", issue, "--summary", "x"],
                                env=project.env(issue))
    assert result.exit_code != 0 and "canceled" in result.stderr
    assert project.tracker.get_sync(issue).state_type is StateType.CANCELED
    assert not project.tracker.get_sync(issue).comments


# --- the channel: the controller applies, exactly once, through outages ------------------


class FlakyTracker(LocalTracker):
    """The local tracker, unreachable for writes while ``down`` (as Linear is during an
    outage: RATELIMITED, a 5xx, a revoked key)."""

    down = False

    def _check(self) -> None:
        from ralph_dev.core.errors import TrackerUnavailable

        if self.down:
            raise TrackerUnavailable("Linear answered 503 (ralph-dev retries)")

    async def comment(self, *args: Any, **kw: Any) -> Any:
        self._check()
        return await super().comment(*args, **kw)

    async def set_state(self, *args: Any, **kw: Any) -> Any:
        self._check()
        return await super().set_state(*args, **kw)


def test_done_during_a_tracker_outage_costs_nothing_and_is_applied_once(
        xdg: Path, jj_bin: str) -> None:
    """Issue 10 item 2: `worker done` while the tracker is down succeeds for the worker
    (its pane does not die as a failed attempt); the controller makes the tracker writes
    when the tracker answers again, once, even when its queue entry survives a restart."""
    from ralph_dev.adapters.writebacks import WriteBackItem

    project = make_project(xdg, jj_bin)
    project.tracker = FlakyTracker(project.settings.paths.tracker_db, "DEMO")
    try:
        issue = project.issue("Add ok file")
        (project.spawn(issue) / "ok.txt").write_text("fine\n")
        FlakyTracker.down = True
        result = project.cli(["worker", "done", issue, "--summary", "Added ok.txt."], issue)
        assert result.exit_code == 0, result.output
        assert "did not answer" in result.output and "Nothing is lost" in result.output
        record = project.store.load_record(issue)
        assert record is not None and record.done and record.attempts == 1
        assert project.tracker.get_sync(issue).state_type is StateType.STARTED
        queue, end = project.controller.writebacks, project.controller
        assert [i.issue for i in queue.items()] == [issue]  # no new worker starts meanwhile
        item = queue.items()[0]
        assert item.blame == "outside" and item.failures == 0  # an outage: nobody's failure
        # a tick that cannot read the tracker tries nothing
        assert end.call(end.write_back_due(tracker_ok=False)) == []
        FlakyTracker.down = False
        # the first tick that reads the tracker again makes the writes: no backoff of their own
        assert end.call(end.write_back_due()) == []
        got = project.tracker.get_sync(issue)
        assert got.state_type is StateType.STARTED  # completed after its merge
        assert len([c for c in got.comments if c.by_ralph]) == 1
        assert queue.items() == []
        # a controller killed after the writes but before it dropped the entry repeats none
        queue.add(WriteBackItem(item.id, item.kind, item.issue, item.body))
        assert end.call(end.write_back_due()) == []
        assert len([c for c in project.tracker.get_sync(issue).comments if c.by_ralph]) == 1
        events = [e["event"] for e in project.store.iter_events()]
        assert "relay_failed" in events and events.count("relayed") == 2
    finally:
        FlakyTracker.down = False
        for end in project.ends:
            end.close()


class RefusingTracker(LocalTracker):
    """The local tracker refusing every comment for a reason only a person can fix (as
    Linear refuses a write in a project of two teams with no team configured)."""

    refuse = False

    async def comment(self, *args: Any, **kw: Any) -> Any:
        from ralph_dev.core.errors import TrackerInputError

        if self.refuse:
            raise TrackerInputError("Linear needs a team for this write and the project has "
                                    "two: set tracker.linear_team")
        return await super().comment(*args, **kw)


def test_a_write_the_tracker_refuses_for_good_goes_to_a_person_not_to_a_retry_loop(
        xdg: Path, jj_bin: str) -> None:
    """Issue 25: a write that can never succeed was retried forever while the worker was
    told "Nothing is lost" and nobody was told anything. Now the worker hears the truth,
    the write is not retried, status says what to fix (NEEDS YOU) and a person is
    notified (`relay_refused`); once the config is read again it is tried again."""
    from ralph_dev.control.state.status import snapshot

    project = make_project(xdg, jj_bin)
    project.tracker = RefusingTracker(project.settings.paths.tracker_db, "DEMO")
    try:
        issue = project.issue("Add ok file")
        project.spawn(issue)
        RefusingTracker.refuse = True
        result = project.cli(["worker", "note", issue, "Halfway: the parser is done."], issue)
        assert result.exit_code == 0, result.output
        assert "refused" in result.output and "set tracker.linear_team" in result.output
        assert "Nothing is lost" not in result.output
        end = project.controller
        (item,) = end.writebacks.items()
        assert item.blame == "permanent" and item.failures == 1
        for _ in range(3):  # ticks: never tried again on their own
            assert end.call(end.write_back_due()) == []
        assert end.writebacks.items()[0].failures == 1
        refused = [e for e in project.store.iter_events() if e["event"] == "relay_refused"]
        assert len(refused) == 1 and "linear_team" in refused[0]["error"]
        doc = end.call(snapshot(project.settings))
        (need,) = [n for n in doc["needs_you"] if n["kind"] == "tracker_write"]
        assert need["issue"] == issue and "set tracker.linear_team" in need["message"]
        RefusingTracker.refuse = False  # a person fixed the config; the controller reads it
        assert end.call(end.write_back_due(config_loaded_at=utcnow())) == []
        assert end.writebacks.items() == []
        notes = [c for c in project.tracker.get_sync(issue).comments if c.by_ralph]
        assert len(notes) == 1 and "the parser is done" in notes[0].body
        doc = end.call(snapshot(project.settings))
        assert not [n for n in doc["needs_you"] if n["kind"] == "tracker_write"]
    finally:
        RefusingTracker.refuse = False
        for end in project.ends:
            end.close()


def test_reports_wait_for_a_controller_that_is_not_running(project: Project) -> None:
    """No controller: the report is recorded and applied when one runs."""
    issue = project.issue("Add ok file")
    (project.spawn(issue, listen=False) / "ok.txt").write_text("fine\n")
    result = project.cli(["worker", "done", issue, "--summary", "Added it."], issue)
    assert result.exit_code == 0, result.output
    assert "not answering" in result.output
    assert not project.store.load_record(issue).done
    project.controller.call(project.controller.intake.accept_all())
    assert project.store.load_record(issue).done
    assert project.tracker.get_sync(issue).state_type is StateType.STARTED  # merge first


def test_a_report_cannot_name_another_issue_or_role(project: Project) -> None:
    """Issue 12 item 3: the issue and role are those of the run dir the report lies in."""
    from ralph_dev.adapters import mailbox as ch

    mine, other = project.issue("mine"), project.issue("other")
    project.spawn(mine, Role.RESEARCH, listen=False)
    ch.write_report(project.run_dir(mine), "done", {
        "summary": "forged", "issue": other, "role": "execute",
        "verify": {"command": "true", "exit_code": 0}})
    project.controller.call(project.controller.intake.accept_all())
    assert project.tracker.get_sync(other).state_type is StateType.UNSTARTED
    assert not project.tracker.get_sync(other).comments
    body = project.tracker.get_sync(mine).comments[-1].body
    assert "(research worker)" in body


def test_worker_commands_ignore_config_and_environment_overrides(project: Project,
                                                                 tmp_path: Path) -> None:
    """Issue 12 item 3: `RALPH_DEV_VERIFY_COMMAND` or `--config alt.toml` once made
    `worker done`'s verify pass; the verify command is the controller's."""
    issue = project.issue()
    project.spawn(issue)  # no ok.txt: the project's verify fails
    alt = tmp_path / "alt.toml"
    alt.write_text(f'[projects.demo]\nrepo = "{project.settings.repo}"\n'
                   'verify_command = "echo bypassed"\n')
    env = {**project.env(issue), "RALPH_DEV_VERIFY_COMMAND": "echo bypassed",
           "RALPH_DEV_CONFIG": str(alt)}
    for args in (["worker", "done", issue, "--summary", "x"],
                 ["--config", str(alt), "worker", "done", issue, "--summary", "x"]):
        result = CliRunner().invoke(main, args, env=env)
        assert result.exit_code != 0 and "verify failed" in result.stderr, result.output
    assert not project.store.load_record(issue).done


def test_peoples_commands_refuse_inside_a_worker(project: Project) -> None:
    """Issue 12 item 3: `ralph-dev issue state X Canceled` from inside a worker."""
    mine, other = project.issue("mine"), project.issue("other")
    project.spawn(mine, listen=False)
    for args in (["issue", "state", other, "Canceled"], ["init", "x", "--force"],
                 ["status"]):
        result = CliRunner().invoke(main, args, env=project.env(mine))
        assert result.exit_code != 0, args
        assert "person's command" in result.stderr
    assert project.tracker.get_sync(other).state_type is StateType.UNSTARTED


def test_the_controller_reads_reports_warily(project: Project, tmp_path: Path) -> None:
    """The outbox is the worker's: a link to a file its sandbox hides is not followed,
    and a flood of reports is heard a few at a time."""
    from ralph_dev.adapters import mailbox as ch

    issue = project.issue()
    project.spawn(issue, listen=False)
    run = project.run_dir(issue)
    secret = tmp_path / "elsewhere.json"
    report = ch.write_report(run, "note", {"text": "from a link"})
    (run / "outbox" / f"{report.id}.json").rename(secret)
    (run / "outbox" / f"{report.id}.json").symlink_to(secret)
    for n in range(30):
        ch.write_report(run, "note", {"text": f"note {n}"})
    channel = project.controller.intake
    first = project.controller.call(channel.accept(issue))
    assert ch.REPORTS_AT_ONCE - 1 <= len(first) <= ch.REPORTS_AT_ONCE  # (the link: refused)
    project.controller.call(channel.accept_all())
    project.controller.call(channel.accept_all())
    bodies = [c.body for c in project.tracker.get_sync(issue).comments]
    assert len(bodies) == 30 and not any("from a link" in b for b in bodies)
    assert secret.exists()
    assert any(e["event"] == "report_refused" for e in project.store.iter_events())


def test_worker_diff_shows_the_change_as_of_now(project: Project) -> None:
    """jj cannot run inside the sandbox (the repository is read-only there): `worker diff`
    has the controller snapshot the workspace from outside and print the change."""
    issue = project.issue("Build it")
    workspace = project.spawn(issue)
    empty = project.cli(["worker", "diff", issue], issue)
    assert empty.exit_code == 0 and "no change yet" in empty.output
    (workspace / "ok.txt").write_text("the change\n")  # and at once, no hook in between
    shown = project.cli(["worker", "diff", issue], issue)
    assert shown.exit_code == 0, shown.output
    assert "+++ b/ok.txt" in shown.output and "+the change" in shown.output
    assert "did not answer" not in shown.output


def test_an_older_state_report_never_overwrites_a_newer_one(project: Project) -> None:
    """What the agent said last wins, whatever order its reports are applied in: one left
    in the outbox can be applied after a later one the socket delivered (a controller
    that just started listening), and the status must not go back to "working" while
    the agent waits out a usage limit."""
    import os

    from ralph_dev.adapters import mailbox as ch

    issue = project.issue("Add ok file")
    project.spawn(issue, listen=False)
    run = project.run_dir(issue)
    older = ch.write_report(run, "activity", {"state": "waiting for the model"})
    # the error says what the agent does now by itself: no second report to wait for
    newer = ch.write_report(run, "agent_error", {"error": "rate_limit", "text": "429"})
    late = (run / ch.OUTBOX / f"{newer.id}.json").stat().st_mtime + 5
    os.utime(run / ch.OUTBOX / f"{older.id}.json", (late, late))  # applied last
    project.controller.call(project.controller.intake.accept_all())
    record = project.store.load_record(issue)
    assert record is not None and record.agent_state == "api error: rate_limit"
    # nor is the model taken to have answered after the error (an outage's probe)
    assert record.agent_error == "rate_limit" and record.agent_error_streak == 1


def test_a_report_is_a_fact_beside_the_record_which_only_the_actuator_writes(
        project: Project) -> None:
    """The record has one writer: accepting a report notes what the worker said beside
    it, and the next load (the next tick) reads it; the actuator's next start of the
    worker then wins over what the last one said."""
    from ralph_dev.adapters import mailbox as ch
    from ralph_dev.core.actions import Restart

    issue = project.issue("Add ok file")
    project.spawn(issue, listen=False)
    record_file = project.store.record_path(issue)
    written = record_file.read_bytes()
    ch.write_report(project.run_dir(issue), "blocked", {"text": "which port?"})
    project.controller.call(project.controller.intake.accept_all())
    assert record_file.read_bytes() == written  # the actuator's file, untouched
    assert project.store.load_record(issue).blocked  # the fact, folded in
    started = Restart(issue=issue, reason="test", attempt=2).record_changes(datetime.now(UTC))
    project.store.update_record(issue, **started)  # what the actuator writes at a start
    assert not project.store.load_record(issue).blocked
