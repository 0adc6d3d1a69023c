"""Issue 26 without a cluster: the ``[cluster]`` table's config, the names and the fence
(pure), and that a project without the table never imports Ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_jj_repo

from ralph_dev.adapters.config_file import project_table
from ralph_dev.cli import main
from ralph_dev.core import cluster
from ralph_dev.core.config import ClusterSettings, live_settings, load_project
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.paths import config_file


def write_config(text: str) -> Path:
    path = config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_no_cluster_table_is_no_cluster(xdg: Path) -> None:
    write_config('[projects.app]\nrepo = "/srv/app"\n')
    assert load_project("app", environ={}).cluster is None


def test_a_cluster_table_is_read_with_its_defaults(xdg: Path) -> None:
    write_config('[projects.app]\nrepo = "/srv/app"\n[projects.app.cluster]\nengine = "ray"\n')
    settings = load_project("app", environ={})
    assert settings.cluster == ClusterSettings(engine="ray", address="auto", remote=None,
                                               snapshot_interval=300.0)
    assert project_table(settings)["cluster"] == {"engine": "ray", "address": "auto",
                                                  "snapshot_interval": 300.0, "lease": 30.0,
                                                  "warm": 2}

    write_config('[projects.app]\nrepo = "/srv/app"\n[projects.app.cluster]\n'
                 'address = "10.0.0.5:6379"\nremote = "git@host:team/app.git"\n')
    settings = load_project("app", environ={})
    assert settings.cluster is not None
    assert (settings.cluster.address, settings.cluster.remote) == ("10.0.0.5:6379",
                                                                   "git@host:team/app.git")
    env = load_project("app", environ={"RALPH_DEV_CLUSTER_ADDRESS": "ray://head:10001"})
    assert env.cluster is not None and env.cluster.address == "ray://head:10001"


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('engine = "dask"', "projects.app.cluster.engine: expected 'ray', got 'dask'"),
        ('address = "head"', "projects.app.cluster.address: 'head' is not a Ray address: "
                             "write 'auto'"),
        ('remote = "--upload-pack=evil"', "projects.app.cluster.remote: '--upload-pack=evil' "
                                          "is not a git URL"),
        ('remote = ""', "projects.app.cluster.remote: '' is not a git URL"),
        ("slots = 4", "projects.app.cluster: unknown key 'slots'"),
        ("snapshot_interval = 0", "projects.app.cluster.snapshot_interval: must be greater"),
        ("lease = 2", "projects.app.cluster.lease: must be at least 5"),
        ("max_hosts = 0", "projects.app.cluster.max_hosts: must be 1 or more"),
    ],
)
def test_a_bad_cluster_table_names_key_and_fix(xdg: Path, table: str, expected: str) -> None:
    path = write_config(f'[projects.app]\nrepo = "/r"\n[projects.app.cluster]\n{table}\n')
    with pytest.raises(ConfigError) as err:
        load_project("app", environ={})
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_joining_a_cluster_waits_for_a_restart(xdg: Path) -> None:
    write_config('[projects.app]\nrepo = "/srv/app"\n')
    running = load_project("app", environ={})
    write_config('[projects.app]\nrepo = "/srv/app"\n[projects.app.cluster]\n')
    _kept, applied, later = live_settings(running, load_project("app", environ={}))
    assert later == ["cluster"] and "cluster" not in applied


def test_no_cluster_never_imports_ray(xdg: Path) -> None:
    """Every module but the Ray plane, and the controller's wiring picking the plane,
    leave Ray unimported (a fresh interpreter: this one may have imported it)."""
    script = """
import importlib, pkgutil, sys
from pathlib import Path
import ralph_dev
for module in pkgutil.walk_packages(ralph_dev.__path__, "ralph_dev."):
    if not module.name.startswith("ralph_dev.hosts.ray.") \
            and not module.name.endswith("__main__"):
        importlib.import_module(module.name)
from ralph_dev.control.loop.wiring import host_for
from ralph_dev.core.config import ProjectSettings
from ralph_dev.hosts.local import LocalHost
host = host_for(ProjectSettings(name="app", repo=Path("/srv/app")))
assert isinstance(host, LocalHost)
print(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_start_says_what_a_cluster_it_cannot_reach_lacks(xdg: Path, tmp_path: Path) -> None:
    """A person at ``start`` is told at once, before any daemon runs, that the cluster
    is not there (Ray itself would retry for minutes)."""
    repo = tmp_path / "app"
    write_config(f'[projects.app]\nrepo = "{repo}"\n'
                 '[projects.app.agent]\nrunner = "command"\ncommand = "true"\n'
                 '[projects.app.cluster]\n'
                 'address = "127.0.0.1:1"\nremote = "/srv/app.git"\n')
    make_jj_repo(repo)
    result = CliRunner().invoke(main, ["start", "app"])
    assert result.exit_code != 0
    assert "the cluster is not ready" in result.output, result.output
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in result.output, result.output
    assert not (Path(os.environ["XDG_STATE_HOME"]) / "ralph-dev/app/daemon.pid").exists()


# --- names and the fence --------------------------------------------------------------


def test_actor_names_carry_project_issue_and_attempt() -> None:
    name = cluster.actor_name("app", "APP-7", 3)
    assert name == "app:APP-7#3"
    assert cluster.parse_actor_name(name, "app") == ("APP-7", 3)
    assert cluster.parse_actor_name(name, "other") is None
    assert cluster.parse_actor_name("app:not an issue#1", "app") is None
    assert cluster.parse_actor_name("someone-elses-actor", "app") is None


def test_only_the_current_attempts_push_is_mergeable() -> None:
    pushed = ["main", "ralph/APP-1/a1", "ralph/APP-1/a2", "ralph/APP-12/a3", "ralph/APP-1"]
    assert cluster.attempt_bookmark("APP-1", 2) == "ralph/APP-1/a2"
    assert cluster.pushed_attempts("APP-1", pushed) == {1: "ralph/APP-1/a1",
                                                         2: "ralph/APP-1/a2"}
    assert cluster.mergeable_push("APP-1", 2, pushed) == "ralph/APP-1/a2"
    # attempt 1's host came back from a partition and pushed again: still not mergeable
    assert cluster.mergeable_push("APP-1", 3, pushed) is None
    assert cluster.mergeable_push("APP-12", 2, pushed) is None


def test_a_new_attempt_resumes_from_the_latest_earlier_push() -> None:
    pushed = ["ralph/APP-1/a1", "ralph/APP-1/a3", "ralph/APP-1/a5"]
    assert cluster.resume_point("APP-1", 4, pushed) == "ralph/APP-1/a3"
    assert cluster.resume_point("APP-1", 1, pushed) is None
    assert cluster.resume_point("APP-2", 2, pushed) is None
