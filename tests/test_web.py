"""What the daemon serves: the dashboard in a real headless chromium (a running swarm's
issues, live updates, worker panes, a screenshot as artifact), the state API, Prometheus
metrics that count a swarm run across processes and daemon restarts, /healthz, and
access: every route but /healthz and /metrics needs the token, on loopback too (a real
sandboxed worker reads nothing without it); browsers log in with the one-time link
`status` prints, exchanged for an HttpOnly cookie."""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import os
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families
from swarm_kit import REPO_ROOT, Swarm, wait_for

from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tmux import Tmux
from ralph_dev.control.daemon.services import DaemonServices
from ralph_dev.control.state.status import load_schema
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


def _token(swarm: Swarm) -> str:
    """The project's generated access token, as a person's script reads it."""
    return (swarm.state_dir / "web-token").read_text().strip()


def _bearer(swarm: Swarm) -> dict[str, str]:
    return {"Authorization": f"Bearer {_token(swarm)}"}


def _login_link(swarm: Swarm) -> str:
    """The one-time link `ralph-dev status` prints on its dashboard line."""
    out = swarm.cli("status", swarm.project).stdout
    line = next(x for x in out.splitlines() if x.strip().startswith("dashboard:"))
    link = line.split("dashboard:", 1)[1].strip()
    assert "?token=" in link, out
    return link


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
def test_dashboard_shows_a_running_swarm_and_follows_it(
        swarm: Swarm, browser: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    swarm.script = {"*": "work:4", "DEMO-11": "block"}
    swarm.write_script()
    identifiers = swarm.import_plan()
    swarm.cli("issue", "add", swarm.project, HOSTILE_TITLE)
    swarm.start()
    url = _web_json(swarm)["url"]
    assert url.startswith("http://127.0.0.1:")
    browser.get(url)  # without the token: nothing but the way in
    assert "needs its access token" in browser.find_element("tag name", "body").text
    assert not _cards(browser)
    link = _login_link(swarm)  # as the person gets in: the link `status` prints
    browser.get(link)
    assert browser.current_url == url  # the token is off the address bar
    cookie = browser.get_cookie("ralph_dev_demo")
    assert cookie and cookie["httpOnly"] and _token(swarm) not in cookie["value"]

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

    # issue 24: a usage limit is one fact on top, its reset as HH:MM in the browser's zone
    from ralph_dev.core.agent_faults import USAGE_LIMIT
    from ralph_dev.core.model import Pause

    for key, value in swarm.env.items():
        monkeypatch.setenv(key, value)
    reset = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=3)
    StateStore(load_project(swarm.project).paths).set_pause(Pause(
        kind=USAGE_LIMIT, cause="the model's usage limit was reached: You've hit your limit",
        fix="nothing", since=datetime.now(UTC), until=reset, quiet_workers=True))
    said = f"usage limit until {reset.astimezone().strftime('%H:%M')}"  # chromium's TZ is ours
    wait_for(lambda: said in browser.find_element("id", "facts").text, 30, said)

    shot = _artifacts() / "dashboard.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


# --- metrics, state API, health --------------------------------------------------------


def _value(metrics: dict, name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.slow
def test_metrics_count_a_swarm_run_and_survive_a_daemon_restart(swarm: Swarm) -> None:
    swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n[[task]]\ntitle = "C"\n')
    started = swarm.cli("start", swarm.project).stdout
    url = _web_json(swarm)["url"]
    link = next(x for x in started.splitlines() if "dashboard:" in x).split()[1]
    assert link.startswith(url + "?token="), started  # `start` prints a login link too
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with opener.open(link, timeout=20) as page:
        assert page.status == 200 and page.url == url
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
    status, body = _get(url + "api/v1/state", _bearer(swarm))
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


async def test_on_loopback_every_route_but_health_and_metrics_needs_the_token(
        services_env: Swarm) -> None:
    services = await _services(services_env)
    try:
        url = services.url
        assert url and url.startswith("http://127.0.0.1:")
        token_file = services.store.paths.state_dir / "web-token"
        assert token_file.stat().st_mode & 0o077 == 0  # made for the person alone
        token = token_file.read_text().strip()
        bearer = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as http:
            for path in ("", "api/v1/state", "api/v1/events", "api/v1/workers/DEMO-1/pane",
                         "static/app.js"):
                async with http.get(url + path) as answer:
                    assert answer.status == 401, path
                    text = await answer.text()
                    assert "needs its access token" in text and token not in text
                    assert "default-src 'none'" in answer.headers["Content-Security-Policy"]
            async with http.get(url + "api/v1/state",
                                headers={"Authorization": "Bearer " + "x" * len(token)}
                                ) as answer:
                assert answer.status == 401
            async with http.get(url + "api/v1/state", headers=bearer) as answer:
                assert answer.status == 200
                assert (await answer.json())["schema_version"] == 1
            # a page elsewhere that rebinds its name to 127.0.0.1 gets nothing, token or not
            for path in ("api/v1/state", "healthz", "metrics"):
                async with http.get(url + path, headers={
                        "Host": f"evil.example:{services.web.port}", **bearer}) as answer:
                    assert answer.status == 421, path
            # open on loopback: health and counters, no issue text
            async with http.get(url + "healthz") as answer:
                assert answer.status == 503
                assert "no heartbeat" in await answer.text()
            services.store.write_heartbeat(tick=1)
            async with http.get(url + "healthz") as answer:
                assert answer.status == 200
            async with http.get(url + "metrics") as answer:
                assert answer.status == 200 and "ralph_dev_" in await answer.text()
            async with http.get(url + "api/v1/workers/DEMO-1/pane", headers=bearer) as answer:
                assert answer.status == 404
            async with http.get(url + "api/v1/workers/..%2Fetc/pane", headers=bearer) as answer:
                assert answer.status == 400
            async with http.get(url + "static/..%2Fserver.py", headers=bearer) as answer:
                assert answer.status == 404
            async with http.get(url + "static/app.js", headers=bearer) as answer:
                assert answer.status == 200 and "textContent" in await answer.text()
    finally:
        await services.stop()
    assert not (services.store.paths.state_dir / "web.json").exists()
    assert not (services.store.paths.state_dir / "web-login.key").exists()


async def test_the_fleet_api_answers_every_project_behind_the_one_token(
        services_env: Swarm, tmp_path: Path) -> None:
    """Issue 36: one daemon's dashboard answers for every project of the config, each
    as its own state document, behind that dashboard's token; a project that cannot be
    read at all is named, and the others still answer."""
    from conftest import make_jj_repo

    swarm = services_env
    swarm.cli("init", "second", "--repo", str(make_jj_repo(tmp_path / "second")),
              "--key", "SEC")
    swarm.import_plan('[[task]]\ntitle = "A"\n')
    swarm.config_file.write_text(swarm.config_file.read_text()
                                 + '\n[projects.broken]\nrepo = "relative/path"\n')
    services = await _services(swarm)
    try:
        url = services.url
        assert url is not None
        token = (services.store.paths.state_dir / "web-token").read_text().strip()
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "api/v1/fleet") as answer:
                assert answer.status == 401
            async with http.get(url + "api/v1/fleet",
                                headers={"Authorization": f"Bearer {token}"}) as answer:
                assert answer.status == 200
                fleet = await answer.json()
    finally:
        await services.stop()
    assert fleet["schema_version"] == 1
    assert [d["project"] for d in fleet["projects"]] == ["demo", "second"]
    validator = jsonschema.Draft202012Validator(load_schema())
    for doc in fleet["projects"]:
        validator.validate(doc)
    assert fleet["projects"][0]["issues"]["total"] == 1
    assert "projects.broken.repo" in fleet["errors"]["broken"]



@pytest.mark.slow
async def test_the_fleet_page_puts_what_needs_you_in_any_project_first(
        services_env: Swarm, tmp_path: Path, browser: Any) -> None:
    """Issue 36: one page, behind the one token, with each project's workers, waits,
    trunk and spend, and every project's NEEDS YOU on top, named by project."""
    from conftest import make_jj_repo

    swarm = services_env
    swarm.cli("init", "second", "--repo", str(make_jj_repo(tmp_path / "second")),
              "--key", "SEC")
    swarm.import_plan('[[task]]\ntitle = "A"\n')
    plan = tmp_path / "second.toml"
    plan.write_text('[[task]]\ntitle = "B"\n')
    swarm.cli("issue", "import", "second", str(plan))
    services = await _services(swarm)
    url = services.url
    assert url is not None
    token = (services.store.paths.state_dir / "web-token").read_text().strip()

    def shown() -> list[str]:
        return list(browser.execute_script(
            "return [...document.querySelectorAll('article[data-project]')]"
            ".map(a => a.dataset.project);"))

    def drive() -> tuple[list[str], str]:  # the browser in a thread: the server runs here
        browser.get(url + "fleet")
        assert "needs its access token" in browser.find_element("tag name", "body").text
        browser.get(f"{url}?token={token}")
        browser.get(url + "fleet")
        wait_for(lambda: shown() == ["demo", "second"], 30, "both projects on the page")
        assert browser.find_element("id", "needs-you").is_displayed()
        said = browser.execute_script(
            "return [...document.querySelectorAll('#needs-list li')]"
            ".map(li => li.dataset.project);")
        return list(said), browser.find_element(
            "css selector", 'article[data-project="second"]').text

    try:
        said, second = await asyncio.to_thread(drive)
        assert "demo" in said and "second" in said, said
        assert "daemon not running" in second and "1 ready" in second
        assert "trunk main" in second and "spend of live workers" in second
    finally:
        await services.stop()


async def test_a_login_link_works_once_and_leaves_an_httponly_cookie(services_env: Swarm
                                                                     ) -> None:
    import time

    from ralph_dev.control.daemon.web.access import LOGIN_KEY_FILE, LOGIN_TTL, login_url, mint_login

    services = await _services(services_env)
    paths = services.store.paths
    try:
        url = services.url
        token = (paths.state_dir / "web-token").read_text().strip()
        link = login_url(paths)
        assert link and link.startswith(url + "?token=") and token not in link
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as browser_like:
            async with browser_like.get(link, allow_redirects=False) as answer:
                assert answer.status == 303 and answer.headers["Location"] == "/"
                set_cookie = answer.headers["Set-Cookie"]
                assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
                assert token not in set_cookie  # the cookie is not the Bearer token
            async with browser_like.get(url) as answer:
                assert answer.status == 200 and "<html" in (await answer.text()).lower()
            async with browser_like.get(url + "api/v1/state") as answer:
                assert answer.status == 200  # the page's own requests carry the cookie
        async with aiohttp.ClientSession() as other:
            async with other.get(link, allow_redirects=False) as answer:
                assert answer.status == 401  # once only
                assert "used already or has expired" in await answer.text()
            key = bytes.fromhex((paths.state_dir / LOGIN_KEY_FILE).read_text().strip())
            expired = mint_login(key, now=time.time() - LOGIN_TTL - 5)
            forged = mint_login(b"not the daemon's key, 32 bytes!!")
            for value in (expired, forged, "", "a.b.c"):
                async with other.get(url + f"?token={value}", allow_redirects=False) as answer:
                    assert answer.status == 401, value
            async with other.get(url + "api/v1/state", headers={
                    "Cookie": f"ralph_dev_demo={token}"}) as answer:
                assert answer.status == 401  # the raw token is no cookie
    finally:
        await services.stop()
    assert login_url(paths) is None  # no daemon, no link


async def test_a_token_is_required_when_one_is_set(services_env: Swarm,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RALPH_DEV_WEB_TOKEN", TOKEN)
    services = await _services(services_env)
    try:
        url = services.url
        assert not (services.store.paths.state_dir / "web-token").exists()  # the set one
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
                async with http.get(url + "api/v1/state", headers=headers) as answer:
                    assert answer.status == 401
                    assert "needs its access token" in await answer.text()
                    assert TOKEN not in await answer.text()
            async with http.get(url + "api/v1/state",
                                headers={"Authorization": f"Bearer {TOKEN}"}) as answer:
                assert answer.status == 200
            # a token the person set is asked on every route, whatever the Host name (a
            # proxy in front of the loopback address)
            for path in ("metrics", "healthz"):
                async with http.get(url + path) as answer:
                    assert answer.status == 401, path
            async with http.get(url + "metrics", headers={
                    "Authorization": f"Bearer {TOKEN}", "Host": "ralph.example"}) as answer:
                assert answer.status == 200
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as browser_like:
            async with browser_like.get(url + f"?token={TOKEN}") as answer:
                assert answer.status == 200  # like Jupyter: the token itself opens it too
                assert "HttpOnly" in answer.history[0].headers["Set-Cookie"]
                assert str(answer.url) == url
            async with browser_like.get(url + "api/v1/state") as answer:
                assert answer.status == 200
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


def test_the_token_file_is_hidden_from_workers_wherever_it_lies(services_env: Swarm) -> None:
    """``web.token_file`` outside ralph-dev's own (hidden) directories: the workers'
    sandbox hides it too (here through the verify command's, which shares it)."""
    import uuid

    from ralph_dev.adapters.verify import run_verify
    from ralph_dev.agent.sandbox import verify_wrapper

    holder = Path("/var/tmp") / f"ralph-web-token-{uuid.uuid4().hex[:8]}"
    holder.mkdir()
    try:
        token_file = holder / "token"
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o600)
        _configure_web(services_env, f'token_file = "{token_file}"')
        settings = load_project(services_env.project)
        outcome = run_verify(f"cat {token_file}; echo read", services_env.repo,
                             wrapper=verify_wrapper(settings, services_env.repo))
        assert "read" in outcome.output_tail and TOKEN not in outcome.output_tail
        assert token_file.read_text().strip() == TOKEN  # the person's file is untouched
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def test_a_readable_token_file_is_refused(tmp_path: Path) -> None:
    from ralph_dev.control.daemon.web.server import WebError, read_token
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


# --- what a worker can reach ------------------------------------------------------------

PROBE = r'''
import json, os, sys, time, urllib.error, urllib.request
from pathlib import Path

issue, role = sys.argv[1], sys.argv[2]
shared = Path(__file__).parent
if issue != "DEMO-2":  # every other worker is the demo agent (DEMO-1 hangs in its pane)
    os.execv(sys.executable, [sys.executable, "-m", "ralph_dev.devtools.demo_agent", issue, role])
deadline = time.time() + 90
while not (shared / "target.json").exists() and time.time() < deadline:
    time.sleep(0.2)
target = json.loads((shared / "target.json").read_text())
answers = {}
for path in target["paths"]:
    try:
        with urllib.request.urlopen(target["url"] + path, timeout=10) as answer:
            answers[path] = [answer.status, answer.read(4000).decode("utf-8", "replace")]
    except urllib.error.HTTPError as err:
        answers[path] = [err.code, err.read(4000).decode("utf-8", "replace")]
    except OSError as exc:
        answers[path] = [None, repr(exc)]
files = {}
for name in target["files"]:
    try:
        files[name] = Path(name).read_text()
    except OSError as exc:
        files[name] = "refused: " + type(exc).__name__
result = {"answers": answers, "files": files, "environ": dict(os.environ)}
(shared / "probe.json").write_text(json.dumps(result))
print("[probe] done", flush=True)
while True:
    time.sleep(3600)
'''


@pytest.mark.slow
@pytest.mark.parametrize("configured", [False, True], ids=["made-by-ralph-dev", "env"])
def test_a_sandboxed_worker_reads_nothing_without_the_token(swarm: Swarm,
                                                            configured: bool) -> None:
    """A real worker (spawned by the real controller into a bubblewrap-confined pane)
    asks the dashboard for the state, the event stream and another worker's pane, and
    looks for the token in its environment and in the files that hold it: nothing.
    With no token configured ralph-dev makes one; a daemon given RALPH_DEV_WEB_TOKEN
    must not hand it on to the controller and its workers."""
    probe = swarm.shared / "probe.py"
    probe.write_text(PROBE)
    config = swarm.config_file
    text = config.read_text()
    command = next(c for c in text.splitlines() if c.startswith("command = "))
    config.write_text(text.replace(
        command, f"command = {json.dumps(f'{sys.executable} {probe} {{issue}} {{role}}')}", 1))
    if configured:
        swarm.env["RALPH_DEV_WEB_TOKEN"] = TOKEN
    swarm.script = {"DEMO-1": "hang"}
    swarm.write_script()
    swarm.import_plan('[[task]]\ntitle = "Hang"\n[[task]]\ntitle = "Probe"\n')
    swarm.start()
    url = _web_json(swarm)["url"]
    wait_for(lambda: "[demo agent] DEMO-1" in swarm.tmux(
        "capture-pane", "-p", "-t", "=ralph-demo:=DEMO-1").stdout, 60, "DEMO-1's pane")
    state_dir = swarm.state_dir
    (swarm.shared / "target.json").write_text(json.dumps({
        "url": url,
        "paths": ["api/v1/state", "api/v1/events", "api/v1/workers/DEMO-1/pane", "",
                  "static/app.js", "?token=", "healthz"],
        "files": [str(state_dir / "web-login.key"), str(state_dir / "web-token"),
                  str(state_dir / "web.json"),
                  str(state_dir / "events.jsonl"), str(swarm.config_file)],
    }))
    result_file = swarm.shared / "probe.json"
    wait_for(result_file.exists, 90, "the sandboxed probe's findings")
    found = json.loads(result_file.read_text())
    answers = found["answers"]

    assert found["environ"].get("RALPH_DEV_ISSUE") == "DEMO-2"  # it was a real worker
    assert "RALPH_DEV_WEB_TOKEN" not in found["environ"]
    assert all(v.startswith("refused: ") for v in found["files"].values()), found["files"]
    # it does reach the daemon (health is open with ralph-dev's own token only)
    assert answers["healthz"][0] in ((401,) if configured else (200, 503)), answers
    for path in ("api/v1/state", "api/v1/events", "api/v1/workers/DEMO-1/pane", "",
                 "static/app.js", "?token="):
        status, body = answers[path]
        assert status == 401, (path, status, body)
        assert "DEMO-1" not in body and "Hang" not in body and "schema_version" not in body
    # what the person gets with the token: the other worker's screen
    token = TOKEN if configured else _token(swarm)
    status, body = _get(url + "api/v1/workers/DEMO-1/pane",
                        {"Authorization": f"Bearer {token}"})
    assert status == 200 and "[demo agent] DEMO-1" in body
    assert token not in json.dumps(found)  # not in its environment, nor anywhere it read
    login_key = (state_dir / "web-login.key").read_text().strip()
    assert login_key not in json.dumps(found)
