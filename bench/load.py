"""Load a ZooKeeper with a realistic queue, fast: ``python bench/load.py --jobs 100000``.

Without ``--hosts`` it starts a throwaway server, loads it, prints the figures and stops it
again (a measure of the loader); with ``--hosts`` the queue stays for the console to show.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import new_chroot, setup_django, throwaway_zookeeper


def load(
    hosts: str,
    *,
    jobs: int,
    batches: int,
    distribution: dict[str, float] | None = None,
    quiet: bool = False,
):
    """Load ``jobs`` jobs in ``batches`` batches into ``hosts``; returns the LoadResult."""
    from bench.loader import bulk_load
    from queues.zk.client import connect

    def say(line: str) -> None:
        if not quiet:
            print(f"  load: {line}", flush=True)

    zk = connect(hosts, timeout=30)
    try:
        return bulk_load(zk, batches=batches, jobs=jobs, distribution=distribution, progress=say)
    finally:
        zk.stop()
        zk.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=2_000)
    parser.add_argument("--hosts", default="", help="ZooKeeper to load (default: a throwaway one)")
    parser.add_argument("--chroot", action="store_true", help="load into a fresh chroot")
    args = parser.parse_args()
    setup_django()
    with throwaway_zookeeper(args.hosts) as hosts:
        target = new_chroot(hosts, "bench-load") if args.chroot else hosts
        began = time.monotonic()
        result = load(target, jobs=args.jobs, batches=args.batches)
        elapsed = time.monotonic() - began
        print(
            f"loaded {result.jobs} jobs, {len(result.batches)} batches, {result.nodes} nodes "
            f"into {target} in {elapsed:.1f}s ({result.jobs / elapsed:.0f} jobs/s, "
            f"{result.nodes / elapsed:.0f} nodes/s)"
        )
        for state, jids in sorted(result.jobs_by_state.items(), key=lambda kv: -len(kv[1])):
            print(f"  {state:<13}{len(jids):>8}")


if __name__ == "__main__":
    main()
