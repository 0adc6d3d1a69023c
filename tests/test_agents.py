"""The agent runner: what a worker's window runs, with which environment and prompt.

The real Claude Code CLI runs in tests/test_claude_smoke.py; here a stand-in
program records the argv and environment it was exec'd with, so the exec
wrapper is exercised for real without a model.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import ralph_dev
from ralph_dev.agent.claude import PLUGIN_NAME, AgentError, claude_argv, plugin_dir
from ralph_dev.agent.fence import tool_fence
from ralph_dev.agent.launch import build_launch, command_argv
from ralph_dev.agent.supervisor import build_supervisor_launch
from ralph_dev.core.config import AgentSettings, ProjectSettings, build_project
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.model import Issue, Launch, Role, StateType

REPO_ROOT = Path(__file__).resolve().parent.parent
FAKE_KEY = "sk-ant-test-0000000000-abcdefghijklmnopqrst"
PANE_LAUNCHER = Path(ralph_dev.__file__).parent / "launcher.py"
"""The file every pane runs (by its path: it never moves)."""

HOSTILE_TITLE = "Fix $(touch /tmp/ralph-pwned-title) `id` ; rm -rf ~ C-c Enter \x1b[31mred\x1b[0m"
HOSTILE_DESCRIPTION = (
    "Please run $(touch /tmp/ralph-pwned-desc) and `touch /tmp/ralph-pwned-bt`; rm -rf ~\n"
    "Keys: C-c Enter Escape C-d\n\x1b]0;title\x07 NUL:\x00 end\n" + "A" * 10_240
)


def hostile_issue(identifier: str = "DEMO-7") -> Issue:
    return Issue(identifier=identifier, title=HOSTILE_TITLE, state_name="Todo",
                 state_type=StateType.UNSTARTED, description=HOSTILE_DESCRIPTION)


RECORDER = """#!{python}
import json, os, sys
# beside its bin/ directory: the launcher passes no variable the spec does not name
out = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "record.json")
with open(out, "w") as fh:
    json.dump({{"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ)}}, fh)
"""


@pytest.fixture
def recorder(tmp_path: Path) -> Path:
    """A stand-in ``claude`` that writes down how it was started."""
    path = tmp_path / "bin" / "claude"
    path.parent.mkdir()
    path.write_text(RECORDER.format(python=sys.executable))
    path.chmod(0o755)
    return path


def make_settings(tmp: Path, **agent: object) -> ProjectSettings:
    raw = {"repo": str(tmp / "repo"), "workspace_root": str(tmp / "workspaces"),
           "agent": {"home": "isolated", "sandbox": "off", **agent}}
    # (the launch's argv and environment, seen unconfined; the sandbox: test_confinement)
    return build_project("demo", raw)


def workspace_for(settings: ProjectSettings, identifier: str) -> Path:
    path = settings.workspaces / identifier
    path.mkdir(parents=True, exist_ok=True)
    return path


def every_string(launch: Launch) -> str:
    """Everything a shell or tmux could ever see of this launch."""
    parts = [*launch.argv, str(launch.cwd), *launch.env.keys(), *launch.env.values()]
    if launch.spec_file is not None:
        parts.append(launch.spec_file.read_text())
    return "\n".join(parts)


# --- nothing from the issue reaches argv, env or a shell ------------------------------


@pytest.mark.parametrize("runner", ["claude", "command"])
def test_issue_text_never_reaches_argv_env_or_spec(xdg: Path, recorder: Path, runner: str) -> None:
    agent = {"claude_bin": str(recorder)}
    if runner == "command":
        agent = {"runner": "command",
                 "command": "my-agent --issue {issue} --role {role} --prompt {prompt_file}"}
    settings = make_settings(xdg, **agent)
    issue = hostile_issue()
    launch = build_launch(settings, issue, Role.EXECUTE, workspace_for(settings, "DEMO-7"),
                          "sonnet", attempt=1)
    seen = every_string(launch)
    for fragment in ("touch /tmp", "rm -rf", "`id`", "C-c Enter", "\x1b", "AAAAAAAAAA", "Fix $("):
        assert fragment not in seen, fragment
    # … while the prompt file carries it, as data
    prompt = launch.prompt_file.read_text()
    assert "$(touch /tmp/ralph-pwned-title) `id` ; rm -rf ~ C-c Enter" in prompt
    assert "A" * 10_240 in prompt


def test_prompt_file_is_private_and_opens_with_the_worker_preamble(xdg: Path,
                                                                   recorder: Path) -> None:
    settings = make_settings(xdg, claude_bin=str(recorder))
    launch = build_launch(settings, hostile_issue(), Role.REVIEW,
                          workspace_for(settings, "DEMO-7"), "opus", attempt=2,
                          feedback="Please also cover $(whoami) \x1b[2J")
    mode = stat.S_IMODE(launch.prompt_file.stat().st_mode)
    assert mode == 0o600
    assert stat.S_IMODE(launch.prompt_file.parent.stat().st_mode) == 0o700
    assert launch.prompt_file.parent == settings.paths.prompts_dir
    text = launch.prompt_file.read_text()
    assert text.startswith("You are ONE ralph-dev worker of project demo, started for ONE "
                           "issue: DEMO-7. Your role: review.")
    preamble = text.split("===== BEGIN ISSUE DATA")[0]
    assert "Do not orchestrate" in preamble and "subagents" in preamble
    assert "Report ONLY through `ralph-dev worker …`" in preamble
    assert "ralph-dev:ralph-dev-review" in preamble
    assert "Attempt: 2." in preamble and "Earlier attempts did not finish" in preamble
    # the issue and the feedback are fenced with a token that the data does not contain
    begin = [line for line in text.splitlines() if line.startswith("===== BEGIN ISSUE DATA")]
    assert len(begin) == 1
    token = begin[0].split()[-2]
    assert f"===== END ISSUE DATA {token} =====" in text
    assert f"===== BEGIN FEEDBACK DATA {token} =====" in text
    assert "Please also cover $(whoami) \\x1b[2J" in text
    # control characters are shown, not sent to a terminal
    assert "\x1b" not in text and "\x00" not in text and "\x07" not in text
    assert "\\x1b[31mred\\x1b[0m" in text


def test_huge_description_is_capped_below_the_argv_element_limit(xdg: Path,
                                                                  recorder: Path) -> None:
    settings = make_settings(xdg, claude_bin=str(recorder))
    issue = Issue(identifier="DEMO-8", title="big", state_name="Todo",
                  state_type=StateType.UNSTARTED, description="é" * 200_000)
    launch = build_launch(settings, issue, Role.EXECUTE, workspace_for(settings, "DEMO-8"),
                          "sonnet", attempt=1)
    data = launch.prompt_file.read_bytes()
    assert len(data) < 128 * 1024 - 1
    assert b"more bytes not shown" in data


# --- the exec wrapper, for real ------------------------------------------------------------


def run_launch(launch: Launch, record_to: Path, **extra_env: str) -> dict:
    """Run a launch as its pane would; ``record_to`` is where the recorder writes (its
    bin/ directory's parent), ``extra_env`` what the pane inherits besides."""
    env = {**launch.env, "UNRELATED_INHERITED": "from-the-tmux-server", **extra_env}
    proc = subprocess.run(launch.argv, env=env, cwd=launch.cwd, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(record_to.read_text())
    assert "UNRELATED_INHERITED" not in got["env"]  # only what the spec names
    return got


def test_exec_wrapper_passes_the_prompt_as_one_argv_element(
        xdg: Path, recorder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    settings = make_settings(xdg, claude_bin=str(recorder), extra_args=["--verbose"])
    workspace = workspace_for(settings, "DEMO-7")
    launch = build_launch(settings, hostile_issue(), Role.EXECUTE, workspace, "sonnet",
                          attempt=1)
    assert launch.argv == [sys.executable, "-I", "-S", str(PANE_LAUNCHER),
                           str(launch.spec_file)]
    # tmux hands a new pane the PATH of the tmux client, not the one asked for:
    # the wrapper restores the launch's PATH (ralph-dev and jj's git first).
    got = run_launch(launch, tmp_path / "record.json", CLAUDECODE="1",
                     CLAUDE_CODE_ENTRYPOINT="cli", CLAUDE_CODE_CHILD_SESSION="1",
                     CLAUDE_CODE_SESSION_ID="0f8e", PATH="/usr/bin:/bin")
    argv = got["argv"]
    assert argv[0] == str(recorder)
    assert argv[-2] == "--"
    assert argv[-1] == launch.prompt_file.read_text()
    assert argv[argv.index("--model") + 1] == "sonnet"
    assert argv[argv.index("--plugin-dir") + 1] == str(plugin_dir())
    assert argv[argv.index("--permission-mode") + 1] == "dontAsk"
    assert "--verbose" in argv[: argv.index("--")]
    assert "--dangerously-skip-permissions" not in argv
    assert Path(got["cwd"]) == workspace
    env = got["env"]
    for nested in ("CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_CODE_CHILD_SESSION",
                   "CLAUDE_CODE_SESSION_ID"):
        assert nested not in env, nested
    assert env["ANTHROPIC_API_KEY"] == FAKE_KEY
    assert env["RALPH_DEV_ISSUE"] == "DEMO-7"
    assert env["PATH"] == launch.env["PATH"] != "/usr/bin:/bin"
    assert not (Path("/tmp/ralph-pwned-title").exists() or Path("/tmp/ralph-pwned-desc").exists())


def test_the_controllers_verify_gets_what_worker_dones_verify_had(
        xdg: Path, recorder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27: the verified merge lane ran the verify command without the worker's
    variables. Both sites now build it with one function, from the same agent environment:
    the worker's (as its pane's launcher gives it, plus what a Claude session sets for its
    shells) and the controller's rebuilt copy are equal, variable for variable."""
    from ralph_dev.agent.launch import verify_env
    from ralph_dev.core.environment import verify_environment, worker_identity

    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    monkeypatch.setenv("RALPH_DEV_LOG_LEVEL", "INFO")
    settings = make_settings(xdg, claude_bin=str(recorder))
    workspace = workspace_for(settings, "DEMO-7")
    launch = build_launch(settings, hostile_issue(), Role.RESOLVE, workspace, "sonnet",
                          attempt=2)
    secrets = json.loads(launch.spec_file.with_suffix(".secrets.json").read_text())
    in_the_worker = {**launch.env, **secrets, "TERM": "tmux-256color", "CLAUDECODE": "1",
                     "CLAUDE_CODE_ENTRYPOINT": "cli"}
    at_done = verify_environment(in_the_worker, project="demo", identity=worker_identity(
        issue="DEMO-7", role="resolve", workspace=str(workspace), attempt=2))
    at_merge = verify_env(settings, workspace, issue="DEMO-7", role=Role.RESOLVE, attempt=2)
    assert at_merge == at_done
    assert at_merge["RALPH_DEV_ISSUE"] == "DEMO-7" and at_merge["RALPH_DEV_ATTEMPT"] == "2"
    assert at_merge["RALPH_DEV_ROLE"] == "resolve" and at_merge["RALPH_DEV_PROJECT"] == "demo"
    assert at_merge["RALPH_DEV_WORKSPACE"] == str(workspace)
    assert at_merge["HOME"] == launch.env["HOME"] and at_merge["PATH"] == launch.env["PATH"]
    assert "ANTHROPIC_API_KEY" not in at_merge and "RALPH_DEV_RUN_DIR" not in at_merge
    trunk = verify_env(settings, settings.repo, issue=None)
    assert "RALPH_DEV_ISSUE" not in trunk and trunk["RALPH_DEV_PROJECT"] == "demo"


@pytest.mark.parametrize("pane", [
    [sys.executable, "-I", "-S", str(PANE_LAUNCHER)],
    # what windows opened by an older ralph-dev run (a respawned pane runs it again)
    [sys.executable, "-P", "-m", "ralph_dev.launcher"],
], ids=["by-path", "as-module"])
def test_exec_wrapper_reports_a_missing_spec(tmp_path: Path, pane: list[str]) -> None:
    proc = subprocess.run([*pane, str(tmp_path / "gone.json")], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "launch spec" in proc.stderr and "gone.json" in proc.stderr


# --- the environment -----------------------------------------------------------------------


def test_worker_environment(xdg: Path, recorder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    monkeypatch.setenv("LINEAR_API_KEY", "lin_api_test_0000")  # the controller's alone
    monkeypatch.setenv("RALPH_DEV_LINEAR_WEBHOOK_SECRET", "whsec-controller-only")
    monkeypatch.setenv("RALPH_DEV_WEB_TOKEN", "web-token-the-daemons-alone")
    monkeypatch.setenv("RALPH_DEV_LOG_LEVEL", "INFO")
    monkeypatch.setenv("UNRELATED_SECRET", "nope")
    settings = make_settings(xdg, claude_bin=str(recorder))
    workspace = workspace_for(settings, "DEMO-7")
    config = xdg / "config" / "ralph-dev" / "config.toml"
    launch = build_launch(settings, hostile_issue(), Role.PLAN, workspace, "opus", attempt=3,
                          config_path=config)
    env = launch.env
    assert env["RALPH_DEV_PROJECT"] == "demo"
    assert env["RALPH_DEV_ISSUE"] == "DEMO-7"
    assert env["RALPH_DEV_ROLE"] == "plan"
    assert env["RALPH_DEV_WORKSPACE"] == str(workspace)
    assert env["RALPH_DEV_ATTEMPT"] == "3"
    # our iteration cap, not Claude Code's default of 8 blocks, ends the Ralph loop
    assert env["CLAUDE_CODE_STOP_HOOK_BLOCK_CAP"] == str(settings.agent.iteration_cap + 1)
    assert env["RALPH_DEV_CONFIG"] == str(config)
    assert env["RALPH_DEV_LOG_LEVEL"] == "INFO"
    for var in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"):
        assert env[var] == os.environ[var]
    # the key reaches the agent only through a 0600 file the wrapper reads and deletes:
    # never as `tmux -e` (visible in ps), argv, the spec or the prompt
    assert "ANTHROPIC_API_KEY" not in env
    secrets_file = launch.spec_file.with_suffix(".secrets.json")
    assert json.loads(secrets_file.read_text()) == {"ANTHROPIC_API_KEY": FAKE_KEY}
    assert "whsec-controller-only" not in json.dumps(env) + secrets_file.read_text()
    assert "web-token-the-daemons-alone" not in json.dumps(env) + secrets_file.read_text()
    assert secrets_file.stat().st_mode & 0o777 == 0o600
    assert "UNRELATED_SECRET" not in env
    for flag in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY",
                 "DISABLE_AUTOUPDATER"):
        assert env[flag] == "1"
    assert env["HOME"] == str(settings.paths.worker_dir("DEMO-7") / "home")
    # ralph-dev (for hooks and worker commands) comes first, and is THIS installation's
    first = env["PATH"].split(os.pathsep)[0]
    link = Path(first) / "ralph-dev"
    assert link.resolve() == Path(sys.executable).with_name("ralph-dev").resolve()
    assert sorted(p.name for p in Path(first).iterdir()) == ["ralph-dev"]
    # the git that works with jj precedes the system one
    from ralph_dev.adapters.jj_cli import find_jj

    jj = find_jj()
    if jj and (Path(os.path.realpath(jj)).parent / "git").exists():
        entries = env["PATH"].split(os.pathsep)
        assert entries.index(str(Path(os.path.realpath(jj)).parent)) < entries.index("/usr/bin")
    # the secret is in the environment only: not in argv, the spec or the prompt
    assert FAKE_KEY not in " ".join(launch.argv)
    assert launch.spec_file is not None and FAKE_KEY not in launch.spec_file.read_text()
    assert FAKE_KEY not in launch.prompt_file.read_text()
    assert FAKE_KEY not in repr(launch)


def test_user_home_mode_keeps_home_and_only_adds_trust(xdg: Path, recorder: Path,
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "person"
    home.mkdir()
    original = {"hasCompletedOnboarding": True, "oauthAccount": {"email": "p@example.com"},
                "projects": {"/elsewhere": {"hasTrustDialogAccepted": False, "x": 1}}}
    (home / ".claude.json").write_text(json.dumps(original))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    settings = make_settings(xdg, claude_bin=str(recorder), home="user")
    launch = build_launch(settings, hostile_issue(), Role.EXECUTE,
                          workspace_for(settings, "DEMO-7"), "sonnet", attempt=1)
    assert launch.env["HOME"] == str(home)
    data = json.loads((home / ".claude.json").read_text())
    assert data["oauthAccount"] == original["oauthAccount"]
    assert data["projects"]["/elsewhere"] == original["projects"]["/elsewhere"]
    assert data["projects"][str(settings.workspaces)]["hasTrustDialogAccepted"] is True
    # the key handed to ralph-dev is approved, so claude does not ask about it
    assert data["customApiKeyResponses"]["approved"] == [FAKE_KEY[-20:]]


def test_a_key_a_person_rejected_stays_rejected(xdg: Path, recorder: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "person"
    home.mkdir()
    responses = {"approved": [], "rejected": [FAKE_KEY[-20:]]}
    (home / ".claude.json").write_text(json.dumps({"customApiKeyResponses": responses}))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    settings = make_settings(xdg, claude_bin=str(recorder), home="user")
    build_launch(settings, hostile_issue(), Role.EXECUTE, workspace_for(settings, "DEMO-7"),
                 "sonnet", attempt=1)
    data = json.loads((home / ".claude.json").read_text())
    assert data["customApiKeyResponses"] == responses


def test_isolated_home_is_seeded_and_seeding_is_idempotent(xdg: Path, recorder: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    settings = make_settings(xdg, claude_bin=str(recorder))
    build_launch(settings, hostile_issue(), Role.EXECUTE, workspace_for(settings, "DEMO-7"),
                 "sonnet", attempt=1)
    path = settings.paths.worker_dir("DEMO-7") / "home" / ".claude.json"
    data = json.loads(path.read_text())
    assert data["hasCompletedOnboarding"] is True
    assert data["projects"][str(settings.workspaces)]["hasTrustDialogAccepted"] is True
    assert data["customApiKeyResponses"]["approved"] == [FAKE_KEY[-20:]]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    before = path.stat().st_mtime_ns, path.stat().st_ino
    # a second worker in the same root: already as wanted, nothing written
    build_launch(settings, hostile_issue("DEMO-9"), Role.EXECUTE,
                 workspace_for(settings, "DEMO-9"), "sonnet", attempt=1)
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before


def test_a_broken_claude_json_of_a_person_is_reported_not_replaced(
        xdg: Path, recorder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "person"
    home.mkdir()
    (home / ".claude.json").write_text("{not json")
    monkeypatch.setenv("HOME", str(home))
    settings = make_settings(xdg, claude_bin=str(recorder), home="user")
    with pytest.raises(AgentError, match=r"\.claude\.json is not readable JSON"):
        build_launch(settings, hostile_issue(), Role.EXECUTE, workspace_for(settings, "DEMO-7"),
                     "sonnet", attempt=1)
    assert (home / ".claude.json").read_text() == "{not json"


def test_missing_claude_is_a_clear_error(xdg: Path) -> None:
    settings = make_settings(xdg, claude_bin="claude-does-not-exist-here")
    with pytest.raises(AgentError, match=r"not on the worker's PATH nor installed by"):
        build_launch(settings, hostile_issue(), Role.EXECUTE, workspace_for(settings, "DEMO-7"),
                     "sonnet", attempt=1)
    settings = make_settings(xdg, claude_bin="/nowhere/claude")
    with pytest.raises(AgentError, match="is not an executable file"):
        build_launch(settings, hostile_issue(), Role.EXECUTE, workspace_for(settings, "DEMO-7"),
                     "sonnet", attempt=1)


def test_agent_home_setting_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"agent\.home: expected 'user' or 'isolated'"):
        build_project("demo", {"repo": "/tmp/r", "agent": {"home": "/root"}})
    assert AgentSettings().home == "user"


# --- the tool fence --------------------------------------------------------------------------


@pytest.mark.parametrize("role", list(Role))
def test_tool_fence_per_role(role: Role) -> None:
    fence = tool_fence(role, Path("/ws/DEMO-1"))
    argv = claude_argv("claude", role, "sonnet", plugin=Path("/p"), workspace=Path("/ws/DEMO-1"))
    offered = argv[argv.index("--tools") + 1].split(",")
    allowed = argv[argv.index("--allowedTools") + 1].split(",")
    denied = argv[argv.index("--disallowedTools") + 1].split(",")
    assert offered == list(fence.tools) and allowed == list(fence.allowed)
    assert {"Bash", "Read", "Skill"} <= set(offered)
    assert "Agent" in denied and "Agent" not in offered
    # offered, never pre-approved: the PreToolUse hook turns it into a question on the issue
    # (and dontAsk denies it should the hook not answer)
    assert "AskUserQuestion" in offered
    assert "AskUserQuestion" not in allowed and "AskUserQuestion" not in denied
    edits = {"Edit", "Write", "NotebookEdit"}
    if role in (Role.EXECUTE, Role.RESOLVE):
        assert edits <= set(offered) and not edits & set(denied)
        # pre-approved only in its own workspace and /tmp: a bare Write allows any path
        assert not edits & set(allowed)
        assert {"Edit(//ws/DEMO-1/**)", "Write(//ws/DEMO-1/**)", "Edit(//tmp/**)"} <= set(allowed)
    else:
        assert not edits & set(offered) and not edits & set(allowed) and edits <= set(denied)
    assert argv[argv.index("--permission-mode") + 1] == "dontAsk"
    assert argv[-1] == "--"


# --- the command runner ------------------------------------------------------------------------


def test_command_runner_fills_placeholders_inside_single_words(xdg: Path, tmp_path: Path,
                                                               recorder: Path) -> None:
    odd_root = tmp_path / "work spaces $(x) `y`"
    raw = {"repo": str(tmp_path / "repo"), "workspace_root": str(odd_root),
           "agent": {"runner": "command", "sandbox": "off", "command":
                     f"{recorder} --issue {{issue}} --role={{role}} --cwd {{workspace}} "
                     "'--prompt-file={prompt_file}' 'two words' {issue}-{role}"}}
    settings = build_project("demo", raw)
    workspace = workspace_for(settings, "DEMO-7")
    launch = build_launch(settings, hostile_issue(), Role.RESEARCH, workspace, "sonnet",
                          attempt=1)
    expected = [
        str(recorder), "--issue", "DEMO-7", "--role=research", "--cwd", str(workspace),
        f"--prompt-file={launch.prompt_file}", "two words", "DEMO-7-research",
    ]
    assert launch.spec_file is not None
    assert json.loads(launch.spec_file.read_text())["argv"] == expected
    assert launch.argv == [sys.executable, "-I", "-S", str(PANE_LAUNCHER),
                           str(launch.spec_file)]
    assert launch.cwd == workspace
    assert launch.env["RALPH_DEV_ROLE"] == "research"
    # and through the exec wrapper, exactly that argv runs (no prompt appended)
    got = run_launch(launch, tmp_path / "record.json")
    assert got["argv"] == expected
    assert Path(got["cwd"]) == workspace


@pytest.mark.parametrize(("template", "message"), [
    ("agent {nope}", "unknown placeholder {nope}"),
    ("agent 'unbalanced", "cannot be split into words"),
    ("   ", "agent.command is empty"),
])
def test_command_runner_bad_templates(template: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        command_argv(template, {"issue": "DEMO-1", "role": "execute", "workspace": "/w",
                                "prompt_file": "/p"})


def test_placeholder_values_are_never_re_expanded() -> None:
    argv = command_argv("a {workspace} {issue}", {"issue": "DEMO-1", "role": "execute",
                                                  "workspace": "/w/{issue} $(x)",
                                                  "prompt_file": "/p"})
    assert argv == ["a", "/w/{issue} $(x)", "DEMO-1"]


# --- the plugin: skills and hooks --------------------------------------------------------------


def front_matter(path: Path) -> dict[str, str]:
    text = path.read_text()
    assert text.startswith("---\n"), path
    head = text.split("---\n")[1]
    out = {}
    for line in head.splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


SKILLS = [f"ralph-dev-{r.value}" for r in Role] + ["ralph-dev-supervisor"]


def test_plugin_has_a_skill_per_role_and_its_hooks() -> None:
    root = plugin_dir()
    manifest = json.loads((root / ".claude-plugin" / "plugin.json").read_text())
    assert manifest["name"] == PLUGIN_NAME == "ralph-dev"
    for name in SKILLS:
        skill = root / "skills" / name / "SKILL.md"
        meta = front_matter(skill)
        assert meta["name"] == name
        assert len(meta["description"]) > 40
        body = skill.read_text()
        assert "research" in body.lower() and "last resort" in body.lower()
        if name != "ralph-dev-supervisor":
            assert "ralph-dev worker done $RALPH_DEV_ISSUE --summary" in body
            assert "ralph-dev worker blocked $RALPH_DEV_ISSUE --question" in body
            assert "subagents" in body
    assert "ralph-dev worker plan $RALPH_DEV_ISSUE --file" in (
        root / "skills" / "ralph-dev-plan" / "SKILL.md").read_text()
    supervisor = (root / "skills" / "ralph-dev-supervisor" / "SKILL.md").read_text()
    assert "never edit" in supervisor.lower() or "never change" in supervisor.lower()
    hooks = json.loads((root / "hooks" / "hooks.json").read_text())["hooks"]
    commands = {event: [h["command"] for entry in entries for h in entry["hooks"]]
                for event, entries in hooks.items()}
    assert commands == {
        "SessionStart": ["ralph-dev hook session-start"],
        "PostToolUse": ["ralph-dev hook post-tool-use"],
        "Stop": ["ralph-dev hook stop"],
        "StopFailure": ["ralph-dev hook stop-failure"],
        # what the agent does now (issue 13 item 1): its own account, not the pane's
        "UserPromptSubmit": ["ralph-dev hook state"],
        "PreToolUse": ["ralph-dev hook state", "ralph-dev hook ask-user-question"],
        # an idle agent's question goes to a person (issue 24 item 5)
        "Notification": ["ralph-dev hook state"],
        "SessionEnd": ["ralph-dev hook state"],
    }
    assert hooks["PostToolUse"][0]["matcher"] == "Edit|Write|Bash|MultiEdit"
    # nobody in a worker can answer AskUserQuestion's picker: its question is posted
    assert hooks["PreToolUse"][1]["matcher"] == "AskUserQuestion"


def test_repository_root_is_the_same_plugin() -> None:
    for name in ("skills", "hooks", ".claude-plugin"):
        assert (REPO_ROOT / name).resolve() == (plugin_dir() / name).resolve(), name
    assert (REPO_ROOT / "skills" / "ralph-dev-execute" / "SKILL.md").is_file()


@pytest.mark.slow
def test_a_built_wheel_ships_the_plugin_and_finds_it(tmp_path: Path) -> None:
    """Build a wheel from a copy of the checkout; the unpacked wheel must locate its plugin."""
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns(".git", "*.egg-info", "build", "dist", "__pycache__",
                                    ".pytest_cache", ".ruff_cache", ".hypothesis", "node_modules")
    shutil.copytree(REPO_ROOT, source, symlinks=True, ignore=ignore)
    out = tmp_path / "wheel"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                           str(out), str(source)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("ralph_dev-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    expected = {"ralph_dev/plugin/.claude-plugin/plugin.json",
                "ralph_dev/plugin/hooks/hooks.json",
                *(f"ralph_dev/plugin/skills/{s}/SKILL.md" for s in SKILLS)}
    assert expected <= names, sorted(expected - names)
    probe = subprocess.run(
        [sys.executable, "-c",
         "from ralph_dev.agent.claude import plugin_dir; print(plugin_dir())"],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, cwd=tmp_path,
        capture_output=True, text=True, timeout=60, check=False)
    assert probe.returncode == 0, probe.stderr
    found = Path(probe.stdout.strip())
    assert found == (tmp_path / "site" / "ralph_dev" / "plugin").resolve()
    assert (found / "skills" / "ralph-dev-execute" / "SKILL.md").is_file()


def test_invalid_identifier_is_refused_before_anything_is_written(xdg: Path,
                                                                  recorder: Path) -> None:
    settings = make_settings(xdg, claude_bin=str(recorder))
    bad = Issue(identifier="../x", title="t", state_name="Todo", state_type=StateType.UNSTARTED)
    with pytest.raises(Exception, match="is not an issue identifier"):
        build_launch(settings, bad, Role.EXECUTE, workspace_for(settings, "DEMO-1"), "sonnet",
                     attempt=1)
    assert not settings.paths.prompts_dir.exists()


# --- the fake Anthropic API the smoke test drives Claude Code with ----------------------------


def _post(url: str, body: dict, key: str = FAKE_KEY) -> tuple[str, str]:
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",  # noqa: S310
                                     headers={"content-type": "application/json",
                                              "x-api-key": key})
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
        return response.headers.get("content-type", ""), response.read().decode()


def test_fake_api_streams_scripted_turns_and_records_requests() -> None:
    import urllib.request

    from ralph_dev.devtools.scripted_model import FakeAnthropic, ScriptedWorker, Text, ToolUse, bash

    brain = ScriptedWorker({"DEMO-3": [bash("touch a"), [Text("editing"), ToolUse("Edit", {})]]},
                           final_text="bye")
    tools = [{"name": "Bash"}, {"name": "Edit"}]
    with FakeAnthropic(brain) as api:
        with urllib.request.urlopen(api.url + "/", timeout=10) as response:  # noqa: S310
            assert json.loads(response.read()) == {}
        first = {"model": "m", "stream": True, "tools": tools, "system": "sys",
                 "messages": [{"role": "user", "content": "work on DEMO-3"}]}
        kind, body = _post(api.url + "/v1/messages?beta=true", first)
        assert kind.startswith("text/event-stream")
        events = [line.split(": ", 1)[1] for line in body.splitlines()
                  if line.startswith("event: ")]
        assert events == ["message_start", "content_block_start", "content_block_delta",
                          "content_block_stop", "message_delta", "message_stop"]
        data = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
        assert data[1]["content_block"]["name"] == "Bash"
        assert json.loads(data[2]["delta"]["partial_json"]) == {"command": "touch a",
                                                                  "description": "scripted step"}
        assert data[4]["delta"]["stop_reason"] == "tool_use"
        # the next turn (one tool use so far) plays step two, as plain JSON when not streamed
        second = dict(first, stream=False, messages=[
            *first["messages"],
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash",
                                               "input": {"command": "touch a"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": "done"}]},
        ])
        kind, body = _post(api.url + "/v1/messages", second)
        message = json.loads(body)
        assert [b["type"] for b in message["content"]] == ["text", "tool_use"]
        assert message["stop_reason"] == "tool_use"
        # side calls (no Bash offered) get a short text; count_tokens answers plausibly
        _, body = _post(api.url + "/v1/messages", {"model": "haiku", "messages": [
            {"role": "user", "content": "title for DEMO-3"}]})
        assert json.loads(body)["content"] == [{"type": "text", "text": "ok"}]
        _, body = _post(api.url + "/v1/messages/count_tokens", first)
        assert json.loads(body)["input_tokens"] > 0
        assert len(api.messages()) == 3 and len(api.main_messages()) == 2
        assert all("x-api-key" not in r.headers for r in api.requests)
        assert api.errors == []


def test_claude_env_refuses_a_claude_of_another_version(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from claude_env import CLAUDE_CODE_VERSION, ClaudeUnavailable, find_claude

    fake = tmp_path / "claude"
    fake.write_text("#!/bin/sh\necho '1.0.0 (Claude Code)'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("RALPH_DEV_CLAUDE_BIN", str(fake))
    with pytest.raises(ClaudeUnavailable, match=r"reports version 1\.0\.0"):
        find_claude(allow_install=False)
    fake.write_text(f"#!/bin/sh\necho '{CLAUDE_CODE_VERSION} (Claude Code)'\n")
    assert find_claude(allow_install=False) == str(fake)


def test_only_the_supervisor_holds_the_tracker_key(xdg: Path, recorder: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25: in Linear mode a worker gets no tracker key (the controller relays every
    write); the supervisor, which reads the tracker through people's commands, does, and
    only through the launcher's 0600 file. No configuration hands it to workers."""
    monkeypatch.setenv("LINEAR_API_KEY", "lin_api_sentinel_25")
    monkeypatch.setenv("RALPH_DEV_WEB_TOKEN", "web-token-sentinel-25")
    raw = {"repo": str(xdg / "repo"), "workspace_root": str(xdg / "workspaces"),
           "tracker": {"kind": "linear", "linear_project": "Alpha"},
           "agent": {"home": "isolated", "sandbox": "off", "claude_bin": str(recorder)}}
    settings = build_project("demo", raw)
    (xdg / "repo").mkdir()
    worker = build_launch(settings, hostile_issue(), Role.EXECUTE,
                          workspace_for(settings, "DEMO-7"), "sonnet", attempt=1)
    supervisor = build_supervisor_launch(settings, "status", reason="crash loop")
    for launch in (worker, supervisor):
        assert launch.spec_file is not None
        held = every_string(launch)
        secrets = launch.spec_file.with_suffix(".secrets.json")
        if secrets.exists():
            held += secrets.read_text()
        assert "web-token-sentinel-25" not in held
        assert ("lin_api_sentinel_25" in held) is (launch is supervisor)
        assert "lin_api_sentinel_25" not in every_string(launch)  # never in argv or the spec
    for name in ("LINEAR_API_KEY", "RALPH_DEV_WEB_TOKEN", "RALPH_DEV_LINEAR_WEBHOOK_SECRET"):
        raw["agent"] = {"pass_env": [name]}
        with pytest.raises(ConfigError, match=f"agent.pass_env: {name} is the controller's"):
            build_project("demo", raw)


def test_supervisor_launch(xdg: Path, recorder: Path, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RALPH_DEV_ISSUE", "DEMO-1")  # e.g. started from inside a worker
    settings = make_settings(xdg, claude_bin=str(recorder))
    (xdg / "repo").mkdir()
    launch = build_supervisor_launch(settings, "DEMO-3 `boom` \x1b[1m",
                                            reason="crash loop")
    assert "RALPH_DEV_ISSUE" not in launch.env
    assert launch.env["RALPH_DEV_ROLE"] == "supervisor"
    assert launch.cwd == settings.repo
    assert stat.S_IMODE(launch.prompt_file.stat().st_mode) == 0o600
    text = launch.prompt_file.read_text()
    assert "ralph-dev:ralph-dev-supervisor" in text and "crash loop" in text
    assert "DEMO-3 `boom` \\x1b[1m" in text and "\x1b" not in text
    assert "boom" not in every_string(launch)
    got = run_launch(launch, tmp_path / "record.json")
    argv = got["argv"]
    assert argv[1] == "-p"
    assert argv[argv.index("--tools") + 1] == "Bash,Read,Skill"
    allowed = argv[argv.index("--allowedTools") + 1].split(",")
    assert "Bash(ralph-dev status:*)" in allowed and "Bash(ralph-dev stop:*)" in allowed
    # no prefix that covers init, issue writes, service, worker or --config (issue 12)
    assert not [rule for rule in allowed if rule.startswith("Bash(ralph-dev")
                and rule.split("ralph-dev", 1)[1].split(":", 1)[0].strip().split(" ")[0]
                not in {"status", "doctor", "events", "plan", "logs", "issue", "stop", "start"}]
    assert {"Bash(ralph-dev issue list:*)", "Bash(ralph-dev issue show:*)"} == {
        rule for rule in allowed if rule.startswith("Bash(ralph-dev issue")}
    assert "Bash" not in allowed and "Bash(ralph-dev:*)" not in allowed
    assert {"Edit", "Write", "Agent"} <= set(argv[argv.index("--disallowedTools") + 1].split(","))
    assert argv[-1] == text


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_the_launchers_json_reads_what_json_writes(ensure_ascii: bool) -> None:
    """The pane's launcher decodes its spec with ``_json``'s scanner, not ``json`` (whose
    import costs every spawn ~8 ms): it reads every spec ``json.dumps`` writes exactly as
    ``json.loads`` does, and refuses what ``json.loads`` refuses."""
    from ralph_dev.inpane.exec_launch import _loads

    spec = {"argv": ["/usr/bin/claude", "--", "é\u2028\x00\x1b[31m\ud83d\ude00 \"q\" \\ /"],
            "env": {"A": "", "B": "x" * 5000}, "prompt_arg": True, "sandbox": None,
            "attempt": 3, "ratio": -1.5e-7, "big": 2**70, "nested": [[{}], [], {"k": [1]}],
            "unset": ["CLAUDECODE"]}
    for text in (json.dumps(spec, indent=2, ensure_ascii=ensure_ascii) + "\n",
                 json.dumps(spec, ensure_ascii=ensure_ascii), "  [1, 2]  ", '"plain"',
                 "Infinity", "[NaN, -Infinity]"):
        assert repr(_loads(text)) == repr(json.loads(text)), text
    for bad in ("", "   ", "\u00a0[1]", "[1]\u00a0", "{", '{"a": 1} x', '{"a": }', "[1,]",
                "{'a': 1}", '"\\x41"', '{"a": 1}{"b": 2}', "nul"):
        with pytest.raises(ValueError):
            json.loads(bad)
        with pytest.raises(ValueError):
            _loads(bad)
