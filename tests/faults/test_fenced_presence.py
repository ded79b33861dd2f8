"""A fenced write costs one round trip when the job as read says which of its nodes exist
(``fence.write_fenced``), and two only when that was wrong: before, every write of a node that
may or may not exist read its presence first, a round trip of its own (5 of the 42 requests a
job made through every step in ``bench/daemons.py --shipped --real``). Whichever way the guess
goes, the write is fenced: made in a multi checked against the lock, or not at all."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from daemons.conftest import make_job
from daemons.test_batched import CONFIG
from kazoo.client import KazooClient

from queues.core.states import JobState
from queues.daemons.shared import SessionGate
from queues.zk import paths as zpaths
from queues.zk.codecs import decode_json
from queues.zk.errors import Conflict
from queues.zk.fence import fenced
from queues.zk.jobs import job_load, job_set_json, job_set_space_needed
from queues.zk.kazoo_private import session_id
from queues.zk.locks import lock_create
from queues.zk.records import Job

pytestmark = pytest.mark.zookeeper


@pytest.fixture
def claimed(zk: KazooClient) -> Iterator[tuple[Job, list[int], Callable[[], Any]]]:
    """A job locked in the shared client's session; a gate counting the multis it sends."""
    job = make_job(zk, CONFIG, state=JobState.PROCESSING)
    lock = zpaths.job_node(job.jid, "lock")
    assert lock_create(zk, lock)
    gate = SessionGate()
    fence = gate.fence(zk, gate.generation, session_id(zk))
    sent: list[int] = []

    def counting(send: Callable[[], Any]) -> Any:
        sent.append(1)
        return fence(send)

    yield job, sent, lambda: fenced(counting)
    if zk.exists(lock):
        zk.delete(lock)


def node(zk: KazooClient, job: Job, name: str) -> Any:
    return decode_json(name, zk.get(zpaths.job_node(job.jid, name))[0])


def test_a_node_the_job_has_not_is_created_and_then_overwritten_in_one_multi_each(
    zk: KazooClient, claimed
) -> None:
    job, sent, gate = claimed
    assert job.identifiers is None
    with gate():
        written = job_set_json(zk, job, "identifiers", {"primary_id": "ark:/99999/fk4a"})
        job_set_json(zk, written, "identifiers", {"primary_id": "ark:/99999/fk4b"})
    assert sent == [1, 1]
    assert node(zk, job, "identifiers") == {"primary_id": "ark:/99999/fk4b"}


def test_a_node_made_since_the_job_was_read_is_overwritten_after_one_refused_create(
    zk: KazooClient, claimed
) -> None:
    job, sent, gate = claimed
    zk.create(zpaths.job_node(job.jid, "metadata"), b'{"title": "before"}')
    with gate():
        job_set_json(zk, job, "metadata", {"title": "after"})
    assert sent == [1, 1]
    assert node(zk, job, "metadata") == {"title": "after"}


def test_a_node_gone_since_the_job_was_read_is_created_after_one_refused_overwrite(
    zk: KazooClient, claimed
) -> None:
    job, sent, gate = claimed
    with gate():
        written = job_set_json(zk, job, "inventory", {"version": 1})
    zk.delete(zpaths.job_node(job.jid, "inventory"))
    with gate():
        job_set_json(zk, written, "inventory", {"version": 2})
    assert sent == [1, 1, 1]
    assert node(zk, job, "inventory") == {"version": 2}


def test_a_write_whose_lock_is_gone_is_refused_once_and_not_tried_the_other_way(
    zk: KazooClient, claimed
) -> None:
    job, sent, gate = claimed
    zk.delete(zpaths.job_node(job.jid, "lock"))
    with gate(), pytest.raises(Conflict):
        job_set_json(zk, job, "store", {"a": 1})
    assert sent == [1]
    assert zk.exists(zpaths.job_node(job.jid, "store")) is None


def test_a_size_the_job_has_already_is_not_written_again(zk: KazooClient, claimed) -> None:
    job, sent, gate = claimed
    with gate():
        sized = job_set_space_needed(zk, job, 4096)
        assert job_set_space_needed(zk, sized, 4096) is sized
    assert sent == [1]
    assert job_load(zk, job.jid).space_needed == 4096
