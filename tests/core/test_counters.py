"""The minter's counters: plain integers in ZooKeeper, never the same value twice."""

from __future__ import annotations

import threading

import pytest
from kazoo.client import KazooClient

from queues.zk.counters import counter_next, counter_path
from queues.zk.errors import MalformedNode


def test_counter_starts_at_one_and_counts_up_as_plain_text(zk: KazooClient) -> None:
    assert [counter_next(zk, "ark-fk4") for _ in range(3)] == [1, 2, 3]
    assert zk.get("/mrt-console/minter/ark-fk4")[0] == b"3"
    assert counter_next(zk, "ark-other") == 1


def test_counter_name_is_made_safe_for_a_node(zk: KazooClient) -> None:
    assert counter_path("ark:/99999/fk4") == "/mrt-console/minter/ark__99999_fk4"
    counter_next(zk, "ark:/99999/fk4")
    assert zk.exists("/mrt-console/minter/ark__99999_fk4") is not None


def test_two_clients_counting_at_once_never_get_the_same_value(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    got: list[list[int]] = [[], []]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2, timeout=10)

    def count(client: KazooClient, out: list[int]) -> None:
        try:
            barrier.wait()
            out.extend(counter_next(client, "race") for _ in range(40))
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=count, args=(c, out))
        for c, out in zip((zk, other_zk), got, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert sorted(got[0] + got[1]) == list(range(1, 81))


def test_malformed_counter_is_named_not_overwritten(zk: KazooClient) -> None:
    zk.create("/mrt-console/minter/broken", b"seven", makepath=True)
    with pytest.raises(MalformedNode, match="/mrt-console/minter/broken"):
        counter_next(zk, "broken")
    assert zk.get("/mrt-console/minter/broken")[0] == b"seven"
