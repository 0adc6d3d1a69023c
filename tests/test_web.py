"""What the daemon serves: the dashboard in a real headless chromium (a running swarm's
issues, live updates, worker panes, a screenshot as artifact), the state API, Prometheus
metrics that count a swarm run across processes and daemon restarts, /healthz, and
access: loopback only without a token, a constant-time token otherwise."""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families
from swarm_kit import REPO_ROOT, Swarm, wait_for

from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.control.daemon_services import DaemonServices
from ralph_dev.control.status import load_schema
from ralph_dev.core.config import load_project

TOKEN = "test-token-0123456789abcdef"
QUESTION = "Which database should this use? (scripted question)"
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1600,1400",
)
HOSTILE_TITLE = '<img src=x onerror="document.body.dataset.pwned=1">Bobby'


@pytest.fixture
def swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[Swarm]:
    s = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2)
    yield s
    s.teardown()


def _web_json(swarm: Swarm) -> dict[str, Any]:
    path = swarm.state_dir / "web.json"

    def read() -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if data.get("url") or data.get("error") else None

    return wait_for(read, 30, "the daemon's web.json")


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 - http on loopback
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:  # noqa: S310 - idem
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = _get(url + "metrics")
    assert status == 200
    values = {}
    for family in text_string_to_metric_families(text):  # prometheus_client's own parser
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


# --- the dashboard in a real browser ----------------------------------------------------


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    chromium = shutil.which("chromium")
    driver_bin = shutil.which("chromedriver")
    if not chromium or not driver_bin:
        pytest.fail("the dashboard test needs Debian's chromium and chromium-driver: run "
                    "scripts/setup.sh --test (it installs them), or "
                    "apt-get install -y chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # never let selenium fetch a driver
    options = Options()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(driver_bin), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _artifacts() -> Path:
    where = Path(os.environ.get("RALPH_DEV_TEST_ARTIFACTS", REPO_ROOT / "tests" / "artifacts"))
    where.mkdir(parents=True, exist_ok=True)
    return where


def _cards(driver: Any) -> dict[str, str]:
    return dict(driver.execute_script(
        "return [...document.querySelectorAll('.card')]"
        ".map(c => [c.dataset.issue, c.dataset.column]);"))


@pytest.mark.slow
def test_dashboard_shows_a_running_swarm_and_follows_it(swarm: Swarm, browser: Any) -> None:
    swarm.script = {"*": "work:4", "DEMO-11": "block"}
    swarm.write_script()
    identifiers = swarm.import_plan()
    swarm.cli("issue", "add", swarm.project, HOSTILE_TITLE)
    swarm.start()
    url = _web_json(swarm)["url"]
    assert url.startswith("http://127.0.0.1:")
    browser.get(url)

    def every_issue_shown() -> bool:
        return set(identifiers) | {"DEMO-13"} <= set(_cards(browser))

    wait_for(every_issue_shown, 60, "every issue on the board")
    wait_for(lambda: browser.execute_script(
        "return [...document.querySelectorAll('pre.pane')]"
        ".some(p => p.textContent.includes('[demo agent]'));"), 60, "a worker's pane text")
    wait_for(lambda: QUESTION in browser.find_element("id", "needs-you").text, 90,
             "the worker's question under 'Needs you'")
    assert browser.find_element("id", "needs-you").is_displayed()

    # a person puts an issue on hold in the tracker: the open page follows, no reload
    marker = browser.execute_script("return document.body.dataset.generatedAt;")
    assert _cards(browser)["DEMO-12"] == "blocked"
    swarm.cli("issue", "label", "DEMO-12", "+ralph:hold")
    wait_for(lambda: _cards(browser).get("DEMO-12") == "held", 30, "DEMO-12 moved to held")
    wait_for(lambda: _cards(browser).get("DEMO-2") == "done", 120, "DEMO-2 done")
    assert browser.execute_script("return performance.getEntriesByType('navigation').length") == 1
    assert browser.execute_script("return document.body.dataset.generatedAt;") != marker
    events = browser.find_element("id", "events").text
    assert "spawn" in events and "merge" in events
    merges = browser.find_element("id", "merges").text  # trunk's changes with their diff stat
    assert "DEMO-2: " in merges and "changes/DEMO-2.txt" in merges and "+1 -0" in merges

    # issue text is shown as text, never run as HTML
    card = browser.find_element("css selector", '.card[data-issue="DEMO-13"] .title')
    assert card.text == HOSTILE_TITLE
    assert browser.execute_script("return document.body.dataset.pwned") is None

    shot = _artifacts() / "dashboard.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


# --- metrics, state API, health --------------------------------------------------------


def _value(metrics: dict, name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.slow
def test_metrics_count_a_swarm_run_and_survive_a_daemon_restart(swarm: Swarm) -> None:
    swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n[[task]]\ntitle = "C"\n')
    swarm.start()
    url = _web_json(swarm)["url"]
    before = _metrics(url)
    assert _value(before, "ralph_dev_merges_total") == 0
    assert _value(before, "ralph_dev_usage_limit_pauses_total") == 0
    wait_for(swarm.all_done, 120, "all three done")
    wait_for(lambda: _value(_metrics(url), "ralph_dev_merges_total") == 3, 30, "3 merges counted")
    after = _metrics(url)
    assert _value(after, "ralph_dev_spawns_total", role="execute", kind="spawn") == 3
    assert _value(after, "ralph_dev_issues", state="done") == 3
    assert _value(after, "ralph_dev_tick_duration_seconds_count") > 0
    assert _value(after, "ralph_dev_controller_up") == 1
    assert _value(after, "ralph_dev_events_total", event="worker_done") == 3

    status, text = _get(url + "healthz")
    assert status == 200 and text.startswith("ok: heartbeat")
    status, body = _get(url + "api/v1/state")
    doc = json.loads(body)
    jsonschema.Draft202012Validator(load_schema()).validate(doc)
    assert doc == doc | {"project": "demo", "schema_version": 1}
    assert [m["issue"] for m in doc["merges"][:3]] and doc["dashboard"]["url"] == url

    swarm.stop(workers=False)
    swarm.start()  # a new daemon process reads the counts back from the events log
    again = _web_json(swarm)["url"]
    restarted = _metrics(again)
    assert _value(restarted, "ralph_dev_spawns_total", role="execute", kind="spawn") == 3
    assert _value(restarted, "ralph_dev_merges_total") == 3


# --- access ---------------------------------------------------------------------------


@pytest.fixture
def services_env(swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> Swarm:
    for key, value in swarm.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RALPH_DEV_WEB_TOKEN", raising=False)
    return swarm


def _configure_web(swarm: Swarm, table: str) -> None:
    config = swarm.config_file
    config.write_text(config.read_text() + f"\n[projects.{swarm.project}.web]\n{table}\n")


async def _services(swarm: Swarm) -> DaemonServices:
    settings = load_project(swarm.project)
    services = DaemonServices(settings, StateStore(settings.paths), Tmux.from_settings(settings))
    await services.start()
    return services


async def test_without_a_token_only_loopback_names_are_answered(services_env: Swarm) -> None:
    services = await _services(services_env)
    try:
        url = services.url
        assert url and url.startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "api/v1/state") as answer:
                assert answer.status == 200
                assert "default-src 'none'" in answer.headers["Content-Security-Policy"]
                assert (await answer.json())["schema_version"] == 1
            # a page elsewhere that rebinds its name to 127.0.0.1 gets nothing
            async with http.get(url + "api/v1/state",
                                headers={"Host": f"evil.example:{services.web.port}"}) as answer:
                assert answer.status == 421
            async with http.get(url + "healthz") as answer:
                assert answer.status == 503
                assert "no heartbeat" in await answer.text()
            services.store.write_heartbeat(tick=1)
            async with http.get(url + "healthz") as answer:
                assert answer.status == 200
            async with http.get(url + "api/v1/workers/DEMO-1/pane") as answer:
                assert answer.status == 404
            async with http.get(url + "api/v1/workers/..%2Fetc/pane") as answer:
                assert answer.status == 400
            async with http.get(url + "static/..%2Fserver.py") as answer:
                assert answer.status == 404
            async with http.get(url + "static/app.js") as answer:
                assert answer.status == 200 and "textContent" in await answer.text()
    finally:
        await services.stop()
    assert not (services.store.paths.state_dir / "web.json").exists()


async def test_a_token_is_required_when_one_is_set(services_env: Swarm,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RALPH_DEV_WEB_TOKEN", TOKEN)
    services = await _services(services_env)
    try:
        url = services.url
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
                async with http.get(url + "api/v1/state", headers=headers) as answer:
                    assert answer.status == 401
                    assert "needs its access token" in await answer.text()
                    assert TOKEN not in await answer.text()
            async with http.get(url + "metrics",
                                headers={"Authorization": f"Bearer {TOKEN}"}) as answer:
                assert answer.status == 200
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as browser_like:
            async with browser_like.get(url + f"?token={TOKEN}") as answer:
                assert answer.status == 200
                assert "HttpOnly" in answer.headers["Set-Cookie"]
            async with browser_like.get(url + "api/v1/state") as answer:
                assert answer.status == 200  # the page's own requests carry the cookie
    finally:
        await services.stop()


async def test_another_address_without_a_token_is_refused_and_said(services_env: Swarm
                                                                     ) -> None:
    _configure_web(services_env, 'host = "0.0.0.0"')
    services = await _services(services_env)
    try:
        assert services.web is None and services.url is None
        refused = [e for e in services.store.iter_events() if e["event"] == "web_disabled"]
        assert "needs an access token" in refused[-1]["error"]
        said = json.loads((services.store.paths.state_dir / "web.json").read_text())
        assert said["url"] is None and "needs an access token" in said["error"]
    finally:
        await services.stop()


def test_a_readable_token_file_is_refused(tmp_path: Path) -> None:
    from ralph_dev.control.web.server import WebError, read_token
    from ralph_dev.core.config import WebSettings

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o644)
    with pytest.raises(WebError, match="chmod 600"):
        read_token(WebSettings(token_file=token_file), environ={})
    token_file.chmod(0o600)
    assert read_token(WebSettings(token_file=token_file), environ={}) == TOKEN
    token_file.write_text("short")
    with pytest.raises(WebError, match="shorter than 16"):
        read_token(WebSettings(token_file=token_file), environ={})
