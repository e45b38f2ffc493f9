"""flowtide.topology: what the settings say about where the databases are (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from flowtide.errors import CredentialError
from flowtide.sharding import shard_for
from flowtide.store.pg.shards import Endpoint
from flowtide.topology import TopologyError, from_settings, parse_shard_list

A, B, C = ("postgresql://u:pa@h/a", "postgresql://u:pb@h/b", "postgresql://u:pc@h/c")


def test_shard_list_with_a_cluster_database() -> None:
    topo = from_settings(db=None, shards=f"{A}; {B};", cluster_db=C)
    assert topo.source == "env" and topo.count == 2 and topo.cluster == C
    assert [s.dsn for s in topo.shards] == [A, B]
    assert topo.owner(42).index == shard_for(42, 2)
    # What may be shown: no password.
    assert all("pa" not in str(d) and "pb" not in str(d) for d in topo.describe())


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"db": None, "shards": f"{A};{B}", "cluster_db": None}, "needs the cluster database"),
        ({"db": A, "shards": f"{A};{B}", "cluster_db": C}, "not both"),
        ({"db": None, "shards": f"{A};{A}", "cluster_db": C}, "shards 0 and 1 name the same"),
        ({"db": None, "shards": f"{A};{C}", "cluster_db": C}, "cannot also be a shard"),
        ({"db": None, "shards": None, "cluster_db": None}, "no database"),
    ],
)
def test_settings_that_contradict_each_other(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        from_settings(**settings)


def test_one_database() -> None:
    topo = from_settings(db=A, shards=None, cluster_db=None)
    assert (topo.source, topo.count, topo.cluster, topo.shard(0).dsn) == ("single", 1, A, A)
    with pytest.raises(TopologyError, match="shard index 1 does not exist"):
        topo.shard(1)
    assert from_settings(db=A, shards=None, cluster_db=C).cluster == C


class Vault:
    def __init__(self, bodies: dict[str, dict[str, Any]]) -> None:
        self.bodies = bodies

    def resolve(self, alias: str) -> dict[str, Any]:
        if alias not in self.bodies:
            raise CredentialError(f"credential '{alias}' is not defined")
        return self.bodies[alias]


def _endpoint(index: int, credential: str = "shard_login") -> Endpoint:
    return Endpoint(
        index, f"db{index}.internal", 5432 + index, f"shard{index}", credential, True, 0.0
    )


def test_shard_map_logins_come_from_the_credential_store() -> None:
    vault = Vault({"shard_login": {"user": "svc", "password": "s3cret pw"}})
    topo = from_settings(
        db=None,
        shards=None,
        cluster_db=C,
        endpoints=[_endpoint(1), _endpoint(0)],
        credentials=vault,
    )
    assert topo.source == "table" and topo.count == 2
    dsn = topo.shard(1).dsn
    assert "host=db1.internal" in dsn and "port=5433" in dsn and "dbname=shard1" in dsn
    assert "s3cret" in dsn  # the connection needs it...
    assert "s3cret" not in topo.shard(1).display  # ...what is shown never has it
    with pytest.raises(TopologyError, match=r"active shards are \[0, 2\]"):
        from_settings(
            db=None,
            shards=None,
            cluster_db=C,
            endpoints=[_endpoint(0), _endpoint(2)],
            credentials=vault,
        )
    with pytest.raises(TopologyError, match="has no `user`"):
        from_settings(
            db=None,
            shards=None,
            cluster_db=C,
            endpoints=[_endpoint(0, "empty")],
            credentials=Vault({"empty": {"password": "x"}}),
        )


def test_parse_shard_list_ignores_blanks() -> None:
    assert parse_shard_list(f" {A} ;; {B} ;") == [A, B]
    assert parse_shard_list("") == []
