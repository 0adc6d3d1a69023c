#!/usr/bin/env bash
# The test command: set up everything the tests need from nothing, lint, type-check, and
# run the whole suite (real tmux, real jj, real Claude Code against a scripted
# fake model), in parallel. Extra arguments go to pytest.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh --test
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/ralph-dev
export PATH="$ROOT/.venv/bin:$HOME/.local/bin:$PATH"
export RALPH_DEV_CLAUDE_BIN=${RALPH_DEV_CLAUDE_BIN:-$(ls "$CACHE"/claude-code-*/node_modules/.bin/claude 2>/dev/null | tail -n 1)}
export RALPH_DEV_LINEAR_SCHEMA=${RALPH_DEV_LINEAR_SCHEMA:-$ROOT/../shared/linear/schema.graphql}
ruff check .
mypy  # strict on ralph_dev/core, checked everywhere else (pyproject.toml [tool.mypy])
# Tests run in parallel (pytest-xdist): each has its own tmux server, repository, ports
# and XDG dirs, and most of their time is spent waiting on agents and tmux, so more
# workers than cores pays. RALPH_DEV_TEST_WORKERS=0 runs them in this process.
# The longest start first (tests/expected_durations.json). Each run records its tests'
# durations in .pytest_cache; after a full run, refresh the table from them with
# `.venv/bin/python scripts/durations.py`.
exec python -m pytest -q --durations=15 -n "${RALPH_DEV_TEST_WORKERS:-4}" --dist worksteal "$@"
