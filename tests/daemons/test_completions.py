"""The process's mover of complete batches (``queues/daemons/completions.py``): a loop hands the
batches its move completed over and goes on; the moves are made one hand-over after another in
a thread of their own, a failed one is logged and left to the reporting sweep."""

from __future__ import annotations

import logging
import threading

import pytest

from queues.daemons.completions import ReportingMoves


def test_a_hand_over_does_not_wait_for_the_move_and_settle_waits_for_every_one() -> None:
    release = threading.Event()
    moved: list[list[str]] = []

    def move(_zk: object, bids: list[str]) -> list[str]:
        release.wait()
        moved.append(bids)
        return bids

    mover = ReportingMoves(move)
    mover.hand(None, "notify", ["bid0000000001"])  # returns while the move waits
    mover.hand(None, "notify", [])  # nothing to move: nothing handed over
    mover.hand(None, "recording", ["bid0000000002", "bid0000000003"])
    assert not mover.settle(timeout=0)
    assert moved == []
    release.set()
    assert mover.settle(timeout=30)
    assert moved == [["bid0000000001"], ["bid0000000002", "bid0000000003"]]


def test_a_failed_move_is_logged_and_the_next_ones_are_made(
    caplog: pytest.LogCaptureFixture,
) -> None:
    moved: list[list[str]] = []

    def move(_zk: object, bids: list[str]) -> list[str]:
        if "bid0000000001" in bids:
            raise ConnectionError("connection lost")
        moved.append(bids)
        return bids

    mover = ReportingMoves(move)
    with caplog.at_level(logging.WARNING, logger="queues.daemons"):
        mover.hand(None, "notify", ["bid0000000001"])
        mover.hand(None, "notify", ["bid0000000002"])
        assert mover.settle(timeout=30)
    assert moved == [["bid0000000002"]]
    assert any(
        "bid0000000001 notify: batch completion: connection lost (the reporting sweep moves them)"
        in r.getMessage()
        for r in caplog.records
    )
