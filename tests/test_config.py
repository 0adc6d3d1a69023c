"""Settings: layering, XDG isolation, `init`, and errors that say where and how."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_jj_repo

from ralph_dev.cli import main
from ralph_dev.core.config import load_project
from ralph_dev.core.errors import ConfigError, UnknownProject
from ralph_dev.core.model import Role
from ralph_dev.core.paths import config_file, data_home, state_home


def write_config(text: str) -> Path:
    path = config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_xdg_dirs_are_honoured(xdg: Path) -> None:
    assert config_file() == xdg / "config/ralph-dev/config.toml"
    assert state_home() == xdg / "state/ralph-dev"
    assert data_home() == xdg / "data/ralph-dev"


def test_defaults_file_env_and_overrides_layer_in_order(xdg: Path) -> None:
    write_config(
        """
[projects.app]
repo = "/srv/app"
verify_command = "make test"
[projects.app.limits]
max_workers = 4
per_role = { plan = 1 }
[projects.app.timing]
stall_timeout = 60
"""
    )
    settings = load_project("app", environ={})
    assert settings.repo == Path("/srv/app")
    assert settings.trunk == "main"  # default
    assert settings.limits.max_workers == 4  # file
    assert settings.role_limit(Role.PLAN) == 1
    assert settings.role_limit(Role.EXECUTE) == 4
    assert settings.timing.stall_timeout == 60.0
    assert settings.key == "APP"
    assert settings.paths.tracker_db == xdg / "data/ralph-dev/app/tracker.db"
    assert settings.workspaces == xdg / "data/ralph-dev/app/workspaces"

    env = {"RALPH_DEV_LIMITS_MAX_WORKERS": "6", "RALPH_DEV_TMUX_SOCKET": "private"}
    settings = load_project("app", environ=env)
    assert settings.limits.max_workers == 6  # environment beats file
    assert settings.tmux_socket == "private"

    settings = load_project("app", {"limits.max_workers": 2}, environ=env)
    assert settings.limits.max_workers == 2  # CLI flag beats environment


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('repo = "/r"\n[projects.app.limits]\nmax_workers = "three"',
         "projects.app.limits.max_workers: expected an integer, got 'three'"),
        ('repo = "/r"\n[projects.app.timing]\nstall_timeout = -5',
         "projects.app.timing.stall_timeout: must be greater than 0"),
        ('repo = "/r"\ncolour = "blue"', "projects.app: unknown key 'colour'"),
        ('repo = "relative/path"', "projects.app.repo: must be an absolute path"),
        ('repo = "/r"\n[projects.app.tracker]\nkind = "jira"',
         "projects.app.tracker.kind: expected 'local' or 'linear', got 'jira'"),
        ('repo = "/r"\n[projects.app.tracker]\nkind = "linear"',
         "projects.app.tracker.linear_project: is required"),
        ('repo = "/r"\n[projects.app.limits]\nper_role = { wizard = 1 }',
         "projects.app.limits.per_role.wizard: unknown role"),
        ('trunk = "main"', "projects.app.repo: missing"),
        ('repo = "/r"\n[projects.app.merge]\nparallel_verifies = 0',
         "projects.app.merge.parallel_verifies: must be at least 1 (1: one verify at a time)"),
        ('repo = "/r"\n[projects.app.merge]\nverify_memory_mb = -1',
         "projects.app.merge.verify_memory_mb: must not be negative"),
    ],
)
def test_invalid_config_names_file_key_and_problem(xdg: Path, table: str, expected: str) -> None:
    path = write_config(f"[projects.app]\n{table}\n")
    with pytest.raises(ConfigError) as err:
        load_project("app", environ={})
    message = str(err.value)
    assert str(path) in message
    assert expected in message


def test_bad_environment_value_names_the_variable(xdg: Path) -> None:
    write_config('[projects.app]\nrepo = "/r"\n')
    with pytest.raises(ConfigError, match="environment variable RALPH_DEV_TIMING_POLL_INTERVAL"):
        load_project("app", environ={"RALPH_DEV_TIMING_POLL_INTERVAL": "soon"})


TYPO = "RALPH_DEV_LIMITS_MAX_WORKER"
"""The typo issue 27 found ignored in silence (MAX_WORKERS is the setting)."""


def test_an_unknown_environment_variable_names_the_closest(xdg: Path) -> None:
    write_config('[projects.app]\nrepo = "/r"\n')
    with pytest.raises(ConfigError, match=f"environment variable {TYPO}: ralph-dev has no "
                                          "such setting; did you mean "
                                          "RALPH_DEV_LIMITS_MAX_WORKERS\\?"):
        load_project("app", environ={TYPO: "5"})
    with pytest.raises(ConfigError, match="RALPH_DEV_NOPE_AT_ALL: ralph-dev has no such"):
        load_project("app", environ={"RALPH_DEV_NOPE_AT_ALL": "1"})
    assert load_project("app", environ={"RALPH_DEV_LIMITS_MAX_WORKERS": "5"}
                        ).limits.max_workers == 5


def test_every_ralph_dev_variable_ralph_dev_uses_is_accepted(xdg: Path) -> None:
    """ralph-dev sets RALPH_DEV_* variables of its own (for workers, hooks, the tests): each
    one named anywhere in the code, scripts, tests, README or docs loads a project untouched."""
    import re

    from ralph_dev.core.config import OWN_PREFIXES, _env_overrides

    root = Path(__file__).resolve().parent.parent
    files = [*root.glob("ralph_dev/**/*.py"), *root.glob("ralph_dev/**/*.md"),
             *root.glob("tests/*.py"), *root.glob("scripts/*"), root / "README.md",
             *root.glob("docs/*.md")]
    named = {m for f in files if f.is_file()
             for m in re.findall(r"RALPH_DEV_[A-Z0-9_]*[A-Z0-9]", f.read_text(errors="replace"))}
    named -= {TYPO, "RALPH_DEV_NOPE_AT_ALL"}  # this file's deliberate mistakes
    named -= {prefix.rstrip("_") for prefix in OWN_PREFIXES}  # the prefixes themselves
    assert {"RALPH_DEV_ISSUE", "RALPH_DEV_RUN_DIR", "RALPH_DEV_WEB_TOKEN",
            "RALPH_DEV_DEMO_SCRIPT", "RALPH_DEV_TEST_WORKERS"} <= named
    _env_overrides(dict.fromkeys(named, "1"))  # raises for any it does not know


def test_broken_toml_and_unknown_project(xdg: Path) -> None:
    write_config('[projects.app]\nrepo = "/r"\n')
    with pytest.raises(UnknownProject, match="ralph-dev init other --repo PATH"):
        load_project("other", environ={})
    write_config("[projects.app\nrepo=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_project("app", environ={})


def test_init_writes_table_and_refuses_to_clobber(xdg: Path, tmp_path: Path) -> None:
    repo = make_jj_repo(tmp_path / "repo")
    path = write_config("# my own notes\n[projects.other]\nrepo = \"/x\"\n")
    runner = CliRunner()
    result = runner.invoke(main, ["init", "app", "--repo", str(repo), "--verify", "make test"])
    assert result.exit_code == 0, result.output
    text = path.read_text()
    assert "# my own notes" in text  # a person's comments survive
    settings = load_project("app", environ={})
    assert settings.repo == repo.resolve()
    assert settings.verify_command == "make test"
    assert load_project("other", environ={}).repo == Path("/x")

    before = path.read_text()
    result = runner.invoke(main, ["init", "app", "--repo", str(repo), "--max-workers", "9"])
    assert result.exit_code != 0
    assert "already exists; use --force" in result.output
    assert path.read_text() == before  # nothing written

    result = runner.invoke(main, ["init", "app", "--repo", str(repo), "--max-workers", "9",
                                  "--force"])
    assert result.exit_code == 0, result.output
    assert load_project("app", environ={}).limits.max_workers == 9


@pytest.mark.parametrize("name", ["../evil", "a b", "", "x" * 80, "_under"])
def test_init_refuses_bad_project_names(xdg: Path, tmp_path: Path, name: str) -> None:
    result = CliRunner().invoke(main, ["init", name, "--repo", str(tmp_path)])
    assert result.exit_code != 0
    assert "not a valid project name" in result.output
    assert not config_file().exists()


def test_init_refuses_missing_repo(xdg: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["init", "app", "--repo", str(tmp_path / "nope")])
    assert result.exit_code != 0
    assert "no such directory" in result.output
    assert not config_file().exists()
