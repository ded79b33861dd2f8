"""The ZooKeeper server's time (``queues/zk/servertime.py``) against a real server: one write
per resample, and a connection lost at the resample's write leaves the last sample going on
(advanced by the monotonic clock) rather than failing a decision that did not wait on
ZooKeeper before."""

from __future__ import annotations

from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss

from queues.zk import servertime
from tests.zkproxy import request

SET_DATA = 5  # ZooKeeper's setData opcode


def test_the_server_time_is_the_mtime_of_a_write_just_made(zk: Any) -> None:
    servertime.forget(zk)
    before = zk.exists(servertime.CLOCK)
    now = servertime.server_now(zk)
    stat = zk.exists(servertime.CLOCK)
    assert stat is not None and (before is None or stat.version == before.version + 1)
    assert stat.mtime / 1000 <= now
    # Within a resample's time, no second write.
    servertime.server_now(zk)
    assert zk.exists(servertime.CLOCK).version == stat.version


def test_a_resample_cut_off_goes_on_from_the_last_sample(
    proxy: Any, proxied_client: Any, zk: Any, monkeypatch: Any
) -> None:
    client = proxied_client(timeout=5)
    first = servertime.server_now(client)
    monkeypatch.setattr(servertime, "RESAMPLE_SECONDS", 0.0)  # every call writes
    proxy.cut_before(request(SET_DATA, servertime.CLOCK.encode()))

    later = servertime.server_now(client)

    assert proxy.fired.is_set()
    assert later >= first
    assert abs(later - servertime.server_now(zk)) < 5
    # A client that never had a sample has nothing to go on: the connection error is its own.
    fresh = proxied_client(timeout=5)
    proxy.cut_before(request(SET_DATA, servertime.CLOCK.encode()))
    with pytest.raises(ConnectionLoss):
        servertime.server_now(fresh)
