"""The consistency check timed at several queue sizes: ``python bench/consistency.py``.

For each size (default 10,000 and 100,000 jobs, 50 jobs a batch) it loads a fresh chroot of
one ZooKeeper (a throwaway server unless ``--hosts``) with the bulk loader, then walks it with
the check the ``consistency`` daemon runs (``queues.operator.check.run_check``, findings counted by
a sink as the daemon's recorder takes them), in a child process of its own so that its peak
resident memory is the walk's alone. Printed per size and run: the walk's wall time, its time
per 1,000 jobs, the child's peak RSS, the ZooKeeper requests it sent (per kind) and what it
found. ``--walk HOSTS`` runs only the walk (one child's work), for a profiler:
``py-spy record -o out.svg -- .venv/bin/python bench/consistency.py --walk HOST:PORT/chroot``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, median, new_chroot, setup_django, throwaway_zookeeper

JOBS_PER_BATCH = 50


def walk(hosts: str) -> dict[str, Any]:
    """One check over ``hosts``; its figures as a dict (printed as JSON by the child)."""
    from queues.operator import check
    from queues.zk.client import connect

    zk = connect(hosts, timeout=30)
    requests: Counter[str] = Counter()
    original = zk._call

    def counting(request: Any, async_object: Any) -> Any:
        requests[type(request).__name__] += 1
        return original(request, async_object)

    zk._call = counting
    kinds: Counter[str] = Counter()
    phases: dict[str, float] = {}  # each phase's seconds (its name without the counts)
    current = ["", 0.0]

    def progress(step: Any) -> None:
        now = time.monotonic()
        if step.phase != current[0]:
            if current[0]:
                phases[current[0]] = phases.get(current[0], 0.0) + now - float(current[1])
            current[:] = [step.phase, now]

    try:
        began = time.monotonic()
        report = check.run_check(zk, sink=lambda f: kinds.update([f.kind]), progress=progress)
        seconds = time.monotonic() - began
    finally:
        zk._call = original
        zk.stop()
        zk.close()
    return {
        "seconds": seconds,
        "jobs": report.jobs,
        "batches": report.batches,
        "index_entries": report.index_entries,
        "findings": dict(kinds),
        "requests": dict(requests),
        "phases": {k: round(v, 2) for k, v in phases.items()},
        # ru_maxrss is in KiB on Linux.
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def walk_in_child(hosts: str) -> dict[str, Any]:
    answer = subprocess.run(
        [sys.executable, __file__, "--walk", hosts, "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(answer.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--runs", type=int, default=2, help="walks per size (median printed)")
    parser.add_argument("--hosts", default="", help="ZooKeeper to load (default: a throwaway one)")
    parser.add_argument("--walk", default="", help="only walk this (loaded) ZooKeeper")
    parser.add_argument("--json", action="store_true", help="with --walk: one JSON line")
    args = parser.parse_args()
    setup_django()
    if args.walk:
        result = walk(args.walk)
        print(json.dumps(result) if args.json else result, flush=True)
        return

    from bench.load import load

    print(f"consistency check, {machine()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    with throwaway_zookeeper(args.hosts) as hosts:
        rows = []
        for size in args.sizes:
            target = new_chroot(hosts, f"bench-check-{size}")
            began = time.monotonic()
            load(target, jobs=size, batches=max(1, size // JOBS_PER_BATCH), quiet=True)
            print(f"{size} jobs loaded into {target} in {time.monotonic() - began:.0f} s")
            runs = []
            for _ in range(args.runs):
                result = walk_in_child(target)
                runs.append(result)
                print(
                    f"  walk: {result['seconds']:.2f} s, peak RSS {result['peak_rss_mib']:.0f} MiB,"
                    f" {result['jobs']} jobs, {result['batches']} batches, findings "
                    f"{result['findings'] or 0}, requests {result['requests']}, phases "
                    f"{result['phases']}",
                    flush=True,
                )
            rows.append((size, runs))
        print("\n| jobs | walk (median) | per 1,000 jobs | peak RSS | requests |")
        print("|---|---|---|---|---|")
        for size, runs in rows:
            seconds = median([r["seconds"] for r in runs])
            rss = max(r["peak_rss_mib"] for r in runs)
            sent = sum(runs[0]["requests"].values())
            print(
                f"| {size:,} | {seconds:.2f} s | {1000 * seconds / size:.3f} s | {rss:.0f} MiB "
                f"| {sent:,} |"
            )
        print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
