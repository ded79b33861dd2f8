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
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from queues.services import moves

log = logging.getLogger("queues.daemons")


class ReportingMoves:
    """Batches handed over by the loops, moved to Reporting one hand-over after another by one
    thread, started at the first hand-over."""

    def __init__(self, move: Callable[[Any, list[str]], Any] | None = None) -> None:
        self._move = move or _to_reporting
        self._waiting: deque[tuple[Any, str, list[str]]] = deque()
        self._busy = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def hand(self, zk: Any, step: str, bids: list[str]) -> None:
        """Move ``bids`` (complete, as ``step``'s completion check found them) to Reporting,
        through ``zk``, the client of the loop handing them over."""
        if not bids:
            return
        with self._changed:
            self._waiting.append((zk, step, bids))
            if self._thread is None or not self._thread.is_alive():
                self._busy = False  # a thread that died with a move under way
                self._thread = threading.Thread(
                    target=self._run, name="batch-completions", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until every batch handed over has been moved (or its move failed); False when
        ``timeout`` passed first. A stopping process, and tests."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._waiting and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._waiting:
                    self._busy = False
                    self._changed.notify_all()
                    self._changed.wait()
                zk, step, bids = self._waiting.popleft()
                self._busy = True
            try:
                self._move(zk, bids)
            except Exception as exc:
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
