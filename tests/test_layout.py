"""The package's shape, checked: layers import downward only, each outside tool is
started from one home, nothing probes for capabilities, classes are composed.

These rules are what lets a newcomer point at one folder per box of the
architecture picture; a change that breaks one fails here with the file named.
"""

from __future__ import annotations

import ast
import builtins
import fnmatch
import re
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ralph_dev"

LAYERS = {
    "core": set(),
    "adapters": {"core"},
    "agent": {"core", "adapters"},
    "inpane": {"core", "adapters", "agent"},
    "hosts": {"core", "adapters", "agent"},
    "control": {"core", "adapters", "agent", "hosts"},
    "cli": {"core", "adapters", "agent", "inpane", "hosts", "control", "devtools"},
    "devtools": {"core", "adapters", "agent", "inpane", "hosts", "control"},
}
"""Which layers each layer may import from (besides itself)."""

TOOL_HOMES = {
    # a call that starts a process → the modules allowed to make it
    "subprocess": {"adapters/process.py", "adapters/verify.py", "adapters/verify_runs.py",
                   "adapters/tmux.py",
                   "agent/supervisor.py", "adapters/processes.py", "adapters/notify.py",
                   "inpane/children.py", "inpane/exec_launch.py",
                   "devtools/demo.py", "devtools/demo_agent.py"},
    "os.exec": {"adapters/tmux.py", "inpane/exec_launch.py"},
    "import libtmux": {"adapters/tmux.py"},  # only doctor's tmux version: tmux_version()
    "import sqlite3": {"adapters/tracker/local*.py"},
    "import gql": {"adapters/tracker/linear/client.py"},
}
"""ralph-dev's own CLI re-run by the daemon and the demo is not an outside tool; every
tool ralph-dev waits for (jj, tmux, git, gh, bwrap, systemctl, claude --version) runs
on the one command runner, adapters/process.py; the rest are long-lived processes with
their own lifecycle (verify's /bin/sh, the merge lane's detached verify runner, the agent
supervisor, the daemon, a notify command, a cluster worker's tmux server leashed to its
node, Codex under its supervisor in its pane) or the pane's exec of its agent."""

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
    """Live windows run ``ralph_dev/launcher.py`` (by its path; older ones ``python -m
    ralph_dev.launcher``): neither ever moves."""
    shim = PACKAGE / "launcher.py"
    assert shim.is_file()
    assert {"ralph_dev.inpane.exec_launch"} <= imported(shim)
    # the launcher runs before anything else in every pane: stdlib only (subprocess and
    # time: the worker's egress proxy is started, and waited for, from there)
    for name in imported(PACKAGE / "inpane" / "exec_launch.py"):
        assert name.split(".")[0] in {"__future__", "_json", "json", "os", "sys", "typing",
                                      "collections", "subprocess", "time"}, name


def test_a_panes_launcher_imports_only_what_every_launch_needs(tmp_path: Path) -> None:
    """Each spawn waits for its pane's Python to start before the agent runs: the launcher
    imports neither ``site`` nor the modules that cost most of a start (``json`` brings
    ``re`` and ``enum``; ``pathlib``, ``subprocess``, ``typing``)."""
    import subprocess

    from ralph_dev.adapters.processes import launcher_argv

    python, *rest = launcher_argv(str(tmp_path / "gone.json"))
    done = subprocess.run([python, "-X", "importtime", *rest], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and "gone.json" in done.stderr, done.stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
              if line.startswith("import time:")}
    assert "ralph_dev.inpane.exec_launch" in loaded
    costly = loaded & {"site", "json", "re", "enum", "pathlib", "subprocess", "typing",
                       "contextlib"}
    assert not costly, f"a pane's launcher imports {sorted(costly)} at its start"


CORE_NEVER_IMPORTS = {"subprocess", "socket", "sqlite3", "fcntl", "signal", "aiohttp", "libtmux",
                      "gql", "asyncio", "shutil", "tempfile", "structlog", "logging"}
"""core/ is the decision core and its data: what it needs from outside comes through
the ports, so none of the modules that reach processes, sockets, files' locks, the
event loop or the log may be imported there."""


def test_core_is_pure() -> None:
    found = [f"{rel(path)} imports {name}" for path in (PACKAGE / "core").rglob("*.py")
             for name in imported(path) if name.split(".")[0] in CORE_NEVER_IMPORTS]
    assert not found, found


TRACKER_WRITES = {"set_state", "change_labels", "add_labels", "remove_labels", "comment",
                  "create_issues", "set_priority", "add_blocker", "remove_blocker"}
WINDOW_KILLS = {"kill_window"}
ACTUATOR = "control/loop/act.py"


def called_methods(path: Path) -> set[str]:
    return {node.func.attr for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}


def test_one_actuator_writes_to_the_tracker_and_kills_windows() -> None:
    """Every hold, comment, state change and closed window is an action ``decide`` emitted,
    carried out in one place; adapters (which implement these calls) and the CLI (a
    person's own hands) aside."""
    acting = {rel(path) for path in modules()
              if rel(path).split("/")[0] not in ("adapters", "hosts", "cli")
              and called_methods(path) & (TRACKER_WRITES | WINDOW_KILLS)}
    assert acting <= {ACTUATOR}, f"outside the actuator: {sorted(acting - {ACTUATOR})}"


def test_the_actuator_never_asks_where_workers_run() -> None:
    """Issue 33: the cluster went in as a switch in the actuator (``self.cluster`` tested
    twelve times). It acts through the one worker-host port: nothing in it names a
    cluster, Ray or tmux, nor branches on which host it has."""
    text = (PACKAGE / ACTUATOR).read_text().lower()
    named = sorted({word for word in ("cluster", "ray", "tmux", "panes", "isinstance(self.host")
                    if re.search(rf"\b{re.escape(word)}", text)})
    assert not named, f"{ACTUATOR} names {named}"
    assert {"hosts"} & {n.split(".")[1] for n in imported(PACKAGE / ACTUATOR)
                         if n.startswith("ralph_dev.")} == set()


CHAIN_SCOPES = ("",)
"""Where no class may sit on a chain of three project classes (exceptions and Protocols
aside): each part is composed of small classes, never stacked to shorten a file."""


def _project_classes() -> dict[str, tuple[str, list[str]]]:
    """Every class of the package: qualified name → (its module's path, the qualified
    names of its bases as written, resolved through the module's imports)."""
    classes: dict[str, tuple[str, list[str]]] = {}
    for path in modules():
        module = "ralph_dev." + rel(path)[:-3].replace("/", ".")
        tree = ast.parse(path.read_text())
        names = {node.name: f"{module}.{node.name}" for node in tree.body
                 if isinstance(node, ast.ClassDef)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.update({alias.asname or alias.name: f"{node.module}.{alias.name}"
                              for alias in node.names})
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [names.get(ast.unparse(b), ast.unparse(b)) for b in node.bases]
                classes[f"{module}.{node.name}"] = (rel(path), bases)
    return classes


def _exempt(name: str, classes: dict[str, tuple[str, list[str]]]) -> bool:
    """A Protocol (``Protocol`` among its own bases: a class that implements one
    explicitly is still concrete), or an exception (through any of its bases)."""

    def exception(cls: str) -> bool:
        builtin = getattr(builtins, cls, None)
        return (isinstance(builtin, type) and issubclass(builtin, BaseException)) or any(
            exception(base) for base in (classes[cls][1] if cls in classes else []))

    bases = classes[name][1]
    return any(b.rsplit(".", 1)[-1] == "Protocol" for b in bases) or exception(name)


def class_chains(scopes: tuple[str, ...]) -> list[str]:
    """Each chain of three or more project classes that a class under ``scopes`` sits
    on (as the top, a middle or the bottom), written ``A → B → C`` (A inherits B)."""
    classes = _project_classes()
    linked = {name: [b for b in bases if b in classes and not _exempt(b, classes)]
              for name, (_path, bases) in classes.items() if not _exempt(name, classes)}

    def chains_up(name: str) -> list[list[str]]:
        return [[name, *rest] for base in linked[name] for rest in chains_up(base)] or [[name]]

    found = set()
    for name in linked:
        for chain in chains_up(name):
            if len(chain) >= 3 and any(classes[c][0].startswith(scopes) for c in chain):
                found.add(" → ".join(c.rsplit(".", 1)[-1] for c in chain))
    return sorted(found)


def test_no_class_sits_on_a_chain_of_three_project_classes() -> None:
    chains = class_chains(CHAIN_SCOPES)
    assert not chains, f"compose these instead of inheriting: {chains}"


def test_the_chain_rule_sees_a_chain_across_modules(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule itself can fail: a chain spread over two modules, through an import."""
    package = tmp_path / "ralph_dev"
    (package / "adapters" / "tracker").mkdir(parents=True)
    (package / "adapters" / "tracker" / "a.py").write_text(
        "class Db:\n    pass\n\nclass Reader(Db):\n    pass\n\n"
        "class Oops(ValueError):\n    pass\n\nclass Worse(Oops):\n    pass\n")
    (package / "adapters" / "tracker" / "b.py").write_text(
        "from typing import Protocol\nfrom ralph_dev.adapters.tracker.a import Reader, Worse\n"
        "class Port(Protocol):\n    pass\n\nclass Tracker(Reader, Port):\n    pass\n\n"
        "class Worst(Worse):\n    pass\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert class_chains(CHAIN_SCOPES) == ["Tracker → Reader → Db"]
