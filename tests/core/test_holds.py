"""Queue holds and collection holds: persistent empty markers under /locks."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from queues.services import hold_moves
from queues.zk import locks
from queues.zk.errors import InvalidID

from .helpers import assert_marker

QUEUE_NODES = {
    "ingest": "/locks/queue/ingest",
    "access-small": "/locks/queue/accessSmall",
    "access-large": "/locks/queue/accessLarge",
}


@pytest.mark.parametrize(("name", "path"), QUEUE_NODES.items())
def test_queue_hold_is_an_empty_marker_set_and_cleared(
    zk: KazooClient, name: str, path: str
) -> None:
    assert locks.queue_held(zk, name) is False
    assert locks.queue_hold_set(zk, name) is True
    assert_marker(zk, path)
    assert locks.queue_held(zk, name) is True
    assert locks.queue_hold_set(zk, name) is False
    assert locks.queue_hold_clear(zk, name) is True
    assert zk.exists(path) is None
    assert locks.queue_hold_clear(zk, name) is False


def test_holds_list_shows_every_queue_and_held_collection(zk: KazooClient) -> None:
    locks.queue_hold_set(zk, "access-large")
    locks.collection_hold_set(zk, "ucb_lib_b")
    locks.collection_hold_set(zk, "ucb_lib_a")
    holds = locks.holds_list(zk)
    assert set(holds.queues) == {"ingest", "access-small", "access-large"}
    assert holds.queue_held("access-large")
    assert not holds.queue_held("ingest")
    assert list(holds.collections) == ["ucb_lib_a", "ucb_lib_b"]


def test_collection_hold_is_an_empty_marker_checked_by_profile(zk: KazooClient) -> None:
    assert locks.collection_hold_set(zk, "ucb_lib_test") is True
    assert_marker(zk, "/locks/collections/ucb_lib_test")
    assert locks.collection_held(zk, "ucb_lib_test")
    assert not locks.collection_held(zk, "ucb_lib_other")
    assert locks.collection_hold_set(zk, "ucb_lib_test") is False
    assert locks.collection_hold_clear(zk, "ucb_lib_test") is True
    assert zk.exists("/locks/collections/ucb_lib_test") is None
    assert not locks.collection_held(zk, "ucb_lib_test")


def test_collection_held_is_false_for_a_missing_or_odd_profile(zk: KazooClient) -> None:
    assert locks.collection_held(zk, "") is False
    assert locks.collection_held(zk, "../queue/ingest") is False


def test_marker_written_by_another_tool_counts_as_a_hold(zk: KazooClient) -> None:
    zk.ensure_path("/locks/collections/merritt_demo")
    assert locks.collection_held(zk, "merritt_demo")
    assert "merritt_demo" in locks.holds_list(zk).collections


def test_services_report_whether_the_hold_changed(zk: KazooClient) -> None:
    assert str(hold_moves.queue_hold(name="ingest")) == "queue ingest: released -> held"
    assert str(hold_moves.queue_hold(name="ingest")) == "queue ingest: held -> held (already held)"
    assert [str(o) for o in hold_moves.queue_release(name="ingest")] == [
        "queue ingest: held -> released"
    ]
    assert [str(o) for o in hold_moves.queue_release(name="ingest")] == [
        "queue ingest: released -> released (was not held)"
    ]
    assert (
        str(hold_moves.collection_hold(profile="ucb_lib_test"))
        == "collection ucb_lib_test: released -> held"
    )
    [outcome] = hold_moves.collection_release(profile="ucb_lib_test")
    assert (outcome.before, outcome.after) == ("held", "released")


@pytest.mark.parametrize("name", ["Ingest", "accessSmall", "../x", ""])
def test_unknown_queue_name_is_refused(zk: KazooClient, name: str) -> None:
    with pytest.raises(InvalidID):
        hold_moves.queue_hold(name=name)


@pytest.mark.parametrize("profile", ["a/b", "..", ".", "a b", ""])
def test_malformed_profile_is_refused(zk: KazooClient, profile: str) -> None:
    with pytest.raises(InvalidID):
        hold_moves.collection_hold(profile=profile)
    assert zk.get_children("/locks/collections") == []
