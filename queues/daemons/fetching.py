"""Downloads under way per depositor host, so one slow depositor cannot hold every
downloading loop of a process (the policy itself is in queues/depositors.py)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit


def depositor_host(url: str) -> str:
    """The host a payload URL is fetched from, lowercased ("" for file:// URLs)."""
    return (urlsplit(url).hostname or "").lower()


class HostSlots:
    """Downloads under way per depositor host in this process, at most ``per_host`` each.

    A consumer asks before it takes a job (``try_take``) and passes over a job whose host is
    full, so one slow depositor occupies at most ``per_host`` download threads, never all.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: Counter[str] = Counter()

    def try_take(self, host: str, per_host: int) -> bool:
        with self._lock:
            if host and self._busy[host] >= per_host:
                return False
            self._busy[host] += 1
            return True

    def give_back(self, host: str) -> None:
        with self._lock:
            self._busy[host] -= 1
            if self._busy[host] <= 0:
                del self._busy[host]

    def busy(self, host: str) -> int:
        with self._lock:
            return self._busy[host]

    @contextmanager
    def holding(self, host: str) -> Iterator[None]:
        try:
            yield
        finally:
            self.give_back(host)


HOST_SLOTS = HostSlots()
