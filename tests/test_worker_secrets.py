"""Issue 25: in Linear mode no worker holds a secret it does not need.

The real daemon and controller run a project on the fake Linear, with the tracker's
key, the webhook's secret, the dashboard's token and a GitHub token in their
environment. A hostile worker looks for them everywhere it can (its own environment,
every process it can see, the key file) and tries to write to another issue with
whatever it found, directly through Linear's API and through `ralph-dev worker`. The
verify command (run by `worker done` in the worker's sandbox and by the controller's
merge lane) dumps its environment too. None of them holds a secret, and the other
issue is untouched; the worker's own issue still finishes.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_kit import Swarm, attach_fake_linear, wait_for

pytestmark = pytest.mark.slow

HOSTILE = textwrap.dedent('''
    """DEMO-1's worker, hostile: hunts for secrets and writes to DEMO-2 with them."""
    import json, os, subprocess, sys, urllib.request
    from pathlib import Path

    from ralph_dev.devtools.demo_agent import main

    issue, role = sys.argv[1], sys.argv[2]
    DUMPS, KEY_FILE, OTHER = Path({dumps!r}), {key_file!r}, "DEMO-2"
    if issue == "DEMO-1":
        seen = {{"environ": dict(os.environ), "proc": {{}}}}
        for proc in Path("/proc").iterdir():  # every process this sandbox can see
            try:
                seen["proc"][proc.name] = (proc / "environ").read_bytes().decode("utf-8", "replace")
            except OSError:
                continue
        try:
            found = Path(KEY_FILE).read_text().strip()
            seen["key_file"] = found
        except OSError as exc:
            seen["key_file_error"] = str(exc)
            found = ""
        attempts = {{}}
        for name, key in (("env", os.environ.get("LINEAR_API_KEY", "")), ("file", found)):
            body = json.dumps({{"query": 'mutation {{ commentCreate(input: {{issueId: "'
                                + OTHER + '", body: "pwned with the ' + name
                                + ' key"}}) {{ success }} }}'}}).encode()
            request = urllib.request.Request(
                os.environ.get("RALPH_DEV_LINEAR_URL", "http://127.0.0.1:9/graphql"), body,
                {{"Content-Type": "application/json", "Authorization": key}})
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    attempts[name] = answer.read().decode()
            except Exception as exc:  # refused, as it must be
                attempts[name] = f"refused: {{exc}}"
        seen["linear"] = attempts
        note = subprocess.run([sys.executable, "-m", "ralph_dev", "worker", "note", OTHER,
                               "pwned through worker note"], capture_output=True, text=True)
        seen["worker_note"] = [note.returncode, note.stdout + note.stderr]
        (DUMPS / "agent-DEMO-1.json").write_text(json.dumps(seen))
    sys.exit(main([issue, role]))
''')

SENTINELS = {
    "RALPH_DEV_LINEAR_WEBHOOK_SECRET": "sentinel-whsec-4711",
    "RALPH_DEV_WEB_TOKEN": "sentinel-webtoken-4711",
    "GH_TOKEN": "sentinel-gh-4711",
}


@pytest.fixture
def linear_swarm(tmp_path: Path, jj_bin: str, tmux_socket: str) -> Iterator[tuple[Swarm, object]]:
    swarm = Swarm.create(tmp_path, jj_bin, tmux_socket, max_workers=2,
                         verify='env > "$DUMPS/verify-${RALPH_DEV_ISSUE:-merge-lane}-$$.env"')
    fake, _, _ = attach_fake_linear(swarm, tmp_path)
    try:
        yield swarm, fake
    finally:
        swarm.teardown()
        fake.stop()


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside /tmp (which the sandbox replaces anyway)."""
    path = Path("/var/tmp") / f"ralph-secrets-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_no_worker_hook_or_verify_run_holds_a_tracker_secret(
        linear_swarm: tuple[Swarm, object], tmp_path: Path, outside: Path) -> None:
    swarm, fake = linear_swarm
    key: str = fake.api_key  # type: ignore[attr-defined]
    secrets = {"LINEAR_API_KEY": key, **SENTINELS}
    dumps = swarm.shared / "dumps"
    dumps.mkdir()
    # the daemon (and so the controller) holds every secret; the verify command finds
    # its dump directory through a variable ralph-dev's own config passes on
    swarm.env.update(secrets, DUMPS=str(dumps))
    config = swarm.config_file
    # the key file where nothing else hides it (the sandbox hides all of /tmp anyway)
    key_file = outside / "linear.key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    config.write_text(config.read_text().replace(str(tmp_path / "linear.key"), str(key_file)))
    hostile = swarm.shared / "hostile.py"
    hostile.write_text(HOSTILE.format(dumps=str(dumps), key_file=str(key_file)))
    text = config.read_text()
    command = next(line for line in text.splitlines() if line.startswith("command = "))
    config.write_text(text.replace(command, "command = " + json.dumps(
        f"{sys.executable} {hostile} {{issue}} {{role}}") + '\npass_env = ["DUMPS"]')
        # a machine shared with other test runs is often loaded past the default limit
        .replace("max_workers = 2\n", "max_workers = 2\nmax_load_per_cpu = 0\n"))
    swarm.import_plan('[[task]]\nref = "a"\ntitle = "Hostile"\n'
                      '[[task]]\ntitle = "Other"\nblocked_by = ["a"]\n')
    assert {i["identifier"] for i in swarm.issues()} == {"DEMO-1", "DEMO-2"}

    swarm.start()
    wait_for(swarm.all_done, 120, "both issues Done in Linear")
    wait_for(lambda: not swarm.workspaces(), 60, "both merged")
    swarm.stop()

    seen = json.loads((dumps / "agent-DEMO-1.json").read_text())
    verify_dumps = {p.name: p.read_text() for p in dumps.glob("verify-*.env")}
    # at `worker done` and again in the verified merge lane, with the same variables
    assert sum(n.startswith("verify-DEMO-1-") for n in verify_dumps) >= 2, verify_dumps.keys()
    assert len(seen["proc"]) >= 2  # it saw itself and its parents in its sandbox
    places = {"the agent's environment": json.dumps(seen["environ"]),
              **{f"process {pid} in its sandbox": env for pid, env in seen["proc"].items()},
              **{f"verify run {name}": env for name, env in verify_dumps.items()}}
    for where, text in places.items():
        leaked = [name for name, value in secrets.items() if value in text]
        assert not leaked, f"{leaked} reached {where}"
    assert "LINEAR_API_KEY" not in seen["environ"]
    assert "key_file" not in seen, "the tracker's key file is readable in the sandbox"
    # with no key it cannot write to another issue, neither to Linear nor through ralph-dev
    for name, answer in seen["linear"].items():
        assert answer.startswith("refused") or '"errors"' in answer, (name, answer)
    code, said = seen["worker_note"]
    assert code != 0 and "DEMO-2" in said, said
    other = fake.comments_on("DEMO-2")  # type: ignore[attr-defined]
    assert not [c for c in other if "pwned" in c], other
    assert [e for e in swarm.events() if e["event"] == "merge" and e["issue"] == "DEMO-1"]
