"""The tmux adapter against a real tmux server on a private socket per test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import retry_until, running

from ralph_dev.adapters import tmux as tmux_mod
from ralph_dev.adapters.tmux import HISTORY_LIMIT, HOME_WINDOW, Tmux
from ralph_dev.adapters.tmux_args import (
    TmuxError,
    TmuxInputError,
    chunk_text,
    escape_arg,
    parse_panes,
    sanitize_text,
)
from ralph_dev.core.config import build_project
from ralph_dev.core.model import InvalidIdentifier

ENV = {"PATH": os.environ["PATH"]}


@pytest.fixture
def tx(tmux_socket: str, tmp_path: Path) -> Tmux:
    t = Tmux("ralph-test", tmux_socket)
    t.ensure_session(tmp_path, ENV)
    return t


def window(t: Tmux, window_id: str):
    for w in t.list_windows():
        if w.window_id == window_id:
            return w
    return None


def wait_dead(t: Tmux, window_id: str):
    """The window once tmux reports it dead AND knows its exit status (a moment apart)."""

    def dead():
        x = window(t, window_id)
        return x if x is not None and not x.alive and x.exit_status is not None else None

    return retry_until(dead, what=f"window {window_id} dead with its exit status")


def read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""


# --- pure helpers ---------------------------------------------------------------


def test_escape_arg_protects_a_trailing_semicolon() -> None:
    assert escape_arg("ls;") == "ls\\;"
    assert escape_arg("a\\;") == "a\\\\;"
    assert escape_arg(";") == "\\;"
    assert escape_arg("; rm -rf ~") == "; rm -rf ~"


def test_sanitize_text_makes_control_characters_visible() -> None:
    text = "a\x1b[31mred\x03\x04\r\nb\tc\x7f\x9bd\n"
    assert sanitize_text(text) == "a\u241b[31mred\u2403\u2404\nb    c\u2421\ufffdd\n"
    assert sanitize_text("C-c Enter $(x) `y`; ü 日本") == "C-c Enter $(x) `y`; ü 日本"


def test_chunk_text_splits_by_utf8_bytes_without_losing_anything() -> None:
    text = "ab日本語" * 500
    chunks = chunk_text(text, limit=100)
    assert "".join(chunks) == text
    assert all(len(c.encode()) <= 100 for c in chunks)
    assert chunk_text("") == []


def test_parse_panes_keeps_one_pane_per_window_and_skips_junk() -> None:
    sep = "\t"
    lines = [
        sep.join(["@1", "%7", "0", "", "", "10", "1700000000", "bash", "ENG-1"]),
        sep.join(["@1", "%3", "1", "2", "", "11", "1700000000", "sh", "ENG-1"]),
        sep.join(["@2", "%4", "1", "", "9", "12", "", "sleep", "name\twith tab"]),
        "garbage",
        sep.join(["x", "%5", "0", "", "", "1", "1", "c", "n"]),
    ]
    windows = parse_panes(lines)
    assert [(w.window_id, w.pane_id) for w in windows] == [("@1", "%3"), ("@2", "%4")]
    assert windows[0].alive is False and windows[0].exit_status == 2
    assert windows[1].exit_status == 128 + 9 and windows[1].name == "name\twith tab"
    assert windows[1].last_activity is None


def test_from_settings_uses_session_name_and_socket(tmp_path: Path) -> None:
    settings = build_project("demo", {"repo": str(tmp_path), "tmux_socket": "sock-1"})
    t = Tmux.from_settings(settings)
    assert (t.session, t.socket_name) == ("ralph-demo", "sock-1")
    assert Tmux.from_settings(build_project("demo", {"repo": str(tmp_path)})).socket_name is None


def test_bad_names_and_targets_are_refused(tx: Tmux, tmp_path: Path) -> None:
    with pytest.raises(TmuxInputError):
        Tmux("a:b")
    with pytest.raises(InvalidIdentifier):
        tx.open_window("A-1; rm -rf ~", cwd=tmp_path, command=["true"], environment=ENV)
    with pytest.raises(TmuxInputError, match="not a tmux window or pane id"):
        tx.kill_window("ENG-1")
    with pytest.raises(TmuxInputError):
        tx.send_text("=ralph-test:ENG-1", "hi")
    with pytest.raises(TmuxInputError, match="not a directory"):
        tx.open_window("ENG-1", cwd=tmp_path / "missing", command=["true"], environment=ENV)
    with pytest.raises(TmuxInputError, match="environment variable name"):
        tx.open_window("ENG-1", cwd=tmp_path, command=["true"], environment={"A B": "x"})
    assert tx.find("ENG-1") == []


# --- sessions and liveness --------------------------------------------------------


def test_ensure_session_is_idempotent(tmux_socket: str, tmp_path: Path) -> None:
    t = Tmux("ralph-test", tmux_socket)
    assert not t.session_exists()
    t.ensure_session(tmp_path, {**ENV, "RALPH_DEV_PROJECT": "demo;"})
    t.ensure_session(tmp_path, ENV)
    shown = t.run("show-environment", "-t", "ralph-test", "RALPH_DEV_PROJECT").check()
    assert shown.lines() == ["RALPH_DEV_PROJECT=demo;"]
    assert t.session_exists() and t.server_alive()
    windows = t.list_windows()
    assert [w.name for w in windows] == [HOME_WINDOW]
    assert windows[0].alive
    limit = t.run("show-options", "-v", "-t", "ralph-test", "history-limit").check()
    assert limit.lines() == [str(HISTORY_LIMIT)]
    assert t.run("show-options", "-v", "-t", "ralph-test", "destroy-unattached").lines() == ["off"]
    sessions = t.run("list-sessions", "-F", "#{session_name}").check().lines()
    assert sessions == ["ralph-test"]


def test_absent_server_and_session_are_empty_not_errors(tmux_socket: str, tmp_path: Path) -> None:
    t = Tmux("ralph-a", tmux_socket)
    assert t.list_windows() == []
    assert t.session_exists() is False
    assert t.server_alive() is False
    t.kill_session()  # absent is fine
    # a session whose name merely starts with ours must not count (tmux prefix matching)
    Tmux("ralph-ab", tmux_socket).ensure_session(tmp_path, ENV)
    assert t.server_alive() is True
    assert t.session_exists() is False
    assert t.list_windows() == []
    with pytest.raises(TmuxError, match="does not exist"):
        t.open_window("ENG-1", cwd=tmp_path, command=["true"], environment=ENV)


def test_kill_session(tx: Tmux) -> None:
    tx.kill_session()
    assert not tx.session_exists()
    tx.kill_session()


def test_window_alive_then_dead_with_exit_status(tx: Tmux, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    w = tx.open_window(
        "ENG-1",
        cwd=tmp_path,
        command=["sh", "-c", f"while [ ! -e '{flag}' ]; do sleep 0.05; done; exit 3"],
        environment=ENV,
    )
    assert w.name == "ENG-1" and w.alive and w.pid
    seen = window(tx, w.window_id)
    assert seen is not None and seen.alive and seen.exit_status is None
    assert seen.pane_id == w.pane_id and seen.pid == w.pid
    assert seen.command == "sh" and seen.last_activity is not None
    flag.touch()
    dead = wait_dead(tx, w.window_id)
    assert dead.exit_status == 3


def test_instantly_exiting_command_still_leaves_its_status(tx: Tmux, tmp_path: Path) -> None:
    # remain-on-exit is set before the command starts: no race with a fast exit
    w = tx.open_window("ENG-2", cwd=tmp_path, command=["false"], environment=ENV)
    dead = wait_dead(tx, w.window_id)
    assert dead.exit_status == 1 and dead.name == "ENG-2"
    w0 = tx.open_window("ENG-3", cwd=tmp_path, command=["true"], environment=ENV)
    dead0 = wait_dead(tx, w0.window_id)
    assert dead0.exit_status == 0


def test_every_fast_exit_gets_its_status(tx: Tmux, tmp_path: Path) -> None:
    # tmux 3.3a loses the exit of ~5% of such commands; list_windows recovers it
    ids = [
        tx.open_window(f"ENG-{n}", cwd=tmp_path, command=["sh", "-c", f"exit {n}"],
                       environment=ENV).window_id
        for n in range(1, 21)
    ]
    for n, window_id in enumerate(ids, start=1):
        assert wait_dead(tx, window_id).exit_status == n


def test_list_windows_is_exactly_one_tmux_process(
    tx: Tmux, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(1, 5):
        tx.open_window(f"ENG-{n}", cwd=tmp_path, command=["sleep", "30"], environment=ENV)
    calls: list[list[str]] = []
    real_popen = subprocess.Popen

    def counting_popen(argv, *args, **kwargs):
        calls.append(list(argv))
        return real_popen(argv, *args, **kwargs)

    # the command runner starts every tmux process with subprocess.Popen: count them all
    monkeypatch.setattr(subprocess, "Popen", counting_popen)
    windows = tx.list_windows()
    assert len(calls) == 1
    assert calls[0][calls[0].index("list-panes") :][:3] == ["list-panes", "-s", "-t"]
    assert sorted(w.name for w in windows) == sorted(
        [HOME_WINDOW, "ENG-1", "ENG-2", "ENG-3", "ENG-4"]
    )
    assert all(w.alive for w in windows)


# --- opening windows --------------------------------------------------------------


def test_open_window_passes_environment_and_cwd(tx: Tmux, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    cwd = tmp_path / "work #{pane_id} dir"
    cwd.mkdir()
    out = tmp_path / "out.txt"
    hostile = f"$(touch {marker}) `touch {marker}` #{{pane_id}} ;"
    tx.open_window(
        "ENG-5",
        cwd=cwd,
        command=["sh", "-c", 'printf "%s|%s|%s\\n" "$RALPH_X" "$RALPH_Y" "$PWD" > "$1"', "sh",
                 str(out)],
        environment={**ENV, "RALPH_X": hostile, "RALPH_Y": "two words"},
    )
    retry_until(lambda: read(out).endswith("\n"), what="env dump")
    assert read(out) == f"{hostile}|two words|{cwd}\n"
    assert not marker.exists()


def test_command_words_are_never_read_by_a_shell(tx: Tmux, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    out = tmp_path / "argv.txt"
    words = [
        f"$(touch {marker})", f"`touch {marker}`", "a;", "; rm -rf ~", "C-c", "x\\;", "#{pane_id}"
    ]
    dump = "import json,sys; open(sys.argv[1],'w').write(json.dumps(sys.argv[2:]))"
    tx.open_window(
        "ENG-6",
        cwd=tmp_path,
        command=["python3", "-c", dump, str(out), *words],
        environment=ENV,
    )
    retry_until(lambda: read(out), what="argv dump")
    assert json.loads(read(out)) == words
    assert not marker.exists()


def test_pipe_pane_writes_output_to_the_log_file(tx: Tmux, tmp_path: Path) -> None:
    log_file = tmp_path / "logs dir #1 'q'" / "ENG-7.log"
    w = tx.open_window(
        "ENG-7",
        cwd=tmp_path,
        command=["sh", "-c", "echo hello-from-worker; sleep 30"],
        environment=ENV,
        log_file=log_file,
    )
    retry_until(lambda: "hello-from-worker" in read(log_file), what="log output")
    assert log_file.stat().st_mode & 0o777 == 0o600  # it holds issue text
    assert window(tx, w.window_id).alive


def test_half_made_window_is_removed_when_a_step_fails(
    tx: Tmux, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Tmux.run_many

    def failing(self, *commands):
        return real(self, *commands, ["no-such-tmux-command"])

    monkeypatch.setattr(Tmux, "run_many", failing)
    with pytest.raises(TmuxError) as info:
        tx.open_window("ENG-8", cwd=tmp_path, command=["sleep", "30"], environment=ENV)
    assert "no-such-tmux-command" in info.value.command
    assert tx.find("ENG-8") == []


# --- duplicates and killing -------------------------------------------------------


def test_duplicate_window_names_are_listed_and_killable_by_id(tx: Tmux, tmp_path: Path) -> None:
    a = tx.open_window("ENG-9", cwd=tmp_path, command=["sleep", "30"], environment=ENV)
    b = tx.open_window("ENG-9", cwd=tmp_path, command=["sleep", "30"], environment=ENV)
    # a person's own window with an odd name must not confuse the listing
    tx.run("new-window", "-d", "-t", "=ralph-test:", "-n", "my\twin dow;").check()
    found = tx.find("ENG-9")
    assert {w.window_id for w in found} == {a.window_id, b.window_id}
    assert any(w.name == "my\twin dow;" for w in tx.list_windows())
    tx.kill_window(a.window_id)
    assert [w.window_id for w in tx.find("ENG-9")] == [b.window_id]
    tx.kill_window(b.pane_id)  # a pane id kills its window too
    assert tx.find("ENG-9") == []


def test_kill_window_of_a_missing_window_is_fine(tx: Tmux) -> None:
    tx.kill_window("@9999")
    tx.kill_window("%9999")
    assert [w.name for w in tx.list_windows()] == [HOME_WINDOW]


# --- pane I/O ----------------------------------------------------------------------


def hostile_text(marker: Path) -> str:
    first = (
        f"$(touch {marker}) `touch {marker}` ; rm -rf ~ ; touch {marker}\n"
        "C-c\nEnter\nC-d\n"
        "\x1b[31mred\x1b[0m \x1b]0;title\x07 \x03 \x04 \x1a \x1c \x7f\n"
        "line ending with a semicolon;\n"
        "-l -- not options\n"
    )
    filler = "".join(f"{i:04d} " + "x" * 94 + "\n" for i in range(100))  # 10 kB
    return first + filler + "last line without newline;"


def test_send_text_arrives_literally_and_executes_nothing(tx: Tmux, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    out = tmp_path / "typed.txt"
    w = tx.open_window(
        "ENG-10",
        cwd=tmp_path,
        command=["sh", "-c", 'stty -echo; exec cat > "$1"', "sh", str(out)],
        environment=ENV,
    )
    retry_until(lambda: (x := window(tx, w.window_id)) and x.command == "cat", what="cat running")
    text = hostile_text(marker)
    assert len(text.encode()) > 10_000
    tx.send_text(w.pane_id, text, submit_delay=0)
    expected = sanitize_text(text) + "\n"  # Enter ends the last line
    retry_until(lambda: read(out) == expected, timeout=15, what="typed text in file")
    assert not marker.exists()
    alive = window(tx, w.window_id)
    assert alive.alive and alive.command == "cat"
    # a second message still goes to the same, uninterrupted cat
    tx.send_text(w.window_id, "C-c", submit_delay=0)
    retry_until(lambda: read(out) == expected + "C-c\n", what="second text")
    assert window(tx, w.window_id).alive


def test_send_text_leaves_copy_mode_first(tx: Tmux, tmp_path: Path) -> None:
    out = tmp_path / "typed.txt"
    w = tx.open_window(
        "ENG-11",
        cwd=tmp_path,
        command=["sh", "-c", 'stty -echo; exec cat > "$1"', "sh", str(out)],
        environment=ENV,
    )
    retry_until(lambda: (x := window(tx, w.window_id)) and x.command == "cat", what="cat running")
    tx.run("copy-mode", "-t", w.pane_id).check()
    assert tx.run("display-message", "-p", "-t", w.pane_id, "#{pane_in_mode}").lines() == ["1"]
    tx.send_text(w.pane_id, "qhello", submit_delay=0)
    retry_until(lambda: read(out) == "qhello\n", what="text typed after copy mode")


def test_capture_follows_the_pane(tx: Tmux, tmp_path: Path) -> None:
    w = tx.open_window("ENG-12", cwd=tmp_path, command=["cat"], environment=ENV)
    retry_until(lambda: (x := window(tx, w.window_id)) and x.command == "cat", what="cat running")
    assert "some output" not in tx.capture(w.pane_id)
    tx.send_text(w.pane_id, "some output", submit_delay=0)
    retry_until(lambda: "some output" in tx.capture(w.pane_id), what="echoed text")
    tail = tx.capture(w.pane_id, lines=1)
    assert tail.count("\n") == 0 and tail == "some output"


def test_a_failing_tmux_command_raises_with_argv_and_stderr(tx: Tmux) -> None:
    result = tx.run("no-such-command", "x;")
    assert not result.ok
    with pytest.raises(TmuxError) as info:
        result.check()
    err = info.value
    assert "no-such-command" in err.command and "x\\;" in err.command
    assert "unknown command" in err.stderr and err.returncode == 1
    assert "no-such-command" in str(err)
    with pytest.raises(TmuxError) as info:
        tx.run("new-window", "-t", "=nope:", "-e", "API_KEY=sekret-value").check()
    assert "sekret-value" not in str(info.value)
    assert "sekret-value" not in " ".join(info.value.command)
    with pytest.raises(TmuxError):
        tx.capture("%9999")


def test_missing_tmux_binary_is_a_clear_error(tmux_socket: str) -> None:
    t = Tmux("ralph-test", tmux_socket, tmux_bin="/nonexistent/tmux")
    with pytest.raises(tmux_mod.TmuxNotFound, match="install tmux"):
        t.list_windows()


# --- a hung tmux --------------------------------------------------------------------


def tmux_clients(socket: str, server: int) -> list[int]:
    """Running processes whose command line names ``socket``, the server itself aside."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (server, os.getpid()):
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if socket.encode() in cmdline and running(int(entry.name)):  # `-L NAME` or `-LNAME`
            found.append(int(entry.name))
    return found


def test_a_wedged_tmux_server_is_a_timeout_and_leaves_no_client_behind(
        tmux_socket: str, tmp_path: Path) -> None:
    t = Tmux("ralph-test", tmux_socket, timeout=1.0)
    t.ensure_session(tmp_path, ENV)
    server = int(t.run("display-message", "-p", "#{pid}").check().lines()[0])
    os.kill(server, signal.SIGSTOP)  # the server accepts clients but never answers
    try:
        started = time.monotonic()
        with pytest.raises(TmuxError, match=r"did not answer within 1 s.*wedged") as info:
            t.list_windows()
        assert time.monotonic() - started < 1.0 + 4  # the timeout, and the kill
        assert "list-panes" in info.value.command
        assert tmux_clients(tmux_socket, server) == []
    finally:
        os.kill(server, signal.SIGCONT)
    assert t.session_exists()  # the server itself was left alone


def test_a_hung_tmux_client_is_killed_with_what_it_started(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    fake = tmp_path / "tmux"
    fake.write_text(f"#!/bin/sh\nsleep 600 &\necho $$ $! > {pids}\nwait\n")
    fake.chmod(0o755)
    t = Tmux("ralph-test", "never-used", tmux_bin=str(fake), timeout=1.0)
    started = time.monotonic()
    with pytest.raises(TmuxError, match="did not answer within 1 s") as info:
        t.kill_window("@1")
    assert time.monotonic() - started < 1.0 + 4
    assert info.value.returncode == 124
    for pid in map(int, pids.read_text().split()):
        retry_until(lambda pid=pid: not running(pid), timeout=5, what=f"process {pid} gone")
