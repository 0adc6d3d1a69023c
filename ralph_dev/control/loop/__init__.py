"""The controller's loop: observe → decide → act each tick.

The actuator, the intake of workers' reports, the merge lane, and what each tick
reads beside (tripwires, spend, the config watch) live here; what the daemon serves
is in ``control.daemon`` and the state document in ``control.state``.
"""

from __future__ import annotations
