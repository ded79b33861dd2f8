"""A value each thread sets for the code it calls while a block runs: the fence of a claim's job
writes (``queues.zk.fence``), the stop that cuts a loop's back-offs short (``transient``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

V = TypeVar("V")


class PerThread(Generic[V]):
    """``get()``: the value this thread bound last (``bound``) and has not left, or None."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self) -> V | None:
        value: V | None = getattr(self._local, "value", None)
        return value

    @contextlib.contextmanager
    def bound(self, value: V | None) -> Iterator[None]:
        """Make ``value`` this thread's while the block runs (the one before it again after)."""
        previous = self.get()
        self._local.value = value
        try:
            yield
        finally:
            self._local.value = previous
