"""The Linear webhook listener: only signed, fresh, new deliveries of Issue and
Comment events wake the controller; everything else is answered and dropped.

Requests go over real HTTP to the listener on loopback (aiohttp client and
server); the end-to-end test runs ``ralph-dev controller`` as a process and
checks that a signed delivery makes it tick long before its poll interval.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from conftest import retry_until

from ralph_dev.adapters.mailbox_server import MailboxServer
from ralph_dev.adapters.store import StateStore
from ralph_dev.adapters.tracker.local import LocalTracker
from ralph_dev.adapters.webhook import (
    PATH,
    SECRET_ENV,
    Deliveries,
    RateLimitedLog,
    WebhookError,
    WebhookListener,
    secret_from_env,
    signature,
)
from ralph_dev.control.loop.run import run_with_webhooks

SECRET = "whsec-test-5f1c9a0e77d24b3e"
NOW = 1_790_000_000.0
"""The listener's injected clock (UNIX seconds); payload timestamps are ms around it."""


def payload(kind: str = "Issue", *, at: float = NOW, **extra: Any) -> bytes:
    body = {"action": "update", "type": kind, "data": {"id": "abc", "title": "T"},
            "webhookTimestamp": int(at * 1000), "webhookId": "wh-1", **extra}
    return json.dumps(body).encode()


def headers(body: bytes, delivery: str, *, secret: str = SECRET, sig: str | None = None,
            **extra: str) -> dict[str, str]:
    return {"Linear-Signature": signature(secret, body) if sig is None else sig,
            "Linear-Delivery": delivery, "Linear-Event": "Issue",
            "Content-Type": "application/json", **extra}


class Harness:
    def __init__(self, listener: WebhookListener, session: aiohttp.ClientSession) -> None:
        self.listener = listener
        self.session = session

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.port}{PATH}"

    async def post(self, body: bytes, hdrs: dict[str, str]) -> int:
        async with self.session.post(self.url, data=body, headers=hdrs) as resp:
            await resp.read()
            return resp.status


@pytest.fixture
async def hook() -> AsyncIterator[Harness]:
    listener = WebhookListener(SECRET, asyncio.Event(), clock=lambda: NOW, min_interval=0)
    await listener.start("127.0.0.1", 0)
    async with aiohttp.ClientSession() as session:
        yield Harness(listener, session)
    await listener.stop()


async def test_valid_issue_delivery_wakes_the_tick(hook: Harness) -> None:
    body = payload("Issue")
    assert await hook.post(body, headers(body, "d-1")) == 200
    assert hook.listener.wake.is_set()
    assert hook.listener.woken == 1


async def test_valid_comment_delivery_wakes_the_tick(hook: Harness) -> None:
    body = payload("Comment")
    assert await hook.post(body, headers(body, "d-c")) == 200
    assert hook.listener.woken == 1


async def test_bad_signature_is_rejected_without_a_tick(hook: Harness) -> None:
    body = payload()
    assert await hook.post(body, headers(body, "d-2", secret="another-secret")) == 401
    assert await hook.post(body, headers(body, "d-3", sig="")) == 401
    tampered = payload(extra_field="x")  # signed body, then altered
    assert await hook.post(tampered, headers(body, "d-4", sig=signature(SECRET, body))) == 401
    assert not hook.listener.wake.is_set()
    assert hook.listener.woken == 0


async def test_stale_or_future_timestamp_is_rejected(hook: Harness) -> None:
    for at in (NOW - 61, NOW + 61):
        body = payload(at=at)
        assert await hook.post(body, headers(body, f"d-{at}")) == 401
    assert hook.listener.woken == 0
    body = payload(at=NOW - 59)  # inside the window still counts
    assert await hook.post(body, headers(body, "d-ok")) == 200
    assert hook.listener.woken == 1


async def test_timestamp_header_is_the_fallback_and_missing_is_rejected(hook: Harness) -> None:
    raw = {"action": "create", "type": "Issue", "data": {}}
    body = json.dumps(raw).encode()
    assert await hook.post(body, headers(body, "d-none")) == 400
    stale = headers(body, "d-h1", **{"Linear-Timestamp": str(int((NOW - 300) * 1000))})
    assert await hook.post(body, stale) == 401
    fresh = headers(body, "d-h2", **{"Linear-Timestamp": str(int(NOW * 1000))})
    assert await hook.post(body, fresh) == 200
    assert hook.listener.woken == 1


async def test_duplicate_delivery_is_acknowledged_and_ignored(hook: Harness) -> None:
    body = payload()
    assert await hook.post(body, headers(body, "d-dup")) == 200
    hook.listener.wake.clear()
    assert await hook.post(body, headers(body, "d-dup")) == 200  # Linear's retry
    assert not hook.listener.wake.is_set()
    assert hook.listener.woken == 1


async def test_replay_under_a_new_delivery_id_is_a_duplicate(hook: Harness) -> None:
    body = payload()
    assert await hook.post(body, headers(body, "d-orig")) == 200
    assert await hook.post(body, headers(body, "d-forged-new-id")) == 200
    assert await hook.post(body, headers(body, "")) == 200
    assert hook.listener.woken == 1


async def test_odd_payload_values_are_rejected_or_ignored(hook: Harness) -> None:
    for i, stamp in enumerate(("NaN", "Infinity", True, "soon", None)):
        raw = {"type": "Issue", "webhookTimestamp": stamp, "n": i}
        body = json.dumps(raw).encode()
        assert await hook.post(body, headers(body, f"d-odd-{i}")) == 400, stamp
    body = payload(type=["Issue"])  # an unhashable type: answered, no tick, no crash
    assert await hook.post(body, headers(body, "d-list")) == 200
    assert hook.listener.woken == 0


async def test_non_json_body_is_rejected(hook: Harness) -> None:
    for i, body in enumerate((b"not json{", b"[1, 2]", b"\xff\xfe")):
        assert await hook.post(body, headers(body, f"d-bad-{i}")) == 400
    assert hook.listener.woken == 0


async def test_other_event_types_do_not_wake(hook: Harness) -> None:
    body = payload("Project")
    assert await hook.post(body, headers(body, "d-p")) == 200
    assert hook.listener.woken == 0
    async with hook.session.get(hook.url) as resp:  # only POST is served
        assert resp.status == 405


async def test_secret_never_reaches_the_logs(hook: Harness) -> None:
    with structlog.testing.capture_logs() as logs:
        good = payload()
        await hook.post(good, headers(good, "d-l1"))
        await hook.post(good, headers(good, "d-l2", sig=SECRET))  # secret as the signature
        await hook.post(b"nope", headers(b"nope", "d-l3"))
    assert len(logs) == 3
    assert {e["event"] for e in logs} == {"webhook", "webhook_rejected"}
    text = repr(logs)
    assert SECRET not in text
    assert signature(SECRET, good) not in text
    assert '"title"' not in text and "'T'" not in text  # payload text is not logged either
    assert SECRET not in repr(hook.listener)


async def test_a_burst_of_deliveries_coalesces_into_few_ticks() -> None:
    listener = WebhookListener(SECRET, asyncio.Event(), clock=lambda: NOW, min_interval=0.3)
    for i in range(20):
        body = payload(n=i)
        assert listener.judge(body, headers(body, f"burst-{i}")).woke
        listener.poke()
    assert listener.woken == 1  # the first wakes at once, the rest wait for one more
    await asyncio.sleep(0.5)
    assert listener.woken == 2
    await listener.stop()


def test_deliveries_memory_is_bounded() -> None:
    seen = Deliveries(limit=3)
    for d in ("a", "b", "c", "d"):
        seen.add(d)
    assert len(seen) == 3
    assert "a" not in seen and "d" in seen


def test_missing_secret_is_a_clear_error() -> None:
    with pytest.raises(WebhookError, match=SECRET_ENV):
        secret_from_env({})
    assert secret_from_env({SECRET_ENV: " s3 "}) == "s3"


async def test_port_in_use_is_a_clear_error(hook: Harness) -> None:
    other = WebhookListener(SECRET, asyncio.Event())
    with pytest.raises(WebhookError, match="webhook_port"):
        await other.start("127.0.0.1", hook.listener.port or 0)


class _CountingController:
    """Stands in for the controller in the run loop: records each tick."""

    def __init__(self, settings: Any, store: StateStore) -> None:
        self.settings = settings
        self.store = store
        self.tracker = LocalTracker(store.paths.state_dir / "t.db", "DEMO")
        self.server = MailboxServer(settings.paths.worker_dir, self._hear)
        self.stopping = False
        self.tick_number = 0

    async def _hear(self, name: str, report: str) -> None:
        return None

    async def tick(self) -> Any:
        self.tick_number += 1
        return type("Result", (), {"unblocked_work": False})()


async def test_controller_without_webhook_secret_keeps_polling(xdg: Path) -> None:
    from ralph_dev.core.config import ProjectSettings, TrackerSettings

    settings = ProjectSettings(name="demo", repo=xdg,
                               tracker=TrackerSettings(webhook_port=0))
    ctl = _CountingController(settings, StateStore(settings.paths))
    with structlog.testing.capture_logs() as logs:
        await run_with_webhooks(ctl, max_ticks=1, environ={})  # type: ignore[arg-type]
    assert ctl.tick_number == 1  # the controller ran anyway
    assert any(e["event"] == "webhook_disabled" and SECRET_ENV in e["error"] for e in logs)
    assert any(e["event"] == "webhook_disabled" for e in ctl.store.iter_events())


class _FailingController(_CountingController):
    async def _hear(self, name: str, report: str) -> None:
        return None

    async def tick(self) -> Any:
        self.tick_number += 1
        raise OSError(24, "Too many open files")


async def test_a_failing_tick_whose_event_cannot_be_written_does_not_stop_the_loop(
        xdg: Path) -> None:
    """Out of file descriptors: the tick fails and so does writing its event; the
    controller must keep ticking (it exited 1 here before)."""
    from ralph_dev.core.config import ProjectSettings, Timing

    settings = ProjectSettings(name="demo", repo=xdg, timing=Timing(poll_interval=0.05))
    store = StateStore(settings.paths)
    store.paths.events_file.mkdir(parents=True)  # every append now fails with an OSError
    ctl = _FailingController(settings, store)
    with structlog.testing.capture_logs() as logs:
        await run_with_webhooks(ctl, max_ticks=3, environ={})  # type: ignore[arg-type]
    assert ctl.tick_number == 3
    assert [e["event"] for e in logs].count("tick_failed") == 3
    assert any(e["event"] == "event_write_failed" and e["event_name"] == "tick_failed"
               for e in logs)


# --- end to end: the real controller process ------------------------------------


@pytest.fixture
def controller_proc(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[dict[str, Any]]:
    from swarm_kit import Swarm

    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=1,
                         timing={"poll_interval": 60})
    config = swarm.config_file
    text = config.read_text()
    assert 'key = "DEMO"\n' in text
    config.write_text(text.replace('key = "DEMO"\n', 'key = "DEMO"\nwebhook_port = 0\n'))
    env = {**swarm.env, SECRET_ENV: SECRET}
    proc = subprocess.Popen([sys.executable, "-m", "ralph_dev", "controller", "demo"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        yield {"swarm": swarm, "proc": proc}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        swarm.tmux("kill-server")


def _listening_port(swarm: Any) -> int | None:
    for event in swarm.events():
        if event.get("event") == "webhook_listening":
            return int(event["port"])
    return None


@pytest.mark.slow
def test_controller_process_ticks_on_a_signed_webhook(controller_proc: dict[str, Any]) -> None:
    swarm, proc = controller_proc["swarm"], controller_proc["proc"]
    port = retry_until(lambda: _listening_port(swarm), 20, 0.1, "the webhook listener")
    retry_until(lambda: swarm.ticks() >= 1, 20, 0.1, "the first tick")

    url = f"http://127.0.0.1:{port}{PATH}"

    def post(body: bytes, hdrs: dict[str, str]) -> int:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(url, data=body, headers=hdrs, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback http
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    now = time.time()
    forged = payload(at=now)
    assert post(forged, headers(forged, "e2e-0", secret="wrong")) == 401
    log_file = swarm.state_dir / "logs/controller.jsonl"
    retry_until(lambda: "webhook_rejected" in log_file.read_text(), 30, 0.1,
                "the controller to log the rejected delivery")
    # neither the forged delivery nor the poll (every 60 s) ticked again
    assert swarm.ticks() == 1

    body = payload(at=now)
    assert post(body, headers(body, "e2e-1")) == 200
    retry_until(lambda: swarm.ticks() >= 2, 30, 0.1, "a tick woken by the webhook")
    assert proc.poll() is None
    logged = log_file.read_text()
    assert '"webhook"' in logged and SECRET not in logged


async def test_a_body_nested_too_deeply_is_a_400_not_a_crash(hook: Harness) -> None:
    body = b"[" * 100_000 + b"]" * 100_000  # signed: only the parser could fail on it
    assert await hook.post(body, headers(body, "d-deep")) == 400
    assert hook.listener.woken == 0
    good = payload()
    assert await hook.post(good, headers(good, "d-after-deep")) == 200  # still serving


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def open_silent(port: int, count: int) -> list[Connection]:
    """``count`` connections that send nothing, or a request head never finished."""
    connections = []
    for i in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if i % 2:
            writer.write(b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
        connections.append((reader, writer))
    return connections


async def closed_by_peer(connection: Connection, timeout: float) -> bool:
    """The server closed it (EOF) within ``timeout`` seconds."""
    reader, _ = connection
    try:
        async with asyncio.timeout(timeout):
            while await reader.read(1024):
                pass
    except (TimeoutError, ConnectionResetError):
        return False
    return True


async def test_slow_senders_are_timed_out_and_connections_are_capped() -> None:
    listener = WebhookListener(SECRET, asyncio.Event(), clock=lambda: NOW, min_interval=0,
                               header_timeout=1.0, body_timeout=1.0, max_connections=6)
    port = await listener.start("127.0.0.1", 0)
    try:
        with structlog.testing.capture_logs() as logs:
            silent = await open_silent(port, 6)
            async with asyncio.timeout(5):  # the server has taken all six
                while listener.open_connections() < 6:
                    await asyncio.sleep(0.02)
            over = await open_silent(port, 3)  # beyond the cap: closed at once
            for connection in over:
                assert await closed_by_peer(connection, 2)
            assert listener.refused == 3
            # silent and half-sent connections are dropped after the header timeout
            for connection in silent:
                assert await closed_by_peer(connection, 5)
            # a head sent, its body never finished: 408 after the body timeout
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 100\r\n\r\n{")
            async with asyncio.timeout(5):
                status_line = await reader.readline()
            assert b" 408 " in status_line
            writer.close()
            # and after all that a real delivery is served
            async with aiohttp.ClientSession() as session:
                body = payload()
                url = f"http://127.0.0.1:{port}{PATH}"
                async with session.post(url, data=body, headers=headers(body, "d-ok")) as resp:
                    assert resp.status == 200
        refused = [e for e in logs if e["event"] == "webhook_refused"]
        assert refused and refused[0]["limit"] == 6
        for _, writer in silent + over:
            writer.close()
    finally:
        await listener.stop()


def test_rejections_are_logged_at_most_a_burst_a_minute() -> None:
    now = [0.0]
    limited = RateLimitedLog(burst=3, window=60, clock=lambda: now[0])
    with structlog.testing.capture_logs() as logs:
        written = [limited.warning("webhook_rejected", n=i) for i in range(10)]
        now[0] = 61.0
        limited.warning("webhook_rejected", n=10)
    assert written == [True] * 3 + [False] * 7
    assert [e["n"] for e in logs] == [0, 1, 2, 10]
    assert logs[-1]["suppressed"] == 7  # what was held back is said, not lost
