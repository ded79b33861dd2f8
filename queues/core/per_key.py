"""One object per live key (a read index, a ZooKeeper client, a daemon), made on first use and
gone with its key: what a module keeps for each index or client it serves."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar
from weakref import WeakKeyDictionary

K = TypeVar("K")
V = TypeVar("V")


class PerKey(Generic[K, V]):
    """``per_key(key)``: the key's object, ``make(key)`` the first time (under a lock: one
    object per key however many threads ask at once)."""

    def __init__(self, make: Callable[[K], V]) -> None:
        self._make = make
        self._made: WeakKeyDictionary[K, V] = WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, key: K) -> V:
        with self._lock:
            found = self._made.get(key)
            if found is None:
                found = self._made[key] = self._make(key)
            return found
