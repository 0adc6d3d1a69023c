"""The package's shape, checked: layers import downward only, each outside tool is
started from one home, nothing probes for capabilities, modules stay readable.

These rules are what lets a newcomer point at one folder per box of the
architecture picture; a change that breaks one fails here with the file named.
"""

from __future__ import annotations

import ast
import builtins
import fnmatch
import re
from collections.abc import Callable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ralph_dev"

LAYERS = {
    "core": set(),
    "adapters": {"core"},
    "agent": {"core", "adapters"},
    "inpane": {"core", "adapters", "agent"},
    "control": {"core", "adapters", "agent"},
    "cli": {"core", "adapters", "agent", "inpane", "control", "devtools"},
    "devtools": {"core", "adapters", "agent", "inpane", "control"},
}
"""Which layers each layer may import from (besides itself)."""

TOOL_HOMES = {
    # a call that starts a process → the modules allowed to make it
    "subprocess": {"adapters/process.py", "adapters/verify.py",
                   "agent/supervisor.py", "control/processes.py", "adapters/notify.py",
                   "devtools/demo.py", "devtools/demo_agent.py"},
    "os.exec": {"adapters/tmux.py", "inpane/launcher.py"},
    "import libtmux": {"adapters/tmux.py"},  # only doctor's tmux version: tmux_version()
    "import sqlite3": {"adapters/tracker/local*.py"},
    "import gql": {"adapters/tracker/linear/client.py"},
}
"""ralph-dev's own CLI re-run by the daemon and the demo is not an outside tool; every
tool ralph-dev waits for (jj, tmux, git, gh, bwrap, systemctl, claude --version) runs
on the one command runner, adapters/process.py; the rest are long-lived processes with
their own lifecycle (verify's /bin/sh, the agent supervisor, the daemon, a notify
command) or the pane's exec of its agent."""

def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_layers_import_downward_only() -> None:
    wrong = []
    for path in modules():
        layer = rel(path).split("/")[0]
        if layer not in LAYERS:
            continue  # ralph_dev/__init__, __main__, the launcher shim
        for name in imported(path):
            parts = name.split(".")
            if parts[0] == "ralph_dev" and len(parts) > 1 and parts[1] != layer \
                    and parts[1] not in LAYERS[layer]:
                wrong.append(f"{rel(path)} ({layer}) imports {name}")
    assert not wrong, wrong


def test_each_outside_tool_is_started_from_its_home() -> None:
    found: dict[str, set[str]] = {tool: set() for tool in TOOL_HOMES}
    for path in modules():
        text = path.read_text()
        if re.search(r"\bsubprocess\.(run|Popen|call|check_output|check_call)\(", text):
            found["subprocess"].add(rel(path))
        if re.search(r"\bos\.(exec\w+|spawn\w+|system|popen)\(", text):
            found["os.exec"].add(rel(path))
        names = imported(path)
        for module, tool in (("libtmux", "import libtmux"), ("sqlite3", "import sqlite3"),
                             ("gql", "import gql")):
            if any(n == module or n.startswith(module + ".") for n in names):
                found[tool].add(rel(path))
    for tool, where in found.items():
        stray = sorted(p for p in where
                       if not any(fnmatch.fnmatch(p, home) for home in TOOL_HOMES[tool]))
        assert not stray, f"{tool} outside its home: {stray}"


def test_no_capability_probing() -> None:
    probing = [rel(path) for folder in ("control", "cli")
               for path in (PACKAGE / folder).rglob("*.py")
               if re.search(r"\b(getattr|hasattr)\(", path.read_text())]
    assert not probing, f"probing with getattr/hasattr: {probing}"


def test_every_module_starts_with_future_annotations() -> None:
    missing = [rel(path) for path in modules()
               if path.read_text().strip() and "from __future__ import annotations"
               not in path.read_text()]
    assert not missing, missing


def test_the_pane_entry_point_is_stable() -> None:
    """Live windows run ``python -m ralph_dev.launcher``: that module path never moves."""
    shim = PACKAGE / "launcher.py"
    assert shim.is_file()
    assert {"ralph_dev.inpane.launcher"} <= imported(shim)
    # the launcher runs before anything else in every pane: stdlib only
    for name in imported(PACKAGE / "inpane" / "launcher.py"):
        assert name.split(".")[0] in {"__future__", "contextlib", "json", "os", "sys",
                                      "pathlib", "collections"}, name


CORE_NEVER_IMPORTS = {"subprocess", "socket", "sqlite3", "fcntl", "signal", "aiohttp", "libtmux",
                      "gql", "asyncio", "shutil", "tempfile", "structlog", "logging"}
"""core/ is the decision core and its data: what it needs from outside comes through
the ports, so none of the modules that reach processes, sockets, files' locks, the
event loop or the log may be imported there."""


def test_core_is_pure() -> None:
    found = [f"{rel(path)} imports {name}" for path in (PACKAGE / "core").rglob("*.py")
             for name in imported(path) if name.split(".")[0] in CORE_NEVER_IMPORTS]
    assert not found, found


CHAIN_EXCEPTIONS = {
    # tracker composition: branch trackers
    "LinearTracker", "LocalTracker",
}


def project_classes() -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Every class ralph-dev defines → the project classes it derives from, each named
    (module, class), following the names each module imports."""
    found: dict[tuple[str, str], list[ast.expr]] = {}
    scopes: dict[str, dict[str, tuple[str, str]]] = {}
    for path in modules():
        module = "ralph_dev." + rel(path)[:-3].replace("/", ".").removesuffix(".__init__")
        tree = ast.parse(path.read_text())
        scope: dict[str, tuple[str, str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    scope[alias.asname or alias.name] = (node.module, alias.name)
            elif isinstance(node, ast.ClassDef):
                scope[node.name] = (module, node.name)
                found[(module, node.name)] = node.bases
        scopes[module] = scope
    parents: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for (module, name), bases in found.items():
        resolved = []
        for base in bases:
            key = scopes[module].get(base.id) if isinstance(base, ast.Name) else None
            resolved.append(key if key in found else ("", ast.unparse(base)))
        parents[(module, name)] = resolved
    return parents


def test_no_class_sits_on_a_chain_of_three_project_classes() -> None:
    """Composition, not inheritance: a class extends at most one project class that
    itself extends none (exceptions and typing.Protocols aside, whose hierarchies
    are what they are for)."""
    parents = project_classes()

    def derives(key: tuple[str, str], outside_base: Callable[[str], bool]) -> bool:
        """Whether a class derives, through project classes, from an outside base."""
        return any(derives((module, base), outside_base) if module else outside_base(base)
                   for module, base in parents[key])

    def exception(base: str) -> bool:
        found = getattr(builtins, base, None)
        return isinstance(found, type) and issubclass(found, BaseException)

    def protocol(base: str) -> bool:
        return base in ("Protocol", "typing.Protocol")

    def depth(key: tuple[str, str]) -> int:
        return 1 + max((depth(p) for p in parents[key] if p[0]), default=0)

    chains = sorted(f"{module}.{name} ({depth((module, name))} deep)"
                    for module, name in parents
                    if depth((module, name)) >= 3 and name not in CHAIN_EXCEPTIONS
                    and not derives((module, name), exception)
                    and not derives((module, name), protocol))
    assert not chains, f"classes on a chain of three project classes: {chains}"
