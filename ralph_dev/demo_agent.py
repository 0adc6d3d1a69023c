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
``conflict:PATH`` writes the same PATH as other issues (to force a conflict).
"""

from __future__ import annotations

import argparse
import json
import os
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
    return subprocess.call([sys.executable, "-m", "ralph_dev", *args])


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
    workspace = Path.cwd()

    if what == "fail":
        print("[demo agent] failing on purpose", flush=True)
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
    if what == "block":
        return ralph("worker", "blocked", issue, "--question",
                     "Which database should this use? (scripted question)")

    seconds = 1.0
    target = Path("changes") / f"{issue}.txt"
    if what.startswith("work:"):
        seconds = float(what.split(":", 1)[1] or 1)
    elif what.startswith("conflict:"):
        target = Path(what.split(":", 1)[1])
    if role == "plan":
        print("[demo agent] a plan worker would create sub-issues here", flush=True)
    else:
        deadline = time.monotonic() + seconds
        step = 0
        while time.monotonic() < deadline:
            step += 1
            print(f"[demo agent] {issue}: working… ({step})", flush=True)
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        path = workspace / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{issue}: done by the demo agent (role {role})\n")
        print(f"[demo agent] wrote {target}", flush=True)
    code = ralph("worker", "done", issue, "--summary",
                 f"Scripted demo change for {issue}: wrote {target}.")
    print(f"[demo agent] worker done exited {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
