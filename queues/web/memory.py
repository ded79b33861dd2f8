"""Memory a request freed goes back to the system, and the web process keeps few heaps.

glibc keeps what a thread freed mapped in that thread's heap: the pages a large answer's work
used (a state folder's times, a search's batch texts, a report of 20,000 batches) stayed in the
web process after the request, and at 1,000,000 jobs the process ended a walk of every view
about 35 MiB above what it held (356 MiB, 322 after ``malloc_trim``). After a request during
which the process grew by ``TRIM_AFTER_BYTES`` or more, the free pages are given back
(``queues.zk.packed.trim_heap``: a few milliseconds at that size, the interpreter's lock let go
meanwhile); a request that grew nothing costs two reads of ``/proc/self/statm``.

``limit_heaps`` (called as the web process starts, ``mrtadmin.asgi``) sets two of glibc's
malloc parameters. By default each thread that allocates may get a heap of its own (up to eight
per core: the fill, the watches' threads, the views' executor, the live console's), and each
keeps what was freed in it; and a block of 128 KiB or more is mapped on its own only until the
first such block is freed, after which the size raises itself up to 32 MiB and the large
arrays of a state's listing, its times and its orders come from the heaps, where a freed one
leaves a hole. With at most ``HEAPS`` heaps and blocks of ``MAP_FROM_BYTES`` or more always
mapped on their own (and unmapped when freed), a walk of every view at 1,000,000 jobs ended at
306 MiB instead of 318, the fill at 209 instead of 229. Pages answer as fast but for those that
make such a block at every request: ``/api/batches`` at 1,000,000 jobs about 20% slower (each
block mapped, zeroed and unmapped again). An operator's own
``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_`` or ``GLIBC_TUNABLES`` is left to rule.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from queues.zk.packed import libc_function, trim_heap

TRIM_AFTER_BYTES = 4 * 1024**2
HEAPS = 2
MAP_FROM_BYTES = 1024**2
# glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
OPERATORS_OWN = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """The process's resident size (Linux; 0 where ``/proc`` does not say)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def limit_heaps(environ: Mapping[str, str] = os.environ) -> bool:
    """At most ``HEAPS`` malloc heaps, and blocks of ``MAP_FROM_BYTES`` or more mapped on their
    own (see the module's doc); False where glibc is not there or the environment says how."""
    mallopt = libc_function("mallopt")
    if mallopt is None or any(name in environ for name in OPERATORS_OWN):
        return False
    return bool(mallopt(M_ARENA_MAX, HEAPS)) and bool(mallopt(M_MMAP_THRESHOLD, MAP_FROM_BYTES))


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
