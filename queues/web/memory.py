"""Memory a request freed goes back to the system.

glibc keeps what a thread freed mapped in that thread's heap: the pages a large answer's work
used (a state folder's times, a search's batch texts, a report of 20,000 batches) stayed in the
web process after the request, and at 1,000,000 jobs the process ended a walk of every view
about 35 MiB above what it held (356 MiB, 322 after ``malloc_trim``). After a request during
which the process grew by ``TRIM_AFTER_BYTES`` or more, the free pages are given back
(``queues.zk.packed.trim_heap``: a few milliseconds at that size, the interpreter's lock let go
meanwhile); a request that grew nothing costs two reads of ``/proc/self/statm``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from queues.zk.packed import trim_heap

TRIM_AFTER_BYTES = 4 * 1024**2
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """The process's resident size (Linux; 0 where ``/proc`` does not say)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class GiveBackMemoryMiddleware:
    """Outermost: after a request that grew the process, give its free pages back."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        before = resident_bytes()
        try:
            return self.get_response(request)
        finally:
            if before and resident_bytes() - before >= TRIM_AFTER_BYTES:
                trim_heap()
