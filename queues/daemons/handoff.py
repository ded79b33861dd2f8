"""Work a loop hands over to a thread of the process's own, and goes on.

Some of what follows a move takes time the move does not need: moving the batches it completed
to Reporting (round trips queued behind everything else the session sent,
``queues/daemons/completions.py``), removing a completed job's working folder (seconds for a
large object, ``queues/daemons/workfolder.py``). Done in the loop's thread, it holds up every
loop sharing that thread. ``HandedWork`` takes such work in the order it is handed over and does
it, one piece after another, in one thread started at the first hand-over (and again should it
have died); ``settle`` waits for all of it, for a stopping process and for tests.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

_T = TypeVar("_T")


class HandedWork(Generic[_T]):
    """Pieces of work done in order by one thread of their own: ``work`` each, and ``failed``
    with the exception when its ``work`` raised (the thread goes on to the next)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._waiting: deque[_T] = deque()
        self._busy = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def work(self, piece: _T) -> None:
        raise NotImplementedError

    def failed(self, piece: _T, exc: Exception) -> None:
        raise NotImplementedError

    def put(self, piece: _T) -> None:
        with self._changed:
            self._waiting.append(piece)
            if self._thread is None or not self._thread.is_alive():
                self._busy = False  # a thread that died with a piece under way
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until every piece handed over has been done (or failed); False when
        ``timeout`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._waiting and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._waiting:
                    self._busy = False
                    self._changed.notify_all()
                    self._changed.wait()
                piece = self._waiting.popleft()
                self._busy = True
            try:
                self.work(piece)
            except Exception as exc:
                self.failed(piece, exc)
