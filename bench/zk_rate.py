"""The server's raw rate for job-transition-shaped transactions: ``python bench/zk_rate.py``.

N client processes (each its own ZooKeeper session, like daemon processes) commit, one after
another and as fast as the server answers, the five-operation multi a job transition writes: set
the status, delete + create the state-index entry, delete + create the batch-index entry
(``--locked``: the job's ephemeral lock created before and deleted in the multi, as a consumer
must).

Every child is started, connected and has created its nodes before any of them starts (the
scheme of ``bench/daemons.py``): each says it is ready, then waits for one go. The window opens
``WARM_UP`` seconds after the go and lasts ``--seconds``; each child keeps its count of
committed transitions in shared memory, and only what the counts grew by inside the window
counts, over the window's length. A child that made no transition inside it is an error, not a
rate.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BenchError, machine, setup_django, start_together, throwaway_zookeeper

ITEMS = 200  # fake jobs per child, moved one after another between two index folders
WARM_UP = 1.0  # seconds between the go and the window's opening


def _child(hosts: str, locked: bool, count, ready, go, stop) -> None:
    """Set up ``ITEMS`` fake jobs, say ready, wait for the go, then move them until told to
    stop, keeping ``count`` (shared memory) at the transitions committed so far."""
    setup_django()
    from bench.loader import probe_transition
    from queues.zk.client import connect

    zk = connect(hosts)
    base = f"/bench-rate-{uuid.uuid4().hex[:8]}"
    try:
        for folder in ("status", "a", "b", "ba", "bb"):
            zk.ensure_path(f"{base}/{folder}")
        answers = [
            zk.create_async(f"{base}/{folder}/{i}", b"{}")
            for i in range(ITEMS)
            for folder in ("status", "a", "ba")
        ]
        for answer in answers:
            answer.get()
        where = ["a"] * ITEMS
        ready.put(os.getpid())
        go.wait()
        n = 0
        while not stop.is_set():
            probe_transition(zk, base, where, n, locked=locked)
            n += 1
            count.value = n
        zk.delete(base, recursive=True)
    finally:
        zk.stop()
        zk.close()


def measure(
    hosts: str, *, processes: int, seconds: float, locked: bool = False, timeout: float = 120
) -> float:
    """Transitions per second of ``processes`` concurrent client processes, counted over one
    window that opens after every one of them is connected, set up and going.

    ``locked``: each transition also creates and deletes an ephemeral lock, as a consumer must.
    """
    context = multiprocessing.get_context("spawn")  # kazoo's threads do not survive a fork
    ready, go, stop = context.Queue(), context.Event(), context.Event()
    counts = [context.Value("q", 0, lock=False) for _ in range(processes)]
    children = [
        context.Process(target=_child, args=(hosts, locked, count, ready, go, stop))
        for count in counts
    ]
    try:
        start_together(children, ready, go, timeout)
        time.sleep(WARM_UP)
        before = [c.value for c in counts]
        opened = time.monotonic()
        time.sleep(seconds)
        after = [c.value for c in counts]
        window = time.monotonic() - opened
        failed = [c.exitcode for c in children if c.exitcode not in (None, 0)]
        if failed:
            raise BenchError(f"children exited with {failed} inside the window")
        idle = sum(1 for b, a in zip(before, after, strict=True) if a <= b)
        if idle:
            raise BenchError(f"{idle} of {processes} children made no transition in the window")
        return (sum(after) - sum(before)) / window
    finally:
        stop.set()
        for child in (c for c in children if c.pid is not None):
            child.join(timeout=30)
            if child.is_alive():
                child.terminate()
                child.join(timeout=10)


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seconds", type=float, default=8.0, help="the timed window")
    parser.add_argument("--locked", action="store_true", help="each move creates its lock first")
    parser.add_argument("--hosts", default="", help="ZooKeeper to use (default: a throwaway one)")
    args = parser.parse_args(argv)
    setup_django()
    lines = [
        f"Raw transition rate ({'lock, then ' if args.locked else ''}one five-operation multi "
        f"per transition, one after another per process; every process connected and set up "
        f"before the go, counted over a {args.seconds:.0f} s window opening {WARM_UP:.0f} s "
        f"after it):"
    ]
    with throwaway_zookeeper(args.hosts) as hosts:
        for processes in args.processes:
            rate = measure(hosts, processes=processes, seconds=args.seconds, locked=args.locked)
            line = f"  {processes:>3} processes: {rate:.0f} transitions/s"
            print(line, flush=True)
            lines.append(line)
    print()
    for line in lines:
        print(line)
    print(f"Machine: {machine()}")
    return lines


if __name__ == "__main__":
    main()
