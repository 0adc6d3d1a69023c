"""What runs on a cluster's host for one worker attempt: its clone, workspace, window
and mailbox. Nothing here runs on the controller's host, and nothing here knows Ray
(``hosts.ray.plane`` makes :class:`~ralph_dev.hosts.node.worker.NodeWorker` an actor)."""

from __future__ import annotations
