"""Complete batches moved on to Reporting from a thread of the process's own.

A batched loop learns from a completion check sent after its move (``CompletionCheck``, its
answer taken without waiting) which batches that move finished. Moving such a batch to
Reporting reads the batch and writes its status: two or three round trips a batch, each
queued behind whatever else the process's session has sent. Made in the loop's own thread, they
held up every loop sharing it (a third of the short steps' shared thread's time in a one-process
no-op run, docs/benchmarks.md). The loop hands the batches over here instead and goes on.

Nothing is lost to a failure here: a batch left in Processing (a move that failed, or one still
waiting when the process is killed) is moved by the reporting consumer's sweep
(``BatchReporting.sweep``), as a completion missed any other way is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from queues.daemons.handoff import HandedWork
from queues.services import moves

log = logging.getLogger("queues.daemons")


class ReportingMoves(HandedWork[tuple[Any, str, list[str]]]):
    """Batches handed over by the loops, moved to Reporting one hand-over after another by one
    thread, started at the first hand-over."""

    def __init__(self, move: Callable[[Any, list[str]], Any] | None = None) -> None:
        super().__init__("batch-completions")
        self._move = move or _to_reporting

    def hand(self, zk: Any, step: str, bids: list[str]) -> None:
        """Move ``bids`` (complete, as ``step``'s completion check found them) to Reporting,
        through ``zk``, the client of the loop handing them over."""
        if bids:
            self.put((zk, step, bids))

    def work(self, piece: tuple[Any, str, list[str]]) -> None:
        zk, _step, bids = piece
        self._move(zk, bids)

    def failed(self, piece: tuple[Any, str, list[str]], exc: Exception) -> None:
        _zk, step, bids = piece
        log.warning(
            "%s %s: batch completion: %s (the reporting sweep moves them)",
            ", ".join(sorted(bids)),
            step,
            str(exc).strip()[:500] or type(exc).__name__,
        )


def _to_reporting(zk: Any, bids: list[str]) -> None:
    moves.batches_to_reporting(bids, zk=zk)


# The process's one mover (the loops of a process share one ZooKeeper session).
REPORTING_MOVES = ReportingMoves()
