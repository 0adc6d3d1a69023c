"""Issue 25: the workers' sandbox runs what a worker must run, wherever it is installed.

The sandbox hides the host's /tmp, /run and ralph-dev's own dirs, and a person may
well have ralph-dev (a checkout and its venv), the agent or its interpreter there.
Real bubblewrap, tmux, jj and the real daemon and controller:

* a ralph-dev installed under /tmp runs a swarm to done: its workers run its
  ``ralph-dev`` (hooks, ``worker done``) from the hidden venv;
* an agent that needs something the sandbox hides is a setup error before any
  worker starts: ``start`` and ``doctor`` refuse naming the path and the fix, the
  controller pauses the swarm once its probe answers, charges nothing, and resumes by
  itself once the install is fixed;
* what is bound back never reveals a secret inside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from swarm_kit import REPO_ROOT, Swarm, wait_for

from ralph_dev.agent.probe import WorkerSetupCheck
from ralph_dev.core.config import build_project

pytestmark = pytest.mark.slow


def relaxed(swarm: Swarm) -> None:
    """A machine shared with other test runs is often loaded past the default limit."""
    config = swarm.config_file
    text = config.read_text()
    config.write_text(text.replace("[projects.demo.limits]\n",
                                   "[projects.demo.limits]\nmax_load_per_cpu = 0\n", 1))


def set_command(swarm: Swarm, command: str) -> None:
    config = swarm.config_file
    text = config.read_text()
    old = next(line for line in text.splitlines() if line.startswith("command = "))
    config.write_text(text.replace(old, "command = " + json.dumps(command)))


def checkout_under(root: Path) -> Path:
    """ralph-dev as a person's clone under ``root`` with ``scripts/setup.sh``'s venv: the
    package copied from this repository, a venv with a ``ralph-dev`` script, the
    libraries taken from the test environment. Returns the venv's python."""
    shutil.copytree(REPO_ROOT / "ralph_dev", root / "ralph_dev",
                    ignore=shutil.ignore_patterns("__pycache__"))
    venv = root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = sysconfig.get_paths()["purelib"]
    Path(purelib, "ralph_dev_checkout.pth").write_text(f"{root}\n{deps}\n")
    script = venv / "bin" / "ralph-dev"
    script.write_text(f"#!{python}\nimport sys\nfrom ralph_dev.cli import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    return python


def test_a_swarm_runs_from_a_ralph_dev_installed_under_tmp(
        tmp_path: Path, jj_bin: str, tmux_socket: str) -> None:
    """The README's quick start from a clone under /tmp: workers run the clone's own
    ``ralph-dev`` (as hooks and skills call it) inside their sandbox and finish."""
    checkout = tmp_path / "clone"  # under /tmp: hidden from every worker
    python = checkout_under(checkout)
    swarm = Swarm.create(tmp_path / "swarm", jj_bin, tmux_socket, max_workers=2)
    try:
        relaxed(swarm)
        swarm.python = str(python)  # every ralph-dev the test runs is the clone's
        # nothing else on PATH: no other ralph-dev for a worker to fall back on
        swarm.env["PATH"] = f"{python.parent}:/usr/bin:/bin"
        where = subprocess.run([str(python), "-c", "import ralph_dev; print(ralph_dev.__file__)"],
                               capture_output=True, text=True, env=swarm.env, cwd=tmp_path,
                               check=True).stdout
        assert where.startswith(str(checkout)), where
        # an agent that reports the way hooks and skills do: `ralph-dev` on its PATH
        set_command(swarm, "/bin/sh -c 'mkdir -p changes && echo ok > changes/{issue}.txt"
                           " && exec ralph-dev worker done {issue} --summary from-tmp'")
        swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')
        swarm.start()
        wait_for(swarm.all_done, 90, "both issues done by workers of the clone under /tmp")
        wait_for(lambda: not swarm.workspaces(), 60, "both merged")
        assert {"changes/DEMO-1.txt", "changes/DEMO-2.txt"} <= set(swarm.trunk_files())
        link = Path(swarm.env["XDG_DATA_HOME"]) / "ralph-dev/demo/agent-bin/ralph-dev"
        assert link.readlink() == python.parent / "ralph-dev"  # the clone's own
        kinds = [e["event"] for e in swarm.events()]
        assert kinds.count("spawn") == 2 and "swarm_paused" not in kinds
    finally:
        swarm.teardown()


def test_a_worker_that_cannot_run_pauses_the_swarm_and_charges_nothing(
        tmp_path: Path, jj_bin: str, tmux_socket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent (where workers can see it) is a script whose interpreter is a script
    run by an interpreter installed where the sandbox hides it: every worker would die
    at once and use up its attempts. Found without running the agent (issue 33): start
    and doctor refuse, a controller started anyway pauses the swarm once its probe
    answers (said once, nobody charged) and resumes by itself once the interpreter is
    installed where workers can run it."""
    from ralph_dev.adapters.tmux import Tmux
    from ralph_dev.control.loop.wiring import controller_for
    from ralph_dev.core.config import load_project

    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2)
    try:
        relaxed(swarm)
        hidden = tmp_path / "hidden-install" / "sh"  # under /tmp
        hidden.parent.mkdir()
        shutil.copy2("/bin/sh", hidden)
        bin_dir = swarm.shared / "bin"  # shared: workers can see it
        bin_dir.mkdir()
        runner = bin_dir / "run-agent"  # the agent's interpreter: `run-agent SCRIPT ARGS`
        runner.write_text(f'#!{hidden}\nexec /bin/sh "$@"\n')
        runner.chmod(0o755)
        agent = bin_dir / "agent"
        agent.write_text(f"#!{runner}\nexec {sys.executable} -m ralph_dev.devtools.demo_agent "
                         '"$@"\n')
        agent.chmod(0o755)
        set_command(swarm, f"{agent} {{issue}} {{role}}")
        swarm.import_plan('[[task]]\ntitle = "A"\n[[task]]\ntitle = "B"\n')

        refused = swarm.cli("start", swarm.project, check=False)
        assert refused.returncode != 0 and swarm.daemon_pid() is None
        said = refused.stderr
        assert "the agent cannot be started in the workers' sandbox" in said, said
        assert str(agent) in said and f"{hidden} does not exist there" in said  # the paths
        assert "install it where it can be read" in said and 'agent.sandbox = "off"' in said
        doctor = swarm.cli("doctor", swarm.project, check=False)
        assert doctor.returncode != 0
        assert "[FAIL] workers (demo): the agent cannot be started" in doctor.stdout, \
            doctor.stdout

        for key, value in swarm.env.items():
            monkeypatch.setenv(key, value)
        settings = load_project(swarm.project)
        Tmux.from_settings(settings).ensure_session(swarm.repo, {"PATH": os.environ["PATH"]})
        ctl = controller_for(settings)  # wired as the daemon wires it
        check = ctl.observer.setup_check
        assert isinstance(check, WorkerSetupCheck)
        check(settings)  # its probe starts beside the loop (a service's first tick does so)
        assert check.settle(60)
        for _ in range(3):
            result = asyncio.run(ctl.tick())
            assert not [a for a in result.plan.actions if a.kind in ("spawn", "restart")]
        paused = [e for e in swarm.events() if e["event"] == "swarm_paused"]
        assert len(paused) == 1, paused  # said once
        assert str(hidden) in paused[0]["cause"] and "agent.sandbox" in paused[0]["cause"]
        assert all(i["state"] == "Todo" for i in swarm.issues())
        assert not list(ctl.store.paths.records_dir.glob("DEMO-*.json"))  # nobody charged
        assert not swarm.worker_windows()

        moved = bin_dir / "sh"  # the person installs it where workers see it
        shutil.copy2(hidden, moved)
        runner.write_text(f'#!{moved}\nexec /bin/sh "$@"\n')

        def resumed() -> list[tuple[str, int | None]]:
            plan = asyncio.run(ctl.tick()).plan  # the changed setup is probed beside
            return [(a.kind, getattr(a, "attempt", None)) for a in plan.actions]

        assert wait_for(resumed, 60, "the swarm to resume") == [
            ("endpause", None), ("spawn", 1), ("spawn", 1)]
        assert [e for e in swarm.events() if e["event"] == "swarm_resumed"]
        wait_for(lambda: (asyncio.run(ctl.tick()), swarm.all_done())[1], 90, "both done")
    finally:
        swarm.teardown()


def test_what_is_bound_back_never_shows_a_secret_inside_it(
        xdg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool installed under /tmp is bound back with its whole tree; ralph-dev's own
    config inside that tree stays hidden, and the host's /tmp stays the worker's own.
    Inside ralph-dev's own dirs only the program itself is bound, never its tree."""
    from ralph_dev.agent.launch import worker_sandbox

    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    tool = tree / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    (tree / "lib.txt").write_text("its tree shows\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tree / "config"))  # ralph-dev's config inside
    secret = tree / "config" / "ralph-dev" / "config.toml"
    secret.parent.mkdir(parents=True)
    secret.write_text('token = "hunter2"\n')
    (tmp_path / "host-only.txt").write_text("the host's /tmp\n")
    settings = build_project("demo", {"repo": str(tmp_path / "repo"),
                                      "workspace_root": str(tmp_path / "workspaces"),
                                      "agent": {"home": "isolated"}})
    worker_dir, workspace = tmp_path / "worker", tmp_path / "workspaces" / "DEMO-1"
    workspace.mkdir(parents=True)
    sandbox = worker_sandbox(settings, workspace=workspace, worker_dir=worker_dir,
                             home=worker_dir / "home", environ=os.environ,
                             program=str(tool), path=os.environ["PATH"])
    assert sandbox is not None
    look = (f"{tool}; cat {tree}/lib.txt; cat {secret} || echo secret-hidden; "
            f"cat {tmp_path}/host-only.txt || echo host-tmp-hidden")
    out = subprocess.run([sandbox["bwrap"], *sandbox["args"], "--", "/bin/sh", "-c", look],
                         capture_output=True, text=True, timeout=60, check=False)
    said = out.stdout + out.stderr
    assert "tool ran" in said and "its tree shows" in said, said
    assert "hunter2" not in said and "secret-hidden" in said, said
    assert "the host's /tmp" not in said and "host-tmp-hidden" in said, said

    # an agent inside ralph-dev's own data dir: the program alone shows, not its tree
    data = settings.paths.data_dir
    inside = data / "bin" / "agent"
    inside.parent.mkdir(parents=True)
    shutil.copy2(tool, inside)
    (data / "tracker.db").write_text("every issue\n")
    sandbox = worker_sandbox(settings, workspace=workspace, worker_dir=worker_dir,
                             home=worker_dir / "home", environ=os.environ,
                             program=str(inside), path=os.environ["PATH"])
    assert sandbox is not None
    look = f"{inside}; cat {data}/tracker.db || echo tracker-hidden"
    out = subprocess.run([sandbox["bwrap"], *sandbox["args"], "--", "/bin/sh", "-c", look],
                         capture_output=True, text=True, timeout=60, check=False)
    said = out.stdout + out.stderr
    assert "tool ran" in said and "tracker-hidden" in said and "every issue" not in said, said
