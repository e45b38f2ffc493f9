"""What `env` shows templates: chosen by the runtime from an allow-list, never flowtide's
own settings (flowtide.playbook.template.visible_env, flowtide.engine.context)."""

from __future__ import annotations

import pytest

from flowtide.engine.state import ExecutionState
from flowtide.errors import TemplateError
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.template import render, visible_env

SECRET = "postgresql://flowtide:s3cret-pw@db.internal/flowtide"
ENVIRON = {
    "HOME": "/home/ann",
    "APP_REGION": "eu",
    "APP_TIER": "gold",
    "FLOWTIDE_DB": SECRET,
    "FLOWTIDE_TOKEN": "ft_abc",
}


def test_embedded_default_shows_the_users_environment_but_no_flowtide_settings() -> None:
    env = visible_env(ENVIRON, embedded=True)
    assert env == {"HOME": "/home/ann", "APP_REGION": "eu", "APP_TIER": "gold"}


def test_server_and_worker_default_shows_nothing() -> None:
    assert visible_env(ENVIRON, embedded=False) == {}


@pytest.mark.parametrize("embedded", [True, False])
def test_the_allow_list_names_or_globs_what_is_shown(embedded: bool) -> None:
    environ = {**ENVIRON, "FLOWTIDE_TEMPLATE_ENV": "APP_*, HOME ,FLOWTIDE_DB,FLOWTIDE_*"}
    env = visible_env(environ, embedded=embedded)
    # Listed or matched; a FLOWTIDE_ name never, even listed.
    assert env == {"HOME": "/home/ann", "APP_REGION": "eu", "APP_TIER": "gold"}


def test_an_empty_allow_list_hides_everything_in_embedded_mode_too() -> None:
    assert visible_env({**ENVIRON, "FLOWTIDE_TEMPLATE_ENV": ""}, embedded=True) == {}


@pytest.mark.parametrize("source", ["{{ env.FLOWTIDE_DB }}", "x{{ env['FLOWTIDE_DB'] }}"])
def test_a_hidden_name_is_undefined_and_says_why(source: str) -> None:
    context = {"env": visible_env(ENVIRON, embedded=True)}
    with pytest.raises(TemplateError) as info:
        render(source, context, step="start", field="set.ctx.db")
    err = info.value
    assert err.missing == "FLOWTIDE_DB"
    assert "variables named FLOWTIDE_* are never visible to templates" in str(err)
    assert SECRET not in str(err)


def test_a_name_missing_on_the_server_points_at_the_allow_list() -> None:
    context = {"env": visible_env(ENVIRON, embedded=False)}
    with pytest.raises(TemplateError, match="listed in FLOWTIDE_TEMPLATE_ENV") as info:
        render("{{ env.HOME }}", context)
    assert info.value.missing == "HOME"


def test_default_still_works_for_a_hidden_name() -> None:
    context = {"env": visible_env(ENVIRON, embedded=False)}
    assert render("{{ env.FLOWTIDE_DB | default('y') }}", context) == "y"
    assert render("{{ env.HOME | default('none') }}", context) == "none"
    assert render("{{ env.get('HOME', 'none') }}", context) == "none"
    assert render("{{ 'HOME' in env }}", context) is False


PLAYBOOK = """\
workflow:
  - step: start
    set:
      ctx.home: "{{ env.HOME | default('hidden') }}"
"""


def test_the_engine_reads_no_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/from-the-process")
    playbook = parse_playbook(PLAYBOOK)
    # Without an env from the runtime, templates see none at all.
    assert dict(ExecutionState(playbook, 1).context()["env"]) == {}
    # With one, exactly that.
    shown = visible_env({"HOME": "/home/ann"}, embedded=True)
    assert ExecutionState(playbook, 1, shown).context()["env"] is shown
