"""The process's ZooKeeper client: one shared session, the base layout, a clear failure."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from queues import zk as zkmod
from queues.zk.client import BASE_NODES
from queues.zk.server import free_port


def test_client_is_shared_and_creates_the_base_layout(zk: KazooClient) -> None:
    assert zkmod.client() is zk
    assert zkmod.is_connected()
    for node in BASE_NODES:
        assert zk.exists(node) is not None, node
    assert sorted(zk.get_children("/access")) == ["large", "small"]
    assert sorted(zk.get_children("/locks")) == ["collections", "inventory", "queue", "storage"]


def test_close_ends_the_session_and_the_next_call_reconnects(zk: KazooClient) -> None:
    zkmod.close()
    assert not zkmod.is_connected()
    fresh = zkmod.client()
    assert fresh is not zk
    assert fresh.connected
    assert fresh.exists("/jobs/states") is not None


def test_unreachable_ensemble_is_reported_as_unavailable() -> None:
    hosts = f"127.0.0.1:{free_port()}"
    with pytest.raises(zkmod.Unavailable, match=hosts):
        zkmod.connect(hosts, timeout=1.0)
