"""Where a worker runs: one port (``core.ports.WorkerHost``), two implementations.

``hosts.local`` runs workers on this host (its tmux and jj); ``hosts.ray`` places each
worker attempt on a host of a Ray cluster and brings its work back through the git
remote. The actuator, the controller and the observer are handed one of them and
never ask which. ``hosts.node`` is the code that runs ON a cluster's host, apart from
everything that runs on the controller's.
"""

from __future__ import annotations
