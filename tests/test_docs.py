"""The docs keep up with the code: every setting the config schema accepts is in
docs/configuration.md, every command of the CLI is in a command table, and every
relative link (and its anchor) in README.md and docs/ leads somewhere."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (a ``#`` comment there is no heading, a
    ``[x](y)`` there no link)."""
    return re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in ``text`` (``\\|`` is no cell border)."""
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            for line in prose(text).splitlines() if line.lstrip().startswith("|")]


# --- settings -------------------------------------------------------------------------

def _table_type(annotation: object) -> type | None:
    """The settings dataclass a field holds (``ClusterSettings | None`` too; for a table
    of named tables, ``roles``, the one each holds), else None."""
    for tp in (annotation, *typing.get_args(annotation)):
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return tp
    return None


def schema_keys() -> set[str]:
    """Every key a ``[projects.NAME]`` table accepts, read off the schema's dataclasses:
    ``key`` for the table's own keys, ``section.key`` for ``[projects.NAME.section]``."""
    from ralph_dev.core.config import ProjectSettings

    hints = typing.get_type_hints(ProjectSettings)
    keys: set[str] = set()
    for f in dataclasses.fields(ProjectSettings):
        if f.name == "name":
            continue  # the table's own name ([projects.NAME]), filled in, not a key
        section = _table_type(hints[f.name])
        if section is None:
            keys.add(f.name)
        else:
            keys |= {f"{f.name}.{g.name}" for g in dataclasses.fields(section)}
    return keys


def documented_keys() -> set[str]:
    """The keys docs/configuration.md's reference lists: a table row under
    ``## Reference`` whose first cell is one key in backticks."""
    text = CONFIGURATION.read_text()
    reference = re.search(r"^## Reference\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert reference, f"{CONFIGURATION}: no '## Reference' section"
    return {m.group(1) for row in table_rows(reference.group(1))
            if (m := re.fullmatch(r"`([a-z_]+(?:\.[a-z_]+)?)`", row[0]))}


def test_the_schema_walk_finds_what_the_parser_accepts() -> None:
    """The keys read off the dataclasses are the ones the config loader takes (its
    environment overrides are built from the same tables)."""
    from ralph_dev.core.config import setting_variables

    # [projects.NAME.roles.ROLE] and the top-level [accounts.NAME]: no variables
    named_tables = {"roles.cli", "roles.model", "accounts.reserve"}
    assert schema_keys() - named_tables == {
        ".".join(path) for path in setting_variables().values()}
    assert named_tables <= schema_keys()
    assert {"repo", "agent.runner", "merge.verified", "cluster.address",
            "costs.day_usd"} <= schema_keys()


def test_every_setting_is_documented_and_no_other() -> None:
    schema, documented = schema_keys(), documented_keys()
    assert not schema - documented, (
        f"settings missing from {CONFIGURATION.relative_to(ROOT)}'s reference: "
        f"{sorted(schema - documented)}")
    assert not documented - schema, (
        f"{CONFIGURATION.relative_to(ROOT)} documents settings the schema does not accept: "
        f"{sorted(documented - schema)}")


# --- commands -------------------------------------------------------------------------

def commands(group: click.Group | None = None, prefix: str = "") -> list[str]:
    """Every command and subcommand of ``ralph-dev``, as typed: ``issue add``, ``hook stop``."""
    if group is None:
        from ralph_dev.cli import main

        group = main
    found: list[str] = []
    for name, command in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        found.append(path)
        if isinstance(command, click.Group):
            found += commands(command, f"{path} ")
    return found


def test_the_cli_walk_finds_commands_and_subcommands() -> None:
    every = commands()
    assert {"init", "issue", "issue add", "service uninstall", "worker done",
            "hook stop-failure"} <= set(every)


def test_every_command_is_documented() -> None:
    """Each command heads a command table's row somewhere (``| `issue add PROJECT …` |``,
    several to a cell allowed), in README.md or docs/."""
    first_cells = " ".join(row[0] for page in pages() for row in table_rows(page.read_text())
                           if row)
    missing = [path for path in commands()
               if not re.search(r"`(?:ralph-dev )?" + re.escape(path) + r"(?![\w-])",
                                first_cells)]
    assert not missing, f"commands no command table in README.md or docs/ names: {missing}"


# --- links ----------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces → hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose(page.read_text()), flags=re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    """The targets of the page's Markdown links, code spans and blocks left out."""
    text = re.sub(r"`[^`\n]*`", "", prose(page.read_text()))
    return re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)


def test_every_relative_link_and_anchor_leads_somewhere() -> None:
    broken: list[str] = []
    for page in pages():
        for target in links(page):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # https://…, mailto:…: not ours to check
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_readme_links_every_docs_page() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_the_scripts_tests_and_benchmarks_named_exist() -> None:
    """``scripts/…``, ``tests/….py`` and ``benchmarks/….py`` named in the docs are there
    (the quick start's commands among them)."""
    named = {m for page in pages()
             for m in re.findall(r"(?<![\w/.])((?:scripts/[\w.-]+|(?:tests|benchmarks)/\w+\.py))",
                                 page.read_text())}
    assert {"scripts/setup.sh", "scripts/test.sh"} <= named
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, f"named in README.md or docs/ but not in the repository: {missing}"


# --- code paths -----------------------------------------------------------------------

PACKAGE = ROOT / "ralph_dev"
MODULE_PATH = re.compile(
    r"(?:ralph_dev/)?(?:core|control|adapters|agent|inpane|hosts|cli|devtools|plugin)/[\w./-]*")


def test_the_code_paths_named_exist() -> None:
    """A module or folder of the package named in a code span (``control/loop/act.py``,
    ``ralph_dev/core/decide/``) is where the docs say it is: code that moves takes its
    mentions along."""
    missing: list[str] = []
    for page in pages():
        for span in re.findall(r"`([^`\n]+)`", prose(page.read_text())):
            for word in span.split():
                m = MODULE_PATH.fullmatch(word.rstrip(".,:;)"))
                if m and not (PACKAGE / m.group(0).removeprefix("ralph_dev/")).exists():
                    missing.append(f"{page.relative_to(ROOT)}: {m.group(0)}")
    assert not missing, "named in README.md or docs/ but not in ralph_dev/:\n" + "\n".join(
        sorted(set(missing)))


def test_the_layout_table_names_files_that_are_there() -> None:
    """docs/architecture.md's table of folders: each file it names for a folder is in it,
    and every folder of the package has a row."""
    rows = {m.group(1): row[2] for row in table_rows((DOCS / "architecture.md").read_text())
            if len(row) == 3 and (m := re.fullmatch(r"`ralph_dev/(\w+)/`", row[0]))}
    folders = {p.name for p in PACKAGE.iterdir()
               if p.is_dir() and p.name not in {"__pycache__", "systemd"}}
    assert folders <= set(rows), f"folders without a row: {sorted(folders - set(rows))}"
    missing = [f"{folder}/: {name}" for folder, cell in rows.items()
               for name in re.findall(r"`([\w.]+\.(?:py|json|toml))`", cell)
               if not any((PACKAGE / folder).rglob(name))]
    assert not missing, f"named in the layout table but not in that folder: {missing}"
