"""tests/expected_durations.json, the order the suite starts in, is measured, not typed:
every run records its tests' durations, scripts/durations.py makes the table from them,
and every key of the table names a test of the suite."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "durations.py"


def clean_env() -> dict[str, str]:
    """This run's environment without pytest's (an xdist worker's) own variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("durations", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_expected_duration_names_a_test() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], env=clean_env(),
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = json.loads((REPO_ROOT / "tests/expected_durations.json").read_text())
    assert table["seconds"] and table["generated_by"] and table["last_measured"]


def test_a_run_records_its_durations_and_the_script_makes_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured, kept = "tests/test_decide.py::test_backoff_values", "tests/test_demo.py::" \
        "test_demo_runs_to_completion_and_leaves_nothing_running[--scripted]"
    gone = "tests/test_demo.py::test_that_was_renamed"
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"seconds": {measured: 99, kept: 33, gone: 50}}))
    cache = tmp_path / "cache"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-o",
                          f"cache_dir={cache}", measured], cwd=REPO_ROOT, env=clean_env(),
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    recorded = json.loads((cache / "v/ralph-dev/durations").read_text())
    assert list(recorded["seconds"]) == [measured] and recorded["when"]

    durations = script()  # the suite as collected: the check above collects it for real
    monkeypatch.setattr(durations, "collected", lambda: ({measured, kept}, set()))
    assert durations.main(["--cache-dir", str(cache), "--table", str(table),
                           "--min-seconds", "0"]) == 0
    written = json.loads(table.read_text())
    assert written["seconds"] == {kept: 33,  # not measured this time: kept
                                  measured: round(recorded["seconds"][measured], 1)}
    assert written["generated_by"].endswith("scripts/durations.py")
    assert written["last_measured"].startswith(recorded["when"])


def test_a_logs_durations_lines_are_summed_per_test_spaces_and_all() -> None:
    log = """
============================= slowest 15 durations =============================
104.21s call     tests/test_merge_interrupted.py::test_a_merge[colocated]
3.50s setup    tests/test_swarm_person.py::test_a_swarm_run[git user]
12.00s call     tests/test_swarm_person.py::test_a_swarm_run[git user]
1.00s teardown tests/test_swarm_person.py::test_a_swarm_run[git user]
"""
    assert script().measured_in_log(log) == {
        "tests/test_merge_interrupted.py::test_a_merge[colocated]": 104.21,
        "tests/test_swarm_person.py::test_a_swarm_run[git user]": 15.5,
    }
