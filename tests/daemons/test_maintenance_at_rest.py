"""An idle console is quiet (docs/benchmarks.md, "At rest"): the maintenance daemon's round,
once a second, read the four folders of windows, releases, node holds and service holds each
time (240 listings a minute over an empty queue, the loudest thing ``runconsumer all`` sent);
with watches on them, a round over empty folders sends nothing, and a window placed since is
still released by the next rounds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from queues.daemons.maintenance import Maintenance
from queues.zk.maintenance import node_held, node_hold_set, window_set, windows

from .conftest import wait_for

pytestmark = pytest.mark.django_db

ROUNDS = 20
GET_CHILDREN = (8, 12)  # getChildren, getChildren2
PING = 11


def _requests(proxy) -> int:
    """The requests that passed the proxy so far, the client's pings left out."""
    return sum(n for op, n in proxy.counts.items() if op != PING)


def test_rounds_over_no_window_and_no_hold_send_no_request(proxy, proxied_client, zk) -> None:
    client = proxied_client()
    daemon = Maintenance(zk=client, poll=0.05)
    daemon.run_once()  # the first round sets up the watches
    before = _requests(proxy)
    for _ in range(ROUNDS):
        assert not daemon.run_once()
    sent = _requests(proxy) - before
    listed = sum(proxy.counts[op] for op in GET_CHILDREN)
    print(f"{ROUNDS} idle rounds: {sent} requests ({listed} listings in all)")
    assert sent == 0, dict(proxy.counts)

    # A window placed by another client is seen through the watch and released by a round.
    node_hold_set(zk, 9511)
    window_set(zk, "node", "9511", until=datetime.now(UTC) - timedelta(seconds=1))
    wait_for(lambda: daemon.run_once() or not node_held(zk, 9511), timeout=30)
    assert not node_held(zk, 9511)
    assert windows(zk) == []
