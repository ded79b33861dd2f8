"""The suite's parallel workers (pytest-xdist) and what each has of its own.

``bin/run-tests`` (and a bare ``pytest``) runs the suite on ``MRT_TEST_WORKERS`` worker processes,
4 unless set; ``MRT_TEST_WORKERS=0`` (or ``-n 0``) runs it serially in one process, and an
explicit ``-n N`` wins. Each worker is a process of its own with the session fixtures of its own:
one ZooKeeper server (a chroot per test, ``tests/conftest.py``), one PostgreSQL cluster
(``tests/pg.py``), its own temporary folder (pytest's ``basetemp`` is per worker) and its own
SQLite test database (pytest-django names it after the worker). The modules of ``TOGETHER`` run
whole on one worker, one test after another (the suite's own scheduler, below), so a module
fixture is made once.

**Ports.** ``queues.services.zkserver.free_port`` asks the kernel for a free port (bind to 0, close)
and hands out its number for a server started later. The kernel takes such a port from the same
range (Linux's 32768-60999) it gives every outgoing connection, and another worker asks it too:
between the check and the server's start, another worker's server, a test's HTTP server or any
process's connection could take it (the parallel suite's lost ZooKeeper and ensemble starts).
Here every process of a test run claims a block of ports of its own, below that range
(``FIRST`` onward, ``BLOCK`` ports each), by holding an exclusive lock on the block's file under
``/tmp/mrt-test-ports`` for as long as it runs: two test runs on one machine, or a worker and
the chaos run it started (``python tests/workers.py manage.py chaosrun ...``), never share a
block. ``free_port`` then hands out the block's ports in turn, each checked free, and is what
``queues.services.zkserver.free_port`` is, in the suite's processes (``install``).
"""

from __future__ import annotations

import fcntl
import os
import runpy
import socket
import sys
import threading
from pathlib import Path
from typing import IO, Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORKERS = 4
WORKERS_ENV = "MRT_TEST_WORKERS"

FIRST = 20_000  # below Linux's default ephemeral range (ip_local_port_range: 32768-60999)
BLOCK = 500
BLOCKS = 24  # 20000-31999
LOCKS = Path("/tmp/mrt-test-ports")


def workers_wanted() -> int:
    """``MRT_TEST_WORKERS`` (0: serially), or 4."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if not raw:
        return DEFAULT_WORKERS
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise SystemExit(f"{WORKERS_ENV}={raw!r}: expected a number of workers (0: serially)")
    return value


def worker_name() -> str:
    """``gw0``, ``gw1``, ... in a pytest-xdist worker; ``main`` otherwise."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def _ephemeral() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


class _Ports:
    lock = threading.Lock()
    held: IO[str] | None = None  # the claimed block's lock file, open while the process runs
    first = 0
    next = 0


def _claim() -> None:
    """Hold the first block nobody holds, starting from this worker's own number."""
    low, high = _ephemeral()
    last = FIRST + BLOCK * BLOCKS - 1
    if last >= low and high >= FIRST:
        raise RuntimeError(
            f"the tests' ports {FIRST}-{last} overlap the ephemeral range "
            f"{low}-{high} (/proc/sys/net/ipv4/ip_local_port_range)"
        )
    LOCKS.mkdir(mode=0o1777, parents=True, exist_ok=True)
    name = worker_name()
    start = int(name[2:]) + 1 if name.startswith("gw") and name[2:].isdigit() else 0
    for n in [(start + i) % BLOCKS for i in range(BLOCKS)]:
        handle = (LOCKS / f"block-{n}.lock").open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _Ports.held, _Ports.first, _Ports.next = handle, FIRST + n * BLOCK, 0
        return
    raise RuntimeError(f"every block of test ports under {LOCKS} is held by another process")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port of this process's own block that nothing is bound to now."""
    with _Ports.lock:
        if _Ports.held is None:
            _claim()
        for _ in range(BLOCK):
            port = _Ports.first + _Ports.next
            _Ports.next = (_Ports.next + 1) % BLOCK
            if _bindable(port):
                return port
    raise RuntimeError(f"no free port in {_Ports.first}-{_Ports.first + BLOCK - 1}")


def install() -> None:
    """Make ``free_port`` the one every module of the project uses in this process (those that
    imported ``queues.services.zkserver``'s by name too)."""
    import queues.services.zkserver

    original = queues.services.zkserver.free_port
    if original is free_port:
        return
    for module in list(sys.modules.values()):
        if getattr(module, "free_port", None) is original:
            module.free_port = free_port  # type: ignore[union-attr]
    queues.services.zkserver.free_port = free_port  # type: ignore[assignment]


def with_ports(command: list[str]) -> list[str]:
    """``[python, script, ...]`` run with this module's ports (a block of the child's own)."""
    python, script, *rest = command
    return [python, str(Path(__file__).resolve()), str(script), *rest]


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: Any) -> None:
    """Run on ``MRT_TEST_WORKERS`` workers, ``--dist loadgroup``, unless ``-n`` says otherwise.

    Called before pytest-xdist's own hook (both ``tryfirst``; a conftest's comes first), which
    turns ``numprocesses`` into the workers."""
    if "PYTEST_XDIST_WORKER" in os.environ or not config.pluginmanager.hasplugin("xdist"):
        return
    if config.getoption("usepdb", False) or config.getoption("collectonly", False):
        return
    if config.option.numprocesses is None and config.option.dist == "no":
        config.option.numprocesses = workers_wanted()
    if config.option.numprocesses and config.option.dist == "no":
        config.option.dist = "loadgroup"


# Modules whose tests run on one worker, one after another, so that a module fixture (a bulk
# load, a cluster of its own, a daphne) is made once rather than on every worker that runs one
# of its tests. pytest-xdist's own ``xdist_group`` mark does nothing under pytest 9 (xdist 3.8
# renames ``item._nodeid``, which pytest 9 no longer reads): the suite's scheduler below groups
# by this list instead, and a test carrying the mark fails collection (``refuse_xdist_groups``).
TOGETHER = frozenset(
    {
        "tests/faults/test_audited_writes_outage.py",
        "tests/faults/test_chaos_txnlog.py",
        "tests/faults/test_door_bounds.py",
        "tests/faults/test_request_bodies.py",
        "tests/faults/test_transient_database.py",
        "tests/live/test_search_text_index.py",
        "tests/scale/test_every_view_flat.py",
    }
)


def together_scope(nodeid: str) -> str:
    """The unit a worker is sent: a module of ``TOGETHER`` whole, any other test on its own."""
    module = nodeid.split("::", 1)[0]
    return module if module in TOGETHER else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """The suite's scheduler (``--dist loadgroup``, the default set above): pytest-xdist's
    load-by-scope, with ``together_scope`` as the scope."""
    if config.option.dist != "loadgroup":
        return None
    from xdist.scheduler.loadscope import LoadScopeScheduling

    class ModulesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return together_scope(nodeid)

    return ModulesTogether(config, log)


def refuse_xdist_groups(items: list[Any]) -> None:
    """Fail collection for a test marked ``xdist_group``, which would not be grouped (see
    ``TOGETHER``), and for a module of ``TOGETHER`` that is not there (moved or renamed, it would
    silently no longer be)."""
    gone = sorted(module for module in TOGETHER if not (ROOT / module).is_file())
    if gone:
        raise pytest.UsageError(f"tests/workers.py's TOGETHER names no such module: {gone}")
    marked = {item.path.name for item in items if item.get_closest_marker("xdist_group")}
    if marked:
        raise pytest.UsageError(
            f"xdist_group does nothing under pytest 9; list the module in tests/workers.py's "
            f"TOGETHER instead: {', '.join(sorted(marked))}"
        )


def heavy_first(items: list[Any]) -> None:
    """The ``slow`` tests first (in their order), so that no worker starts a long one while the
    others have nothing left to do."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def main(argv: list[str]) -> Any:
    """``python tests/workers.py SCRIPT ARGS...``: run SCRIPT (``manage.py``) as ``__main__``
    with ``install``'s ports."""
    # Run as a script, this folder is the first on the path: its modules (browser.py, pg.py)
    # must not stand in for packages of the same name.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != here]
    script = str(Path(argv[0]).resolve())
    sys.path.insert(0, str(Path(script).parent))
    sys.path.insert(1, str(ROOT))
    install()
    sys.argv = [script, *argv[1:]]
    return runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
