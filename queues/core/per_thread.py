"""A value each thread sets for the code it calls while a block runs: the fence of a claim's job
writes (``queues.zk.fence``), the stop that cuts a loop's back-offs short (``transient``)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class PerThread(Generic[V]):
    """``get()``: the value this thread bound last (``bound``) and has not left, or None."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self) -> V | None:
        value: V | None = getattr(self._local, "value", None)
        return value

    def bound(self, value: V | None) -> contextlib.AbstractContextManager[None]:
        """Make ``value`` this thread's while the block runs (the one before it again after)."""
        return _Binding(self._local, value)


class _Binding(contextlib.AbstractContextManager[None]):
    """``PerThread.bound``'s block (a class, not a generator: a daemon binds one for every
    job's step)."""

    __slots__ = ("_local", "_previous", "_value")

    def __init__(self, local: threading.local, value: Any) -> None:
        self._local = local
        self._value = value
        self._previous: Any = None

    def __enter__(self) -> None:
        self._previous = getattr(self._local, "value", None)
        self._local.value = self._value

    def __exit__(self, *exc: object) -> None:
        self._local.value = self._previous
