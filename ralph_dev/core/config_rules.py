"""The settings rules that types alone cannot express (paths absolute, limits positive…)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

from ralph_dev.core.environment import controller_secret
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.model import Role
from ralph_dev.core.patterns import compile_strategy

if TYPE_CHECKING:
    from ralph_dev.core.config import ClusterSettings, ProjectSettings

KEY_RE = re.compile(r"[A-Z][A-Z0-9]{0,9}")
"""A tracker key: the ``KEY`` in ``KEY-N`` identifiers."""

MIN_LEASE = 5.0
"""Shortest ``cluster.lease``: shorter, and a controller's busy tick would stop agents."""


def validate(settings: ProjectSettings, where: str) -> None:
    """Rules that types alone cannot express."""

    def bad(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{where}.{key}: {problem}")

    if not settings.repo.is_absolute():
        raise bad("repo", f"must be an absolute path, got {str(settings.repo)!r}")
    if settings.workspace_root is not None and not settings.workspace_root.is_absolute():
        raise bad("workspace_root", "must be an absolute path")
    if not re.fullmatch(r"[A-Za-z0-9._/-]+", settings.trunk):
        raise bad("trunk", f"{settings.trunk!r} is not a usable bookmark name")
    if settings.tracker.key and not KEY_RE.fullmatch(settings.tracker.key):
        raise bad("tracker.key", "must be 1-10 capital letters/digits starting with a letter")
    if settings.tracker.kind == "linear" and not settings.tracker.linear_project:
        raise bad("tracker.linear_project", "is required when tracker.kind = 'linear'")
    if settings.tracker.linear_team is not None and not KEY_RE.fullmatch(
            settings.tracker.linear_team):
        raise bad("tracker.linear_team", f"{settings.tracker.linear_team!r} is not a team key "
                  "(1-10 capital letters/digits starting with a letter, e.g. ENG)")
    if settings.tracker.linear_new_state is not None and not (
            settings.tracker.linear_new_state.strip()):
        raise bad("tracker.linear_new_state", "is empty: name a workflow state such as 'Todo', "
                  "or remove the setting")
    for key in ("full_sync_interval", "linear_poll_interval"):
        if getattr(settings.tracker, key) <= 0:
            raise bad(f"tracker.{key}", "must be greater than 0")
    if settings.agent.runner == "command" and not settings.agent.command:
        raise bad("agent.command", "is required when agent.runner = 'command'")
    for key in ("max_workers", "plan_issues", "plan_issues_per_hour"):
        if getattr(settings.limits, key) < 1:
            raise bad(f"limits.{key}", "must be at least 1")
    if settings.host.max_workers is not None and settings.host.max_workers < 1:
        raise ConfigError("host.max_workers: must be at least 1 (leave it out for no "
                          "limit across projects)")
    for account, account_settings in settings.accounts.items():
        if not 0 <= account_settings.reserve < 1:
            raise ConfigError(f"accounts.{account}.reserve: must be at least 0 and below 1 "
                              "(the share of each usage window kept for your own use, "
                              "e.g. 0.2)")
    if settings.host.worker_memory_mb < 0:
        raise ConfigError("host.worker_memory_mb: must be at least 0 (the memory a starting "
                          "worker is taken to need, e.g. 512)")
    if not settings.share > 0:
        raise bad("share", "must be greater than 0 (1 is an even share)")
    for role, cap in settings.limits.per_role.items():
        if role not in {r.value for r in Role}:
            raise bad(f"limits.per_role.{role}", f"unknown role (roles: {', '.join(Role)})")
        if cap < 0:
            raise bad(f"limits.per_role.{role}", "must not be negative")
    for name in settings.agent.pass_env:
        if controller_secret(name):
            raise bad("agent.pass_env", f"{name} is the controller's secret, and workers never "
                      "need it (the controller makes every tracker write for them): remove it")
    for role in settings.agent.models:
        if role not in {r.value for r in Role}:
            raise bad(f"agent.models.{role}", f"unknown role (roles: {', '.join(Role)})")
    _check_clis(settings, bad)
    if settings.agent.network != "open" and settings.agent.sandbox != "bwrap":
        raise bad("agent.network", f"{settings.agent.network!r} needs the workers' sandbox "
                  "(agent.sandbox = \"bwrap\"), which alone takes their network away: set it, "
                  "or agent.network = \"open\"")
    for rule in settings.agent.allow_hosts:
        if not rule.strip() or any(c.isspace() or c in "/@?#" for c in rule.strip()):
            raise bad("agent.allow_hosts", f"{rule!r} is not a host: write a name, "
                      "name:port or *.domain, such as registry.npmjs.org or pypi.org:443")
    t = settings.timing
    for key in ("poll_interval", "stall_timeout", "restart_timeout", "hang_timeout", "retry_base",
                "retry_cap", "health_interval", "heartbeat_stale", "crash_loop_window"):
        if getattr(t, key) <= 0:
            raise bad(f"timing.{key}", "must be greater than 0")
    if t.tripwire_interval < 0:
        raise bad("timing.tripwire_interval", "must not be negative (0: every tick)")
    if settings.hooks.timeout <= 0:
        raise bad("hooks.timeout", "must be greater than 0")
    g = settings.groom
    for key in ("interval", "min_interval", "auto_accept_per_day"):
        if getattr(g, key) < 0:
            raise bad(f"groom.{key}", "must not be negative (0 turns it off)")
    if g.proposals < 1:
        raise bad("groom.proposals", "must be at least 1")
    if t.max_attempts < 1:
        raise bad("timing.max_attempts", "must be at least 1")
    if settings.merge.max_batch < 1:
        raise bad("merge.max_batch", "must be at least 1 (1: one change at a time)")
    if settings.merge.parallel_verifies < 1:
        raise bad("merge.parallel_verifies", "must be at least 1 (1: one verify at a time)")
    if settings.merge.verify_memory_mb < 0:
        raise bad("merge.verify_memory_mb", "must not be negative (0: memory bounds nothing)")
    if t.retry_cap < t.retry_base:
        raise bad("timing.retry_cap", "must not be smaller than timing.retry_base")
    if settings.agent.iteration_cap < 1:
        raise bad("agent.iteration_cap", "must be at least 1")
    if not 0 <= settings.web.port <= 65535:
        raise bad("web.port", "must be between 0 (any free port) and 65535")
    if not settings.web.host.strip():
        raise bad("web.host", "must not be empty (127.0.0.1 serves this machine only)")
    if settings.notify.cooldown < 0:
        raise bad("notify.cooldown", "must not be negative")
    if settings.notify.max_per_hour < 1:
        raise bad("notify.max_per_hour", "must be at least 1")
    for n, url in enumerate(settings.notify.urls):
        if not re.match(r"[A-Za-z][A-Za-z0-9+.-]*://.", url):
            # the URL itself is not shown: it may hold a password or token
            raise bad(f"notify.urls[{n}]", "is not an apprise URL (expected SCHEME://…, "
                                           "e.g. ntfy://topic or mailto://user:pass@host)")
    for name, regex in settings.patterns.strategies.items():
        compile_strategy(name, regex, f"{where}.patterns.strategies")
    if settings.cluster is not None:
        cluster_rules(settings.cluster, bad)
    if settings.notify.command is not None:
        try:
            argv = shlex.split(settings.notify.command)
        except ValueError as exc:
            raise bad("notify.command", f"cannot be split into words ({exc})") from None
        if not argv:
            raise bad("notify.command", "is empty: name a program, or remove the key")


_RAY_ADDRESS = re.compile(r"(ray://)?[A-Za-z0-9_.\[\]:-]+:\d{1,5}")
"""``HOST:PORT`` (a GCS address, as ``ray start --address`` takes) or ``ray://HOST:PORT``
(Ray Client); IPv6 hosts in brackets."""


def cluster_rules(cluster: ClusterSettings, bad: Callable[[str, str], ConfigError]) -> None:
    """A cluster table that can be used: its address is one Ray understands, and its
    remote is a git URL, not a word a shell or git would read as an option."""
    address, remote = cluster.address.strip(), cluster.remote
    if cluster.snapshot_interval <= 0:
        raise bad("cluster.snapshot_interval", "must be greater than 0 (seconds between a "
                  "worker's work-in-progress pushes)")
    if cluster.max_hosts is not None and cluster.max_hosts < 1:
        raise bad("cluster.max_hosts", "must be 1 or more (hosts the autoscaler may be "
                  "asked for at most), or left out: as many as waiting issues need")
    if cluster.warm < 0:
        raise bad("cluster.warm", "must be 0 or more (attempts' processes kept started "
                  "on free slots before they are wanted; 0: none)")
    if cluster.lease < MIN_LEASE:
        raise bad("cluster.lease", f"must be at least {MIN_LEASE:g} (seconds an attempt runs "
                  "without hearing from the controller; its host checks every second)")
    if address != "auto" and not _RAY_ADDRESS.fullmatch(address):
        raise bad("cluster.address", f"{address!r} is not a Ray address: write 'auto' (the "
                  "cluster this host joined with `ray start`), HOST:6379, or ray://HOST:10001")
    if remote is not None and (not remote.strip() or remote.startswith("-")
                               or any(c.isspace() for c in remote)):
        raise bad("cluster.remote", f"{remote!r} is not a git URL every host can reach: write "
                  "one such as git@host:team/app.git or /srv/git/app.git, or remove the key "
                  "to use the project repository's own remote")


def _check_clis(settings: ProjectSettings, bad: Callable[[str, str], ConfigError]) -> None:
    """``roles.ROLE``: known roles, each model named (its CLI is one of the profiles: the
    config's types check that)."""
    for role, agent in settings.roles.items():
        if role not in {r.value for r in Role}:
            raise bad(f"roles.{role}", f"unknown role (roles: {', '.join(Role)}); name the "
                      "table after one, e.g. [projects.NAME.roles.review]")
        if agent.model is not None and not agent.model.strip():
            raise bad(f"roles.{role}.model", "is empty: name a model, or remove the key")
