"""A batch daemon's claims: each open batch's status read about once for a whole round of
claims, not once per claim, and still no batch taken that left the state meanwhile."""

from __future__ import annotations

from typing import Any

import pytest

from queues.services import moves
from queues.zk import batches, paths
from queues.zk.locks import lock_create

from .conftest import DEMO, daemon

BATCHES = 12


def _submit(n: int) -> str:
    return moves.batch_submit(
        profile=DEMO,
        submitter="depositor@example.org",
        payload_url=f"https://depositor.example.org/{n}.txt",
        submission_type="file",
    )


@pytest.fixture
def statuses_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many batch statuses each pipelined read of them asked for."""
    counts: list[int] = []
    real = batches.batch_states

    def counting(zk: Any, bids: Any) -> dict[str, str]:
        counts.append(len(bids))
        return real(zk, bids)

    monkeypatch.setattr(batches, "batch_states", counting)
    return counts


def test_claiming_every_batch_reads_each_status_about_once(zk, statuses_read) -> None:
    made = [_submit(n) for n in range(BATCHES)]
    pending = daemon(zk, "batch-pending")
    claimed = []
    while (batch := pending.claim()) is not None:
        claimed.append(batch.bid)
    assert claimed == sorted(made)  # oldest first, every one
    # One read of the twelve statuses gave the candidates; the claim that found none left
    # read them again (all locked now) to be sure. A read per claim would be 13 reads, 156
    # statuses.
    assert statuses_read == [BATCHES, BATCHES]


def test_a_candidate_that_left_the_state_or_was_locked_is_passed_over(
    zk, other_zk, statuses_read
) -> None:
    first, second, third = (_submit(n) for n in range(3))
    pending = daemon(zk, "batch-pending")
    assert pending.claim().bid == first  # the candidates: the second and the third
    assert lock_create(other_zk, paths.batch_node(second, "lock"))  # another consumer's now
    batches.batch_transition(zk, batches.batch_load(zk, third), "Failed")  # moved on
    fourth = _submit(3)
    # Both candidates left are passed over; the statuses read again find the fourth.
    assert pending.claim().bid == fourth
    assert pending.claim() is None
    assert batches.batch_load(zk, third).state == "Failed"
    assert len(statuses_read) == 3
