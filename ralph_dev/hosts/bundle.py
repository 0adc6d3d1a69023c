"""A worker's launch files, carried to the host a cluster placed it on.

On one host, a worker's window reads its launch in place: the spec, prompt and
secrets the controller wrote in its state directory, and the worker's own
directory (its agent HOME, sandbox filter, private tmp and run directory). A
cluster host shares nothing with the controller but the git remote. So the
controller packs those files (:func:`pack`), the attempt's actor unpacks them
under a directory of its own host (:func:`unpack`), and every path that names one
of them, in the window's command, its environment and the JSON files among them,
is moved from where the controller has it to where the host has it
(:func:`moved`). The prompt and any other text are bytes carried as they are:
nothing in an issue's text is read as a path.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ralph_dev.adapters.files import atomic_write_bytes
from ralph_dev.core.errors import RalphError

BUNDLE_LIMIT = 64 * 2**20
"""Bytes one launch may carry: a worker's own files are small (settings, a filter, a
prompt, one session's transcript); more means something that was never meant to
travel lies in its directory."""


SHIPPED_ROOT = "worker"
"""The name the worker's own directory (``state/workers/ISSUE``) goes by in its launch
files."""

SESSIONS = "sessions"
"""Where a worker's own directory keeps the agent transcripts its hosts sent back."""


class BundleError(RalphError):
    """A launch that cannot travel as it is: the cause, and what to do."""


@dataclass(frozen=True)
class Bundle:
    """Files under named roots: ``roots`` maps each root's path on the controller's host
    to its name (the directory it becomes on the worker's host)."""

    roots: dict[str, str]
    files: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    """The controller's path of each file → (its permission bits, its bytes)."""
    dirs: dict[str, int] = field(default_factory=dict)
    """The controller's path of each directory (empty ones too) → its permission bits."""
    links: dict[str, str] = field(default_factory=dict)
    """The controller's path of each link carried (only from ``pack``'s ``links_in``) →
    the absolute path it names: a program installed at the same path on every host."""
    homes: dict[str, str] = field(default_factory=dict)
    """The XDG base directories the launch names (``XDG_STATE_HOME`` → the controller's
    path): a path under one that is not the launch's own names the host's."""

    @property
    def size(self) -> int:
        return sum(len(data) for _mode, data in self.files.values())


MOVED_HOMES = {"XDG_STATE_HOME": ".local/state", "XDG_DATA_HOME": ".local/share"}
"""The XDG base directories where ralph-dev keeps a project's state and data: a launch
path under one of them that is not the launch's own names the host's. Tools (under the
cache directory, say) are where each host installed them: the same paths."""


def kept_transcript(worker_dir: Path, session: str) -> Path:
    """Where a worker's agent transcript is kept on the controller's host once its host
    sent it back: the issue's next attempt, on whichever host, resumes from it."""
    return worker_dir / SESSIONS / f"{session}.jsonl"


def xdg_homes() -> dict[str, str]:
    """This host's :data:`MOVED_HOMES`, as ralph-dev here finds them."""
    return {var: os.environ.get(var) or str(Path.home() / default)
            for var, default in MOVED_HOMES.items()}


def pack(roots: Mapping[str, Path], *, trees: Iterable[Path] = (),
         leave_out: Iterable[Path] = (), files: Iterable[Path] = (),
         links_in: Iterable[Path] = ()) -> Bundle:
    """Every regular file and directory under each of ``trees`` but the subtrees in
    ``leave_out``, and ``files``; each under one of the ``roots`` (name → path).
    Sockets are not carried, nor links (one could name anything on this host) but those
    to an absolute path in the directories ``links_in`` (ralph-dev's agent-bin, which
    only the controller writes)."""
    bundle = Bundle(roots={str(path): name for name, path in roots.items()},
                    homes=xdg_homes())
    for directory in links_in:
        for link in Path(directory).iterdir():
            target = str(link.readlink()) if link.is_symlink() else ""
            if target.startswith("/") and _root_of(bundle, str(link)) is not None:
                bundle.links[str(link)] = target
    skipped = {str(p) for p in leave_out}
    for tree in trees:
        if _root_of(bundle, str(tree)) is None:
            raise BundleError(f"{tree}: not under any of {sorted(bundle.roots)}")
        for top, subdirs, names in os.walk(tree):
            subdirs[:] = [d for d in subdirs if str(Path(top) / d) not in skipped]
            bundle.dirs[top] = stat.S_IMODE(os.lstat(top).st_mode)
            for name in names:
                path = Path(top) / name
                if str(path) not in skipped:
                    _add(bundle, path)
    for path in files:
        if _root_of(bundle, str(path)) is None:
            raise BundleError(f"{path}: not under any of {sorted(bundle.roots)}")
        _add(bundle, path)
    if bundle.size > BUNDLE_LIMIT:
        raise BundleError(f"a worker's launch files come to {bundle.size:,} bytes, over "
                          f"{BUNDLE_LIMIT // 2**20} MiB: remove what does not belong in "
                          f"{sorted(bundle.roots)}")
    return bundle


def _add(bundle: Bundle, path: Path) -> None:
    try:
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode):
            bundle.files[str(path)] = (stat.S_IMODE(info.st_mode), path.read_bytes())
    except FileNotFoundError:  # gone since it was listed (a report just taken)
        return


def _root_of(bundle: Bundle, path: str) -> str | None:
    return next((root for root in bundle.roots
                 if path == root or path.startswith(root.rstrip("/") + "/")), None)


def unpack(bundle: Bundle, target: Path) -> dict[str, str]:
    """Write the bundle under ``target`` (made anew): each root as ``target/NAME``. The
    moves made (the controller's root → this host's), for :func:`moved`."""
    homes = xdg_homes()
    moves = {**{there: homes[var] for var, there in bundle.homes.items()
                if var in homes and there != "/"},
             **{root: str(target / _checked_name(name)) for root, name in bundle.roots.items()}}
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True, mode=0o700)
    for directory, mode in sorted(bundle.dirs.items()):
        here = Path(_moved_path(directory, moves, bundle))
        here.mkdir(parents=True, exist_ok=True)
        here.chmod(mode & 0o700 or 0o700)
    for path, (mode, data) in bundle.files.items():
        here = Path(_moved_path(path, moves, bundle))
        if here.suffix == ".json":
            data = _moved_json(data, moves)
        atomic_write_bytes(here, data, mode=mode & 0o700 or 0o600)
    for path, named in bundle.links.items():
        here = Path(_moved_path(path, moves, bundle))
        here.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        here.symlink_to(named)
    return moves


def _checked_name(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise BundleError(f"{name!r}: not a root's name")
    return name


def _moved_path(path: str, moves: Mapping[str, str], bundle: Bundle) -> str:
    """``path`` on this host, refused unless it lies under a root with nothing that
    climbs out of it."""
    root = _root_of(bundle, path)
    if root is None or ".." in PurePosixPath(path[len(root):]).parts:
        raise BundleError(f"{path!r}: not a path under the launch's roots")
    return moved(path, moves)


def moved(value: str, moves: Mapping[str, str]) -> str:
    """``value`` with the longest root it starts with replaced by that root's place here;
    each part of a ``:``-separated list (a ``PATH``) so; any other string as it is."""
    if os.pathsep in value:
        return os.pathsep.join(moved(part, moves) for part in value.split(os.pathsep))
    for root in sorted(moves, key=len, reverse=True):
        if value == root:
            return moves[root]
        if value.startswith(root.rstrip("/") + "/"):
            return moves[root] + value[len(root.rstrip("/")):]
    return value


def _moved_json(data: bytes, moves: Mapping[str, str]) -> bytes:
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return data
    return (json.dumps(_moved_value(document, moves), indent=2) + "\n").encode("utf-8")


def _moved_value(value: Any, moves: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return moved(value, moves)
    if isinstance(value, list):
        return [_moved_value(item, moves) for item in value]
    if isinstance(value, dict):
        return {moved(key, moves): _moved_value(item, moves) for key, item in value.items()}
    return value
