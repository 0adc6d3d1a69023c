"""Who may use the dashboard and the state API: the person, and nobody else on the machine.

Workers share the host's network (their model API must be reachable), so a request from
127.0.0.1 proves nothing about who sent it: without a token any worker could read every
issue, the events and other workers' panes, which its sandbox hides from it. So every
page and API route asks for a secret no worker can read:

* the **access token**: ``web.token_file`` / ``RALPH_DEV_WEB_TOKEN`` when configured,
  else one made once per project and kept in ``STATE_DIR/web-token`` (0600; the state
  directory is hidden from every worker). Scripts send it as ``Authorization: Bearer``.
* a **one-time login link** for browsers, the way Jupyter does it: ``status`` and
  ``start`` sign ``/?token=…`` with a key the running daemon wrote next to ``web.json``
  (``web-login.key``, 0600, new at each daemon start). The daemon takes each link once,
  before it expires, and answers with an HttpOnly cookie that is an HMAC of the access
  token (never the token itself); the browser is sent on to ``/`` so the link leaves the
  address bar.

Nothing here is given to a worker, a hook or a verify command: the environment policy
(``core.environment``) drops ``RALPH_DEV_WEB_TOKEN`` and the sandbox hides the files.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from typing import Any

from ralph_dev.adapters.files import atomic_write_bytes, atomic_write_text
from ralph_dev.core.paths import ProjectPaths

TOKEN_FILE = "web-token"  # noqa: S105 - a file name, not a secret
LOGIN_KEY_FILE = "web-login.key"
LOGIN_TTL = 900.0
"""Seconds a login link works (once); ``ralph-dev status`` prints a fresh one any time."""
USED_KEPT = 10_000
"""Links redeemed and not yet expired that the daemon remembers (far more than a person
opens in ``LOGIN_TTL``; past it the oldest are forgotten, and they expire anyway)."""


def generated_token(paths: ProjectPaths) -> str:
    """The project's own access token (made on first use, then kept): the dashboard works
    with no set-up, and a token survives daemon restarts, so an open page and a script's
    Bearer token go on working."""
    path = paths.state_dir / TOKEN_FILE
    try:
        value = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        value = ""
    if len(value) < 32:
        value = secrets.token_urlsafe(32)
        atomic_write_text(path, value + "\n", mode=0o600)
    return value


def session_value(token: str) -> str:
    """What the browser's cookie holds: derived from the token, so a cookie read from a
    browser profile is not the Bearer token scripts use."""
    return hmac.new(token.encode("utf-8"), b"ralph-dev dashboard session",
                    hashlib.sha256).hexdigest()


def cookie_name(project: str) -> str:
    """Per project: browsers share cookies between ports of one host, and two projects'
    dashboards on 127.0.0.1 must not overwrite each other's."""
    return f"ralph_dev_{project.replace('-', '_')}"


def _sign(key: bytes, nonce: str, expires: int) -> str:
    return hmac.new(key, f"{nonce}.{expires}".encode(), hashlib.sha256).hexdigest()


def mint_login(key: bytes, now: float | None = None, ttl: float = LOGIN_TTL) -> str:
    """A login token: a random nonce, its expiry and their HMAC under the daemon's key."""
    now = time.time() if now is None else now
    nonce, expires = secrets.token_hex(12), int(now + ttl)
    return f"{nonce}.{expires}.{_sign(key, nonce, expires)}"


class LoginLinks:
    """The daemon's side: which login tokens it signed and which it already took."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.used: dict[str, int] = {}

    def redeem(self, value: str, now: float | None = None) -> bool:
        """True once for a valid, unexpired token this daemon's key signed."""
        now = time.time() if now is None else now
        nonce, _, rest = value.partition(".")
        expires_text, _, mac = rest.partition(".")
        if not (nonce and expires_text.isdigit() and mac):
            return False
        expires = int(expires_text)
        if not hmac.compare_digest(mac.encode(), _sign(self.key, nonce, expires).encode()):
            return False
        if expires < now or nonce in self.used:
            return False
        self.used = {n: e for n, e in self.used.items() if e >= now}
        while len(self.used) >= USED_KEPT:
            self.used.pop(next(iter(self.used)))
        self.used[nonce] = expires
        return True


def write_login_key(paths: ProjectPaths) -> bytes:
    """A fresh signing key for this daemon run (links of an earlier run stop working)."""
    key = secrets.token_bytes(32)
    atomic_write_bytes(paths.state_dir / LOGIN_KEY_FILE, key.hex().encode() + b"\n", mode=0o600)
    return key


def forget_login_key(paths: ProjectPaths) -> None:
    (paths.state_dir / LOGIN_KEY_FILE).unlink(missing_ok=True)


def served(paths: ProjectPaths) -> dict[str, Any]:
    """What the daemon wrote about its dashboard (``web.json``: url or error, its pid)."""
    try:
        data = json.loads((paths.state_dir / "web.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def login_url(paths: ProjectPaths, now: float | None = None) -> str | None:
    """A one-time link into the running daemon's dashboard (None when it serves none, or
    when this process cannot read its key: another user, or a worker)."""
    url = served(paths).get("url")
    try:
        key = bytes.fromhex((paths.state_dir / LOGIN_KEY_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    if not isinstance(url, str) or not key:
        return None
    return f"{url}?token={mint_login(key, now)}"


def offered_secret(header: str) -> str:
    """The token of an ``Authorization: Bearer …`` header ("" without one)."""
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def token_matches(offered: str, wanted: str) -> bool:
    """Constant-time, whatever the lengths."""
    return hmac.compare_digest(offered.encode("utf-8"), wanted.encode("utf-8"))
