"""The server's raw rate for job-transition-shaped transactions: ``python bench/zk_rate.py``.

N client processes (each its own ZooKeeper session, like daemon processes) commit, one after
another and as fast as the server answers, the five-operation multi a job transition writes: set
the status, delete + create the state-index entry, delete + create the batch-index entry. The
processes measure over the same wall-clock window; their sum is the rate.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import setup_django, throwaway_zookeeper


def _child(
    hosts: str, seconds: float, start_at: float, locked: bool, out: multiprocessing.Queue
) -> None:
    setup_django()
    from bench.loader import transition_rate

    result = transition_rate(hosts, threads=1, seconds=seconds, start_at=start_at, locked=locked)
    out.put((result.transactions, result.seconds))


def measure(hosts: str, *, processes: int, seconds: float, locked: bool = False) -> float:
    """Transitions per second summed over ``processes`` concurrent client processes.

    ``locked``: each transition also creates and deletes an ephemeral lock, as a consumer must.
    """
    context = multiprocessing.get_context("spawn")  # kazoo's threads do not survive a fork
    out = context.Queue()
    start_at = time.time() + 3.0 + 0.3 * processes  # after every child has connected
    children = [
        context.Process(target=_child, args=(hosts, seconds, start_at, locked, out))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    results = [out.get(timeout=seconds + 120) for _ in children]
    for child in children:
        child.join(timeout=30)
    return sum(n / s for n, s in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--hosts", default="", help="ZooKeeper to use (default: a throwaway one)")
    args = parser.parse_args()
    setup_django()
    with throwaway_zookeeper(args.hosts) as hosts:
        for processes in args.processes:
            rate = measure(hosts, processes=processes, seconds=args.seconds)
            print(f"{processes:>3} processes: {rate:.0f} transitions/s (5 operations each)")


if __name__ == "__main__":
    main()
