"""Linear on a bad day, and bad input: outages, rate limits, garbage, wrong keys.

Time is simulated (an injectable clock), so a 5-minute outage takes a second.
"""

from __future__ import annotations

import logging
import os
import pty
import select
import stat
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from click.testing import CliRunner
from conftest import assert_implements, make_jj_repo
from fake_linear import Clock, FakeLinear, World

from ralph_dev.adapters.tracker.linear.apikey import KEY_ENV, ApiKey, load_api_key
from ralph_dev.adapters.tracker.linear.client import URL_ENV, LinearClient
from ralph_dev.adapters.tracker.linear.errors import (
    LinearAuthError,
    LinearSetupError,
    LinearUnavailable,
)
from ralph_dev.adapters.tracker.linear.tracker import LinearTracker
from ralph_dev.cli import main
from ralph_dev.cli.linear_setup import prepare_linear
from ralph_dev.core.config import TrackerSettings, build_project
from ralph_dev.core.errors import ConfigError, TrackerError, TrackerUnavailable
from ralph_dev.core.ports import Tracker

SECRET = "lin_api_SECRETsecret0123456789"


@pytest.fixture
def world() -> Iterator[World]:
    with FakeLinear(api_key=SECRET) as fake:
        team = fake.add_team("ENG", "Engineering")
        project = fake.add_project("Alpha", [team], slug="a1b2c3d4e5f6")
        for i in range(3):
            fake.add_issue(team, f"issue {i}", project_id=project)
        yield World(fake, team, project, Clock(), [])


async def test_five_minute_outage_then_recovery(world: World) -> None:
    tracker = world.tracker(poll_interval=10)
    tracker.client.timeout = 0.5
    world.fake.faults.slow_seconds = 1.5
    before = await tracker.list_issues()
    world.fake.faults.always = "503"
    world.fake.faults.queue = ["slow", "502", "slow"]
    start = len(world.fake.requests)
    errors = []
    for _tick in range(30):  # a controller tick every 10 s for 5 minutes
        world.clock.advance(10)
        try:
            await tracker.list_issues()
        except TrackerError as exc:
            errors.append(exc)
    assert len(errors) == 30
    assert all(isinstance(e, TrackerUnavailable) and e.retryable for e in errors)
    assert any("timed out" in str(e) for e in errors)
    assert any("HTTP 503" in str(e) for e in errors)
    sent = len(world.fake.requests) - start
    assert sent < 15, f"backoff should spare a struggling API, sent {sent} requests in 5 min"
    world.fake.faults.always = None
    world.fake.faults.queue = []
    world.clock.advance(tracker.client.backoff_cap)
    after = await tracker.list_issues()
    assert [i.identifier for i in after] == [i.identifier for i in before]
    assert tracker.usage()["consecutive_failures"] == 0


async def test_ratelimited_burst_is_retryable_and_backs_off(world: World) -> None:
    tracker = world.tracker()
    await tracker.list_issues()
    world.fake.faults.queue = ["ratelimited"] * 3
    for _ in range(3):
        world.clock.advance(tracker.client.backoff_cap + 1)
        reset_ms = (world.clock() + timedelta(seconds=30)).timestamp() * 1000
        world.fake.rate_headers = {"X-RateLimit-Requests-Reset": str(int(reset_ms))}
        with pytest.raises(LinearUnavailable, match="rate limited") as err:
            await tracker.list_issues()
        assert err.value.retryable
        assert tracker.client.backoff_until is not None
        assert tracker.client.backoff_until >= world.clock() + timedelta(seconds=29)
    count = len(world.fake.requests)
    with pytest.raises(LinearUnavailable, match="backing off"):
        await tracker.list_issues()  # no request while backing off
    assert len(world.fake.requests) == count
    world.clock.advance(tracker.client.backoff_cap + 1)
    assert len(await tracker.list_issues()) == 3


async def test_low_remaining_allowance_spaces_requests_out_without_blocking(
    world: World,
) -> None:
    """Below 10 % left, requests are spaced at the bucket's refill rate (limit per hour),
    so it never runs dry; a gap longer than a few seconds is refused at once instead of
    blocking the controller's loop."""
    tracker = world.tracker(poll_interval=1)
    world.fake.rate_headers = {"X-RateLimit-Requests-Limit": "2500",
                               "X-RateLimit-Requests-Remaining": "100"}
    await tracker.list_issues()
    usage = tracker.usage()
    assert usage["slowed_down"] and usage["rate_limit"]["requests_remaining"] == 100
    assert world.sleeps and all(0 < s <= 3600 / 2500 for s in world.sleeps)  # 1.44 s apart
    world.fake.rate_headers = {"X-RateLimit-Requests-Limit": "100",
                               "X-RateLimit-Requests-Remaining": "5"}
    world.clock.advance(2)
    await tracker.list_issues()
    world.clock.advance(2)
    sent = len(world.fake.requests)
    with pytest.raises(LinearUnavailable, match="spaces its requests out"):
        await tracker.list_issues()  # 36 s apart now: refused at once, the loop goes on
    assert len(world.fake.requests) == sent and max(world.sleeps) <= 5
    world.fake.rate_headers = {"X-RateLimit-Requests-Limit": "2500",
                               "X-RateLimit-Requests-Remaining": "2400"}
    world.clock.advance(40)
    await tracker.list_issues()
    assert not tracker.usage()["slowed_down"]


async def test_usage_counts_requests_and_complexity_per_hour(world: World) -> None:
    tracker = world.tracker()
    await tracker.list_issues()
    usage = tracker.usage()
    assert usage["requests_this_hour"] == len(world.fake.requests) == 3
    assert usage["complexity_this_hour"] > 0
    world.clock.advance(3600)
    assert tracker.usage()["requests_this_hour"] == 0
    assert len(tracker.usage()["by_hour"]) == 1


@pytest.mark.parametrize("fault", ["malformed", "partial", "nodata", "500", "internal"])
async def test_garbage_answers_are_typed_retryable_errors(world: World, fault: str) -> None:
    tracker = world.tracker()
    await tracker.list_issues()
    world.fake.faults.queue = [fault]
    world.clock.advance(30)
    with pytest.raises(LinearUnavailable) as err:
        await tracker.list_issues()
    assert err.value.retryable
    world.clock.advance(tracker.client.backoff_cap + 1)
    assert len(await tracker.list_issues()) == 3


async def test_partial_answer_during_setup_is_typed(world: World) -> None:
    world.fake.faults.queue = ["partial"]
    with pytest.raises(LinearUnavailable, match="incomplete or malformed"):
        await world.tracker().directory.project()


async def test_wrong_key_names_the_source_never_the_key(world: World) -> None:
    wrong = "lin_api_WRONGwrong987654321"
    client = LinearClient(ApiKey(wrong, f"the {KEY_ENV} environment variable"),
                          world.fake.url, clock=world.clock)
    with structlog.testing.capture_logs() as logs, pytest.raises(LinearAuthError) as err:
        await LinearTracker(client, "Alpha").list_issues()
    assert not err.value.retryable
    assert KEY_ENV in str(err.value)
    assert wrong not in str(err.value) and wrong not in repr(client)
    assert wrong not in repr(logs)


async def test_key_never_in_logs_or_errors(world: World, caplog: pytest.LogCaptureFixture,
                                           ) -> None:
    caplog.set_level(logging.DEBUG)
    tracker = world.tracker()
    tracker.client._key = ApiKey(SECRET, "the test")
    with structlog.testing.capture_logs() as logs:
        await tracker.list_issues()
        await tracker.add_labels("ENG-1", ["user-input-needed"])
        await tracker.comment("ENG-1", "hello")
        world.fake.faults.queue = ["503"]
        world.clock.advance(400)
        with pytest.raises(TrackerError) as err:
            await tracker.list_issues()
    assert logs, "the tracker logs what it does"
    assert SECRET not in repr(logs)
    assert SECRET not in caplog.text
    assert SECRET not in str(err.value)
    assert SECRET not in repr(tracker) and SECRET not in str(tracker.usage())


def test_key_from_env_or_owner_only_file(tmp_path: Path) -> None:
    key_file = tmp_path / "linear.key"
    key_file.write_text(SECRET + "\n")
    key_file.chmod(0o644)
    settings = TrackerSettings(kind="linear", linear_project="Alpha",
                               linear_api_key_file=key_file)
    with pytest.raises(ConfigError) as err:
        load_api_key(settings, env={})
    assert str(key_file) in str(err.value) and "chmod 600" in str(err.value)
    assert SECRET not in str(err.value)
    key_file.chmod(stat.S_IRUSR | stat.S_IWUSR)
    key = load_api_key(settings, env={})
    assert key.value == SECRET and str(key_file) in key.source
    assert SECRET not in repr(key) and SECRET not in str(key)
    assert load_api_key(settings, env={KEY_ENV: "lin_env"}).source.endswith(
        f"{KEY_ENV} environment variable")
    with pytest.raises(ConfigError, match=KEY_ENV):
        load_api_key(TrackerSettings(kind="linear", linear_project="A"), env={})


# --- init / prepare_linear ------------------------------------------------------------------


def linear_settings(tmp_path: Path, project: str = "Alpha"):  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    return build_project("alpha", {"repo": str(repo),
                                   "tracker": {"kind": "linear", "linear_project": project}})


@pytest.fixture
def linear_env(world: World, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv(KEY_ENV, SECRET)
    monkeypatch.setenv(URL_ENV, world.fake.url)
    return world


async def test_prepare_linear_checks_and_creates_steering_labels(
    linear_env: World, xdg: Path
) -> None:
    settings = linear_settings(xdg)
    setup = await prepare_linear(settings, echo=False)
    assert setup.project == "Alpha" and setup.teams == ("ENG",)
    steering = set(settings.labels.steering())
    assert set(setup.labels_created) == steering
    names = {lab["name"] for lab in linear_env.fake.labels.values() if lab["team_id"] is None}
    assert steering <= names
    again = await prepare_linear(settings, echo=False)
    assert again.labels_created == ()  # idempotent


async def test_prepare_linear_refuses_a_team_without_a_started_state(
    linear_env: World, xdg: Path
) -> None:
    fake = linear_env.fake
    odd = fake.add_team("OPS", "Operations", states=[("Todo", "unstarted"), ("Done", "completed")])
    fake.add_project("Gamma", [linear_env.team, odd])
    with pytest.raises(LinearSetupError) as err:
        await prepare_linear(linear_settings(xdg, "Gamma"), echo=False)
    assert "Operations (OPS)" in str(err.value) and "started" in str(err.value)
    assert not fake.labels  # nothing created when a check fails


async def test_prepare_linear_unknown_project(linear_env: World, xdg: Path) -> None:
    with pytest.raises(LinearSetupError, match="closest: 'Alpha'"):
        await prepare_linear(linear_settings(xdg, "Alphq"), echo=False)


def test_init_with_a_wrong_key_exits_non_zero_and_writes_nothing(
    world: World, xdg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "lin_api_WRONGwrong987654321")
    monkeypatch.setenv(URL_ENV, world.fake.url)
    make_jj_repo(xdg / "repo")
    config = xdg / "config" / "ralph-dev" / "config.toml"
    result = CliRunner().invoke(main, ["init", "alpha", "--repo", str(xdg / "repo"),
                                       "--tracker", "linear", "--linear-project", "Alpha"])
    assert result.exit_code != 0
    assert f"{KEY_ENV} environment variable" in result.output
    assert "WRONG" not in result.output
    assert not config.exists()


def test_init_with_linear_writes_config(linear_env: World, xdg: Path) -> None:
    make_jj_repo(xdg / "repo")
    config = xdg / "config" / "ralph-dev" / "config.toml"
    result = CliRunner().invoke(main, ["init", "alpha", "--repo", str(xdg / "repo"),
                                       "--tracker", "linear", "--linear-project", "alpha"])
    assert result.exit_code == 0, result.output
    assert "signed in as" in result.output
    text = config.read_text()
    assert 'linear_project = "alpha"' in text and SECRET not in text
    assert os.environ[KEY_ENV] == SECRET



@pytest.fixture
def two_teams(linear_env: World, xdg: Path) -> World:
    """Project "Duo" of teams ENG and OPS (the fixture's ENG, and a second one), and a
    repository for it."""
    ops = linear_env.fake.add_team("OPS", "Operations")
    linear_env.fake.add_project("Duo", [linear_env.team, ops])
    make_jj_repo(xdg / "repo")
    return linear_env


def init_duo(xdg: Path, *more: str) -> Any:
    return CliRunner().invoke(main, ["init", "duo", "--repo", str(xdg / "repo"),
                                     "--tracker", "linear", "--linear-project", "Duo", *more])


def test_init_on_a_two_team_project_names_the_teams_and_the_setting(
    two_teams: World, xdg: Path,
) -> None:
    result = init_duo(xdg)
    assert result.exit_code != 0
    assert "2 teams, ENG (Engineering) and OPS (Operations)" in result.output
    assert "--linear-team ENG or OPS" in result.output
    assert "tracker.linear_team" in result.output and "nothing was written" in result.output
    assert not (xdg / "config" / "ralph-dev" / "config.toml").exists()
    assert not two_teams.fake.labels  # nothing written in Linear either


def test_init_with_linear_team_writes_it_and_new_issues_go_there(
    two_teams: World, xdg: Path,
) -> None:
    result = init_duo(xdg, "--linear-team", "ops")
    assert result.exit_code == 0, result.output
    assert "new issues go to OPS" in result.output
    assert 'linear_team = "OPS"' in (xdg / "config" / "ralph-dev" / "config.toml").read_text()
    added = CliRunner().invoke(main, ["issue", "add", "duo", "A new issue"])
    assert added.exit_code == 0, added.output
    assert added.output.strip().startswith("OPS-")
    wrong = init_duo(xdg, "--linear-team", "WEB", "--force")
    assert wrong.exit_code != 0
    assert "tracker.linear_team = 'WEB' is not a team of Linear project 'Duo'" in wrong.output
    assert "ENG (Engineering) and OPS (Operations)" in wrong.output


def test_init_on_a_terminal_asks_for_the_team(two_teams: World, xdg: Path) -> None:
    """A person at a terminal is asked, with the teams listed, and the answer is kept."""
    main_fd, pane_fd = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ralph_dev", "init", "duo", "--repo", str(xdg / "repo"),
         "--tracker", "linear", "--linear-project", "Duo"],
        stdin=pane_fd, stdout=pane_fd, stderr=pane_fd, env=os.environ.copy())
    os.close(pane_fd)
    seen = b""
    try:
        while b"tracker.linear_team)?" not in seen:
            ready, _, _ = select.select([main_fd], [], [], 60)
            assert ready, f"no prompt within 60 s; the terminal showed: {seen!r}"
            seen += os.read(main_fd, 4096)
        os.write(main_fd, b"ops\n")
        assert proc.wait(timeout=60) == 0
        while select.select([main_fd], [], [], 0.5)[0]:
            try:
                seen += os.read(main_fd, 4096)
            except OSError:  # the terminal closed with the process
                break
    finally:
        proc.kill()
        os.close(main_fd)
    assert b"ENG (Engineering) and OPS (Operations)" in seen
    assert 'linear_team = "OPS"' in (xdg / "config" / "ralph-dev" / "config.toml").read_text()


async def test_refused_connection_is_retryable(world: World) -> None:
    world.fake.stop()  # nothing listens on its port any more
    tracker = world.tracker()
    with pytest.raises(LinearUnavailable) as err:
        await tracker.list_issues()
    assert err.value.retryable and "Projects" in str(err.value)


def test_open_tracker_builds_a_linear_tracker(
    xdg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ralph_dev.adapters.tracker import open_tracker

    settings = linear_settings(xdg)
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=KEY_ENV):
        open_tracker(settings)
    monkeypatch.setenv(KEY_ENV, SECRET)
    monkeypatch.setenv(URL_ENV, "http://127.0.0.1:9/graphql")
    tracker = open_tracker(settings)
    assert isinstance(tracker, LinearTracker)
    assert_implements(tracker, Tracker)
    assert tracker.client.url == "http://127.0.0.1:9/graphql"
    assert tracker.context.full_sync_interval == settings.tracker.full_sync_interval


async def test_refused_input_is_not_retryable(world: World) -> None:
    tracker = world.tracker()
    await tracker.list_issues()
    world.fake.faults.queue = ["badinput"]
    with pytest.raises(TrackerError) as err:
        await tracker.comment("ENG-1", "hello")
    assert not isinstance(err.value, TrackerUnavailable) and not err.value.retryable
    assert "Argument Validation Error" in str(err.value)
    assert tracker.client.backoff_until is None
