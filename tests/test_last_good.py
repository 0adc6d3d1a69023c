"""The last good config (issue 33): what a swarm ran with, kept in the project's state dir,
so a bad edit of config.toml never takes down what runs nor blinds the person to it.

* the table kept is the very one read valid (an edit landing just after the read is not
  kept as "good"); an invalid read keeps the last good one;
* the controller's look at the file counts from before its first read, so an edit in
  between is read at its first tick;
* the commands that read fall back on it, with a warning naming the file and the problem.
(``test_live_config.py`` drives the same on a running swarm.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import make_jj_repo

from ralph_dev.adapters.config_file import (
    LAST_GOOD,
    config_signature,
    last_good,
    read_good,
)
from ralph_dev.adapters.store import StateStore
from ralph_dev.cli import main
from ralph_dev.control.loop.config_watch import ConfigWatch
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.paths import ProjectPaths, config_file

GOOD = '[projects.app]\nrepo = "/r"\n[projects.app.limits]\nmax_workers = 2\n'
BAD = GOOD.replace("max_workers = 2", 'max_workers = "three"')


def _kept(name: str = "app") -> dict:
    return json.loads((ProjectPaths(name).state_dir / LAST_GOOD).read_text())


def test_the_table_read_valid_is_kept_and_an_invalid_read_keeps_it(xdg: Path) -> None:
    path = config_file()
    path.parent.mkdir(parents=True)
    path.write_text(GOOD)
    assert read_good("app", path).limits.max_workers == 2
    assert _kept() == {"repo": "/r", "limits": {"max_workers": 2}}
    assert (ProjectPaths("app").state_dir.stat().st_mode & 0o077) == 0  # private
    path.write_text(BAD)
    with pytest.raises(ConfigError, match="max_workers"):
        read_good("app", path)
    assert _kept()["limits"] == {"max_workers": 2}  # not the invalid table
    settings = last_good("app", path)
    assert settings is not None and settings.limits.max_workers == 2


def test_an_edit_after_the_signature_is_read_at_the_first_check(xdg: Path) -> None:
    """A process takes the file's signature, then reads it; an edit landing between its
    read and its watch's first look is still seen (not taken for what was read)."""
    path = config_file()
    path.parent.mkdir(parents=True)
    path.write_text(GOOD)
    seen = config_signature(path)
    running = read_good("app", path)
    path.write_text(BAD)  # a person's edit, right after the read
    watch = ConfigWatch("app", path, StateStore(running.paths))
    assert watch.check(running) is None  # signature taken now: the edit goes unseen
    watch = ConfigWatch("app", path, StateStore(running.paths))
    watch.started_with(seen, None)
    reloaded = watch.check(running)
    assert reloaded is not None and reloaded.settings is None
    assert "max_workers" in (reloaded.error or "")
    assert watch.check(running) is None  # said once


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize(("edit", "problem"), [
    ('max_workers = "two"', "expected an integer"),  # a wrong value
    ("max_workers = 2\n[projects.app.limits", "not valid TOML"),  # not even TOML
])
def test_commands_that_read_use_the_last_good_config_with_a_warning(
        xdg: Path, edit: str, problem: str) -> None:
    make_jj_repo(xdg / "app")
    assert cli("init", "app", "--repo", str(xdg / "app"), "--max-workers", "2").exit_code == 0
    assert cli("issue", "add", "app", "Storage layer").exit_code == 0
    StateStore(ProjectPaths("app")).append_event("spawn", issue="APP-1", reason="test")
    path = config_file()
    path.write_text(path.read_text().replace("max_workers = 2", edit))
    for args in (("issue", "list", "app"), ("issue", "show", "APP-1"), ("events", "app")):
        result = cli(*args)
        assert result.exit_code == 0, result.output
        assert f"warning: the config file {path} is invalid: " in result.stderr
        assert problem in result.stderr and "last good config" in result.stderr
        assert ("APP-1" if args[0] == "issue" else "spawn") in result.stdout
    refused = cli("issue", "add", "app", "Another")  # a write is not made on an old config
    assert refused.exit_code == 1 and problem in refused.stderr

    (ProjectPaths("app").state_dir / LAST_GOOD).unlink()  # no good config known at all
    listed = cli("issue", "list", "app")
    assert listed.exit_code == 1 and problem in listed.stderr and "warning" not in listed.stderr
    events = cli("events", "app")  # the events need no config: the state dir is known
    assert events.exit_code == 0 and "spawn" in events.stdout
    assert "no good config of it is known" in events.stderr
