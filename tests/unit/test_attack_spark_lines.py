"""`[spark]` lines: a SQL statement echoed to the step's log never shows a secret, not
even part of one (cut at 160 characters) or one whose spaces were joined."""

from __future__ import annotations

from types import SimpleNamespace

from flowtide.logs import CommandLog, LogKey
from flowtide.redaction import MASK
from flowtide.tools.base import ToolContext
from flowtide.tools.spark import shown_statement


class _Spool:
    def __init__(self) -> None:
        self.data = b""

    def append(self, key: LogKey, data: bytes, total: int, lines: int) -> None:
        self.data += data

    def close(self, key: LogKey, total: int, lines: int) -> None:
        pass


def _ctx(*secrets: str) -> ToolContext:
    ctx = ToolContext(execution_id=1, step="s")
    ctx.secrets.update(secrets)
    return ctx


def test_a_secret_cut_at_the_lines_end_is_masked_whole() -> None:
    secret = "Zq8-very-long-api-key-0123456789"
    statement = "SELECT " + "x, " * 48 + f"'{secret}' AS k FROM t"
    assert statement.index(secret) < 159 < statement.index(secret) + len(secret)
    shown = shown_statement(statement, SimpleNamespace(log=None), _ctx(secret))
    assert secret[:6] not in shown


def test_a_secret_with_spaces_is_masked_before_they_are_joined() -> None:
    secret = "correct  horse\nbattery staple"
    statement = f"SELECT '{secret}' AS phrase"
    shown = shown_statement(statement, SimpleNamespace(log=None), _ctx(secret))
    assert "horse" not in shown and MASK in shown


def test_the_runs_log_secrets_are_masked_too() -> None:
    # A value of the execution's secret set that the call itself did not touch.
    secret = "exec-secret  with spaces"
    log = CommandLog(LogKey(1, 2, "s"), _Spool(), lambda: [secret])
    try:
        shown = shown_statement(f"SELECT '{secret}'", SimpleNamespace(log=log), _ctx())
    finally:
        log.close()
    assert "spaces" not in shown


def test_a_spark_connect_token_in_the_master_is_never_shown() -> None:
    # The master may come from the worker's environment (FLOWTIDE_SPARK_MASTER): its
    # token is no value of any execution's secret set, yet every spark call event and
    # step log showed the master.
    from flowtide.spark.session import SessionInfo, shown_master

    master = "sc://spark.internal:15002/;use_ssl=true;token=tok-S3cr3t;user_id=etl"
    info = SessionInfo(master, "connect", None, "3.5", 0.0, 0.0)
    assert "tok-S3cr3t" not in str(info.as_dict())
    assert shown_master(master) == "sc://spark.internal:15002/;use_ssl=true;token=***;user_id=etl"
    assert shown_master("sc://etl:pw-S3cr3t@h:15002") == "sc://etl:***@h:15002"
    assert shown_master("local[*]") == "local[*]"
