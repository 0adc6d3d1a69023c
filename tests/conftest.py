"""Shared fixtures: an isolated XDG sandbox, the real jj, a private tmux server."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests: 500 examples each in CI (the bar), fewer locally.
settings.register_profile(
    "ci", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

REPO_ROOT = Path(__file__).resolve().parent.parent

# The suite runs several swarms at once on a small machine: its load per CPU says nothing
# about whether a test's host can carry one more worker, so admission by load is off for
# every test (tests/test_admission.py turns the floors it checks on again itself).
os.environ["RALPH_DEV_LIMITS_MAX_LOAD_PER_CPU"] = "0"


@pytest.fixture
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point every XDG dir (and HOME) into tmp_path: a whole private ralph-dev instance."""
    for var, sub in (
        ("XDG_CONFIG_HOME", "config"),
        ("XDG_STATE_HOME", "state"),
        ("XDG_DATA_HOME", "data"),
        ("XDG_CACHE_HOME", "cache"),
    ):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.delenv("RALPH_DEV_CONFIG", raising=False)
    monkeypatch.delenv("RALPH_DEV_TMUX_SOCKET", raising=False)
    return tmp_path


def find_jj() -> str | None:
    """The jj binary: $RALPH_DEV_JJ, PATH, or where shared/tools/install-jj.sh links it."""
    for candidate in (
        os.environ.get("RALPH_DEV_JJ"),
        shutil.which("jj"),
        str(Path.home() / ".local/bin/jj"),
    ):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def make_jj_repo(path: Path, *, trunk: str = "main") -> Path:
    """A small jj repository (colocated with git) with one commit and a trunk bookmark:
    what ``ralph-dev init`` accepts without a word."""
    jj = find_jj()
    assert jj, "jj is not installed: run ../shared/tools/install-jj.sh (CI does)"
    path.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "JJ_USER": "Test", "JJ_EMAIL": "test@example.com"}
    (path / "README.md").write_text("# a project\n")
    for args in (["git", "init"], ["commit", "-m", "initial commit"],
                 ["bookmark", "create", trunk, "-r", "@-"]):
        subprocess.run([jj, "--no-pager", *args], cwd=path, env=env, check=True,
                       capture_output=True)
    return path


@pytest.fixture(scope="session")
def jj_bin() -> str:
    found = find_jj()
    if found is None:
        pytest.fail("jj is not installed: run ../shared/tools/install-jj.sh (CI does)")
    return found


@pytest.fixture
def tmux_socket() -> Iterator[str]:
    """A private tmux socket name; the server on it is killed afterwards."""
    name = f"ralph-test-{uuid.uuid4().hex[:10]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True, check=False)
    uid = os.getuid()
    tmpdir = os.environ.get("TMUX_TMPDIR", "/tmp")
    Path(tmpdir, f"tmux-{uid}", name).unlink(missing_ok=True)


def retry_until(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05, what: str = ""
) -> object:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` on timeout."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def assert_implements(obj: object, protocol: type) -> None:
    """``obj`` has every method ``protocol`` (a ``core.ports`` Protocol) names."""
    wanted = {name for cls in protocol.__mro__ if cls.__module__ == protocol.__module__
              for name in vars(cls) if not name.startswith("_")}
    missing = sorted(name for name in wanted if not callable(getattr(obj, name, None)))
    assert wanted and not missing, f"{type(obj).__name__} lacks {missing}"


SHARED_CLUSTER_MODULES = frozenset({"test_ray_plane.py", "test_cluster_swarm.py",
                                    "test_cluster_claude.py"})
"""Tests that take the one Ray cluster of the machine in turn (``ray_kit``): one xdist
worker runs them all, instead of several waiting for each other."""

SHORT_TEST_SECONDS = 0.5


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests start first, spread over the xdist workers.

    ``--dist worksteal`` first hands each worker a contiguous slice of the collection
    (then idle workers steal from the end of busy ones' queues): in file order, one
    worker could start with 250 s of Claude Code tests while another finishes early.
    So the order is built slice by slice: the longest tests (``expected_durations``)
    go, longest first, to the slice with the least expected work, and short tests fill
    each slice to the size worksteal gives it. Deterministic: every worker collects
    the same order, as xdist requires."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 0))
    if workers < 2 or len(items) < workers:
        return
    from expected_durations import EXPECTED_SECONDS

    def seconds(item: pytest.Item) -> float:
        return EXPECTED_SECONDS.get(item.nodeid.split("/")[-1], SHORT_TEST_SECONDS)

    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        module = item.nodeid.split("::")[0].split("/")[-1]
        key = "ray" if module in SHARED_CLUSTER_MODULES else item.nodeid
        groups.setdefault(key, []).append(item)
    sizes, left = [], len(items)
    for remaining in range(workers, 0, -1):  # worksteal's first split (check_schedule)
        sizes.append(left // remaining)
        left -= sizes[-1]
    slices: list[list[pytest.Item]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for group in sorted(groups.values(), key=lambda g: -sum(map(seconds, g))):
        room = [i for i in range(workers) if len(slices[i]) + len(group) <= sizes[i]]
        target = min(room or range(workers), key=lambda i: (load[i], len(slices[i])))
        slices[target].extend(group)
        load[target] += sum(map(seconds, group))
    items[:] = [item for part in slices for item in part]


_SKIPPED_IN_CI: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember skips: in CI a skipped test is a test that did not run, not a pass."""
    if report.skipped and os.environ.get("CI"):
        _SKIPPED_IN_CI.append(report.nodeid)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI=true any skip fails the run (a missing tool or schema must be installed,
    not silently counted as green)."""
    if _SKIPPED_IN_CI and exitstatus == pytest.ExitCode.OK:
        print(f"\nCI: {len(_SKIPPED_IN_CI)} test(s) skipped, e.g. {_SKIPPED_IN_CI[0]}: "
              "under CI every test must run (see the skip reasons above)")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie waiting for its reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
