"""Agent CLIs as data: a project and each role choose theirs (``agent.cli``,
``[projects.NAME.roles.ROLE]``), decide names it on every start, the launch builds that
CLI's argv and environment, and a bad choice is refused naming the key and the fix."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from test_config import write_config

from ralph_dev.agent.launch import build_launch
from ralph_dev.core.actions import Spawn
from ralph_dev.core.agent_profiles import (
    CLAUDE,
    CODEX,
    PROFILES,
    aware_roles,
    role_cli,
    role_model,
)
from ralph_dev.core.config import AgentSettings, RoleAgent, load_project
from ralph_dev.core.decide.orders import fill
from ralph_dev.core.errors import ConfigError
from ralph_dev.core.model import Issue, Observed, Role, StateType


def test_every_cli_the_config_accepts_has_a_profile() -> None:
    named = set(typing.get_args(typing.get_type_hints(AgentSettings)["cli"]))
    assert named == set(PROFILES)
    assert set(typing.get_args(typing.get_args(
        typing.get_type_hints(RoleAgent)["cli"])[0])) == set(PROFILES)
    for profile in PROFILES.values():
        assert set(profile.states) == {"busy", "idle", "asking", "rate_limited",
                                       "out_of_quota"}, profile.name
        assert profile.pinned and all(profile.supports.values()), profile.name


def test_roles_choose_their_cli_and_model(xdg: Path) -> None:
    write_config('[projects.app]\nrepo = "/r"\n'
                 '[projects.app.agent]\nmodels = { plan = "opus" }\n'
                 '[projects.app.roles.review]\ncli = "codex"\n'
                 '[projects.app.roles.research]\ncli = "codex"\nmodel = "o4-mini"\n')
    settings = load_project("app", environ={})
    assert role_cli(settings, Role.EXECUTE) == "claude"
    assert role_cli(settings, Role.REVIEW) == "codex"
    assert role_model(settings, Role.EXECUTE) == CLAUDE.default_model
    assert role_model(settings, Role.PLAN) == "opus"
    # a role on another CLI never gets the project's Claude model
    assert role_model(settings, Role.REVIEW) == CODEX.default_model
    assert role_model(settings, Role.RESEARCH) == "o4-mini"
    # both report their live state (Codex through its supervisor reading its events)
    assert aware_roles(settings) == set(Role)


def test_a_project_on_codex_and_a_command_project_with_one_cli_role(xdg: Path) -> None:
    write_config('[projects.app]\nrepo = "/r"\n[projects.app.agent]\ncli = "codex"\n'
                 '[projects.cmd]\nrepo = "/r"\n[projects.cmd.agent]\nrunner = "command"\n'
                 'command = "my-agent {prompt_file}"\n'
                 '[projects.cmd.roles.review]\ncli = "claude"\n')
    app = load_project("app", environ={})
    assert {role_cli(app, r) for r in Role} == {"codex"}
    assert role_model(app, Role.EXECUTE) == CODEX.default_model
    cmd = load_project("cmd", environ={})
    assert role_cli(cmd, Role.EXECUTE) == "command"
    assert role_cli(cmd, Role.REVIEW) == "claude"
    assert aware_roles(cmd) == {Role.REVIEW}


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('[projects.app.agent]\ncli = "aider"',
         "projects.app.agent.cli: expected 'claude' or 'codex' or 'gemini', got 'aider'"),
        ('[projects.app.roles.reviw]\ncli = "codex"',
         "projects.app.roles.reviw: unknown role"),
        ('[projects.app.roles.review]\nclli = "codex"',
         "projects.app.roles.review: unknown key 'clli'"),
        ('[projects.app.roles.review]\nmodel = " "',
         "projects.app.roles.review.model: is empty"),
        ('[projects.app]\nroles = "codex"', "projects.app.roles: expected"),
    ],
)
def test_bad_cli_choices_name_the_key_and_the_fix(xdg: Path, table: str, expected: str) -> None:
    head = '[projects.app]\nrepo = "/r"\n'
    if table.startswith("[projects.app]\n"):
        head, table = head + table.split("\n", 1)[1] + "\n", ""
    write_config(head + table + "\n")
    with pytest.raises(ConfigError) as err:
        load_project("app", environ={})
    assert expected in str(err.value)


def test_decide_names_the_cli_of_each_start_and_resumes_only_where_it_can(xdg: Path) -> None:
    write_config('[projects.app]\nrepo = "/r"\n'
                 '[projects.app.roles.review]\ncli = "codex"\n')
    settings = load_project("app", environ={})
    issue = Issue(identifier="APP-1", title="t", state_name="Todo",
                  state_type=StateType.UNSTARTED)
    observed = Observed(issues=(issue,))
    execute, review = fill([Spawn("APP-1", "r", role=Role.EXECUTE),
                            Spawn("APP-1", "r", role=Role.REVIEW)], observed, settings)
    assert isinstance(execute, Spawn) and isinstance(review, Spawn)
    assert (execute.cli, execute.model) == ("claude", "sonnet")
    assert (review.cli, review.model) == ("codex", CODEX.default_model)


def test_a_codex_worker_gets_its_own_home_its_own_key_and_codex_argv(
        xdg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "codex"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    repo = tmp_path / "repo"
    repo.mkdir()
    write_config(f'[projects.app]\nrepo = "{repo}"\n[projects.app.agent]\ncli = "codex"\n'
                 f'codex_bin = "{fake}"\nhome = "isolated"\nsandbox = "off"\n')
    settings = load_project("app", environ={})
    workspace = tmp_path / "ws"
    workspace.mkdir()
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "person"),
               "OPENAI_API_KEY": "sk-openai", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
               "ANTHROPIC_API_KEY": "sk-ant-other"}
    issue = Issue(identifier="APP-1", title="t", state_name="Todo",
                  state_type=StateType.UNSTARTED)
    launch = build_launch(settings, issue, Role.EXECUTE, workspace, "gpt-5-codex", attempt=1,
                          environ=environ, resume_session="0199-session")
    spec = launch.spec_file.read_text() if launch.spec_file else ""
    import json

    data = json.loads(spec)
    argv = data["argv"]
    # under its supervisor, which reads its events (``inpane.codex_exec``)
    assert argv[:4] == ["ralph-dev", "hook", "codex-exec", "--"]
    argv = argv[4:]
    assert argv[:5] == [str(fake), "exec", "--json", "resume", "0199-session"]
    assert argv[argv.index("--model") + 1] == "gpt-5-codex"
    assert argv[-1] == "--" and data["prompt_arg"] is True
    env = {**data["env"], **json.loads(Path(data["secrets_file"]).read_text())}
    assert env["OPENAI_API_KEY"] == "sk-openai" and env["OPENAI_BASE_URL"].startswith("http")
    assert "ANTHROPIC_API_KEY" not in env  # only its own provider's key
    codex_home = Path(env["CODEX_HOME"])
    assert codex_home.parent == Path(env["HOME"]) and codex_home != Path(environ["HOME"])
    assert 'approval_policy = "never"' in (codex_home / "config.toml").read_text()
    launch.discard_secrets()
