"""A request during which the web process grew gives the pages it freed back to the system
(``queues/web/memory.py``): glibc otherwise keeps them, and at 1,000,000 jobs a walk of every
view left the process about 35 MiB above what it held."""

from __future__ import annotations

import pytest

from queues.web import memory
from queues.zk.packed import libc_function

pytestmark = pytest.mark.skipif(
    libc_function("malloc_trim") is None or not memory.resident_bytes(),
    reason="glibc and /proc only",
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


HEAPS_SCRIPT = """
import sys, threading
from queues.web.memory import limit_heaps
from queues.zk.packed import libc_function
if sys.argv[1] == "limited":
    assert limit_heaps()
together = threading.Barrier(9)
def work():
    kept = [bytes(600) for _ in range(2000)]  # past pymalloc's 512 bytes: from glibc
    together.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for thread in threads:
    thread.start()
together.wait()
libc_function("malloc_stats")()  # to stderr: a paragraph per heap ("Arena N:")
"""


def _heaps(mode: str) -> int:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in memory.OPERATORS_OWN}
    done = subprocess.run(
        [sys.executable, "-c", HEAPS_SCRIPT, mode], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines())


def test_the_web_process_keeps_few_heaps_however_many_threads_allocate() -> None:
    """Eight threads allocating at once get a heap each by default; after ``limit_heaps``
    (what ``mrtadmin.asgi`` calls first) they share ``HEAPS``."""
    assert _heaps("default") >= 8
    assert _heaps("limited") == memory.HEAPS


def test_an_operators_own_malloc_settings_are_left_to_rule() -> None:
    assert not memory.limit_heaps({"MALLOC_ARENA_MAX": "4"})
    assert not memory.limit_heaps({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})


LARGE_SCRIPT = """
import sys
from queues.web import memory
if sys.argv[1] == "limited":
    assert memory.limit_heaps()
first = bytearray(8 * 1024**2)  # freed: by default, blocks up to its size come from the heap
del first
held = [bytearray(1536 * 1024) for _ in range(40)]  # 60 MB
last = bytearray(1536 * 1024)  # made after them and kept: the heap's top stays in use
before = memory.resident_bytes()
del held
print(before - memory.resident_bytes())
"""


def test_large_blocks_are_mapped_on_their_own_and_unmapped_when_freed() -> None:
    """By default a freed large block raises the size glibc maps blocks from; a state's
    arrays of a few MB then come from the heap and stay mapped there once freed."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in memory.OPERATORS_OWN}
    freed = {}
    for mode in ("default", "limited"):
        done = subprocess.run(
            [sys.executable, "-c", LARGE_SCRIPT, mode], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        freed[mode] = int(done.stdout) / 1024**2
    assert freed["default"] < 10, freed
    assert freed["limited"] > 50, freed
