"""The jj adapter put together: one repository's parts over one ``JjCli``.

Each part implements one port of ``core.ports`` and holds the repository's
single :class:`JjCli` (the one place a ``jj`` process starts) and its
:class:`JjHome` (ralph-dev's own workspaces in it) by composition:

========================  ===========================================  ==============
part                      what it does                                 port
========================  ===========================================  ==============
``JjWorkspaces``          add, list, snapshot, describe, diff, forget  ``Workspaces``
``JjMerger``              merge, prepare_merge, land                   ``Merger``
``JjTrunk``               check_repo, trunk_commit, the checkouts      ``Trunk``
``JjPublisher``           publish (pull-request mode)                  ``Publisher``
========================  ===========================================  ==============

The merger and the publisher share the guarded rebase (``JjRebase``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ralph_dev.adapters.jj_cli import JjCli
from ralph_dev.adapters.jj_home import JjHome
from ralph_dev.adapters.jj_merge import JjMerger, JjPublisher, JjRebase
from ralph_dev.adapters.jj_trunk import JjTrunk
from ralph_dev.adapters.jj_workspaces import JjWorkspaces

if TYPE_CHECKING:
    from ralph_dev.core.config import ProjectSettings


@dataclass(frozen=True)
class JjRepository:
    """One project's repository as ralph-dev uses it (the ``Repository`` of the ports)."""

    cli: JjCli
    home: JjHome
    workspaces: JjWorkspaces
    merger: JjMerger
    trunk: JjTrunk
    publisher: JjPublisher

    @classmethod
    def open(cls, repo: Path, workspace_root: Path, trunk: str = "main", *,
             jj_bin: str | None = None,
             user: tuple[str, str] = ("ralph-dev", "ralph-dev@localhost")) -> JjRepository:
        """The parts for ``repo``, whose workers' workspaces go under ``workspace_root``
        and whose changes merge into bookmark ``trunk``."""
        cli = JjCli(repo, workspace_root=workspace_root, jj_bin=jj_bin, user=user)
        home = JjHome(cli, workspace_root)
        on_trunk = JjTrunk(home, trunk)
        rebase = JjRebase(home, on_trunk)
        return cls(cli=cli, home=home, workspaces=JjWorkspaces(home, trunk),
                   merger=JjMerger(rebase), trunk=on_trunk, publisher=JjPublisher(rebase))

    @classmethod
    def from_settings(cls, settings: ProjectSettings) -> JjRepository:
        return cls.open(settings.repo, settings.workspaces, settings.trunk)
