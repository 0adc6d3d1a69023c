"""A scripted stand-in for a coding agent, for the demo and the swarm tests.

Started by the ``command`` runner exactly like a real agent: it works in its
workspace, then reports through ``ralph-dev worker …`` like a real worker
would. It makes one small, distinct change per issue (so parallel workers
never conflict and trunk can be checked to hold each change exactly once).

Behaviour per issue can be scripted for fault tests with a JSON file named by
``RALPH_DEV_DEMO_SCRIPT``: ``{"DEMO-3": "fail", "DEMO-4": "hang", "*": "work:2"}``
— ``work:N`` works N seconds then reports done (default ``work:1``), ``fail``
exits 1 without reporting, ``hang`` sleeps silently forever, ``hang-once``
hangs on attempt 1 only, ``write-hang`` makes its change and then hangs (a worker
a person overtakes by marking the issue Done), ``block`` reports blocked with a question,
``conflict:PATH`` writes the same PATH as other issues (to force a conflict: with
``RALPH_DEV_DEMO_LOCKS`` set, an execute worker reports done only once every issue
scripted with the same ``conflict:PATH`` has started, so each started from a trunk
without the others' change and the later merges certainly conflict),
``until:FILE`` works until FILE exists (a test's gate: at most 10 minutes),
``prepared:FILE`` works like ``work:1`` and copies what FILE in its workspace says (the
project's ``after_create`` hook wrote it, or ``missing``) into its change,
``plan:FILE`` (a plan worker) submits the plan file FILE with ``worker plan`` and
reports done, ``groom:FILE`` (a groom worker) runs each ``[COMMAND, ARG…]`` of the
JSON list in FILE as ``ralph-dev worker COMMAND ISSUE ARG…`` (``propose``,
``prioritize``, ``flag``, ``backlog``) and reports done.

Steering behaviours (label steering tests): ``block-once`` asks a person a
question unless people's feedback already reached it (the feedback block of its
``--prompt-file``, else ``ralph-dev worker feedback --all``), and then writes
that feedback into its change, so a test can see the resumed worker read it;
``block-hang`` asks and then stays idle in its pane; ``block-linger:N`` asks
and exits only N seconds later (an answer may arrive meanwhile), and once its
prompt holds feedback behaves like ``block-once``;
``await-feedback`` posts a note, then waits (up to 120 s) for a line typed into
its pane that points to ``ralph-dev worker feedback``, runs that command and
writes its output into its change.

With ``RALPH_DEV_DEMO_LOCKS`` set to a directory, the agent holds an exclusive
lock named after its issue while it runs; finding it taken (a second agent on
the same issue) it leaves ``ISSUE.TWICE`` there and exits 3, so a test can
prove that never happens.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path


def behaviour(issue: str) -> str:
    path = os.environ.get("RALPH_DEV_DEMO_SCRIPT")
    if not path:
        return os.environ.get("RALPH_DEV_DEMO_BEHAVIOUR", "work:1")
    try:
        script = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return "work:1"
    return str(script.get(issue, script.get("*", "work:1")))


def ralph(*args: str) -> int:
    print("$ ralph-dev " + " ".join(args), flush=True)
    return subprocess.call([sys.executable, "-P", "-m", "ralph_dev", *args])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("issue")
    parser.add_argument("role")
    parser.add_argument("--prompt-file", default=None)
    args = parser.parse_args(argv)
    issue, role = args.issue, args.role
    attempt = int(os.environ.get("RALPH_DEV_ATTEMPT", "1"))
    what = behaviour(issue)
    print(f"[demo agent] {issue} role={role} attempt={attempt} behaviour={what}", flush=True)
    if not hold_issue_lock(issue):
        return 3
    workspace = Path.cwd()

    if what == "fail":
        print("[demo agent] failing on purpose", flush=True)
        return 1
    if what == "big-file":  # a change jj will not record: `worker done` refuses it
        (workspace / "data").mkdir(exist_ok=True)
        (workspace / "data" / "big.bin").write_bytes(b"x" * (2 * 2**20))
        code = ralph("worker", "done", issue, "--summary", "Added the data file.")
        print(f"[demo agent] worker done exited {code}; giving up", flush=True)
        return 1
    if what == "hang" or (what == "hang-once" and attempt == 1):
        while True:  # silent: no output, so the controller sees it as stuck
            time.sleep(3600)
    if what == "write-hang":
        path = workspace / "changes" / f"{issue}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{issue}: written, then the agent hung\n")
        print(f"[demo agent] wrote changes/{issue}.txt and now hangs", flush=True)
        while True:
            time.sleep(3600)
    if what.startswith("escape:"):  # a hostile worker: writes outside its workspace
        outside = Path(what.split(":", 1)[1])
        try:
            outside.write_text(f"{issue} was here\n")
            print(f"[demo agent] wrote {outside}", flush=True)
        except OSError as exc:
            print(f"[demo agent] could not write {outside}: {exc}", flush=True)
        while True:
            time.sleep(3600)
    if what == "block":
        return ralph("worker", "blocked", issue, "--question",
                     "Which database should this use? (scripted question)")
    if what == "block-hang":  # asks, then stays in its pane (as an idle agent session would)
        ralph("worker", "blocked", issue, "--question", QUESTION)
        print("[demo agent] asked; now idle in the pane", flush=True)
        while True:
            time.sleep(3600)
    if what.startswith("block-linger:"):  # asks, then takes N seconds to exit
        if prompt_feedback(args.prompt_file) is None:
            ralph("worker", "blocked", issue, "--question", QUESTION)
            time.sleep(float(what.split(":", 1)[1] or 1))
            return 0
        what = "block-once"
    if what == "block-once":
        return block_once(issue, role, workspace, args.prompt_file)
    if what == "await-feedback":
        return await_feedback(issue, role, workspace)

    if what.startswith("plan:"):
        code = ralph("worker", "plan", issue, "--file", what.split(":", 1)[1])
        return code or ralph("worker", "done", issue, "--summary",
                             f"Scripted plan for {issue}: {what.split(':', 1)[1]}.")

    if what.startswith("groom:"):
        for command, *rest in json.loads(Path(what.split(":", 1)[1]).read_text()):
            ralph("worker", command, issue, *rest)
        return ralph("worker", "done", issue, "--summary", f"Scripted groom run {issue}.")

    seconds = 1.0
    target = Path("changes") / f"{issue}.txt"
    seen = ""
    gate: Path | None = None
    if what.startswith("work:"):
        seconds = float(what.split(":", 1)[1] or 1)
    elif what.startswith("until:"):
        gate, seconds = Path(what.split(":", 1)[1]), UNTIL_WAIT
    elif what.startswith("conflict:"):
        target = Path(what.split(":", 1)[1])
        if role == "execute":
            await_partners(issue, what)
    elif what.startswith("prepared:"):
        prepared = workspace / what.split(":", 1)[1]
        seen = prepared.read_text() if prepared.is_file() else "missing\n"
    if role == "plan":
        print("[demo agent] a plan worker would create sub-issues here", flush=True)
    else:
        deadline = time.monotonic() + seconds
        step = 0
        while time.monotonic() < deadline and not (gate is not None and gate.exists()):
            step += 1
            print(f"[demo agent] {issue}: working… ({step})", flush=True)
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        path = workspace / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{issue}: done by the demo agent (role {role})\n{seen}")
        print(f"[demo agent] wrote {target}", flush=True)
    code = ralph("worker", "done", issue, "--summary",
                 f"Scripted demo change for {issue}: wrote {target}.")
    print(f"[demo agent] worker done exited {code}", flush=True)
    return code


UNTIL_WAIT = 600.0
"""Seconds an ``until:FILE`` worker works at most before FILE exists."""

PARTNER_WAIT = 300.0
"""Seconds a ``conflict:`` worker waits for its partners to start before it goes on."""


def await_partners(issue: str, what: str) -> None:
    """Say this issue's ``conflict:`` worker started (a marker in the locks directory)
    and wait until every issue scripted with the same behaviour has: a worker whose
    partner started only after it merged would edit the merged file, with no conflict
    to resolve (a test waiting for one then waits in vain)."""
    directory = os.environ.get("RALPH_DEV_DEMO_LOCKS")
    script = os.environ.get("RALPH_DEV_DEMO_SCRIPT")
    if not directory or not script:
        return
    partners = sorted(k for k, v in json.loads(Path(script).read_text()).items()
                      if v == what)
    (Path(directory) / f"{issue}.conflict-started").touch()
    deadline = time.monotonic() + PARTNER_WAIT
    while time.monotonic() < deadline:
        waiting = [k for k in partners
                   if not (Path(directory) / f"{k}.conflict-started").exists()]
        if not waiting:
            return
        print(f"[demo agent] {issue}: waiting for {', '.join(waiting)} to start", flush=True)
        time.sleep(0.5)


_LOCKS: list[object] = []  # open lock files live as long as the agent


def hold_issue_lock(issue: str) -> bool:
    """Take this issue's agent lock (when RALPH_DEV_DEMO_LOCKS asks for one)."""
    directory = os.environ.get("RALPH_DEV_DEMO_LOCKS")
    if not directory:
        return True
    handle = (Path(directory) / f"{issue}.lock").open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        (Path(directory) / f"{issue}.TWICE").touch()
        print(f"[demo agent] another agent already works on {issue}", flush=True)
        return False
    _LOCKS.append(handle)
    return True


QUESTION = "Which database should this use? (scripted question)"

_FEEDBACK_BLOCK = re.compile(
    r"^===== BEGIN FEEDBACK DATA (\w+) =====\n(.*?)^===== END FEEDBACK DATA \1 =====",
    re.DOTALL | re.MULTILINE,
)


def prompt_feedback(prompt_file: str | None) -> str | None:
    """The people's feedback the launcher put into this worker's prompt, if any."""
    if not prompt_file:
        return None
    try:
        text = Path(prompt_file).read_text(encoding="utf-8")
    except OSError:
        return None
    found = _FEEDBACK_BLOCK.search(text)
    return found.group(2).strip() if found else None


def ralph_output(*args: str) -> tuple[int, str]:
    print("$ ralph-dev " + " ".join(args), flush=True)
    proc = subprocess.run([sys.executable, "-P", "-m", "ralph_dev", *args], capture_output=True,
                          text=True, check=False)
    return proc.returncode, proc.stdout


def finish_with(issue: str, role: str, workspace: Path, text: str) -> int:
    target = Path("changes") / f"{issue}.txt"
    path = workspace / target
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{issue}: done by the demo agent (role {role})\n{text}\n")
    print(f"[demo agent] wrote {target} with the feedback", flush=True)
    return ralph("worker", "done", issue, "--summary",
                 f"Scripted demo change for {issue}, written after reading feedback.")


def block_once(issue: str, role: str, workspace: Path, prompt_file: str | None) -> int:
    feedback = prompt_feedback(prompt_file)
    source = "prompt"
    if feedback is None:
        code, out = ralph_output("worker", "feedback", issue, "--all")
        source = "worker feedback"
        feedback = out.strip() if code == 0 and "BEGIN COMMENTS" in out else None
    if feedback is None:
        return ralph("worker", "blocked", issue, "--question", QUESTION)
    print(f"[demo agent] feedback found in the {source}", flush=True)
    return finish_with(issue, role, workspace, f"feedback (from the {source}):\n{feedback}")


def await_feedback(issue: str, role: str, workspace: Path, limit: float = 120.0) -> int:
    ralph("worker", "note", issue, "Scripted note: started, waiting for a person.")
    print("[demo agent] waiting for feedback…", flush=True)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sys.stdin], [], [], 1.0)
        if not ready:
            continue
        line = sys.stdin.readline()
        if not line:
            break  # stdin closed: no pane to type into
        if "ralph-dev worker feedback" in line:
            code, out = ralph_output("worker", "feedback", issue)
            print(out, flush=True)
            if code != 0:
                return code
            return finish_with(issue, role, workspace, f"relayed feedback:\n{out.strip()}")
    print("[demo agent] no feedback arrived", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
