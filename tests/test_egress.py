"""Issue 38: a worker reaches only the hosts its work needs (``agent.network``).

Real parts: bubblewrap's network namespace, the egress proxy on a Unix socket, the
bridge inside the sandbox, the real Claude Code CLI against the scripted API on the
host's loopback, the real controller's ticks, and plain HTTP servers on loopback for
what a worker must not reach.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_kit import cli_project
from conftest import retry_until
from test_claude_smoke import (  # noqa: F401 (fixtures)
    FAKE_KEY,
    claude_bin,
    controller_ticks,
    open_world,
)

from ralph_dev.agent.cli_bin import find_cli
from ralph_dev.core.agent_profiles import CLAUDE, PROFILES
from ralph_dev.core.model import NewIssue, StateType
from ralph_dev.devtools.scripted_model import FakeAnthropic, Text, bash, conversation_text
from ralph_dev.inpane.egress import allowed

INSTALLED = {name: find_cli(PROFILES[name]) for name in ("codex", "gemini")}
"""Each CLI as ``scripts/setup.sh`` installed it, found before a fixture repoints HOME."""


@pytest.mark.parametrize(("rule", "host", "port", "ok"), [
    ("registry.npmjs.org", "registry.npmjs.org", 443, True),
    ("registry.npmjs.org", "REGISTRY.npmjs.org.", 80, True),  # case, a trailing dot
    ("registry.npmjs.org", "registry.npmjs.org", 22, False),  # no port said: 443 and 80
    ("pypi.org:443", "pypi.org", 80, False),
    ("127.0.0.1:8080", "127.0.0.1", 8080, True),
    ("127.0.0.1:8080", "127.0.0.1", 8081, False),
    ("*.githubusercontent.com", "raw.githubusercontent.com", 443, True),
    ("*.githubusercontent.com", "githubusercontent.com", 443, False),
    ("*.githubusercontent.com", "evilgithubusercontent.com", 443, False),
    ("[::1]:8080", "::1", 8080, True),
    ("api.anthropic.com", "api.anthropic.com.evil.example", 443, False),
])
def test_allow_rules_match_a_host_and_port_exactly(rule: str, host: str, port: int,
                                                   ok: bool) -> None:
    assert allowed([rule], host, port) is ok


class Served:
    """A plain HTTP server on the host's loopback that counts what reached it."""

    def __init__(self) -> None:
        hits: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                body = b"the host's secret"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.hits = hits
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def served() -> Iterator[tuple[Served, Served]]:
    """Two servers on loopback: one a project allows, one it does not."""
    pair = Served(), Served()
    try:
        yield pair
    finally:
        for one in pair:
            one.close()


def through(socket_path: Path, request: bytes) -> bytes:
    """``request`` sent to the proxy on its Unix socket; all it answered."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(10)
        client.connect(str(socket_path))
        client.sendall(request)
        out = b""
        with contextlib.suppress(TimeoutError):
            while chunk := client.recv(65536):
                out += chunk
                if request.startswith(b"CONNECT") and b"\r\n\r\n" in out:
                    break
        return out


def test_the_proxy_carries_only_allowed_hosts_and_writes_down_the_rest(
        tmp_path: Path, served: tuple[Served, Served]) -> None:
    allowed_server, other = served
    spec = tmp_path / "spec.json"
    sock, ledger = tmp_path / "proxy.sock", tmp_path / "egress.jsonl"
    spec.write_text(json.dumps({"egress": {
        "socket": str(sock), "log": str(ledger), "issue": "T-1",
        "allow": [f"127.0.0.1:{allowed_server.port}"]}}))
    proxy = subprocess.Popen([sys.executable, "-m", "ralph_dev.inpane.egress", str(spec)])
    try:
        retry_until(sock.exists, 20, 0.05, what="the proxy's socket")
        got = through(sock, f"GET http://127.0.0.1:{allowed_server.port}/x HTTP/1.1\r\n"
                            f"Host: 127.0.0.1\r\nProxy-Authorization: no\r\n\r\n".encode())
        assert got.startswith(b"HTTP/1.0 200") and got.endswith(b"the host's secret"), got
        refused = through(sock, f"GET http://127.0.0.1:{other.port}/x HTTP/1.1\r\n"
                                "Host: x\r\n\r\n".encode())
        assert refused.startswith(b"HTTP/1.1 403") and b"agent.allow_hosts" in refused
        tunnel = through(sock, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n")
        assert tunnel.startswith(b"HTTP/1.1 403")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as tunnel_client:
            tunnel_client.settimeout(10)
            tunnel_client.connect(str(sock))
            tunnel_client.sendall(f"CONNECT 127.0.0.1:{allowed_server.port} HTTP/1.1\r\n\r\n"
                                  .encode())
            opened = tunnel_client.recv(4096)
            assert opened.startswith(b"HTTP/1.1 200 Connection established")
            # what goes through the tunnel is the client's (TLS, for HTTPS): carried as is
            tunnel_client.sendall(b"GET /tunnelled HTTP/1.0\r\n\r\n")
            answer = b""
            while chunk := tunnel_client.recv(65536):
                answer += chunk
            assert answer.endswith(b"the host's secret"), answer
        garbage = through(sock, b"\x16\x03\x01 not http at all\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400")
    finally:
        proxy.terminate()
        proxy.wait(10)
    assert allowed_server.hits == ["/x", "/tunnelled"] and other.hits == []
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    refusals = [(e["host"], e["port"]) for e in lines if e["kind"] == "refused"]
    assert ("127.0.0.1", other.port) in refusals and ("example.com", 443) in refusals
    sent = [e for e in lines if e["kind"] == "bytes" and e["port"] == allowed_server.port]
    assert sent and sent[0]["out"] > 0 and sent[0]["in"] > 0 and sent[0]["issue"] == "T-1"
    assert "Proxy-Authorization" not in ledger.read_text()


@contextlib.contextmanager
def machine_proxy(rules: list[str], ledger: Path) -> Iterator[int]:
    """A proxy on the host's loopback standing for the one a company's machine reaches
    the internet through (this module's own kind, on TCP): its port; its ledger says
    what went through it."""
    import asyncio

    from ralph_dev.inpane.egress import Ledger, Proxy

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(
        Proxy(rules, Ledger(ledger, "machine")).serve, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_the_proxy_goes_through_the_machines_own_proxy_but_for_what_it_bypasses(
        tmp_path: Path, served: tuple[Served, Served]) -> None:
    """A machine that reaches the internet only through a proxy of its own (its
    ``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``): an allowed connection, tunnelled or
    plain, goes through that proxy, with its credentials, which nothing writes down; a
    name ``NO_PROXY`` covers goes straight there; a refused one goes nowhere."""
    from ralph_dev.agent.egress import machine_proxy as read_machine_proxy

    allowed_server, other = served
    via_ledger = tmp_path / "machine.jsonl"
    with machine_proxy([f"127.0.0.1:{allowed_server.port}"], via_ledger) as port:
        upstream = read_machine_proxy({"HTTPS_PROXY": f"http://me:s3cret@127.0.0.1:{port}",
                                       "http_proxy": f"127.0.0.1:{port}",
                                       "NO_PROXY": "example.org,.localhost:99"})
        assert upstream is not None
        spec = tmp_path / "spec.json"
        sock, ledger = tmp_path / "proxy.sock", tmp_path / "egress.jsonl"
        spec.write_text(json.dumps({"egress": {
            "socket": str(sock), "log": str(ledger), "issue": "T-1", "upstream": upstream,
            "allow": [f"127.0.0.1:{allowed_server.port}", f"localhost:{allowed_server.port}",
                      f"127.0.0.1:{other.port}"]}}))
        proxy = subprocess.Popen([sys.executable, "-m", "ralph_dev.inpane.egress", str(spec)])
        try:
            retry_until(sock.exists, 20, 0.05, what="the proxy's socket")
            got = through(sock, f"GET http://127.0.0.1:{allowed_server.port}/plain HTTP/1.1"
                                "\r\nHost: 127.0.0.1\r\n\r\n".encode())
            assert got.startswith(b"HTTP/1.0 200") and got.endswith(b"the host's secret"), got
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(10)
                client.connect(str(sock))
                client.sendall(f"CONNECT 127.0.0.1:{allowed_server.port} HTTP/1.1\r\n\r\n"
                               .encode())
                assert client.recv(4096).startswith(b"HTTP/1.1 200")
                client.sendall(b"GET /tunnelled HTTP/1.0\r\n\r\n")
                answer = b""
                while chunk := client.recv(65536):
                    answer += chunk
                assert answer.endswith(b"the host's secret"), answer
            direct = through(sock, f"GET http://localhost:{allowed_server.port}/direct "
                                   "HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            assert direct.startswith(b"HTTP/1.0 200"), direct
            # allowed here, but the machine's proxy says no: a 502, and why, written down
            denied = through(sock, f"CONNECT 127.0.0.1:{other.port} HTTP/1.1\r\n\r\n"
                             .encode())
            assert denied.startswith(b"HTTP/1.1 502"), denied
        finally:
            proxy.terminate()
            proxy.wait(10)
    assert allowed_server.hits == ["/plain", "/tunnelled", "/direct"] and other.hits == []
    through_machine = [json.loads(line) for line in via_ledger.read_text().splitlines()]
    assert {(e["host"], e["port"]) for e in through_machine if e["kind"] == "bytes"} == \
        {("127.0.0.1", allowed_server.port)}  # not localhost: NO_PROXY covers it
    assert [e["port"] for e in through_machine if e["kind"] == "refused"] == [other.port]
    said = ledger.read_text()
    assert "the machine's proxy 127.0.0.1" in said and "s3cret" not in said
    assert "s3cret" not in via_ledger.read_text()


@pytest.fixture
def claude_world(xdg: Path, jj_bin: str, tmux_socket: str,
                 claude_bin: str,  # noqa: F811 - the fixture, by its name
                 request: pytest.FixtureRequest) -> Iterator[Any]:
    config = cli_project(xdg, tmux_socket, CLAUDE, claude_bin,
                         (f"network = {json.dumps(request.param)}",))
    with open_world(xdg, jj_bin, tmux_socket, config) as made:
        yield made


FETCH = ("python3 -c \"import sys, urllib.request as u\nfor port in sys.argv[1:]:\n"
         "    try: print(port, u.urlopen('http://127.0.0.1:' + port + '/secret', "
         "timeout=5).read())\n    except Exception as exc: print(port, 'refused', exc)\"")


@pytest.mark.parametrize("claude_world", ["allowlist"], indirect=True)
def test_a_worker_reaches_its_model_api_and_nothing_else_on_the_host(
        claude_world: Any, served: tuple[Served, Served],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's check: a Claude Code worker, its sandbox without network, reaches the
    scripted API on the host's loopback through its proxy and ends Done; its attempts on
    another server of the host get nothing, and each refusal is an event naming the
    issue and the port. Five of them, and the person is told on the issue."""
    world = claude_world
    _, other = served
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt")])
    tries = " ".join([str(other.port)] * 5)

    def brain(request: dict[str, Any]) -> list[Any]:
        said = conversation_text(request)
        if "refused" not in said and "secret" not in said:
            return [bash(f"{FETCH} {tries}", "look around")]
        if "worker done" not in said.split("look around")[-1]:
            return [bash(f"touch ok.txt && ralph-dev worker done {issue} --summary 'added'")]
        return [Text("Done.")]

    with FakeAnthropic(brain) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        tick = controller_ticks(world, world.settings)
        retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                             is StateType.COMPLETED)[1], 240, 0.5,
                    what=f"{issue} done through the proxy: {api.errors}")
        results = [r for r in conversation_text(api.messages()[-1]).splitlines()
                   if r.startswith(str(other.port))]
    assert other.hits == [], "a refused server was reached"
    assert results and all("refused" in r and "403" in r for r in results), results
    events = list(world.store.iter_events())
    refused = [e for e in events if e["event"] == "egress_refused" and e["port"] == other.port]
    assert len(refused) >= 5 and {e["issue"] for e in refused} == {issue}
    assert any(e["event"] == "egress_bytes" and e["out_bytes"] > 0 for e in events)
    comments = world.tracker.get_sync(issue).comments
    assert any("keeps trying hosts it may not reach" in c.body and "agent.allow_hosts"
               in c.body for c in comments)


def command_project(xdg: Path, tmux_socket: str, command: str, network: str,
                    allow: str, verify: str = "test -f ok.txt") -> Path:
    """The config of project ``demo`` whose workers run ``command`` (the command runner)
    with ``agent.network`` and one allowed host."""
    from conftest import make_jj_repo

    repo = make_jj_repo(xdg / "repo")
    config = xdg / "config" / "ralph-dev" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("\n".join([
        "[projects.demo]", f"repo = {json.dumps(str(repo))}", 'trunk = "main"',
        f"tmux_socket = {json.dumps(tmux_socket)}", f"verify_command = {json.dumps(verify)}",
        "[projects.demo.tracker]", 'key = "DEMO"', "[projects.demo.timing]",
        "poll_interval = 0.5", "[projects.demo.agent]", 'runner = "command"',
        f"command = {json.dumps(command)}", f"network = {json.dumps(network)}",
        f"allow_hosts = [{json.dumps(allow)}]", ""]))
    return config


@pytest.fixture
def probe_world(xdg: Path, jj_bin: str, tmux_socket: str, served: tuple[Served, Served],
                request: pytest.FixtureRequest) -> Iterator[Any]:
    """A project whose workers run a probe (the command runner) with ``agent.network`` as
    the test asks, the first of the ``served`` servers allowed: it fetches from both,
    writes what it got in its workspace, and reports done."""
    ports = [one.port for one in served]
    # inline (the sandbox hides /tmp, where the test's files are), and without braces
    # (the command runner's template would take them for placeholders)
    probe = ("import pathlib, subprocess, sys, urllib.request as u\n"
             "out = []\n"
             f"for port in {ports!r}:\n"
             "    url = 'http://127.0.0.1:%d/' % port\n"
             "    try:\n"
             "        out.append('%d %s' % (port, u.urlopen(url, timeout=5).read().decode()))\n"
             "    except Exception as exc:\n"
             "        out.append('%d no: %s' % (port, exc))\n"
             "pathlib.Path('ok.txt').write_text(chr(10).join(out))\n"
             "subprocess.run(['ralph-dev', 'worker', 'done', sys.argv[1], '--summary', "
             "'probed'])\n")
    config = command_project(xdg, tmux_socket, f"python3 -c {shlex.quote(probe)} {{issue}}",
                             request.param, f"127.0.0.1:{ports[0]}")
    with open_world(xdg, jj_bin, tmux_socket, config) as made:
        yield made


@pytest.mark.parametrize("probe_world", ["allowlist", "none", "open"], indirect=True)
def test_each_network_mode_lets_a_worker_reach_what_it_says(
        probe_world: Any, served: tuple[Served, Served]) -> None:
    """``allowlist``: the allowed server (``agent.allow_hosts``) and nothing else;
    ``none``: nothing at all, not even an allowed host; ``open``: all of them, as before."""
    world, (allowed_server, other) = probe_world, served
    network = world.settings.agent.network
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Probe")])
    tick = controller_ticks(world, world.settings)
    retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                         is StateType.COMPLETED)[1], 120, 0.5, what="the probe done")
    said = world.jj_out("file", "show", "-r", "main", "ok.txt")
    lines = dict(line.split(" ", 1) for line in said.splitlines())
    reached = {int(port) for port, text in lines.items() if "secret" in text}
    assert reached == {"allowlist": {allowed_server.port}, "none": set(),
                       "open": {allowed_server.port, other.port}}[network], said
    assert bool(other.hits) is (network == "open")
    assert bool(allowed_server.hits) is (network != "none")
    refused = [e for e in world.store.iter_events() if e["event"] == "egress_refused"]
    assert [(e["issue"], e["port"]) for e in refused] == \
        ([(issue, other.port)] if network == "allowlist" else [])


def test_the_controllers_verify_reaches_only_what_workers_may(
        xdg: Path, jj_bin: str, tmux_socket: str, served: tuple[Served, Served]) -> None:
    """The verify command runs code workers wrote: on the controller's side too (the
    merge lane's run) it reaches only ``agent.allow_hosts``, through a proxy of its own,
    and what it was refused is named in the run's output."""
    allowed_server, other = served
    fetch = ("import urllib.request as u\n"
             f"for port in ({allowed_server.port}, {other.port}):\n"
             "    try: print(port, u.urlopen('http://127.0.0.1:%d/verify' % port, "
             "timeout=5).read())\n"
             "    except Exception as exc: print(port, 'no', exc)\n")
    config = command_project(
        xdg, tmux_socket, "sh -c 'touch ok.txt && ralph-dev worker done {issue} "
        "--summary probed'", "allowlist", f"127.0.0.1:{allowed_server.port}",
        verify=f"python3 -c {shlex.quote(fetch)}")
    with open_world(xdg, jj_bin, tmux_socket, config) as world:
        (issue,) = world.tracker.create_issues_sync([NewIssue(title="Probe")])
        tick = controller_ticks(world, world.settings)
        retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                             is StateType.COMPLETED)[1], 120, 0.5, what="the probe merged")
        runs = world.settings.paths.lane_dir / "runs"
        said = {p.parent.name: p.read_text() for p in runs.glob("*/output.log")}
    # the worker's own verify (at `worker done`) and the lane's reached the allowed host
    assert allowed_server.hits.count("/verify") >= 2, said
    assert other.hits == [], said
    assert said and all(f"{other.port} no" in out for out in said.values()), said
    from ralph_dev.agent.egress import refused_in

    assert [refused_in(p) for p in runs.glob("*/egress.jsonl")] == \
        [[f"127.0.0.1:{other.port}"]], list(runs.iterdir())
    # had it failed, its output (to the worker, on the issue) would name what was refused
    from ralph_dev.control.loop.merging import MergeLane

    lane = MergeLane(world.settings, jj=world.jj, store=world.store, pull_requests=None)  # type: ignore[arg-type]
    (run,) = (p.parent.name for p in runs.glob("*/egress.jsonl"))
    assert f"the verify's network refused 127.0.0.1:{other.port}" in \
        lane._outcome(run)["output_tail"]


def test_a_network_mode_without_the_sandbox_is_refused(xdg: Path) -> None:
    from test_config import write_config

    from ralph_dev.core.config import load_project
    from ralph_dev.core.errors import ConfigError

    write_config('[projects.app]\nrepo = "/r"\n[projects.app.agent]\nsandbox = "off"\n'
                 'network = "allowlist"\n')
    with pytest.raises(ConfigError, match=r"agent\.network.*needs the workers. sandbox"):
        load_project("app", environ={})
    write_config('[projects.app]\nrepo = "/r"\n[projects.app.agent]\n'
                 'allow_hosts = ["https://pypi.org/simple"]\n')
    with pytest.raises(ConfigError, match=r"agent\.allow_hosts.*is not a host"):
        load_project("app", environ={})


@pytest.mark.parametrize("cli", ["codex", "gemini"])
def test_codex_and_gemini_work_through_the_proxy(
        cli: str, xdg: Path, jj_bin: str, tmux_socket: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38 item 3: each supported CLI reaches its scripted API on the host's
    loopback through the proxy, from a sandbox without network, and its issue ends Done;
    the bytes it sent are counted."""
    from cli_kit import pinned_cli

    from ralph_dev.devtools.scripted_gemini import FakeGemini
    from ralph_dev.devtools.scripted_openai import FakeOpenAI

    profile = PROFILES[cli]
    program = pinned_cli(profile, INSTALLED[cli])
    config = cli_project(xdg, tmux_socket, profile, program, ('network = "allowlist"',))
    with open_world(xdg, jj_bin, tmux_socket, config) as world:
        (issue,) = world.tracker.create_issues_sync([NewIssue(title="Add ok.txt")])

        def brain(request: dict[str, Any]) -> list[Any]:
            said = conversation_text(request)
            if "--summary 'through'" not in said:
                return [bash(f"touch ok.txt && ralph-dev worker done {issue} "
                             "--summary 'through'")]
            return [Text("Done.")]

        fake = FakeOpenAI(brain) if cli == "codex" else FakeGemini(brain)
        with fake as api:
            if cli == "codex":
                monkeypatch.setenv("OPENAI_BASE_URL", f"{api.url}/v1")
                monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-egress-0123456789")
            else:
                monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", api.url)
                monkeypatch.setenv("GEMINI_API_KEY", "AIza-fake-egress-0123456789")
            tick = controller_ticks(world, world.settings)
            retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                                 is StateType.COMPLETED)[1], 240, 0.5,
                        what=f"{issue} done on {cli} through the proxy: {api.errors}")
        port = int(api.url.rsplit(":", 1)[1])
        carried = [e for e in world.store.iter_events() if e["event"] == "egress_bytes"]
        assert carried and sum(e["out_bytes"] for e in carried) > 0
        ledger = (world.settings.paths.worker_dir(issue) / "egress.jsonl")
        if ledger.exists():  # the worker's directory may be gone with the issue done
            assert f'"port": {port}' in ledger.read_text()



def _package_server(root: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    """A server on the host's loopback with what a worker's tools fetch: a git repository
    (git's dumb HTTP), an npm package document and a pip index with a wheel."""
    import zipfile

    subprocess.run(["git", "init", "-q", "--bare", str(root / "repo.git")], check=True)
    seed = root / "seed"
    subprocess.run(["git", "init", "-q", str(seed)], check=True)
    (seed / "README").write_text("from the allowed host\n")
    for args in (["add", "README"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit",
                                     "-qm", "seed"], ["push", "-q", str(root / "repo.git"),
                                                      "HEAD:refs/heads/main"]):
        subprocess.run(["git", "-C", str(seed), *args], check=True)
    subprocess.run(["git", "-C", str(root / "repo.git"), "update-server-info"], check=True)
    (root / "demo-pkg").write_text(json.dumps({
        "name": "demo-pkg", "dist-tags": {"latest": "1.2.3"},
        "versions": {"1.2.3": {"name": "demo-pkg", "version": "1.2.3", "dist": {
            "tarball": "http://127.0.0.1/demo-pkg-1.2.3.tgz", "shasum": "0" * 40}}}}))
    wheel = root / "files" / "demo_pkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as made:
        made.writestr("demo_pkg/__init__.py", "")
        made.writestr("demo_pkg-1.0.dist-info/METADATA",
                      "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
        made.writestr("demo_pkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: t\n"
                      "Root-Is-Purelib: true\nTag: py3-none-any\n")
        made.writestr("demo_pkg-1.0.dist-info/RECORD", "")
    (root / "simple" / "demo-pkg").mkdir(parents=True)
    (root / "simple" / "demo-pkg" / "index.html").write_text(
        f'<a href="/files/{wheel.name}">{wheel.name}</a>\n')

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_git_npm_and_pip_reach_an_allowed_host_through_the_proxy(
        xdg: Path, jj_bin: str, tmux_socket: str, tmp_path: Path) -> None:
    """Issue 38 item 3: a worker's own tools (git, npm, pip) honour the proxy the sandbox
    names and fetch from a host the project allows, with no network of their own."""

    server, port = _package_server(tmp_path / "packages")
    base = f"http://127.0.0.1:{port}"
    # no braces: the command runner's template would take them for placeholders
    script = (
        "export npm_config_cache=/tmp/npm-cache npm_config_update_notifier=false; "
        f"git clone -q {base}/repo.git cloned > log.txt 2>&1; echo git=$? >> ok.txt; "
        f"npm view demo-pkg version --registry {base}/ >> ok.txt 2>> log.txt; "
        "echo npm=$? >> ok.txt; "
        f"{sys.executable} -m pip download -q --no-deps --no-cache-dir --index-url "
        f"{base}/simple/ demo-pkg -d /tmp/dl >> log.txt 2>&1; echo pip=$? >> ok.txt; "
        "ls /tmp/dl >> ok.txt; rm -rf cloned; "
        "ralph-dev worker done \"$0\" --summary tools")
    config = command_project(xdg, tmux_socket, f"sh -c {shlex.quote(script)} {{issue}}",
                             "allowlist", f"127.0.0.1:{port}")
    try:
        with open_world(xdg, jj_bin, tmux_socket, config) as world:
            (issue,) = world.tracker.create_issues_sync([NewIssue(title="Fetch")])
            tick = controller_ticks(world, world.settings)
            retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                                 is StateType.COMPLETED)[1], 180, 0.5, what="the tools done")
            said = world.jj_out("file", "show", "-r", "main", "ok.txt")
    finally:
        server.shutdown()
        server.server_close()
    assert "git=0" in said and "npm=0" in said and "1.2.3" in said, said
    assert "pip=0" in said and "demo_pkg-1.0-py3-none-any.whl" in said, said


def test_what_a_proxy_wrote_is_told_once_even_by_a_restarted_controller(xdg: Path) -> None:
    """Each refusal becomes one event, and a controller started again (or the same one,
    once the worker's window went) does not tell it twice; refusals before the worker's
    start do not count towards putting it before the person."""
    from datetime import UTC, datetime, timedelta

    from test_config import write_config

    from ralph_dev.adapters.store import StateStore
    from ralph_dev.agent.egress import LEDGER
    from ralph_dev.control.loop.egress import EgressWatch
    from ralph_dev.core.config import load_project
    from ralph_dev.core.model import WorkerRecord

    write_config('[projects.app]\nrepo = "/r"\n[projects.app.agent]\nnetwork = "allowlist"\n')
    settings = load_project("app", environ={})
    store = StateStore(settings.paths)
    ledger = settings.paths.worker_dir("APP-1") / LEDGER
    ledger.parent.mkdir(parents=True)
    start = datetime.now(UTC)

    def refusal(at: datetime, port: int) -> str:
        return json.dumps({"at": at.timestamp(), "kind": "refused", "issue": "APP-1",
                           "host": "10.0.0.1", "port": port, "why": "not allowed"}) + "\n"

    ledger.write_text(refusal(start - timedelta(minutes=5), 1) + refusal(start, 2)
                      + '{"kind": "bytes", "out": 10, "in": 20, "at": 0}\n{"torn')
    records = {"APP-1": WorkerRecord("APP-1", started_at=start)}
    assert EgressWatch(settings, store).read(records, ["APP-1"]) == {"APP-1": (1, "10.0.0.1:2")}
    again = EgressWatch(settings, store)  # a controller started again
    assert again.read(records, ["APP-1"]) == {}
    with ledger.open("a") as file:
        file.write('"}\n' + refusal(start, 3))
    again.read(records, [])  # its window went: what its proxy wrote last is read
    events = list(store.iter_events())
    assert [e["port"] for e in events if e["event"] == "egress_refused"] == [1, 2, 3]
    assert [(e["out_bytes"], e["in_bytes"]) for e in events
            if e["event"] == "egress_bytes"] == [(10, 20)]


@pytest.mark.slow
@pytest.mark.parametrize("probe_world", ["allowlist"], indirect=True)
def test_a_cluster_worker_reaches_only_what_is_allowed_and_its_refusals_come_back(
        probe_world: Any, served: tuple[Served, Served], tmp_path: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The issue's first item on a cluster: the worker runs on a node with a HOME and XDG
    dirs of its own, behind a proxy of that node's; the allowed server answers it, the
    other sees nothing, and the refusal comes back to the controller as an event naming
    the issue and the port."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'ralph-dev[ray]')")
    import dataclasses

    from ray_kit import bare_remote, local_cluster
    from test_cluster_claude import cluster_ticks

    from ralph_dev.core.config import ClusterSettings, Timing

    world, (allowed_server, other) = probe_world, served
    remote = bare_remote(tmp_path / "remote.git")
    world.jj.cli.run("git", "remote", "add", "origin", str(remote), touch_checkout=True).check()
    (issue,) = world.tracker.create_issues_sync([NewIssue(title="Probe")])
    with local_cluster(tmp_path_factory.getbasetemp(), "demo", nodes=1,
                       connect=False) as made:
        world.settings = dataclasses.replace(
            world.settings, cluster=ClusterSettings(engine="ray", address=made.address,
                                                    remote=None),
            timing=Timing(poll_interval=0.5, retry_base=0.5, retry_cap=1))
        tick, close = cluster_ticks(world)
        try:
            retry_until(lambda: (tick(), world.tracker.get_sync(issue).state_type
                                 is StateType.COMPLETED)[1], 240, 0.5,
                        what="the probe on a cluster node done")
            # the proxy writes a connection's bytes as it ends: a tick or two more reads them
            for _ in range(3):
                tick()
        finally:
            close()
    said = world.jj_out("file", "show", "-r", "main", "ok.txt")
    lines = dict(line.split(" ", 1) for line in said.splitlines())
    assert {int(port) for port, text in lines.items() if "secret" in text} == \
        {allowed_server.port}, said
    assert other.hits == [] and allowed_server.hits
    refused = [e for e in world.store.iter_events() if e["event"] == "egress_refused"]
    assert [(e["issue"], e["port"]) for e in refused] == [(issue, other.port)]
    assert any(e["event"] == "egress_bytes" and e["issue"] == issue and e["in_bytes"] > 0
               for e in world.store.iter_events())


def test_a_hosts_ledger_is_copied_once_whatever_the_controller_restarts(tmp_path: Path) -> None:
    """``hosts.ray.ledger``: what a cluster worker's proxy wrote on its host reaches the
    controller's copy whole lines at a time, once, across a controller stopped between
    appending and noting, and a new attempt's ledger (on another host) goes after it."""
    from ralph_dev.adapters.files import read_lines_from
    from ralph_dev.hosts.ray.ledger import LedgerCopy

    hosts = {1: tmp_path / "host-a.jsonl", 2: tmp_path / "host-b.jsonl"}
    folder = tmp_path / "worker"
    folder.mkdir()

    def read(issue: str, attempt: int, position: int, limit: int) -> tuple[bytes, int]:
        assert issue == "T-1"
        lines, end = read_lines_from(hosts[attempt], position, limit)
        return b"".join(line + b"\n" for line in lines), end

    def copier() -> LedgerCopy:  # a controller (re)started
        return LedgerCopy(lambda issue: folder, read)

    copy = folder / "egress.jsonl"
    assert copier().bring("T-1", 1) == 0 and not copy.exists()
    hosts[1].write_bytes(b'{"n": 1}\n{"n": 2}\n{"n": 3')  # the third still being written
    assert copier().bring("T-1", 1) == 18
    assert copy.read_bytes() == b'{"n": 1}\n{"n": 2}\n'
    with hosts[1].open("ab") as host:
        host.write(b'}\n{"n": 4}\n')
    with copy.open("ab") as stopped:  # appended, then stopped before noting it
        stopped.write(b'{"n": 3}\n')
    assert copier().bring("T-1", 1) == 18
    assert copy.read_bytes() == b'{"n": 1}\n{"n": 2}\n{"n": 3}\n{"n": 4}\n'
    assert copier().bring("T-1", 1) == 0
    hosts[2].write_bytes(b'{"n": 5}\n')  # attempt 2, elsewhere: its ledger starts anew
    assert copier().bring("T-1", 2) == 9
    assert copy.read_bytes().splitlines()[-2:] == [b'{"n": 4}', b'{"n": 5}']
