"""A request during which the web process grew gives the pages it freed back to the system
(``queues/web/memory.py``): glibc otherwise keeps them, and at 1,000,000 jobs a walk of every
view left the process about 35 MiB above what it held."""

from __future__ import annotations

import pytest

from queues.web import memory
from queues.zk.packed import _malloc_trim

pytestmark = pytest.mark.skipif(
    _malloc_trim() is None or not memory.resident_bytes(), reason="glibc and /proc only"
)

HELD = 30_000  # blocks of 2,000 bytes: 60 MB from glibc (past pymalloc's 512 bytes)


def _work(request: object) -> bytes:
    held = [bytes(2_000) for _ in range(HELD)]
    kept = bytes(2_000)  # made after them: the heap's top stays in use, glibc keeps the rest
    del held
    return kept


def test_the_pages_a_request_freed_go_back_and_stay_without_the_middleware() -> None:
    mib = 1024**2
    given_back = memory.GiveBackMemoryMiddleware(_work)

    before = memory.resident_bytes()
    answer = given_back(None)  # kept: freeing it would free the heap's top, and glibc trims that
    with_it = memory.resident_bytes() - before

    before = memory.resident_bytes()
    other = _work(None)
    without_it = memory.resident_bytes() - before
    del answer, other

    # The same work without the middleware keeps its 60 MB (what the middleware gave back is
    # touched again); with it, the process holds about what it held before.
    assert with_it < 10 * mib, with_it / mib
    assert without_it > 40 * mib, without_it / mib
