"""Where a worker's network goes (``agent.network``), as its launch is planned.

``open`` changes nothing. ``none`` gives the sandbox a network namespace of its own with
only a loopback (``bwrap --unshare-net``): nothing leaves. ``allowlist`` does the same
and adds one way out: the egress proxy (``inpane.egress``) the launcher starts on the
host, reached through a Unix socket bound into the sandbox, and ``inpane.netbridge``
inside, which the agent's tools reach as ``HTTPS_PROXY=http://127.0.0.1:3128``. The
proxy lets through the agent's API (its profile's hosts, and the host of its base-URL
variable), ``agent.allow_hosts`` and the cluster's git remote when it is an HTTPS one;
the rules are fixed here, outside the sandbox, where the worker cannot change them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ralph_dev.adapters.processes import python_module
from ralph_dev.core.agent_profiles import CLAUDE, AgentProfile
from ralph_dev.core.config import ProjectSettings

PROXY_PORT = 3128
"""Where the proxy is inside the sandbox (its own loopback: no other process is there)."""
SOCKET_MOUNT = Path("/run/ralph-egress")
SOCKET_NAME = "proxy.sock"
LEDGER = "egress.jsonl"
"""The proxy's record of a worker's refusals and bytes, in its worker dir (outside the
sandbox, hidden from it)."""
READ_MARK = "egress.read"
"""How far the controller has read a worker's ledger, beside it."""
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                   "all_proxy")
NO_PROXY_VARIABLES = ("NO_PROXY", "no_proxy")
"""Cleared: inside the sandbox even loopback is the sandbox's own, so everything goes
through the proxy (a model API on the host's loopback too)."""


def url_host(url: str) -> str | None:
    """``host:port`` of an http(s) URL (its scheme's port when it names none); None for
    anything else (an ssh remote, a path)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port or (443 if parts.scheme == 'https' else 80)}"


def allow_rules(settings: ProjectSettings, profile: AgentProfile | None,
                env: Mapping[str, str]) -> list[str]:
    """Where the worker's proxy lets it go."""
    profile = profile or CLAUDE  # the command runner reaches Claude Code's API, as ever
    rules = [*profile.api_hosts]
    base = url_host(env.get(profile.base_url_variable, ""))
    if base:
        rules.append(base)
    remote = url_host(settings.cluster.remote or "") if settings.cluster is not None else None
    if remote:
        rules.append(remote)
    return [*rules, *settings.agent.allow_hosts]


@dataclass(frozen=True)
class NetworkPlan:
    """What ``agent.network`` adds to a worker's launch."""

    bwrap_args: list[str]
    argv_prefix: list[str]
    env: dict[str, str]
    egress: dict[str, Any] | None
    """The proxy's part of the launch spec (``inpane.egress``), or None."""


def network_plan(settings: ProjectSettings, *, worker_dir: Path, issue: str,
                 profile: AgentProfile | None, env: Mapping[str, str]) -> NetworkPlan | None:
    """A worker's: None with ``open`` (or no sandbox, which config refuses with the other
    modes)."""
    return _plan(settings, worker_dir, issue, lambda: allow_rules(settings, profile, env),
                 env)


def verify_network(settings: ProjectSettings, *, run_dir: Path, issue: str | None,
                   env: Mapping[str, str]) -> NetworkPlan | None:
    """The controller's verify command's: it runs code workers wrote, so it reaches what
    they may, but for their agent's API (``agent.allow_hosts``: the registries a test
    run installs from). Its ledger is the run's own; the lane names its refusals in the
    run's output (:func:`refused_in`)."""
    return _plan(settings, run_dir, issue or "", lambda: list(settings.agent.allow_hosts),
                 env)


def machine_proxy(env: Mapping[str, str]) -> dict[str, str] | None:
    """The proxy this machine reaches the internet through, as its variables say it
    (curl's reading: the lower-case name first): the egress proxy goes through it."""
    def named(name: str) -> str:
        return env.get(name.lower()) or env.get(name.upper()) or ""

    said = {"https": named("https_proxy"), "http": named("http_proxy"),
            "no_proxy": named("no_proxy")}
    return said if said["https"] or said["http"] else None


def _plan(settings: ProjectSettings, own_dir: Path, issue: str,
          rules: Callable[[], list[str]], env: Mapping[str, str]) -> NetworkPlan | None:
    """``env``: the variables the launch was given, before this plan replaces the proxy
    ones (the machine's proxy is read from them)."""
    if settings.agent.network == "open" or settings.agent.sandbox != "bwrap":
        return None
    if settings.agent.network == "none":
        return NetworkPlan(["--unshare-net"], [], {}, None)
    egress_dir = own_dir / "egress"
    egress_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    inside = SOCKET_MOUNT / SOCKET_NAME
    proxy = f"http://127.0.0.1:{PROXY_PORT}"
    return NetworkPlan(
        ["--unshare-net", "--bind", str(egress_dir), str(SOCKET_MOUNT)],
        python_module("ralph_dev.inpane.netbridge", str(inside), str(PROXY_PORT), "--"),
        {**dict.fromkeys(PROXY_VARIABLES, proxy), **dict.fromkeys(NO_PROXY_VARIABLES, "")},
        {"socket": str(egress_dir / SOCKET_NAME), "log": str(own_dir / LEDGER),
         "allow": rules(), "issue": issue,
         **({"upstream": upstream} if (upstream := machine_proxy(env)) else {})})


def refused_in(ledger: Path, limit: int = 1 << 20) -> list[str]:
    """``host:port`` of each refusal a ledger holds, once each, in the order first
    refused."""
    try:
        data = ledger.read_bytes()[:limit]
    except OSError:
        return []
    found: dict[str, None] = {}
    for line in data.splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            entry = json.loads(line)
            if entry["kind"] == "refused":
                found[f"{str(entry['host'])[:253]}:{int(entry['port'])}"] = None
    return list(found)
