"""A swarm started by an older ralph-dev is adopted after an upgrade, mid-run.

The old release (the last one with the flat package layout) is taken from
this repository's history and installed into a private environment; it
starts a swarm whose agents are busy when the installation is swapped for the
current code (as ``pip install -U`` would) and the daemon is restarted. The
current controller must adopt the running workers — never a second agent on
their issues — and finish every issue with its change in trunk once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
from io import BytesIO
from pathlib import Path

import pytest
from swarm_kit import REPO_ROOT, Swarm, wait_for

pytestmark = pytest.mark.slow

OLD_RELEASE = "ad8e3a5"
"""The last commit with the flat layout (ralph_dev/controller.py, ralph_dev/launcher.py…)."""

AGENT = textwrap.dedent('''
    """Works on one issue under an exclusive lock until the test lets it go, then reports
    done."""
    import fcntl, os, pathlib, subprocess, sys, time
    issue = sys.argv[1]
    lock = open(os.path.join(os.environ["UPGRADE_LOCKS"], issue + ".lock"), "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pathlib.Path(os.environ["UPGRADE_LOCKS"], issue + ".TWICE").touch()
        sys.exit(3)
    # busy until the test says the upgrade is over: an agent that ended while no
    # controller ran would test something else (a report waiting for its controller)
    go = pathlib.Path(os.environ["UPGRADE_LOCKS"], "go")
    deadline = time.monotonic() + 600
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    pathlib.Path("changes").mkdir(exist_ok=True)
    pathlib.Path("changes", issue + ".txt").write_text(issue + " done\\n")
    sys.exit(subprocess.call([sys.executable, "-m", "ralph_dev", "worker", "done", issue,
                              "--summary", "upgrade test change"]))
''')


def old_release(dest: Path) -> Path:
    """The old release's package, extracted from git (a clone carries the history)."""
    found = subprocess.run(["git", "-C", str(REPO_ROOT), "cat-file", "-e", OLD_RELEASE],
                           capture_output=True, check=False)
    assert found.returncode == 0, (
        f"commit {OLD_RELEASE} (the flat-layout release) is not in this clone's history: "
        "fetch it with `git fetch --unshallow` to run the upgrade test")
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", OLD_RELEASE, "ralph_dev"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "ralph_dev"


def private_python(root: Path, package: Path) -> tuple[Path, Path]:
    """A venv whose ``ralph_dev`` is a link we can swap (the installed package) and whose
    other libraries come from the test environment. Returns (python, package link)."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = root / "installed"
    site.mkdir()
    link = site / "ralph_dev"
    link.symlink_to(package, target_is_directory=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = sysconfig.get_paths()["purelib"]
    Path(purelib, "ralph_upgrade_test.pth").write_text(f"{site}\n{deps}\n")
    return python, link


def test_a_swarm_started_before_an_upgrade_is_adopted_after_it(
        tmp_path: Path, jj_bin: str, tmux_socket: str) -> None:
    python, installed = private_python(tmp_path, old_release(tmp_path / "old"))
    locks = tmp_path / "locks"
    locks.mkdir()
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    swarm = Swarm.create(tmp_path / "swarm", jj_bin, tmux_socket, max_workers=2)
    swarm.env.update(UPGRADE_LOCKS=str(locks),
                     PATH=f"{python.parent}:{swarm.env['PATH']}")
    swarm.python = str(python)  # every `ralph-dev` the test runs is the installed one
    config = swarm.config_file
    text = config.read_text()
    old_command = next(line for line in text.splitlines() if line.startswith("command = "))
    shared = next(line for line in text.splitlines() if line.startswith("shared_paths = "))
    config.write_text(text.replace(old_command, "command = " + json.dumps(
        f"{python} {agent} {{issue}}")).replace(shared + "\n", "")  # the old release's config
        .replace("tripwire_interval = 0\n", ""))
    try:
        flat = subprocess.run([str(python), "-c", "import ralph_dev.controller, os; "
                               "print(os.path.realpath(ralph_dev.controller.__file__))"],
                              capture_output=True, text=True, env=swarm.env, check=False,
                              cwd=tmp_path)
        assert "/old/" in flat.stdout, flat.stderr  # the old, flat release runs the swarm
        idents = swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n'
                                   '[[task]]\ntitle = "C"\n[[task]]\ntitle = "D"\n')
        swarm.start()
        running = wait_for(lambda: len(swarm.worker_windows()) == 2 and swarm.worker_windows(),
                           30, "two busy workers of the old release")
        swarm.stop(workers=False)  # the old daemon and controller go, the agents stay

        installed.unlink()  # `pip install -U ralph-dev`
        installed.symlink_to(REPO_ROOT / "ralph_dev", target_is_directory=True)
        # agents now get only what the config names besides the allowlist
        text = config.read_text()
        command = next(line for line in text.splitlines() if line.startswith("command = "))
        config.write_text(text.replace(command, command + '\npass_env = ["UPGRADE_LOCKS"]'))
        # and are sandboxed: what the test's agent runs from is shared with them
        swarm.share([str(p) for p in (python.parent.parent, installed.parent, agent, locks)])
        swarm.start()
        wait_for(lambda: sum(e["event"] == "controller_started" for e in swarm.events()) >= 2,
                 60, "the upgraded controller")
        (locks / "go").touch()  # the old release's agents may finish now
        wait_for(swarm.all_done, 120, "every issue Done after the upgrade")
        wait_for(lambda: not swarm.worker_windows() and not swarm.workspaces(), 60,
                 "workers and workspaces cleaned up")
    finally:
        swarm.teardown()
    assert not list(locks.glob("*.TWICE")), "two agents ran on one issue"
    spawns = [e["issue"] for e in swarm.events() if e["event"] in ("spawn", "restart")]
    for ident in running:
        assert spawns.count(ident) == 1, (ident, spawns)  # adopted, never started again
    trunk = swarm.jj_out("log", "-r", "::main", "--no-graph", "-T", 'description ++ "\\n"')
    for ident in idents:
        assert sum(line.startswith(f"{ident}:") for line in trunk.splitlines()) == 1, ident
    assert sorted(swarm.trunk_files()) == sorted(
        {"README.md", *(f"changes/{i}.txt" for i in idents)})
    assert len([e for e in swarm.events() if e["event"] == "controller_started"]) >= 2
