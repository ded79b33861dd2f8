"""Tasks run by a few threads, those with the same key one after another.

A loop whose step waits on servers outside (a depositor's host, a callback's receiver) runs its
steps here, keyed by the server: the server's tasks form a lane, run one after another by one
thread at a time, and a server that does not answer holds up only its own lane while the others
go on in the other threads.

A task under way can be set aside (``set_aside``): it goes on in its thread, which no longer
counts as its lane's, and the lane goes on without it in another thread. At most ``lanes``
threads run lanes at once and at most ``aside`` tasks are set aside at once, so tasks set aside
never take the lanes' threads.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from queues.core import transient

T = TypeVar("T")

# A task, and the stop event of the thread that submitted it (``transient.stopped_by``).
Task = tuple[Future[Any], Callable[[], Any], threading.Event | None]


class SerialByKey:
    def __init__(self, workers: int, name: str, *, aside: int = 0) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers + aside, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._lanes = workers  # threads running lanes at once, at most
        self._aside_max = aside
        self._running = 0  # threads running a lane now
        self._aside: set[Future[Any]] = set()  # tasks set aside and not ended
        # Tasks waiting behind the one running for their key; a key is here while it has a
        # thread or waits for one (``_ready``).
        self._queued: dict[str, collections.deque[Task]] = {}
        self._ready: collections.deque[str] = collections.deque()  # keys waiting for a thread
        self._current: dict[str, Future[Any]] = {}  # the task a key's thread runs now

    def submit(self, key: str, task: Callable[[], T], *, first: bool = False) -> Future[T]:
        """Run ``task`` once the tasks submitted before it with ``key`` have ended (``first``:
        before those not begun yet). The future may be cancelled until then."""
        future: Future[T] = Future()
        entry = (future, task, transient.current_stop())
        with self._lock:
            queue = self._queued.get(key)
            if queue is not None:
                if first:
                    queue.appendleft(entry)
                else:
                    queue.append(entry)
                return future
            self._queued[key] = collections.deque([entry])
            self._ready.append(key)
            self._start()
        return future

    def _start(self) -> None:
        """Give threads to the keys waiting for one, as far as the lanes allow (under the
        lock)."""
        while self._ready and self._running < self._lanes:
            key = self._ready.popleft()
            self._running += 1
            self._pool.submit(self._run, key)

    def _run(self, key: str) -> None:
        # A key's thread runs its tasks one after another until none is left, or until the
        # task it runs is set aside (the key has another thread then, or none).
        while True:
            with self._lock:
                queue = self._queued[key]
                if not queue:
                    del self._queued[key]
                    self._running -= 1
                    self._start()
                    return
                future, task, stop = queue.popleft()
                self._current[key] = future
            if future.set_running_or_notify_cancel():
                try:
                    with transient.stopped_by(stop):
                        result = task()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            with self._lock:
                if future in self._aside:
                    self._aside.discard(future)
                    return
                del self._current[key]

    def set_aside(self, key: str, future: Future[Any]) -> bool:
        """Let ``key``'s lane go on without ``future``, its task under way, which ends in its
        thread; False when that is not its task now or ``aside`` tasks are set aside already."""
        with self._lock:
            if self._current.get(key) is not future or len(self._aside) >= self._aside_max:
                return False
            self._aside.add(future)
            del self._current[key]
            self._running -= 1
            if self._queued[key]:
                self._ready.appendleft(key)  # it had a thread: it comes first
            else:
                del self._queued[key]
            self._start()
            return True

    def aside(self) -> int:
        """Tasks set aside and not ended."""
        with self._lock:
            return len(self._aside)

    def shutdown(self) -> None:
        """Wait for every task submitted (a cancelled one does not run) and stop the threads."""
        self._pool.shutdown(wait=True)
