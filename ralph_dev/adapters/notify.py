"""Delivering a message to people: apprise URLs and a plain command hook.

The only module that imports apprise, and only in a short-lived helper process
(``python -m ralph_dev.adapters.notify``): apprise loads its many service
plugins at import (~30 MB), which the long-running daemon should not carry for
a message sent a few times a day; a hung service also cannot stall the daemon,
since the helper is killed after :data:`DELIVERY_TIMEOUT`. The helper gets the
URLs on stdin (never argv: they hold passwords and tokens) and answers with a
JSON line whose problem descriptions carry only apprise's privacy form of each
URL (``json://user:****@host/…``) — secrets never reach a log, an event or an
error message.

The command hook (``notify.command``) is split into argv with shlex and never
run through a shell; the message goes to its stdin as JSON, so no issue text
ever becomes an argument. It runs without ralph-dev's secret environment
variables.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import unquote

from ralph_dev.adapters.processes import python_module
from ralph_dev.core.environment import public_env

DELIVERY_TIMEOUT = 60.0
"""Seconds the apprise helper (all URLs) or the command hook may take."""
MIN_SECRET_CHARS = 4
"""URL parts shorter than this are not masked in apprise's log lines (too common)."""


@dataclass(frozen=True)
class Message:
    """One notification; ``data`` is the machine-readable part the command hook gets."""

    title: str
    body: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"data": dict(self.data)}


def deliver(message: Message, urls: Sequence[str], command: str | None) -> list[str]:
    """Send ``message`` everywhere configured; the problems (safe to log), or []."""
    problems: list[str] = []
    if urls:
        problems += _deliver_apprise(message, urls)
    if command:
        problems += _run_command(message, command)
    return problems


def _deliver_apprise(message: Message, urls: Sequence[str]) -> list[str]:
    request = json.dumps({"urls": list(urls), "title": message.title, "body": message.body})
    try:
        proc = subprocess.run(
            python_module("ralph_dev.adapters.notify"), input=request,
            capture_output=True, text=True, timeout=DELIVERY_TIMEOUT, check=False,
            env=public_env(os.environ),
        )
    except subprocess.TimeoutExpired:
        return [f"apprise did not finish within {DELIVERY_TIMEOUT:.0f}s (a service hung); "
                "the message may not have arrived"]
    try:
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        return [str(p) for p in answer["problems"]]
    except (ValueError, IndexError, KeyError, TypeError):
        # stderr is not shown: a traceback could quote a URL
        return [f"the apprise helper failed (exit {proc.returncode}); check that apprise is "
                "installed (`pip install apprise`) and try `ralph-dev notify-test PROJECT`"]


def _run_command(message: Message, command: str) -> list[str]:
    argv = shlex.split(command)
    shown = argv[0]
    try:
        proc = subprocess.run(
            argv, input=json.dumps(message.as_json()), capture_output=True, text=True,
            timeout=DELIVERY_TIMEOUT, check=False, env=public_env(os.environ),
        )
    except FileNotFoundError:
        return [f"notify.command: {shown!r} was not found; give its full path"]
    except PermissionError:
        return [f"notify.command: {shown!r} is not executable"]
    except subprocess.TimeoutExpired:
        return [f"notify.command {shown!r} did not finish within {DELIVERY_TIMEOUT:.0f}s"]
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return [f"notify.command {shown!r} exited with {proc.returncode}: {tail[0][:200]}"]
    return []


# --- the helper process ---------------------------------------------------------------


def secret_parts(url: str, private_form: str) -> set[str]:
    """The parts of ``url`` that apprise hides in its privacy form (passwords, tokens)."""

    def parts(text: str) -> set[str]:
        return {p for p in re.split(r"[/:@?&=,#+\s]+", unquote(text))
                if len(p) >= MIN_SECRET_CHARS}

    return parts(url) - parts(private_form)


def scrub(text: str, secrets: set[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "****")
    return text


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def send_with_apprise(urls: Sequence[str], title: str, body: str) -> list[str]:
    """Send to each URL (in this process); the problems, with every secret masked."""
    import apprise

    collected = _Collect()
    apprise_log = logging.getLogger("apprise")
    apprise_log.addHandler(collected)
    apprise_log.setLevel(logging.WARNING)
    apprise_log.propagate = False
    problems: list[str] = []
    secrets: set[str] = set()
    plugins = []
    for n, url in enumerate(urls):
        plugin = apprise.Apprise.instantiate(url)
        if not plugin:
            scheme = url.split("://", 1)[0][:20]
            problems.append(f"notify.urls[{n}] ({scheme}://…) is not a URL apprise understands")
            continue
        # apprise's URLBase.url() carries no annotations
        shown = plugin.url(privacy=True)  # type: ignore[no-untyped-call]
        secrets |= secret_parts(url, shown) | secret_parts(plugin.url(), shown)  # type: ignore[no-untyped-call]
        plugins.append((shown, plugin))
    for shown, plugin in plugins:
        collected.lines.clear()
        try:
            sent = plugin.notify(body=body, title=title)
        except Exception as exc:  # a plugin bug must not hide the other URLs' results
            sent = False
            collected.lines.append(f"{type(exc).__name__}: {exc}")
        if not sent:
            why = "; ".join(collected.lines[-2:]) or "the service refused it"
            problems.append(f"{shown}: {why}")
    return [scrub(p, secrets) for p in problems]


def main() -> int:
    """Read ``{"urls", "title", "body"}`` from stdin; print ``{"problems": [...]}``."""
    request = json.loads(sys.stdin.read())
    problems = send_with_apprise(request["urls"], request["title"], request["body"])
    print(json.dumps({"problems": problems}))
    return 0


if __name__ == "__main__":  # pragma: no cover - run as the helper process
    sys.exit(main())
