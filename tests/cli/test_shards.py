"""`flowtide shards add|list|set` and `flowtide db upgrade|status` over a cluster database
and two shard databases, both ways of describing them (FLOWTIDE_SHARDS, the shard map),
on a real PostgreSQL."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from .helpers import Flowtide, describe

_names = itertools.count()


@pytest.fixture
def dbs(pg_server: Any) -> Iterator[dict[str, str]]:
    """A cluster database and two shard databases."""
    tag = f"{os.getpid()}_{next(_names)}"
    names = {role: f"topo_{role}_{tag}" for role in ("cluster", "s0", "s1")}
    dsns = {role: pg_server.create_database(name) for role, name in names.items()}
    try:
        yield dsns
    finally:
        for name in names.values():
            pg_server.drop_database(name)


def _versions(rows: list[dict[str, Any]]) -> set[tuple[Any, str, int]]:
    return {(r["shard"], r["component"], r["version"]) for r in rows}


def test_db_upgrade_with_a_shard_list(ft: Flowtide, dbs: dict[str, str]) -> None:
    shards = f"{dbs['s0']};{dbs['s1']}"
    args = ("--shards", shards, "--cluster-db", dbs["cluster"])
    before = ft.ok("db", "status", *args, expect=1)
    assert "shard 1 " in before.stdout and "needs upgrade" in before.stdout
    rows = ft.json("db", "upgrade", *args)
    from flowtide.store import pgschema

    assert _versions(rows) == {
        (None, "cluster", pgschema.CLUSTER.latest),
        (0, "shard", pgschema.SHARD.latest),
        (1, "shard", pgschema.SHARD.latest),
    }
    text = ft.ok("db", "status", *args).stdout
    assert text.count("(current)") == 3
    # No password in what is printed.
    for dsn in dbs.values():
        password = dsn.split(":")[2].split("@")[0]
        assert password not in text
    # Without the cluster database, the list is refused with the reason.
    proc = ft("db", "upgrade", "--shards", shards)
    assert proc.returncode == 2 and "needs the cluster database too" in proc.stderr


def test_shard_map_drives_db_upgrade(ft: Flowtide, dbs: dict[str, str], pg_server: Any) -> None:
    cluster = dbs["cluster"]
    login = json.dumps({"user": pg_server.user, "password": pg_server.password})
    # The map refuses a login the credential store does not have.
    proc = ft(
        "shards",
        "add",
        "0",
        "--host",
        "127.0.0.1",
        "--port",
        str(pg_server.port),
        "--database",
        dbs["s0"].rsplit("/", 1)[1],
        "--credential",
        "shard_login",
        "--cluster-db",
        cluster,
    )
    assert proc.returncode == 2 and "no credential 'shard_login'" in proc.stderr, describe(proc)
    ft.ok(
        "credential", "set", "shard_login", "--json", login, "--kind", "postgres", "--db", cluster
    )
    for index in (0, 1):
        ft.ok(
            "shards",
            "add",
            str(index),
            "--host",
            "127.0.0.1",
            "--port",
            str(pg_server.port),
            "--database",
            dbs[f"s{index}"].rsplit("/", 1)[1],
            "--credential",
            "shard_login",
            "--cluster-db",
            cluster,
        )
    again = ft(
        "shards",
        "add",
        "1",
        "--host",
        "x",
        "--database",
        "y",
        "--credential",
        "shard_login",
        "--cluster-db",
        cluster,
    )
    assert again.returncode == 2 and "shard 1 is in the map already" in again.stderr
    listed = ft.json("shards", "list", "--cluster-db", cluster)
    assert [(r["shard_index"], r["credential"], r["active"]) for r in listed] == [
        (0, "shard_login", True),
        (1, "shard_login", True),
    ]
    text = ft.ok("shards", "list", "--cluster-db", cluster).stdout
    assert pg_server.password not in text and "login 'shard_login'" in text

    # `db upgrade` with only the cluster database finds the shards through the map, their
    # password through the encrypted credential store.
    rows = ft.json("db", "upgrade", "--cluster-db", cluster)
    assert {(r["shard"], r["component"]) for r in rows} == {
        (None, "cluster"),
        (0, "shard"),
        (1, "shard"),
    }
    assert all(pg_server.password not in r["database"] for r in rows)

    # A shard taken out of the map leaves a gap: refused, with the indexes.
    ft.ok("shards", "set", "0", "--inactive", "--cluster-db", cluster)
    proc = ft("db", "status", "--cluster-db", cluster)
    assert proc.returncode == 2 and "active shards are [1]" in proc.stderr, describe(proc)
    ft.ok("shards", "set", "0", "--active", "--cluster-db", cluster)
    nothing = ft("shards", "set", "0", "--cluster-db", cluster)
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr
    missing = ft("shards", "set", "7", "--host", "h", "--cluster-db", cluster)
    assert missing.returncode == 2 and "no shard 7" in missing.stderr


def test_server_settings_of_a_sharded_cluster_are_checked_first(ft: Flowtide) -> None:
    a, b, c = (
        "postgresql://u:p@127.0.0.1:1/a",
        "postgresql://u:p@127.0.0.1:1/b",
        "postgresql://u:p@127.0.0.1:1/c",
    )
    base = ("server", "--nats", "nats://127.0.0.1:1", "--insecure-no-auth")
    # Other shards' servers forward to this one: an address they can reach is needed.
    proc = ft(*base, "--shards", f"{a};{b}", "--cluster-db", c, "--host", "0.0.0.0")
    assert proc.returncode == 2, describe(proc)
    assert "--advertise-url" in proc.stderr
    proc = ft(*base, "--shards", a, "--cluster-db", c, "--shard-index", "3")
    assert proc.returncode == 2 and "shard index 3 does not exist" in proc.stderr
    proc = ft(*base, "--shards", f"{a};{b}")
    assert proc.returncode == 2 and "needs the cluster database too" in proc.stderr
    proc = ft(*base)
    assert proc.returncode == 2 and "no database" in proc.stderr


def test_a_shard_out_of_reach_is_named_and_the_others_still_done(
    ft: Flowtide, dbs: dict[str, str]
) -> None:
    down = "postgresql://flowtide:secret-pw@127.0.0.1:9/gone"
    args = ("--shards", f"{dbs['s0']};{down};{dbs['s1']}", "--cluster-db", dbs["cluster"])
    proc = ft("db", "upgrade", *args)
    assert proc.returncode == 1, describe(proc)
    assert "shard 1 postgresql://flowtide:***@127.0.0.1:9/gone  shard: unavailable" in proc.stdout
    assert "error: not reached: shard 1 " in proc.stderr
    assert "secret-pw" not in proc.stdout + proc.stderr
    # The other shards were upgraded all the same.
    rows = json.loads(ft("db", "status", *args, "--json").stdout)
    done = {(r["shard"], r["component"]): r for r in rows}
    assert done[(0, "shard")]["version"] == done[(0, "shard")]["latest"]
    assert done[(2, "shard")]["version"] == done[(2, "shard")]["latest"]
    assert done[(1, "shard")]["version"] is None and done[(1, "shard")]["error"]
