"""The process's ZooKeeper client: one shared session, the base layout, a clear failure."""

from __future__ import annotations

import os
import socket

import pytest
from kazoo.client import KazooClient

from queues.services.zkserver import free_port
from queues.zk import client as zkmod
from queues.zk.client import BASE_NODES
from queues.zk.errors import Unavailable
from queues.zk.kazoo_private import Handler


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
    with pytest.raises(Unavailable, match=hosts):
        zkmod.connect(hosts, timeout=1.0)


@pytest.mark.parametrize("high", [False, True])
def test_handler_waits_answer_like_kazoos_own(high: bool) -> None:
    """Sockets below select()'s limit take the short way, above it kazoo's own; same answers."""
    left, right = socket.socketpair()
    if high:
        # A web process with many connections: descriptors past FD_SETSIZE.
        moved = os.dup2(left.fileno(), 1500)
        left.close()
        left = socket.socket(fileno=moved)
    try:
        handler = Handler()
        assert handler.select([left], [], [], 0) == ([], [], [])
        right.send(b"x")
        assert handler.select([left], [], [], 1)[0] == [left]
        assert handler.select([], [left], [], 0)[1] == [left]
    finally:
        left.close()
        right.close()
