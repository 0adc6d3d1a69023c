"""``ralph-dev patterns``: what pattern learning has learned, and forgetting one strategy."""

from __future__ import annotations

from typing import Any

import click

from ralph_dev.adapters.pattern_store import (
    known_patterns,
    ledger_path,
    load_ledger,
    reset_pattern,
)
from ralph_dev.adapters.store import utcnow
from ralph_dev.cli import CliContext, echo_json, main, pass_ctx, project_argument
from ralph_dev.core.errors import RalphError
from ralph_dev.core.patterns import STRATEGY_NAME_RE, Standing, vocabulary


def _row(s: Standing) -> dict[str, Any]:
    return {"name": s.name, "state": s.state.value, "helpful_pct": round(100 * s.helpful_share),
            "observations": round(s.observations, 2), "helpful": round(s.helpful, 2),
            "harmful": round(s.harmful, 2), "weight": s.weight}


@main.command()
@project_argument
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--reset", "reset_name", metavar="NAME",
              help="Forget every observation of strategy NAME (it starts over as new).")
@pass_ctx
def patterns(cli: CliContext, project: str, as_json: bool, reset_name: str | None) -> None:
    """Show PROJECT's decomposition strategies: state, helpful share, (decayed)
    observations and the weight plan workers' prompts give them."""
    settings = cli.project(project)
    path = ledger_path(settings)
    if reset_name is not None:
        if not STRATEGY_NAME_RE.fullmatch(reset_name):
            raise RalphError(f"{reset_name[:60]!r} is not a strategy name (lowercase letters, "
                             "digits and '-'); `ralph-dev patterns PROJECT` lists them")
        if not reset_pattern(settings, reset_name):
            known = ", ".join(sorted(known_patterns(load_ledger(path)))) or "none yet"
            raise RalphError(f"{settings.name} has nothing learned about {reset_name!r} "
                             f"(strategies with observations: {known}); nothing was changed")
        click.echo(f"Forgot {reset_name}: its observations are gone; it starts over as new.")
        return
    ledger = load_ledger(path)
    rows = ledger.standings(utcnow())
    unobserved = sorted({s.name for s in vocabulary(settings.patterns.strategies)}
                        - {r.name for r in rows})
    if as_json:
        echo_json({"project": settings.name, "ledger": str(path),
                   "patterns": [_row(r) for r in rows], "unobserved": unobserved,
                   "pending_phases": sorted(ledger.phases)})
        return
    if rows:
        click.echo(f"{'NAME':<28} {'STATE':<12} {'HELPFUL':>7} {'OBSERVATIONS':>12} {'WEIGHT':>6}")
    for r in rows:
        click.echo(f"{r.name:<28} {r.state.value:<12} {round(100 * r.helpful_share):>5} % "
                   f"{r.observations:>12.1f} {r.weight:>6g}")
    if not rows:
        click.echo(f"Nothing learned yet for {settings.name}.")
    click.echo(f"Not observed yet: {', '.join(unobserved) or '-'}")
    if ledger.phases:
        click.echo(f"Phases waiting to settle: {', '.join(sorted(ledger.phases))}")
    click.echo(f"Ledger: {path}")
