"""Every write a batch consumer makes under the batch's lock is fenced as a job step's is: its
report, the report's marks and its move each go out in a multi that checks the lock, in the
session that took it, or not at all. Outside a step, a write to a batch another session holds
is refused. Forced here on a real server: the session ends, the client opens a new one, and
another consumer may take the lock meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from daemons.conftest import wait_for
from kazoo.client import KazooClient

from faults.test_fenced_writes import new_session
from queues.core.states import BatchState
from queues.zk import batches
from queues.zk import paths as zpaths
from queues.zk.errors import Conflict, ItemLocked, LockLost
from queues.zk.fence import fenced
from queues.zk.kazoo_private import session_id
from queues.zk.locks import lock_create
from queues.zk.records import Batch

pytestmark = pytest.mark.slow


def reporting_batch(zk: KazooClient) -> Batch:
    batch = batches.batch_create(zk, submission={"profile": "demo_profile"})
    batch = batches.batch_transition(zk, batch, BatchState.PROCESSING)
    batch = batches.batch_transition(zk, batch, BatchState.REPORTING)
    batches.batch_write_report(zk, batch, failed=[], successful=["jid0000000001"])
    return batches.batch_load(zk, batch.bid)


def lock_of(batch: Batch) -> str:
    return zpaths.batch_node(batch.bid, "lock")


# The batch consumer's writes under the lock: its report (batch-reporting), the report's marks
# (the mail recorded as sent), a step's note that it is to be tried again (batch-pending) and
# its move.
WRITERS: dict[str, Callable[[KazooClient, Batch], Any]] = {
    "report": lambda zk, batch: batches.batch_write_report(
        zk, batch, failed=["jid0000000002"], successful=[], marks={"round": "r2"}
    ),
    "report marks": lambda zk, batch: batches.batch_report_update(zk, batch.bid, {"mailed": True}),
    "retry note": lambda zk, batch: batches.batch_retry_later(
        zk, batch, {"tries": 1}, "waiting for ingest"
    ),
    "move": lambda zk, batch: batches.batch_transition(
        zk, batch, BatchState.COMPLETED, message="done", holder=True
    ),
}


def snapshot(zk: KazooClient, batch: Batch) -> dict[str, tuple[bytes, int] | None]:
    found = {}
    for name in ("status", "status-report"):
        path = zpaths.batch_node(batch.bid, name)
        stat = zk.exists(path)
        found[name] = (zk.get(path)[0], stat.version) if stat is not None else None
    return found


@pytest.mark.parametrize("taken", [True, False], ids=["another holds it", "nobody holds it"])
@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_batch_write_after_the_claims_session_is_gone_writes_nothing(
    zk: KazooClient, zk_hosts: str, own_zk, writer: str, taken: bool
) -> None:
    client, gate = own_zk
    batch = reporting_batch(zk)
    claim = (gate.generation, session_id(client))
    assert lock_create(client, lock_of(batch))
    before = snapshot(zk, batch)
    new_session(client, zk_hosts)
    wait_for(lambda: gate.generation != claim[0])
    if taken:
        assert lock_create(zk, lock_of(batch))
    with fenced(gate.fence(client, *claim)), pytest.raises(LockLost):
        WRITERS[writer](client, batch)
    assert snapshot(zk, batch) == before
    # The same write in the session that holds the lock goes through.
    if not taken:
        assert lock_create(client, lock_of(batch))
        fresh = (gate.generation, session_id(client))
        with fenced(gate.fence(client, *fresh)):
            WRITERS[writer](client, batches.batch_load(zk, batch.bid))
        assert snapshot(zk, batch) != before


@pytest.mark.parametrize("writer", ["report", "report marks"])
def test_a_report_write_outside_a_step_is_refused_while_another_session_holds_the_batch(
    zk: KazooClient, other_zk: KazooClient, writer: str
) -> None:
    batch = reporting_batch(zk)
    assert lock_create(other_zk, lock_of(batch))  # a consumer, ours or Merritt's, holds it
    before = snapshot(zk, batch)
    with pytest.raises(ItemLocked):
        WRITERS[writer](zk, batch)
    assert snapshot(zk, batch) == before
    # Its holder writes it; with nobody holding it, so may anyone.
    WRITERS[writer](other_zk, batch)
    after = snapshot(zk, batch)
    assert after != before
    other_zk.delete(lock_of(batch))
    WRITERS[writer](zk, batches.batch_load(zk, batch.bid))
    assert snapshot(zk, batch) != after


def test_a_holders_move_outside_a_step_goes_only_in_the_session_that_owns_the_lock(
    zk: KazooClient, other_zk: KazooClient
) -> None:
    batch = reporting_batch(zk)
    assert lock_create(other_zk, lock_of(batch))
    before = snapshot(zk, batch)
    with pytest.raises(Conflict):  # "holder", but the lock is another session's
        WRITERS["move"](zk, batch)
    assert snapshot(zk, batch) == before
    WRITERS["move"](other_zk, batch)
    assert batches.batch_load(zk, batch.bid).state == BatchState.COMPLETED
