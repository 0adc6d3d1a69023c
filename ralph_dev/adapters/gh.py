"""The GitHub CLI: opening the pull request of a pushed ``ralph/ISSUE`` bookmark.

Pull-request mode only. Title and body are argv elements (never a shell line);
a retried tick finds the pull request from the first try and takes its URL.
"""

from __future__ import annotations

from pathlib import Path

from ralph_dev.adapters.process import CommandFailed, CommandResult, run_command

GH_TIMEOUT = 120.0


class PullRequestFailed(CommandFailed):
    retryable = True


class Gh:
    """``gh`` run in the project's repository (it reads the remote from there)."""

    def __init__(self, gh_bin: str, repo: Path) -> None:
        self.gh_bin = gh_bin
        self.repo = repo

    def version(self) -> CommandResult:
        return run_command([self.gh_bin, "--version"], timeout=15)

    def open_pull_request(self, *, head: str, base: str, title: str,
                          body: str) -> tuple[str, bool]:
        """Open it, or find the one a retried tick opened: (what gh said of it, new?)."""
        argv = [self.gh_bin, "pr", "create", "--head", head, "--base", base,
                "--title", title[:250], "--body", body]
        result = run_command(argv, cwd=self.repo, timeout=GH_TIMEOUT)
        if not result.ok and "already exists" in result.stderr:
            return result.stderr.strip()[-300:], False  # gh names the existing one
        if not result.ok:
            raise PullRequestFailed(
                f"{head}: `gh pr create` failed (exit {result.returncode}): "
                f"{result.stderr.strip()[-500:]}; is gh installed and authenticated "
                "(gh auth status)?",
                command=result.argv, stderr=result.stderr, returncode=result.returncode,
            )
        lines = result.stdout.strip().splitlines()
        return (lines[-1] if lines else ""), True
