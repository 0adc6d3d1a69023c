"""Accounts, shared by every project on this host that runs its agents on them.

An account is the credential a worker's agent runs on: an API key (with the endpoint it
is for), or the person's own login of the agent CLI. It is known by a fingerprint, a
hash of it that says nothing of the key; the key is never stored.

A usage limit, a rate limit, an outage or a refused key that one project's worker meets
is the account's, not the project's: the project that met it writes it here
(``accounts/FINGERPRINT.json``, one entry per kind, naming the project), every other
project on the same account reads it each tick and pauses the same way, and its end
(the reset passed, the outage's probe answered) is withdrawn by the project that met it.
An entry whose stated end has passed stands for nothing (after a short grace for its
project to end it), so a project that met a limit and then stopped holds no one back
for longer than the limit said.

The account's usage windows (a subscriber's five-hour and seven-day use, as the model
API states them with every answer) are the account's too: any project's worker that
reads them writes them to ``accounts/FINGERPRINT.windows.json``, and every project on
the account paces its starts by them (``core.pacing``). An API key's per-minute limits,
which its agent passes on nowhere, are read by asking the API (``KeyProbe``): at most
once a minute for the whole account, whichever project asks.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ralph_dev.adapters.api_probe import can_probe, model_used, read_key_windows
from ralph_dev.adapters.files import atomic_write_text, flocked, private_dir
from ralph_dev.adapters.store import StateStore, from_iso, to_iso
from ralph_dev.core.agent_profiles import PROFILES, role_cli, role_model
from ralph_dev.core.config import ProjectSettings
from ralph_dev.core.model import Pause, Role, UsageWindow
from ralph_dev.core.pacing import KEY_PROBE_EVERY, KEY_WINDOWS, WINDOW_LENGTHS, WINDOW_NAMES
from ralph_dev.core.paths import state_home


def accounts_dir() -> Path:
    return state_home() / "accounts"


def account_of(settings: ProjectSettings, environ: Mapping[str, str]) -> str:
    """The fingerprint of the account the project's agents run on: its CLI, the endpoint
    and the first key or login token the environment sets (else the person's own login
    of the CLI, in their HOME); "" for a command runner, whose program names none."""
    profile = PROFILES.get(settings.agent.cli)
    if profile is None or settings.agent.runner != "claude":
        return ""  # a command runner's program says nothing of an account
    key = next((environ[v] for v in (*profile.key_variables, *profile.login_variables)
                if environ.get(v)), None)
    endpoint = environ.get(profile.base_url_variable, "")
    what = f"key:{key}" if key else f"login:{environ.get('HOME', '')}"
    digest = hashlib.sha256(f"{profile.name}\0{endpoint}\0{what}".encode()).hexdigest()
    return f"{profile.name}-{digest[:16]}"


ENDED_GRACE = timedelta(seconds=30)
"""How long past its end a pause another project met still holds here unless that
project withdraws it first. At its end that project may find the limit still in force
(its probe refused: a reset stated to the minute), and a project here starting at the
stated end would meet the limit again."""


class AccountPauses:
    """The pauses of one project's account: read by the project, shared by it."""

    def __init__(self, account: str, project: str, directory: Path | None = None) -> None:
        self.account = account
        self.project = project
        self.directory = directory or accounts_dir()

    @property
    def _file(self) -> Path:
        return self.directory / f"{self.account}.json"

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self._file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def read(self, now: datetime) -> tuple[Pause, ...]:
        """The account's pauses other projects met, in force at ``now``: until the project
        that met one withdraws it, or ``ENDED_GRACE`` past its end if it never does (its
        controller stopped)."""
        if not self.account:
            return ()
        found = []
        for kind, entry in sorted(self._load().items()):
            if not isinstance(entry, dict) or entry.get("by") in (None, self.project):
                continue
            until = from_iso(entry.get("until"))
            if until is None or until + ENDED_GRACE <= now:
                continue
            found.append(Pause(kind=str(kind), cause=str(entry.get("cause", "")),
                               fix=str(entry.get("fix", "")), since=from_iso(entry.get("since")),
                               until=until, quiet_workers=True, shared_from=str(entry["by"])))
        return tuple(found)

    def share(self, pause: Pause) -> None:
        """This project met ``pause``: every project on the account pauses with it."""
        if not self.account:
            return
        with self._locked():
            data = self._load()
            data[pause.kind] = {"cause": pause.cause, "fix": pause.fix,
                                "since": to_iso(pause.since), "until": to_iso(pause.until),
                                "by": self.project}
            atomic_write_text(self._file, json.dumps(data, indent=1) + "\n")

    def withdraw(self, kind: str) -> None:
        """This project's pause of ``kind`` is over: so is the account's, if it said it."""
        if not self.account:
            return
        with self._locked():
            data = self._load()
            entry = data.get(kind)
            if isinstance(entry, dict) and entry.get("by") == self.project:
                del data[kind]
                atomic_write_text(self._file, json.dumps(data, indent=1) + "\n")

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        private_dir(self.directory)
        return flocked(self.directory / f".{self.account}.lock")


WINDOW_SLACK = timedelta(minutes=1)
"""A window's reset further ahead than its length and this is no window ralph-dev
knows: a worker's report of it is not believed (a worker is a possibly hostile
process)."""
KEY_WINDOW_AHEAD = timedelta(days=1)
"""An API key's limit may take longer than its minute to fill again (OpenAI states the
time until it is full: "6m0s"), never a day."""


def believed_ahead(window: str) -> timedelta:
    """How far ahead a window's reset may lie and be believed."""
    return KEY_WINDOW_AHEAD if window in KEY_WINDOWS else WINDOW_LENGTHS[window] + WINDOW_SLACK


PROBE = "probe"
"""The windows file's entry for the last probe (when, and the model asked for)."""


class AccountWindows:
    """The account's usage windows: written by any project whose worker read them, read
    by every project on the account."""

    def __init__(self, account: str, directory: Path | None = None) -> None:
        self.account = account
        self.directory = directory or accounts_dir()

    @property
    def _file(self) -> Path:
        return self.directory / f"{self.account}.windows.json"

    def note(self, windows: Mapping[str, tuple[float, datetime]], now: datetime) -> bool:
        """What a worker's agent read of the windows (name: used share, reset), each
        checked; True when it changed what the account's file says."""
        if not self.account:
            return False
        fresh = {name: {"used": round(min(max(used, 0.0), 1.0), 4), "resets_at": to_iso(reset)}
                 for name, (used, reset) in windows.items()
                 if name in WINDOW_NAMES and now - timedelta(minutes=1) < reset
                 <= now + believed_ahead(name)}
        if not fresh:
            return False
        private_dir(self.directory)
        with flocked(self.directory / f".{self.account}.lock"):
            data = self._load()
            if all({k: v for k, v in data.get(name, {}).items() if k != "seen_at"} == entry
                   for name, entry in fresh.items()):
                return False
            for entry in fresh.values():
                entry["seen_at"] = to_iso(now)
            atomic_write_text(self._file, json.dumps({**data, **fresh}, indent=1) + "\n")
        return True

    def claim_probe(self, now: datetime, every: timedelta = KEY_PROBE_EVERY) -> bool:
        """Whether the caller asks the API now: no project on the account asked within
        ``every`` (the claim is written before anyone asks, so two projects claiming at
        once make one request)."""
        if not self.account:
            return False
        private_dir(self.directory)
        with flocked(self.directory / f".{self.account}.lock"):
            data = self._load()
            last = self._probe(data).get("at")
            if last is not None and last <= now < last + every:
                return False
            self._write_probe(data, at=to_iso(now))
        return True

    def probed(self, model: str) -> None:
        """Remember the model the account was asked for: the next probe asks for it when
        no live worker says which model it uses."""
        private_dir(self.directory)
        with flocked(self.directory / f".{self.account}.lock"):
            self._write_probe(self._load(), model=model[:100])

    def _write_probe(self, data: dict[str, Any], **fields: str | None) -> None:
        """The file as ``data`` says, its probe's entry with ``fields`` (under the lock)."""
        probe = data.get(PROBE)
        atomic_write_text(self._file, json.dumps(
            {**data, PROBE: {**(probe if isinstance(probe, dict) else {}), **fields}},
            indent=1) + "\n")

    def last_probe(self) -> tuple[datetime | None, str | None]:
        """When the account's limits were last asked for, and for which model."""
        probe = self._probe(self._load())
        return probe.get("at"), probe.get("model")

    @staticmethod
    def _probe(data: Mapping[str, Any]) -> dict[str, Any]:
        probe = data.get(PROBE)
        if not isinstance(probe, dict):
            return {}
        model = probe.get("model")
        return {"at": from_iso(probe.get("at")),
                "model": model if isinstance(model, str) and model else None}

    def read(self, now: datetime) -> tuple[UsageWindow, ...]:
        """The account's windows that have not started over since they were read."""
        found = []
        for name, entry in sorted(self._load().items()):
            if name not in WINDOW_NAMES or not isinstance(entry, dict):
                continue
            reset, seen = from_iso(entry.get("resets_at")), from_iso(entry.get("seen_at"))
            used = entry.get("used")
            if reset is None or seen is None or reset <= now or not isinstance(
                    used, int | float):
                continue
            found.append(UsageWindow(name=name, used=float(used), resets_at=reset,
                                     seen_at=seen))
        return tuple(found)

    def _load(self) -> dict[str, Any]:
        if not self.account:
            return {}
        try:
            data = json.loads(self._file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}


class KeyProbe:
    """Reads the account's API-key limits by asking its model API once
    (``adapters.api_probe``), for the model a live worker uses (else the one last asked
    for, else the project's), and writes them where every project on the account paces
    by them."""

    def __init__(self, windows: AccountWindows, store: StateStore,
                 environ: Mapping[str, str], *, cli: str, model: str) -> None:
        self.windows = windows
        self.store = store
        self.environ = environ
        self.cli = cli
        """The agent CLI the project's workers run (its API is the one asked)."""
        self.model = model
        """The model they are configured with: asked for when nothing better is known
        (Claude Code's is an alias the API does not know; its transcripts say the
        model's name)."""

    @classmethod
    def of(cls, settings: ProjectSettings, windows: AccountWindows, store: StateStore,
           environ: Mapping[str, str]) -> KeyProbe:
        cli = role_cli(settings, Role.EXECUTE)
        return cls(windows, store, environ, cli=cli, model=role_model(settings, Role.EXECUTE))

    @property
    def possible(self) -> bool:
        """The agents run on an API key whose limits the API states."""
        return bool(self.windows.account) and can_probe(self.cli, self.environ)

    def run(self, transcripts: Iterable[Path], now: datetime) -> None:
        """Ask, unless a project on the account asked within the minute; the windows
        read are noted, and the probe's event says what it read."""
        if not self.possible:
            return
        said = (model_used(t) for t in transcripts) if self.cli == "claude" else ()
        fallback = () if self.cli == "claude" else (self.model,)
        model = next((m for m in itertools.chain(said, (self.windows.last_probe()[1],),
                                                 fallback) if m), None)
        if model is None or not self.windows.claim_probe(now):
            return  # no worker has said its model yet: asked once one has
        reading = read_key_windows(self.cli, self.environ, model, now)
        if reading is None:
            return
        self.windows.probed(reading.model)
        self.windows.note(reading.windows, now)
        used: dict[str, Any] = {name: round(share, 3)
                                for name, (share, _) in reading.windows.items()}
        self.store.append_event("account_probed", model=reading.model, status=reading.status,
                                **used)
