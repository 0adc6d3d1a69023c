"""Issue 26: a cluster host shares nothing with the controller but the git remote. A
worker's launch files travel to its host (``launch_bundle``), and its reports and the
controller's answers travel through the relay (``node_mailbox`` ↔ ``cluster_relay``),
so its commands work there as on one host. Real sockets and threads; no Ray (the
relay's calls are what the actor would carry)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import retry_until

from ralph_dev.adapters import mailbox
from ralph_dev.core.cluster import session_folder
from ralph_dev.hosts.bundle import Bundle, BundleError, moved, pack, unpack
from ralph_dev.hosts.node.mailbox import NodeMailbox
from ralph_dev.hosts.ray.carrier import MailboxCarrier


def _worker_dir(root: Path) -> Path:
    worker = root / "state" / "workers" / "APP-1"
    for sub in ("home/.claude", "tmp", "run/outbox", "run/answers"):
        (worker / sub).mkdir(parents=True)
    (worker / "home" / ".claude" / "settings.json").write_text(json.dumps(
        {"hooks": {"Stop": [{"command": f"ralph-dev hook stop --home {worker / 'home'}"}]},
         "apiKeyHelper": str(worker / "home" / "key")}))
    (worker / "home" / "filter.bpf").write_bytes(bytes(range(256)))
    (worker / "home" / "filter.bpf").chmod(0o640)
    (worker / "run" / "outbox" / "0123abcd.json").write_text("{}")
    (worker / "sessions").mkdir()
    (worker / "sessions" / "old-session-1.jsonl").write_text("{}\n")
    return worker


def test_a_launch_travels_with_every_path_moved_to_its_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = _worker_dir(tmp_path / "controller")
    controller_state = str(tmp_path / "controller" / "state")
    monkeypatch.setenv("XDG_STATE_HOME", controller_state)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # the same on both hosts
    prompts = tmp_path / "controller" / "prompts"
    prompts.mkdir()
    spec = prompts / "APP-1.execute.1.launch.json"
    prompt = prompts / "APP-1.execute.1.md"
    prompt.write_text(f"Issue text that names {worker} stays as it is.\n")
    spec.write_text(json.dumps({
        "argv": ["claude", "--settings", str(worker / "home/.claude/settings.json")],
        "env": {"HOME": str(worker / "home"), "RALPH_DEV_RUN_DIR": str(worker / "run"),
                "OTHER": "/usr/bin", "XDG_STATE_HOME": controller_state,
                "PATH": f"{tmp_path}/controller/data/agent-bin:/usr/bin"},
        "sandbox": {"args": ["--bind", str(worker / "run"), "/run/ralph-dev"]},
        "prompt_file": str(prompt)}))
    (prompts / "APP-2.execute.1.md").write_text("another issue's prompt")
    (worker / "home" / "link").symlink_to("/etc/passwd")

    agent_bin = tmp_path / "controller" / "data" / "agent-bin"
    agent_bin.mkdir(parents=True)
    (agent_bin / "ralph-dev").symlink_to("/usr/bin/env")  # the program, installed alike
    (agent_bin / "relative").symlink_to("ralph-dev")
    bundle = pack({"worker": worker, "launch": prompts, "agent-bin": agent_bin},
                  trees=[worker], leave_out=[worker / "run" / "outbox", worker / "sessions"],
                  files=[spec, prompt], links_in=[agent_bin])
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "node" / "state"))  # on its host
    host = tmp_path / "node" / "runs" / "APP-1-a1"
    moves = unpack(bundle, host)

    # the launch's own files go to its copy; the rest of the controller's XDG state
    # directory is the host's own
    assert {k: v for k, v in moves.items() if k != v} == {
        str(worker): str(host / "worker"), str(prompts): str(host / "launch"),
        str(agent_bin): str(host / "agent-bin"),
        controller_state: str(tmp_path / "node" / "state")}
    assert (host / "agent-bin" / "ralph-dev").readlink() == Path("/usr/bin/env")
    assert not (host / "agent-bin" / "relative").is_symlink()
    shipped = json.loads((host / "launch" / spec.name).read_text())
    assert shipped["argv"][2] == str(host / "worker/home/.claude/settings.json")
    assert shipped["env"] == {"HOME": str(host / "worker/home"),
                              "RALPH_DEV_RUN_DIR": str(host / "worker/run"), "OTHER": "/usr/bin",
                              "XDG_STATE_HOME": str(tmp_path / "node" / "state"),
                              "PATH": f"{host}/agent-bin:/usr/bin"}
    assert shipped["sandbox"]["args"] == ["--bind", str(host / "worker/run"), "/run/ralph-dev"]
    assert shipped["prompt_file"] == str(host / "launch" / prompt.name)
    settings = json.loads((host / "worker/home/.claude/settings.json").read_text())
    assert settings["apiKeyHelper"] == str(host / "worker/home/key")
    # the prompt is the issue's text: bytes, never rewritten; binary files as they are
    assert (host / "launch" / prompt.name).read_text() == prompt.read_text()
    assert (host / "worker/home/filter.bpf").read_bytes() == bytes(range(256))
    assert (host / "worker/home/filter.bpf").stat().st_mode & 0o777 == 0o600  # owner only
    # what is not the launch's stays home: other prompts, the outbox, kept sessions, links
    assert not (host / "launch" / "APP-2.execute.1.md").exists()
    assert not (host / "worker/run/outbox").exists()
    assert not (host / "worker/sessions").exists()
    assert not (host / "worker/home/link").exists()
    assert (host / "worker/tmp").is_dir()
    # a sibling that only begins like the worker's directory is not the worker's copy
    assert moved(str(worker) + "-other", moves) == str(
        tmp_path / "node" / "state" / "workers" / "APP-1-other")
    assert moved("/elsewhere", moves) == "/elsewhere"


def test_a_bundle_that_names_a_path_outside_its_roots_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    for path in (f"{root}/../../etc/cron.d/evil", "/etc/passwd"):
        bundle = Bundle(roots={str(root): "worker"}, files={path: (0o600, b"x")})
        with pytest.raises(BundleError, match="not a path under the launch's roots"):
            unpack(bundle, tmp_path / "host")
    with pytest.raises(BundleError, match="not a root's name"):
        unpack(Bundle(roots={str(root): ".."}), tmp_path / "host")
    assert not (tmp_path / "etc").exists()


def test_a_bundle_over_its_limit_says_what_to_remove(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ralph_dev.hosts.bundle.BUNDLE_LIMIT", 1000)
    root = tmp_path / "w"
    root.mkdir()
    (root / "big").write_bytes(b"x" * 2000)
    with pytest.raises(BundleError, match=r"2,000 bytes, over .*remove what does not belong"):
        pack({"worker": root}, trees=[root])


def test_claude_codes_session_folder_for_a_workspace() -> None:
    assert session_folder(Path("/home/me/.local/share/ralph-dev/nodes/ab12/ws/APP-1-a2")) \
        == "-home-me--local-share-ralph-dev-nodes-ab12-ws-APP-1-a2"
    assert session_folder(Path("/" + "x" * 250)) is None


# -- the relay ---------------------------------------------------------------------------


def _run_dir(path: Path, issue: str = "APP-1") -> Path:
    run = mailbox.make_run_dir(path)
    mailbox.write_worker_info(run, mailbox.WorkerInfo(project="app", issue=issue,
                                                      role="execute", workspace="/ws",
                                                      attempt=1))
    return run


class _Controller:
    """What the controller's intake does with a run directory's reports: answers the ones
    that write (done, note…), drops news once read."""

    def __init__(self, run: Path) -> None:
        self.run = run
        self.heard: list[str] = []

    async def hear(self, name: str, report_id: str) -> mailbox.Answer | None:
        self.heard.append(name)
        for path, report in mailbox.pending_reports(self.run):
            assert report is not None
            if report.kind == "done":
                (self.run / mailbox.DIFF_FILE).write_text("the change as seen here\n")
                mailbox.write_answer(self.run, mailbox.Answer(report.id, True, "merged soon"))
            else:
                path.unlink()
        return mailbox.read_answer(self.run, report_id)


def test_a_workers_report_on_its_host_is_answered_through_the_relay(tmp_path: Path) -> None:
    here = _run_dir(tmp_path / "controller" / "run")
    there = NodeMailbox(tmp_path / "node" / "run")
    there.open()
    controller = _Controller(here)
    calls: list[tuple[list[str], list[str]]] = []

    def exchange(issue: str, attempt: int, files: dict[str, bytes],
                 answers: dict[str, bytes], taken: list[str], wait: float) -> dict[str, bytes]:
        assert (issue, attempt) == ("APP-1", 3)
        calls.append((sorted(files), list(taken)))
        return there.exchange(files, answers, taken, wait)

    async def scenario() -> tuple[mailbox.Report, mailbox.Answer | None]:
        relay = MailboxCarrier(lambda name: here, controller.hear, exchange, lambda name: 3)
        await relay.listen(["APP-1"])
        try:
            deadline = time.monotonic() + 20
            while not (there.run_dir / mailbox.WORKER_FILE).exists():
                assert time.monotonic() < deadline, "worker.json never reached the host"
                await asyncio.sleep(0.05)
            # the worker's commands, on its host: news it does not wait for, then `done`
            await asyncio.to_thread(mailbox.tell, there.run_dir, "activity", {"tool": "Edit"})
            return await asyncio.to_thread(mailbox.submit, there.run_dir, "done",
                                           {"summary": "did it"}, wait=20)
        finally:
            await relay.close()
            there.close()

    report, answer = asyncio.run(scenario())
    assert answer is not None and answer.ok and answer.message == "merged soon"
    # the report is the controller's now, answered there; its files came with the answer
    assert mailbox.read_answer(here, report.id) == answer
    assert (there.run_dir / mailbox.DIFF_FILE).read_text() == "the change as seen here\n"
    assert mailbox.read_worker_info(there.run_dir).issue == "APP-1"
    # a file goes once, until it changes; a report is said taken, and never sent again
    assert [files for files, _ in calls].count([mailbox.WORKER_FILE]) == 1
    assert any(report.id in taken for _, taken in calls)
    assert there.exchange({}, {}, [], 0) == {}
    assert "APP-1" in controller.heard


def test_a_report_the_controller_did_not_keep_is_sent_again(tmp_path: Path) -> None:
    """A controller stopped between taking a report and saying so gets it again."""
    there = NodeMailbox(tmp_path / "node" / "run")
    there.open()
    try:
        written = mailbox.write_report(there.run_dir, "note", {"text": "hello"})
        first = there.exchange({}, {}, [], 5)
        assert list(first) == [written.id]
        assert list(there.exchange({}, {}, [], 0)) == [written.id]  # not said taken yet
        assert there.exchange({}, {}, [written.id], 0) == {}
        # news written without a poke is found while an exchange waits
        later = threading.Timer(0.3, mailbox.write_report,
                                (there.run_dir, "activity", {"tool": "Read"}))
        later.start()
        started = time.monotonic()
        found = there.exchange({}, {}, [], 10)
        later.join()
        assert len(found) == 1 and time.monotonic() - started < 5
    finally:
        there.close()
    assert not (there.run_dir / mailbox.SOCKET).exists()


def test_a_worker_that_stops_waiting_frees_its_connection(tmp_path: Path) -> None:
    there = NodeMailbox(tmp_path / "node" / "run")
    there.open()
    try:
        started = time.monotonic()
        mailbox.tell(there.run_dir, "activity", {"tool": "Read"})  # waits half a second
        assert time.monotonic() - started < 3
        deadline = time.monotonic() + 10
        while [t for t in threading.enumerate() if "process_request" in t.name]:
            assert time.monotonic() < deadline, "a connection's thread waits for ever"
            time.sleep(0.05)
    finally:
        there.close()
    assert len(list((there.run_dir / mailbox.OUTBOX).iterdir())) == 1  # the news stays


def test_attach_types_each_line_into_a_cluster_workers_session(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A person attached to a worker on another host answers its agent a line at a time;
    the screen is read through its actor, and the end of input leaves."""
    from ralph_dev.cli.status import _watch_screen

    class Host:
        def __init__(self) -> None:
            self.typed: list[tuple[str, str]] = []

        def screen(self, issue: str, lines: int = 200) -> str:
            return f"the agent asks: which port?\x1b[31m{len(self.typed)}\n"

        def type_line(self, issue: str, text: str) -> None:
            self.typed.append((issue, text))

    read, write = os.pipe()
    os.write(write, b"8080\n\n$(rm -rf ~) C-c\n")
    os.close(write)
    host = Host()
    with os.fdopen(read) as typed:
        _watch_screen(host, "APP-1", "node-b", typed)  # type: ignore[arg-type]
    assert host.typed == [("APP-1", "8080"), ("APP-1", "$(rm -rf ~) C-c")]
    shown = capsys.readouterr().out
    assert "APP-1 on node-b: a line you type and Enter go to its agent" in shown
    assert "which port?" in shown and "\x1b[31m" not in shown


def test_a_relay_that_fails_unexpectedly_is_said_and_started_again(tmp_path: Path) -> None:
    import structlog

    here = _run_dir(tmp_path / "controller" / "run")
    calls: list[int] = []

    def exchange(issue: str, attempt: int, files: dict[str, bytes],
                 answers: dict[str, bytes], taken: list[str], wait: float) -> dict[str, bytes]:
        calls.append(attempt)
        raise TypeError("a bug")

    async def scenario() -> None:
        relay = MailboxCarrier(lambda name: here, _Controller(here).hear, exchange,
                             lambda name: 1)
        await relay.listen(["APP-1"])
        deadline = time.monotonic() + 10
        while len(calls) < 2:
            assert time.monotonic() < deadline, "the relay was not started again"
            await asyncio.sleep(0.05)
            await relay.listen(["APP-1"])  # each tick asks
        await relay.close()

    with structlog.testing.capture_logs() as logs:
        asyncio.run(scenario())
    failed = [e["error"] for e in logs if e["event"] == "carrier_failed"]
    assert failed[:1] == ["TypeError('a bug')"]


def test_each_call_its_host_answered_renews_the_lease_from_when_it_was_sent(
        tmp_path: Path) -> None:
    """Issue 37: the lease the controller counts runs from the sending of the last call
    the host answered; a refused call (a host cut off, an attempt whose lease ran out)
    renews nothing."""
    from datetime import UTC, datetime

    from ralph_dev.core.errors import HostUnavailable

    here = _run_dir(tmp_path / "controller" / "run")
    answering = {"yes": True}
    arrived: list[datetime] = []
    renewed: list[tuple[str, int, datetime]] = []

    def exchange(issue: str, attempt: int, files: dict[str, bytes],
                 answers: dict[str, bytes], taken: list[str], wait: float) -> dict[str, bytes]:
        arrived.append(datetime.now(UTC))
        time.sleep(0.05)
        if not answering["yes"]:
            raise HostUnavailable("its lease ran out")
        return {}

    async def scenario() -> None:
        carrier = MailboxCarrier(lambda name: here, _Controller(here).hear, exchange,
                                 lambda name: 2, renewed=lambda *said: renewed.append(said))
        await carrier.listen(["APP-1"])
        deadline = time.monotonic() + 10
        while len(renewed) < 3:
            assert time.monotonic() < deadline, "no renewals"
            await asyncio.sleep(0.02)
        answering["yes"] = False
        count, refused = len(renewed), len(arrived)
        while len(arrived) < refused + 2:
            assert time.monotonic() < deadline, "no more calls"
            await asyncio.sleep(0.02)
        assert len(renewed) <= count + 1  # at most the one answered as it turned
        await carrier.close()

    asyncio.run(scenario())
    assert all(issue == "APP-1" and attempt == 2 for issue, attempt, _ in renewed)
    for _, _, sent in renewed:  # sent before it arrived on its host
        assert any(sent <= at for at in arrived)


def test_a_sandbox_made_on_the_controller_hides_what_its_host_has(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37: the sandbox's hide list was computed on the controller's host and moved
    to the node's paths; a node without the controller's dirs made bubblewrap fail
    (``Can't mkdir …/ralph-dev``) and no worker started. On its host the list is the
    host's: ralph-dev's dirs and the credentials there hidden, the controller's left out,
    and a path the sandbox binds that the host lacks named before any pane opens."""
    import shutil
    import subprocess

    from ralph_dev.agent.sandbox import SandboxPathMissing, on_this_host

    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("bubblewrap is not installed")
    node = tmp_path / "node"  # a host with a HOME of its own and no ralph-dev dirs yet
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_STATE_HOME", "state"),
                     ("XDG_DATA_HOME", "data")):
        monkeypatch.setenv(var, str(node / sub))
    home = node / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("the host's key\n")
    (home / ".netrc").write_text("machine example.com password hunter2\n")
    workspace = node / "data" / "ralph-dev" / "nodes" / "n1" / "workspaces" / "APP-1"
    workspace.mkdir(parents=True)
    (workspace / "code.txt").write_text("the worker's code\n")
    (node / "data" / "ralph-dev" / "nodes" / "n1" / "other.txt").write_text("another's\n")
    # as the controller made it, moved to this host's paths: its state dir (under the
    # node's XDG_STATE_HOME, which this host never made) and the controller's credentials
    made_there = ["--die-with-parent", "--unshare-user", "--cap-drop", "ALL",
                  "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                  "--tmpfs", "/run", "--tmpfs", str(node / "state" / "ralph-dev"),
                  "--tmpfs", "/nonexistent-controller-home/.ssh",
                  "--ro-bind", "/dev/null", "/nonexistent-controller-home/.netrc",
                  "--bind", str(workspace), str(workspace), "--chdir", str(workspace)]
    look = ["sh", "-c", f'cat code.txt; ls -A {home}/.ssh; cat {home}/.netrc; '
                        f'ls -A {node}/data/ralph-dev/nodes/n1; echo end']
    before = subprocess.run([bwrap, *made_there, "--", *look], capture_output=True,
                            text=True, check=False)
    assert before.returncode != 0 and "Can't mkdir" in before.stderr, before

    fit = on_this_host(made_there, home)
    ran = subprocess.run([bwrap, *fit, "--", *look], capture_output=True, text=True,
                         check=False)
    assert ran.returncode == 0, (ran.stderr, fit)
    # the workspace shows through; the host's key, .netrc and ralph-dev's data do not
    # (only the mount point of the workspace, made on the empty tmpfs)
    assert ran.stdout == "the worker's code\nworkspaces\nend\n", ran.stdout
    assert not [p for p in fit if p.startswith("/nonexistent-controller-home")]
    assert (node / "state" / "ralph-dev").is_dir()  # made, so it is there to hide

    missing = [*made_there[:-2], "--ro-bind", "/opt/not-on-this-host/claude",
               "/opt/not-on-this-host/claude", *made_there[-2:]]
    with pytest.raises(SandboxPathMissing, match="/opt/not-on-this-host/claude"):
        on_this_host(missing, home)


def test_a_worker_done_waiting_on_an_attempt_that_stops_itself_learns_it_is_superseded(
        tmp_path: Path) -> None:
    """Issue 37: a superseded attempt's `worker done` was kept waiting two minutes, then
    told its report "is applied as soon as it runs", which it never was. An attempt
    that stops itself (its lease ran out) answers every report still waiting with why,
    at once."""
    there = NodeMailbox(tmp_path / "node" / "run")
    there.open()
    try:
        got: list[Any] = []
        asking = threading.Thread(target=lambda: got.append(mailbox.submit(
            there.run_dir, "done", {"summary": "did it"}, wait=30)))
        started = time.monotonic()
        asking.start()
        retry_until(lambda: there._asking == 1, 10, 0.05, what="the done waiting")
        refused = there.refuse_waiting("APP-1: attempt 2 is superseded", wait=5)
        asking.join(10)
        report, answer = got[0]
        assert refused == [report.id]
        assert answer is not None and not answer.ok and "superseded" in answer.message
        assert time.monotonic() - started < 10
        assert there.refuse_waiting("again", wait=0) == []  # answered once
    finally:
        there.close()


def _pauses_of(carrier: MailboxCarrier) -> list[tuple[int, float]]:
    """Each wait the carrier chose (attempt, seconds), taken at once: what it waits
    is the point, not the waiting."""
    chosen: list[tuple[int, float]] = []

    async def pause(name: str, attempt: int, seconds: float) -> None:
        chosen.append((attempt, seconds))
        await asyncio.sleep(0.005)

    carrier._pause = pause  # type: ignore[method-assign]
    return chosen


def test_a_new_attempt_owes_nothing_of_its_predecessors_backoff(tmp_path: Path) -> None:
    """Seen on a cluster that lost a node: the lost attempt's calls failed for a while,
    and its issue's next attempts, each refusing a first call before it was placed,
    waited the whole backoff carried over from it (30 s): longer than the 22.5 s an
    attempt waits to hear from the controller. Each stopped itself as superseded, the
    next started, and the issue never finished."""
    from ralph_dev.core.errors import HostUnavailable
    from ralph_dev.core.policy import RetryPolicy

    here = _run_dir(tmp_path / "controller" / "run")
    current = {"attempt": 1}
    calls: list[int] = []
    retry = RetryPolicy(initial=1.0, backoff=2.0, cap=30.0)

    def exchange(issue: str, attempt: int, files: dict[str, bytes],
                 answers: dict[str, bytes], taken: list[str], wait: float) -> dict[str, bytes]:
        calls.append(attempt)
        if attempt == 1 or calls.count(attempt) == 1:  # lost; then not placed yet
            raise HostUnavailable(f"{issue}: attempt {attempt}: no such worker")
        return {}

    async def scenario() -> list[tuple[int, float]]:
        carrier = MailboxCarrier(lambda name: here, _Controller(here).hear, exchange,
                                 lambda name: current["attempt"], retry=retry)
        chosen = _pauses_of(carrier)
        await carrier.listen(["APP-1"])
        deadline = time.monotonic() + 10
        while calls.count(1) < 8:
            assert time.monotonic() < deadline, "the lost attempt was not called"
            await asyncio.sleep(0.01)
        current["attempt"] = 2
        while calls.count(2) < 3:
            assert time.monotonic() < deadline, "the new attempt was not called"
            await asyncio.sleep(0.01)
        await carrier.close()
        return chosen

    chosen = asyncio.run(scenario())
    assert max(s for a, s in chosen if a == 1) == retry.cap  # the lost one backed off
    assert [s for a, s in chosen if a == 2] == [retry.initial]  # the new one starts over


def test_a_carrier_backing_off_calls_again_before_its_attempts_lease_runs_out(
        tmp_path: Path) -> None:
    """A host cut off for a while and back: its attempt hears from the controller before
    it stops itself, however long the calls failed."""
    from ralph_dev.core.errors import HostUnavailable
    from ralph_dev.hosts.node.worker import LEASE_STOP
    from ralph_dev.hosts.ray.carrier import carry_retry

    here = _run_dir(tmp_path / "controller" / "run")
    calls: list[int] = []
    lease = 30.0

    def exchange(issue: str, attempt: int, files: dict[str, bytes],
                 answers: dict[str, bytes], taken: list[str], wait: float) -> dict[str, bytes]:
        calls.append(attempt)
        raise HostUnavailable(f"{issue}: its host does not answer")

    async def scenario() -> list[tuple[int, float]]:
        carrier = MailboxCarrier(lambda name: here, _Controller(here).hear, exchange,
                                 lambda name: 1, retry=carry_retry(lease))
        chosen = _pauses_of(carrier)
        await carrier.listen(["APP-1"])
        deadline = time.monotonic() + 10
        while len(calls) < 12:
            assert time.monotonic() < deadline, "no calls"
            await asyncio.sleep(0.01)
        await carrier.close()
        return chosen

    chosen = asyncio.run(scenario())
    longest = max(seconds for _, seconds in chosen)
    assert 1.0 < longest <= lease * LEASE_STOP / 3  # backed off, and calls again in time
    assert carry_retry(0).cap == 30.0  # no lease: the usual backoff
