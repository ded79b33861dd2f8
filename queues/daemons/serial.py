"""Tasks run by a few threads, those with the same key one after another.

A loop whose step waits on servers outside (a depositor's host, a callback's receiver) runs its
steps here, keyed by the server: one server's jobs never have two requests under way from the
loop at once, and a server that does not answer holds up only its own jobs while the others' go
on in the other threads.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

Task = tuple[Future[Any], Callable[[], Any]]


class SerialByKey:
    def __init__(self, workers: int, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        # Tasks waiting behind the one running for their key; a key is here while one runs.
        self._queued: dict[str, collections.deque[Task]] = {}

    def submit(self, key: str, task: Callable[[], T]) -> Future[T]:
        """Run ``task`` once the tasks submitted before it with ``key`` have ended. The future
        may be cancelled until then."""
        future: Future[T] = Future()
        with self._lock:
            queue = self._queued.get(key)
            if queue is not None:
                queue.append((future, task))
                return future
            self._queued[key] = collections.deque()
        self._pool.submit(self._run, key, future, task)
        return future

    def _run(self, key: str, future: Future[Any], task: Callable[[], Any]) -> None:
        # The thread that runs a key's first task runs those queued behind it as well.
        while True:
            if future.set_running_or_notify_cancel():
                try:
                    result = task()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            with self._lock:
                queue = self._queued[key]
                if not queue:
                    del self._queued[key]
                    return
                future, task = queue.popleft()

    def shutdown(self) -> None:
        """Wait for every task submitted (a cancelled one does not run) and stop the threads."""
        self._pool.shutdown(wait=True)
