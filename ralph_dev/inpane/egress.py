"""A worker's only way out: an HTTP proxy on the host that lets through allowed hosts only.

With ``agent.network = "allowlist"`` a worker's sandbox has no network of its own
(``bwrap --unshare-net``: a loopback and nothing else). Its launcher starts this proxy
on the host, outside the sandbox, listening on a Unix socket bound into it; inside,
``inpane.netbridge`` carries ``127.0.0.1:PORT`` to that socket, and the agent sees an
ordinary ``HTTPS_PROXY``/``HTTP_PROXY``. So every name is resolved here, never in the
sandbox, and every connection is one this proxy chose to make:

* ``CONNECT host:port`` (HTTPS, git, npm, pip) and absolute-form ``GET http://…``
  requests (a model API on loopback) to an allowed host and port are carried through;
* anything else is answered ``403`` and written down (issue, host, port, why), as is
  each connection's bytes out and in, in the worker's ``egress.jsonl``: outside the
  sandbox, where the worker can neither write nor hide it. The controller reads it
  (``control.loop.egress``).

Standard library only: the launcher starts it before the agent, and it dies with the
launcher's process (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

HEAD_LIMIT = 64 * 1024
"""The longest request head read before a request is refused as malformed."""
CONNECT_TIMEOUT = 30.0
DEFAULT_PORTS = (443, 80)
"""The ports an allowed host without one (``registry.npmjs.org``) may be reached on."""


def rule_of(text: str) -> tuple[str, tuple[int, ...]]:
    """An allow rule (``host``, ``host:port``, ``*.domain``, ``[v6]:port``) as a name
    and the ports it allows (none said: 443 and 80)."""
    text = text.strip().lower()
    head, sep, tail = text.rpartition(":")
    if sep and tail.isdigit() and (":" not in head or head.endswith("]")):
        return head.strip("[]").rstrip("."), (int(tail),)
    return text.strip("[]").rstrip("."), DEFAULT_PORTS


def allowed(rules: Sequence[str], host: str, port: int) -> bool:
    """Whether ``host:port`` matches a rule: ``*.domain`` allows any name under the
    domain, not the domain itself. Names compare without case or a trailing dot."""
    host = host.strip("[]").lower().rstrip(".")
    for rule in rules:
        name, ports = rule_of(rule)
        if port in ports and (host == name or (name.startswith("*.")
                                               and host.endswith(name[1:]))):
            return True
    return False


def split_target(target: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port`` too) as a host and a port; None when it is not one."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


class Upstream:
    """The proxy the machine itself reaches the internet through (its ``HTTPS_PROXY``,
    ``HTTP_PROXY`` and ``NO_PROXY``, read by the controller into the launch spec): an
    allowed connection goes through it, as every other program's on the machine does.
    Only ``http://`` proxy URLs; the credentials one carries are sent to it and never
    written down."""

    def __init__(self, spec: object) -> None:
        said = spec if isinstance(spec, dict) else {}
        self.https = _proxy_of(said.get("https"))
        self.http = _proxy_of(said.get("http"))
        self.bypass = _bypass(str(said.get("no_proxy") or ""))

    def route(self, host: str, *, tunnel: bool) -> tuple[str, int, str | None] | None:
        """The machine's proxy for a connection to ``host`` (its host, port and
        ``Proxy-Authorization`` value); None: straight there."""
        proxy = self.https if tunnel else self.http
        name = host.strip("[]").lower().rstrip(".")
        if proxy is None or any(not part or name == part or name.endswith("." + part)
                                for part in self.bypass):
            return None
        return proxy


def _bypass(no_proxy: str) -> list[str]:
    """``NO_PROXY``'s names, as curl reads them: ``.corp``, ``corp`` and ``*.corp`` each
    cover ``corp`` and the names under it, a port is ignored, and ``*`` (an empty entry
    here) covers everything."""
    out = []
    for part in (p.strip().lower() for p in no_proxy.split(",")):
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if sep and port.isdigit() and (":" not in host or host.endswith("]")):
            part = host
        out.append(part.lstrip("*").lstrip(".").strip("[]").rstrip("."))
    return out


def _proxy_of(url: object) -> tuple[str, int, str | None] | None:
    if not isinstance(url, str) or not url.strip():
        return None
    try:
        parts = urlsplit(url.strip() if "://" in url else f"http://{url.strip()}")
        port = parts.port or 80
    except ValueError:
        return None
    if parts.scheme != "http" or not parts.hostname:
        return None
    auth = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        auth = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    return parts.hostname, port, auth


class Ledger:
    """The worker's ``egress.jsonl``: each refusal and each connection's bytes."""

    def __init__(self, path: Path, issue: str) -> None:
        self.path = path
        self.issue = issue

    def write(self, kind: str, **fields: object) -> None:
        line = json.dumps({"at": time.time(), "kind": kind, "issue": self.issue, **fields})
        with contextlib.suppress(OSError), self.path.open("a", encoding="utf-8") as file:
            file.write(line + "\n")


class Proxy:
    """One worker's proxy: ``rules`` say where it may go."""

    def __init__(self, rules: Sequence[str], ledger: Ledger,
                 upstream: Upstream | None = None) -> None:
        self.rules = list(rules)
        self.ledger = ledger
        self.upstream = upstream or Upstream(None)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > HEAD_LIMIT:
            return await self._refuse(writer, "", 0, "request head too long", status=400)
        lines = head.decode("latin-1").split("\r\n")
        method, _, rest = lines[0].partition(" ")
        target = rest.rsplit(" ", 1)[0]
        if method == "CONNECT":
            where = split_target(target)
            if where is None:
                return await self._refuse(writer, target[:100], 0, "not host:port", status=400)
            host, port = where
            upstream = await self._open(writer, host, port, tunnel=True)
            if upstream is None:
                return None
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            return await self._pipe(reader, writer, upstream, host, port, sent=0)
        if not target.lower().startswith("http://"):
            return await self._refuse(writer, target[:100], 0, "only CONNECT and http:// "
                                      "requests go through this proxy", status=400)
        authority, _, path = target[len("http://"):].partition("/")
        where = split_target(authority) or (authority.strip("[]"), 80)
        host, port = where
        via = self.upstream.route(host, tunnel=False)
        upstream = await self._open(writer, host, port, tunnel=False)
        if upstream is None:
            return None
        headers = [line for line in lines[1:] if line and not line.lower().startswith(
            ("proxy-", "connection:", "keep-alive:"))]
        if via is not None and via[2]:
            headers.append(f"Proxy-Authorization: {via[2]}")
        # the machine's proxy takes the absolute form; a server its own path
        line = f"{method} {f'http://{authority}/' if via else '/'}{path} " \
               f"{rest.rsplit(' ', 1)[-1]}"
        # one request per connection: a next one may be for another host
        request = "\r\n".join([line, *headers, "Connection: close", "", ""]).encode("latin-1")
        upstream[1].write(request)
        return await self._pipe(reader, writer, upstream, host, port, sent=len(request))

    async def _open(self, writer: asyncio.StreamWriter, host: str, port: int, *,
                    tunnel: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to an allowed ``host:port``: straight there, or through the
        machine's proxy (a tunnel it opened, for ``tunnel``; else a connection to it that
        the request goes down in absolute form)."""
        if not allowed(self.rules, host, port):
            await self._refuse(writer, host, port, "not in the project's allowed hosts")
            return None
        via = self.upstream.route(host, tunnel=tunnel)
        try:
            if via is None:
                return await asyncio.wait_for(asyncio.open_connection(host, port),
                                              CONNECT_TIMEOUT)
            opened = await asyncio.wait_for(asyncio.open_connection(via[0], via[1]),
                                            CONNECT_TIMEOUT)
            if tunnel:
                await asyncio.wait_for(_tunnel(opened, host, port, via[2]), CONNECT_TIMEOUT)
            return opened
        except (OSError, TimeoutError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError) as exc:
            said = f"the machine's proxy {via[0]}:{via[1]}: " if via else ""
            self.ledger.write("failed", host=host, port=port, why=(said + str(exc))[:200])
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return None

    async def _refuse(self, writer: asyncio.StreamWriter, host: str, port: int, why: str,
                      status: int = 403) -> None:
        self.ledger.write("refused", host=host[:253], port=port, why=why)
        body = (f"ralph-dev egress: {host}:{port} refused: {why} (agent.allow_hosts)\n"
                .encode())
        writer.write(f"HTTP/1.1 {status} Forbidden\r\nContent-Type: text/plain\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                     + body)
        await writer.drain()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter], host: str,
                    port: int, *, sent: int) -> None:
        counts = {"out": sent, "in": 0}

        async def carry(source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                        key: str) -> None:
            try:
                while chunk := await source.read(65536):
                    counts[key] += len(chunk)
                    sink.write(chunk)
                    await sink.drain()
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    sink.write_eof() if sink.can_write_eof() else sink.close()

        try:
            await asyncio.gather(carry(reader, upstream[1], "out"),
                                 carry(upstream[0], writer, "in"))
        finally:
            upstream[1].close()
            self.ledger.write("bytes", host=host, port=port, out=counts["out"],
                              **{"in": counts["in"]})


async def _tunnel(opened: tuple[asyncio.StreamReader, asyncio.StreamWriter], host: str,
                  port: int, auth: str | None) -> None:
    """Ask the machine's proxy for a tunnel to ``host:port``; OSError when it says no."""
    reader, writer = opened
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    writer.write((f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
                  + (f"Proxy-Authorization: {auth}\r\n" if auth else "")
                  + "\r\n").encode("latin-1"))
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    if status.split(" ")[1:2] != ["200"]:
        writer.close()
        raise OSError(f"it answered {status[:100]!r}")


def _die_with_parent() -> None:
    """End this proxy when the launcher's process (the sandbox, then) ends."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        sys.exit(0)


async def serve(socket: Path, rules: Sequence[str], ledger: Ledger,
                upstream: Upstream | None = None) -> None:
    """Serve on ``socket`` until a signal ends it. The socket is bound by its name in its
    own directory: a worker's directory can be longer than a socket path may be."""
    proxy = Proxy(rules, ledger, upstream)
    os.chdir(socket.parent)
    with contextlib.suppress(FileNotFoundError):
        Path(socket.name).unlink()
    server = await asyncio.start_unix_server(proxy.serve, path=socket.name,
                                             limit=HEAD_LIMIT * 2)
    Path(socket.name).chmod(0o600)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m ralph_dev.inpane.egress LAUNCH_SPEC.json", file=sys.stderr)
        return 2
    try:
        spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))["egress"]
        socket, log = Path(spec["socket"]), Path(spec["log"])
        rules = [str(r) for r in spec["allow"]]
        issue = str(spec.get("issue", ""))
        upstream = Upstream(spec.get("upstream"))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"ralph-dev egress: launch spec {args[0]} unusable ({exc})", file=sys.stderr)
        return 2
    _die_with_parent()
    asyncio.run(serve(socket, rules, Ledger(log, issue), upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
