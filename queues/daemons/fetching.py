"""The fetch policy for depositors' URLs, built from settings in this one place.

Every request the system makes for a depositor (estimating's HEADs, downloads, manifests, the
checks at the submission door) uses :func:`depositor_policy`; the system's own requests (to
Merritt's storage and inventory on its own network) do not.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from django.conf import settings

from queues.steps.netpolicy import FetchPolicy, parse_networks


def depositor_policy(*, timeout: float | None = None) -> FetchPolicy:
    return FetchPolicy(
        restrict=True,
        allow=parse_networks(settings.MRT_FETCH_ALLOW),
        max_redirects=settings.MRT_FETCH_MAX_REDIRECTS,
        timeout=settings.MRT_HTTP_TIMEOUT if timeout is None else timeout,
        deadline=settings.MRT_DOWNLOAD_DEADLINE or None,
        min_rate=settings.MRT_DOWNLOAD_MIN_RATE,
        rate_window=settings.MRT_DOWNLOAD_RATE_WINDOW,
    )


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
