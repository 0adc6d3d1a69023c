#!/usr/bin/env bash
# Set up ralph-dev from a bare machine: jj (+ a git new enough for it),
# bubblewrap (apt; the workers' sandbox), a virtualenv in .venv with ralph-dev installed, and with --test the test
# extras, chromium + chromedriver (apt) and the pinned Claude Code CLI that
# the end-to-end tests drive.
# Idempotent: a second run only checks. Prints (on stdout) the PATH line to use.
set -euo pipefail
USER_PATH=$PATH
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
WITH_TEST=0
[ "${1:-}" = "--test" ] && WITH_TEST=1
SHARED=${RALPH_DEV_SHARED:-$ROOT/../shared}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/ralph-dev
CLAUDE_CODE_VERSION=2.1.197
CODEX_VERSION=0.171.0  # ralph_dev/core/agent_profiles.py pins the same (a test checks)
GEMINI_VERSION=0.61.0  # likewise
say() { printf 'setup: %s\n' "$*" >&2; }

# --- jj -------------------------------------------------------------------
export PATH="$HOME/.local/bin:$PATH"
if ! command -v jj >/dev/null 2>&1; then
  if [ -f "$SHARED/tools/install-jj.sh" ]; then
    say "installing jj with $SHARED/tools/install-jj.sh"
    bash "$SHARED/tools/install-jj.sh" "$HOME/.local/share/ralph-dev/jj" "$HOME/.local/bin"
  else
    say "jj is not installed: install jj >= 0.30 from your package manager (https://jj-vcs.github.io/jj/latest/install-and-setup/) and run this again"
    exit 1
  fi
fi
say "$(jj --version)"

# --- bubblewrap (every worker runs inside it: agent.sandbox = "bwrap") ------
if ! command -v bwrap >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    say "installing bubblewrap with apt-get (workers are confined by it)"
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bubblewrap >/dev/null; } \
      || say "could not install bubblewrap: install it, or set agent.sandbox = \"off\" (workers then run unconfined)"
  else
    say "bubblewrap (bwrap) is missing: install your distribution's bubblewrap package, or set agent.sandbox = \"off\" (workers then run unconfined)"
  fi
fi
command -v bwrap >/dev/null 2>&1 && say "$(bwrap --version)"

# --- Python package -------------------------------------------------------
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
if [ "$WITH_TEST" = 1 ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
else
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
fi
say "$(.venv/bin/ralph-dev --version)"

# --- chromium + chromedriver (the dashboard test drives a real headless browser) ---
if [ "$WITH_TEST" = 1 ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    say "installing chromium and chromium-driver with apt-get (for the dashboard test)"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null \
      || say "could not install chromium/chromium-driver: the dashboard test will fail until they are installed"
  else
    say "no apt-get: install chromium and its chromedriver yourself, or the dashboard test fails"
  fi
fi

# --- agent CLIs (pinned; the tests and the demo drive the real CLIs) -------
# npm_cli DIR PACKAGE@VERSION BIN WHAT-WITHOUT-IT: install into DIR once, say its version
npm_cli() {
  local dir=$1 package=$2 bin=$1/node_modules/.bin/$3 without=$4
  if [ ! -x "$bin" ]; then
    if command -v npm >/dev/null 2>&1; then
      say "installing $package into $dir"
      mkdir -p "$dir"
      (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "$package" >/dev/null)
    else
      say "npm not found: $package not installed ($without)"
    fi
  fi
  if [ -x "$bin" ]; then
    say "$3 $("$bin" --version) (ralph-dev finds it there)"
  fi
}
if [ "$WITH_TEST" = 1 ] || [ "${RALPH_DEV_WITH_CLAUDE:-1}" = 1 ]; then
  npm_cli "$CACHE/claude-code-$CLAUDE_CODE_VERSION" \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" claude \
    "the demo falls back to a scripted agent"
fi
if [ "$WITH_TEST" = 1 ] || [ "${RALPH_DEV_WITH_CODEX:-1}" = 1 ]; then
  npm_cli "$CACHE/codex-$CODEX_VERSION" "@openai/codex@$CODEX_VERSION" codex \
    "agent.cli = \"codex\" and its tests need it"
fi
if [ "$WITH_TEST" = 1 ] || [ "${RALPH_DEV_WITH_GEMINI:-1}" = 1 ]; then
  npm_cli "$CACHE/gemini-$GEMINI_VERSION" "@google/gemini-cli@$GEMINI_VERSION" gemini \
    "agent.cli = \"gemini\" and its tests need it"
fi

# --- the PATH line ---------------------------------------------------------
# ralph-dev is in .venv/bin, and jj may sit in a directory that is not on the
# caller's PATH (~/.local/bin): the line puts both first.
DIRS="$ROOT/.venv/bin"
JJ_DIR=$(dirname "$(command -v jj)")
case ":$USER_PATH:" in *":$JJ_DIR:"*) ;; *) DIRS="$DIRS:$JJ_DIR" ;; esac
say "done; to use ralph-dev and jj from your shell, add this line to ~/.profile (or ~/.bashrc):"
printf 'export PATH="%s:$PATH"\n' "$DIRS"
