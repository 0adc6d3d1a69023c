"""Merges, workspace adds and forgets killed at every step come back whole.

A real jj runs every command, through a wrapper that, at its N-th call, kills
(-9) the process driving the merge — before jj starts, or with jj itself killed
part-way — on a colocated and on a plain jj repository. The next attempt (the
next tick) must then finish the work or roll it back: trunk holds every merged
change exactly once and nothing else, and no work is lost.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_jj import make_repo, show, trunk_files, work

from ralph_dev.adapters.jj import JjRepository
from ralph_dev.adapters.jj_guard import MergeRefused

pytestmark = pytest.mark.slow

WRAPPER = textwrap.dedent("""\
    #!{python}
    # jj, except that call number KILL_AT kills the driving process (and jj itself)
    import os, signal, subprocess, sys, time
    state = {state!r}
    n = int(open(state).read() or 0) + 1
    open(state, "w").write(str(n))
    argv = [{jj!r}, *sys.argv[1:]]
    if n != {kill_at}:
        os.execv(argv[0], argv)
    if {during}:
        proc = subprocess.Popen(argv)
        time.sleep({delay})
        proc.kill()
    os.kill(os.getppid(), signal.SIGKILL)
    sys.exit(137)
""")

DRIVER = textwrap.dedent("""\
    import sys
    from pathlib import Path
    from ralph_dev.adapters.jj import JjRepository
    repo, root, jj_bin, step, name = sys.argv[1:]
    jj = JjRepository.open(Path(repo), Path(root), "main", jj_bin=jj_bin)
    if step == "merge":
        jj.merger.merge(name)
    elif step == "add":
        jj.workspaces.add_workspace(name)
    else:
        jj.workspaces.forget(name)
""")


def drive(jj: JjRepository, jj_bin: str, tmp: Path, step: str, name: str, *, kill_at: int = 0,
          during: bool = False, delay: float = 0.03) -> tuple[int, int]:
    """Run one step in its own process through the killing wrapper: (exit code, jj calls)."""
    state = tmp / f"calls-{step}-{kill_at}-{during}"
    state.write_text("0")
    wrapper = tmp / f"jj-{step}-{kill_at}-{during}"
    wrapper.write_text(WRAPPER.format(python=sys.executable, state=str(state), jj=jj_bin,
                                      kill_at=kill_at, during=during, delay=delay))
    wrapper.chmod(0o755)
    git = Path(jj.cli.child_path().split(":")[0]) / "git"
    if git.exists():  # keep jj's own git first on the wrapped jj's PATH too
        (tmp / "git").unlink(missing_ok=True)
        (tmp / "git").symlink_to(git)
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(jj.cli.repo), str(jj.home.root),
                           str(wrapper), step, name], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
                          cwd=tmp, check=False)
    return proc.returncode, int(state.read_text())


def merged_exactly(jj: JjRepository, expected: dict[str, str]) -> None:
    """Trunk holds exactly these files (besides the initial ones), linearly."""
    assert trunk_files(jj) == {"README", "shared.txt", *expected}
    for path, text in expected.items():
        assert show(jj, "main", path) == text
    parents = jj.cli.run("--ignore-working-copy", "log", "--no-graph", "-r", "::main ~ root()",
                     "-T", 'parents.len() ++ "\\n"').check().lines()
    assert set(parents) == {"1"}


def git_branch(jj: JjRepository, branch: str) -> str:
    """Where the person's git has ``branch`` (colocated repositories)."""
    return subprocess.run(["git", "-C", str(jj.cli.repo), "rev-parse", f"refs/heads/{branch}"],
                          check=True, capture_output=True, text=True,
                          env={"PATH": jj.cli.child_path()}).stdout.strip()


@pytest.fixture(params=["colocated", "plain"])
def repo_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Fresh:
    """The same starting world again and again, at the same paths (jj and git keep
    absolute paths): built once, then restored from a copy before every attempt."""

    def __init__(self, root: Path, jj_bin: str, kind: str, *, also_merge: bool = False) -> None:
        self.root = root
        self.copy = root.with_name(root.name + ".pristine")
        self.jj_bin = jj_bin
        repo = make_repo(jj_bin, root / "repo", colocate=kind == "colocated")
        jj = JjRepository.open(repo, root / "workspaces", "main", jj_bin=jj_bin)
        work(jj, "ENG-1", {"one.txt": "one\n"})
        work(jj, "ENG-2", {"two.txt": "two\n"})
        assert jj.merger.merge("ENG-1").merged  # trunk moved since ENG-2 started: a real rebase
        if also_merge:
            assert jj.merger.merge("ENG-2").merged
        shutil.copytree(root, self.copy, symlinks=True)

    def __call__(self) -> JjRepository:
        shutil.rmtree(self.root)
        shutil.copytree(self.copy, self.root, symlinks=True)
        return JjRepository.open(self.root / "repo", self.root / "workspaces", "main",
                                 jj_bin=self.jj_bin)


def test_a_merge_killed_at_every_step_is_finished_by_the_next_attempt(
        tmp_path: Path, jj_bin: str, repo_kind: str) -> None:
    fresh = Fresh(tmp_path / "world", jj_bin, repo_kind)
    code, calls = drive(fresh(), jj_bin, tmp_path, "merge", "ENG-2")
    assert code == 0 and calls > 5
    seen_refusals = 0
    # killing jj itself mid-command matters where a killed command can leave git's view
    # and jj's apart (colocated); killing the controller between commands, everywhere
    for kill_at in range(1, calls + 1):
        for during in (False, True) if repo_kind == "colocated" else (False,):
            jj = fresh()
            code, _ = drive(jj, jj_bin, tmp_path, "merge", "ENG-2", kill_at=kill_at,
                            during=during)
            assert code == -9, f"call {kill_at} did not kill the merge"
            try:
                jj.merger.merge("ENG-2")  # the next tick
            except MergeRefused:
                seen_refusals += 1  # refused with trunk untouched is safe, never a revert
                merged_exactly(jj, {"one.txt": "one\n"})
                continue
            merged_exactly(jj, {"one.txt": "one\n", "two.txt": "two\n"})
            if repo_kind == "colocated":  # and the person's git was told, whenever it was killed
                assert git_branch(jj, "main") == jj.trunk.trunk_commit()
            assert jj.home.intents.load("ENG-2") is None  # the merge ended: its intent is gone
            assert not jj.merger.merge("ENG-2").merged  # nothing left to merge, nothing repeated
    # every interrupted merge was completed: a refusal here would need a person
    assert seen_refusals == 0


@pytest.mark.parametrize("step", ["add", "forget"])
def test_add_and_forget_killed_at_every_step_recover(tmp_path: Path, jj_bin: str,
                                                     repo_kind: str, step: str) -> None:
    fresh = Fresh(tmp_path / "world", jj_bin, repo_kind, also_merge=step == "forget")
    name = "ENG-3" if step == "add" else "ENG-2"
    code, calls = drive(fresh(), jj_bin, tmp_path, step, name)
    assert code == 0 and calls >= 2
    for kill_at in range(1, calls + 1):
        for during, delay in ((False, 0.0), (True, 0.01), (True, 0.03)):
            jj = fresh()
            code, _ = drive(jj, jj_bin, tmp_path, step, name, kill_at=kill_at, during=during,
                            delay=delay)
            assert code == -9
            if step == "add":
                # the next tick: reused or made, either way usable
                path = jj.workspaces.add_workspace(name)
                (path / "three.txt").write_text("three\n")
                jj.workspaces.describe(name, f"{name}: three")
                assert jj.merger.merge(name).merged
                merged_exactly(jj, {"one.txt": "one\n", "three.txt": "three\n"})
            else:
                jj.workspaces.forget(name)  # finished, or already done: no error either way
                assert name not in {w.name for w in jj.workspaces.list_workspaces()}
                assert not jj.workspaces.workspace_path(name).exists()
                merged_exactly(jj, {"one.txt": "one\n", "two.txt": "two\n"})
            if (jj.cli.repo / ".git").exists():  # the person's git still reads the repo
                subprocess.run(["git", "-C", str(jj.cli.repo), "status"], check=True,
                               capture_output=True, env={"PATH": jj.cli.child_path()})


# --- random interleavings ---------------------------------------------------------------

ISSUES = {"ENG-1": {"one.txt": "one\n"}, "ENG-2": {"two.txt": "two\n"},
          "ENG-3": {"three.txt": "three\n", "sub/three.md": "3\n"}}

operation = st.one_of(
    st.tuples(st.just("merge"), st.sampled_from(sorted(ISSUES))),
    st.tuples(st.just("kill"), st.sampled_from(sorted(ISSUES)), st.integers(1, 14),
              st.booleans()),
    st.tuples(st.just("corrupt"), st.sampled_from(sorted(ISSUES))),
)


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory, jj_bin: str) -> Fresh:
    root = tmp_path_factory.mktemp("interleavings") / "world"
    fresh = Fresh.__new__(Fresh)
    fresh.root, fresh.copy, fresh.jj_bin = root, root.with_name("world.pristine"), jj_bin
    repo = make_repo(jj_bin, root / "repo", colocate=True)
    jj = JjRepository.open(repo, root / "workspaces", "main", jj_bin=jj_bin)
    for name, files in ISSUES.items():
        path = jj.workspaces.add_workspace(name)
        for rel, text in files.items():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / rel).write_text(text)
        jj.workspaces.describe(name, f"{name}: work")
    shutil.copytree(root, fresh.copy, symlinks=True)
    return fresh


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(operation, min_size=2, max_size=7))
def test_no_interleaving_of_merges_kills_and_damage_reverts_trunk(
        three: Fresh, tmp_path_factory: pytest.TempPathFactory, jj_bin: str,
        ops: list[tuple]) -> None:
    jj = three()
    scratch = tmp_path_factory.mktemp("ops")
    in_trunk: set[str] = set()  # once an issue's work is in trunk it stays there, whole
    for op in ops:
        name = op[1]
        if op[0] == "merge":
            with contextlib.suppress(MergeRefused):  # refused with trunk untouched is safe
                jj.merger.merge(name)
        elif op[0] == "kill":
            drive(jj, jj_bin, scratch, "merge", name, kill_at=op[2], during=op[3])
        elif jj.home.intents.load(name):  # a merge of it died after its rebase: its files go
            for other, files in ISSUES.items():  # back to before (what others merged vanishes)
                for rel in files if other != name else ():
                    (jj.workspaces.workspace_path(name) / rel).unlink(missing_ok=True)
        files = trunk_files(jj)
        for issue, wanted in ISSUES.items():
            present = [rel for rel in wanted if rel in files]
            assert not present or len(present) == len(wanted), (issue, files)  # whole
            if present:
                for rel, text in wanted.items():
                    assert show(jj, "main", rel) == text
                in_trunk.add(issue)
            assert issue not in in_trunk or present, f"{issue}'s merged work was reverted"
        assert {"README", "shared.txt"} <= files
        parents = jj.cli.run("--ignore-working-copy", "log", "--no-graph", "-r", "::main ~ root()",
                         "-T", 'parents.len() ++ "\\n"').check().lines()
        assert set(parents) == {"1"}
