"""Inside a worker's sandbox with no network: ``127.0.0.1:PORT`` carried to its proxy.

``agent.network = "allowlist"`` leaves the sandbox only a loopback. Its one way out is
the egress proxy's Unix socket (``inpane.egress``), bound into the sandbox. Tools speak
to a proxy over TCP (``HTTPS_PROXY=http://127.0.0.1:PORT``), so this listens there,
carries each connection to the socket, and runs the agent as its child: the pane's
program is ``python -m ralph_dev.inpane.netbridge SOCKET PORT -- AGENT_ARGV...``, and it
exits with the agent's status. Standard library only (``inpane.children`` is so too).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Sequence

from ralph_dev.inpane.children import start_child

CONNECT_WAIT = 10.0
"""How long a connection waits for the proxy's socket (the proxy starts beside the
sandbox, and the agent may be quicker)."""


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _carry(client: socket.socket, path: str) -> None:
    deadline = time.monotonic() + CONNECT_WAIT
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    while True:
        try:
            upstream.connect(path)
            break
        except OSError:
            if time.monotonic() > deadline:
                client.close()
                upstream.close()
                return
            time.sleep(0.1)
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def listen(path: str, port: int) -> socket.socket:
    """Carry every connection to ``127.0.0.1:port`` to the Unix socket ``path``."""
    server = socket.create_server(("127.0.0.1", port))

    def accept() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_carry, args=(client, path), daemon=True).start()

    threading.Thread(target=accept, name="netbridge", daemon=True).start()
    return server


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[2] != "--" or not args[1].isdigit():
        print("usage: python -m ralph_dev.inpane.netbridge SOCKET PORT -- ARGV...",
              file=sys.stderr)
        return 2
    try:
        listen(args[0], int(args[1]))
    except OSError as exc:
        print(f"ralph-dev: cannot open the way out on 127.0.0.1:{args[1]}: {exc.strerror}",
              file=sys.stderr)
        return 2
    child = start_child(args[3:])
    return 127 if child is None else child.wait()

if __name__ == "__main__":
    sys.exit(main())
