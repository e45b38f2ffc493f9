"""The dev cluster's route ports (flowtide.dev.natsnodes.assign_nats_ports), and how
`dev status` shows a replica (flowtide.cli.dev.peer_text). The route ports
started at 6222 whatever --nats-port said, and a taken route port was reported with
"choose another port with --nats-port", which moved only the client ports. They now sit
2000 above the client ports (6222 for the default 4222) and move with --nats-port."""

from __future__ import annotations

import pytest

from flowtide.dev import config as dev_config
from flowtide.dev.config import StackConfig
from flowtide.dev.natsnodes import assign_nats_ports


@pytest.fixture(autouse=True)
def every_port_free(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev_config, "port_free", lambda port: True)


def test_the_default_ports_are_natss_usual_pair() -> None:
    config = StackConfig(nats_nodes=3)
    assign_nats_ports(config)
    assert config.nats_node_ports == [4222, 4223, 4224]
    assert config.nats_route_ports == [6222, 6223, 6224]


def test_route_ports_move_with_nats_port() -> None:
    config = StackConfig(nats_nodes=3, nats_port=34222)
    assign_nats_ports(config)
    assert config.nats_route_ports == [36222, 36223, 36224]
    password = config.nats_route_password
    assert password
    config.nats_port = 34322
    assign_nats_ports(config)
    assert config.nats_node_ports == [34322, 34323, 34324]
    assert config.nats_route_ports == [36322, 36323, 36324]
    assert config.nats_route_password == password


def test_kept_ports_stay() -> None:
    config = StackConfig(nats_nodes=3, nats_port=34222)
    config.nats_node_ports = [34222, 34223, 34224]
    config.nats_route_ports = [34622, 34623, 34624]
    assign_nats_ports(config)
    assert config.nats_route_ports == [34622, 34623, 34624]


def test_a_stopped_nodes_replica_is_shown_offline() -> None:
    # `dev status` said "nats-1 BEHIND by 0 (seen 3.4 s ago)" of a node that was stopped.
    from flowtide.cli.dev import peer_text

    peer = {
        "name": "nats-1",
        "leader": False,
        "current": False,
        "offline": False,
        "lag": 0,
        "active_seconds": 3.4,
    }
    assert peer_text(peer, running=False) == "nats-1 OFFLINE (stopped, seen 3.4 s ago)"
    assert peer_text({**peer, "offline": True}, running=True) == "nats-1 OFFLINE (seen 3.4 s ago)"
    assert peer_text(peer, running=True) == "nats-1 NOT CURRENT (seen 3.4 s ago)"
    assert peer_text({**peer, "lag": 12}, running=True) == "nats-1 BEHIND by 12 (seen 3.4 s ago)"
    assert peer_text({**peer, "current": True}, running=True) == "nats-1 current"
    assert peer_text({"name": "nats-0", "leader": True}, running=True) == "nats-0 leader"
