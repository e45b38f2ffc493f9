"""The settings tree (flowtide.settings): each variable declared once and read under the
name it always had, bad values refused with the variable's name, the defaults the code
had before the tree, and the catalog and settings table (docs/cli.md) generated from it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from flowtide import settings
from flowtide.errors import EXIT_INVALID, SettingsError, exit_code
from flowtide.settings import render
from flowtide.settings.catalog import CATALOG
from flowtide.settings.tree import SECTIONS

SETTINGS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

#: Every variable the code read before the tree, with the default it used then.
BEFORE: dict[str, Any] = {
    "FLOWTIDE_DB": None,
    "FLOWTIDE_SHARDS": None,
    "FLOWTIDE_CLUSTER_DB": None,
    "FLOWTIDE_SHARD_INDEX": 0,
    "FLOWTIDE_ADVERTISE_URL": None,
    "FLOWTIDE_NATS": None,
    "FLOWTIDE_KV": "memory://",
    "FLOWTIDE_KV_BUCKET": "flowtide_state",
    "FLOWTIDE_NATS_REPLICAS": 1,
    "FLOWTIDE_NATS_PLACEMENT_CLUSTER": None,
    "FLOWTIDE_NATS_PLACEMENT_TAGS": None,
    "FLOWTIDE_NATS_STORAGE": "file",
    "FLOWTIDE_NATS_COMMANDS_MAX_BYTES": -1,
    "FLOWTIDE_NATS_LOGS_MAX_BYTES": 256 * 1024 * 1024,
    "FLOWTIDE_LEASE": 30.0,
    "FLOWTIDE_INSECURE_NO_AUTH": False,
    "FLOWTIDE_MAX_BODY": 16 * 1024 * 1024,
    "FLOWTIDE_PUBLIC_METRICS": False,
    # issue 30: variables added since the tree (with their defaults)
    "FLOWTIDE_SCHEDULER": True,
    "FLOWTIDE_STALLED_AFTER": 600.0,
    "FLOWTIDE_RETENTION": None,
    "FLOWTIDE_STATE_CACHE_MB": 256,
    "FLOWTIDE_JWKS_URL": None,
    "FLOWTIDE_JWT_ISSUER": None,
    "FLOWTIDE_JWT_AUDIENCE": None,
    "FLOWTIDE_JWT_ROLES_CLAIM": "flowtide_roles",
    "FLOWTIDE_JWT_ROLES": None,
    "FLOWTIDE_JWT_POOL_CLAIM": "flowtide_pool",
    "FLOWTIDE_TLS_CERT": None,
    "FLOWTIDE_TLS_KEY": None,
    "FLOWTIDE_CLIENT_CA": None,
    "FLOWTIDE_NATS_USER": None,
    "FLOWTIDE_NATS_PASSWORD": None,
    "FLOWTIDE_NATS_CREDS": None,
    "FLOWTIDE_NATS_CA": None,
    # Notifications (flowtide.notify).
    "FLOWTIDE_NOTIFY_DEFAULT": None,
    "FLOWTIDE_NOTIFY_ALLOW_HOSTS": None,
    "FLOWTIDE_NOTIFY_ATTEMPTS": 6,
    "FLOWTIDE_NOTIFY_BACKOFF": 10.0,
    "FLOWTIDE_NOTIFY_MAX_BACKOFF": 300.0,
    "FLOWTIDE_NOTIFY_TIMEOUT": 10.0,
    "FLOWTIDE_NOTIFY_EXIT_WAIT": 30.0,
    "FLOWTIDE_NOTIFY_PUBLIC_URL": None,
    "FLOWTIDE_SERVER": None,
    "FLOWTIDE_TOKEN": None,
    "FLOWTIDE_TOKEN_FILE": None,
    "FLOWTIDE_CA": None,
    "FLOWTIDE_CLIENT_CERT": None,
    "FLOWTIDE_CLIENT_KEY": None,
    "FLOWTIDE_HOME": None,
    "FLOWTIDE_MASTER_KEY": None,
    "FLOWTIDE_FILE_ROOTS": None,
    "FLOWTIDE_RESULT_STORE": None,
    "FLOWTIDE_RESULT_STORE_KV": None,
    "FLOWTIDE_RESULT_STORE_DISK": None,
    "FLOWTIDE_RESULT_STORE_S3": None,
    "FLOWTIDE_RESULT_STORE_GCS": None,
    "FLOWTIDE_TRACE": None,
    # Traces (flowtide.tracing): flowtide's name, then the OpenTelemetry standard one.
    "FLOWTIDE_OTEL_ENDPOINT": None,
    "OTEL_EXPORTER_OTLP_ENDPOINT": None,
    "WORKER_ID": None,
    "FLOWTIDE_MAX_RESULT_BYTES": 4 * 1024 * 1024,
    "FLOWTIDE_MAX_STORED_RESULT_BYTES": 512 * 1024 * 1024,
    "FLOWTIDE_INLINE_MAX_BYTES": 64 * 1024,
    "FLOWTIDE_HTTP_MAX_RESPONSE_BYTES": 256 * 1024 * 1024,
    "FLOWTIDE_PYTHON_ISOLATION": None,
    "FLOWTIDE_PYTHON_USER": None,
    "FLOWTIDE_PYTHON_MEMORY_MB": 2048,
    "FLOWTIDE_PYTHON_CPU_SECONDS": 0.0,
    "FLOWTIDE_SPARK_MASTER": None,
    "FLOWTIDE_SPARK_JARS": None,
    "FLOWTIDE_SPARK_DATA_DIR": None,
    # Added since the tree (webhooks, flowtide.web.hooks).
    "FLOWTIDE_HOOK_REPLAY_WINDOW": 300.0,
    "FLOWTIDE_HOOK_DEDUP_WINDOW": 86400.0,
    "FLOWTIDE_HOOK_RATE": 50.0,
    # The web UI's sessions (flowtide.web.session).
    "FLOWTIDE_SESSION_LIFETIME": 43200.0,
    "FLOWTIDE_SESSION_IDLE": 3600.0,
    # Added since the tree (templates pasted into SQL, flowtide.web.catalog).
    "FLOWTIDE_SQL_STRICT": False,
    # Fault injection for drills (bench/faults.py), off by default.
    "FLOWTIDE_FAULT_DUPLICATE_COMMANDS": False,
}

#: Variables whose names do not follow the tree's rule: older than it, or a standard's.
HISTORIC = {"WORKER_ID", "OTEL_EXPORTER_OTLP_ENDPOINT"}


def _all() -> list[tuple[str, str, Any, str]]:
    return [(key, env, section, field) for key, env, section, field in render.entries()]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for _key, env, _section, _field in _all():
        monkeypatch.delenv(env, raising=False)
    return monkeypatch


def test_each_variable_is_declared_once_under_its_old_name() -> None:
    names = [env for _key, env, _section, _field in _all()]
    assert len(names) == len(set(names)), "a variable declared twice"
    assert sorted(names) == sorted(BEFORE), "the tree and the variables read before differ"
    for _key, env, section, field in _all():
        derived = f"{section.model_config['env_prefix']}{field}".upper()
        assert env == derived or env in HISTORIC, (env, derived)
    assert names.count("FLOWTIDE_MAX_RESULT_BYTES") == 1


#: A value each setting with a pattern takes (any text is refused by the others).
_PATTERNED = {"nats_storage": "memory"}


def _sample(section: Any, field: str) -> tuple[str, Any]:
    info = section.model_fields[field]
    low = render._bound(info, "ge")
    high = render._bound(info, "le")
    kinds = {info.annotation, *get_args(info.annotation)}
    if field in _PATTERNED:
        return _PATTERNED[field], _PATTERNED[field]
    if bool in kinds:
        return "1", True
    if int in kinds:
        value = max(7, int(low or 0) + 7)
        if high is not None:
            value = min(value, int(high))
        return str(value), value
    if float in kinds:
        return "2.5", 2.5
    if Path in kinds:
        return "/tmp/flowtide-x", Path("/tmp/flowtide-x")
    return "some-value", "some-value"


def test_each_variable_is_read_from_the_environment_under_its_name(
    clean_env: pytest.MonkeyPatch,
) -> None:
    # The names the tree says (README, catalog, messages) are the ones pydantic-settings
    # reads, and a mapping is read as the environment is.
    for _key, env, section, field in _all():
        text, value = _sample(section, field)
        clean_env.setenv(env, text)
        assert getattr(settings.read(section), field) == value, env
        assert getattr(settings.read(section, {env: text}), field) == value, env
        clean_env.delenv(env)


def test_defaults_are_what_the_code_used_before(clean_env: pytest.MonkeyPatch) -> None:
    for _key, env, section, field in _all():
        assert getattr(settings.read(section), field) == BEFORE[env], env
    # Empty is unset, as `os.environ.get(...) or default` made it.
    clean_env.setenv("FLOWTIDE_MAX_RESULT_BYTES", "")
    assert settings.read(settings.LimitsSection).max_result_bytes == 4 * 1024 * 1024


def test_the_servers_settings_come_from_the_tree(clean_env: pytest.MonkeyPatch) -> None:
    from flowtide.server.settings import ServerSettings
    from flowtide.web.access import DEFAULT_MAX_BODY

    clean_env.setenv("FLOWTIDE_DB", "postgresql://x/y")
    got = ServerSettings.from_env()
    assert got == ServerSettings(db="postgresql://x/y")
    assert got.max_body == DEFAULT_MAX_BODY and got.state_cache_bytes == 256 * 1024 * 1024
    clean_env.setenv("FLOWTIDE_JWKS_URL", "https://idp/jwks")
    clean_env.setenv("FLOWTIDE_JWT_ROLES", "ops=admin")
    clean_env.setenv("FLOWTIDE_INSECURE_NO_AUTH", "1")
    got = ServerSettings.from_env()
    assert got.jwt is not None and got.jwt.role_map == {"ops": "admin"}
    assert got.jwt.roles_claim == "flowtide_roles" and got.insecure_no_auth
    clean_env.delenv("FLOWTIDE_DB")
    with pytest.raises(SettingsError, match="FLOWTIDE_DB must name"):
        ServerSettings.from_env()


@pytest.mark.parametrize(
    ("env", "value", "reason"),
    [
        ("FLOWTIDE_MAX_BODY", "lots", "expected a number (a whole one)"),
        ("FLOWTIDE_MAX_BODY", "100", "greater than or equal to 1024"),
        ("FLOWTIDE_STATE_CACHE_MB", "0", "greater than or equal to 1"),
        ("FLOWTIDE_NATS_STORAGE", "disk", "must be file or memory"),
        ("FLOWTIDE_NATS_REPLICAS", "7", "less than or equal to 5"),
        ("FLOWTIDE_LEASE", "soon", "expected a number"),
        ("FLOWTIDE_SHARD_INDEX", "-1", "greater than or equal to 0"),
        # A switch is 1 or 0: "yes" was silently off before; now it is refused.
        ("FLOWTIDE_INSECURE_NO_AUTH", "yes", "must be 1 (on) or 0 (off)"),
    ],
)
def test_a_bad_value_names_its_variable(
    clean_env: pytest.MonkeyPatch, env: str, value: str, reason: str
) -> None:
    clean_env.setenv(env, value)
    with pytest.raises(SettingsError) as info:
        settings.read(settings.ServerSection)
    assert str(info.value).startswith(f"{env}={value!r}: ")
    assert reason in str(info.value) and "pydantic" not in str(info.value)
    assert (info.value.env, info.value.value) == (env, value)
    assert exit_code(info.value) == EXIT_INVALID


def test_a_bad_value_stops_a_process_with_one_line(tmp_path: Path) -> None:
    code = (
        "from flowtide.errors import FlowtideError, exit_code\n"
        "from flowtide.server.settings import ServerSettings\n"
        "try:\n    ServerSettings.from_env()\n"
        "except FlowtideError as exc:\n    print(exc); raise SystemExit(exit_code(exc))\n"
    )
    env = {"FLOWTIDE_DB": "postgresql://x/y", "FLOWTIDE_MAX_BODY": "lots", "PATH": "/usr/bin"}
    src = str(Path(settings.__file__).parents[2])
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == EXIT_INVALID, proc.stderr
    assert proc.stdout == "FLOWTIDE_MAX_BODY='lots': expected a number (a whole one)\n"


def test_current_reads_once_until_reset(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FLOWTIDE_MAX_RESULT_BYTES", "1000")
    first = settings.current(settings.LimitsSection)
    clean_env.setenv("FLOWTIDE_MAX_RESULT_BYTES", "2000")
    assert settings.current(settings.LimitsSection) is first
    settings.reset()
    assert settings.current(settings.LimitsSection).max_result_bytes == 2000


def test_flags_reach_the_servers_processes_as_the_trees_variables(
    clean_env: pytest.MonkeyPatch,
) -> None:
    given = settings.read(
        settings.ServerSection, {}, db="postgresql://x/y", lease=12.5, insecure_no_auth=True
    )
    env = settings.to_env(given)
    assert env["FLOWTIDE_INSECURE_NO_AUTH"] == "1" and env["FLOWTIDE_PUBLIC_METRICS"] == ""
    assert settings.read(settings.ServerSection, env) == given
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert settings.read(settings.ServerSection) == given


def test_the_catalog_is_the_tree() -> None:
    # `python -m flowtide.settings catalog` rewrites it.
    expected = {}
    for key, env, section, field in _all():
        info = section.model_fields[field]
        default = info.default
        expected[key] = (
            env,
            str(default) if isinstance(default, Path) else default,
            info.description,
            render._bound(info, "ge"),
            render._bound(info, "le"),
        )
    assert {k: tuple(v) for k, v in CATALOG.items()} == expected
    assert list(SECTIONS) == sorted({k.split(".")[0] for k in CATALOG}, key=list(SECTIONS).index)


def test_the_readme_table_is_the_tree() -> None:
    # The table lives in the documentation site's command-line page.
    text = SETTINGS_PAGE.read_text(encoding="utf-8")
    found = re.search(
        r"<!-- settings-table: [^>]*-->\n(.*?)<!-- /settings-table -->", text, re.DOTALL
    )
    assert found, "docs/cli.md has no settings table"
    assert found.group(1) == render.table_text(), "python -m flowtide.settings table"


def test_the_command_line_reads_the_catalog_without_pydantic() -> None:
    # `flowtide --help` stays fast: the options come from the generated catalog.
    code = (
        "import sys\nfrom flowtide.cli.root import app\n"
        "print('pydantic_settings' in sys.modules, 'pydantic' in sys.modules)"
    )
    src = str(Path(settings.__file__).parents[2])
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": src, "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.split() == ["False", "False"], proc.stderr
