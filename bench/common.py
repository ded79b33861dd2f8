"""What every benchmark needs: Django set up, a throwaway ZooKeeper, figures and the machine."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def setup_django() -> None:
    """Import the project's settings the way manage.py does, from any working directory."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mrtadmin.settings")
    import django

    django.setup()


@contextlib.contextmanager
def throwaway_zookeeper(hosts: str = "") -> Iterator[str]:
    """``hosts`` if given, else a fresh local server on a free port with its data in a tmp dir.

    The server gets a larger heap than the development default: 100,000 jobs are about 900,000
    nodes, and a server short of heap spends its time collecting garbage, not serving.
    """
    if hosts:
        yield hosts
        return
    from queues.services.zkserver import LocalZooKeeper, free_port

    os.environ.setdefault("ZK_LOCAL_HEAP", "3g")
    # A benchmark stopped by SIGTERM or a closed terminal stops its server too (the default
    # handlers end the process without running the ``finally`` below: the servers were left).
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            handlers[sig] = signal.signal(sig, _exit_on_signal)
    try:
        with tempfile.TemporaryDirectory(prefix="mrt-bench-zk-") as tmp:
            server = LocalZooKeeper(Path(tmp), free_port())
            server.start()
            try:
                yield server.hosts
            finally:
                server.stop()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def new_chroot(hosts: str, name: str) -> str:
    """A connection string into a fresh chroot, so runs never see each other's nodes."""
    from queues.zk import client as zkmod

    chroot = f"/{name}-{uuid.uuid4().hex[:8]}"
    root = zkmod.connect(hosts)
    root.ensure_path(chroot)
    root.stop()
    root.close()
    return f"{hosts}{chroot}"


def drop_chroot(target: str, *, per_multi: int = 1000) -> int:
    """Delete a run's chroot (``target``, from ``new_chroot``) with everything under it, and
    return how many nodes went.

    A server holding every earlier run's nodes is not the server the next run should meet:
    ZooKeeper writes a snapshot of its whole tree every so many writes, in the middle of
    whatever run is timed then, and the snapshot takes longer the bigger the tree has grown.
    The tree is listed level by level and deleted deepest level first, ``per_multi`` deletes a
    request, every level's requests sent before any answer is waited for.
    """
    from queues.zk import client as zkmod
    from queues.zk.kazoo_private import Multi
    from queues.zk.nodes import children_many

    hosts, slash, chroot = target.partition("/")
    if not slash or not chroot:
        raise BenchError(f"{target!r} names no chroot")
    root = zkmod.connect(hosts)
    try:
        levels = [[f"/{chroot}"]]
        while levels[-1]:
            listed = children_many(root, levels[-1])  # None for a node gone meanwhile
            levels.append([f"{p}/{name}" for p, names in listed.items() for name in names or ()])
        for level in reversed(levels):
            sent = []
            for start in range(0, len(level), per_multi):
                txn = Multi(root)
                for path in level[start : start + per_multi]:
                    txn.delete(path)
                sent.append(txn.commit_async())
            for answer in sent:
                failed = [r for r in answer.get() if isinstance(r, Exception)]
                if failed:
                    raise BenchError(f"deleting {target}: {failed[0]!r}")
        return sum(len(level) for level in levels)
    finally:
        root.stop()
        root.close()


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    """CPU model, cores and memory, for the line under every table of figures."""
    model = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = "?"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 1024**2:.0f} GiB RAM"
                break
    return (
        f"{model}, {os.cpu_count()} cores, {memory}; Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )


def zookeeper_version(hosts: str) -> str:
    from queues.services.zkserver import four_letter

    host, _, rest = hosts.partition(":")
    port = int(rest.split(",")[0].split("/")[0])
    answer = four_letter(port) if host in ("127.0.0.1", "localhost") else None
    for line in (answer or "").splitlines():
        if line.startswith("Zookeeper version:"):
            return line.split(":", 1)[1].split(",")[0].strip()
    return "unknown"


class BenchError(RuntimeError):
    """A run that measured nothing worth a figure (no transition in the window, a child that
    never got ready): said as such rather than divided by zero."""


def start_together(children: list[Any], ready: Any, go: Any, timeout: float) -> None:
    """Start every child process, wait until each has said it is ready (connected and set up,
    one item on ``ready``), then let them all go at once (``go``, an Event they wait on)."""
    for child in children:
        child.start()
    for _ in children:
        try:
            ready.get(timeout=timeout)
        except Exception:
            raise BenchError(f"a child was not ready after {timeout:.0f}s") from None
    go.set()
