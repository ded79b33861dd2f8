"""Every benchmark in one run, then one summary: ``python bench/run.py`` (or ``make bench``).

Every page and API view over HTTP through daphne with 1,000 and 100,000 jobs (``--huge``: also
1,000,000), cold after a real restart and warm (``bench/http_pages.py``), then the daemons'
transitions per second next to the raw ZooKeeper rate (``bench/daemons.py``), each on a ZooKeeper
of its own started for the run. ``bench/pages.py`` (in-process, Django's test client) still runs
on its own. The summary ends with the machine it ran on; paste it into docs/benchmarks.md (and
README.md "Latest figures").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", type=int, default=100_000, help="jobs in the large queue")
    parser.add_argument("--huge", action="store_true", help="pages at 1,000,000 jobs too (long)")
    parser.add_argument("--daemon-jobs", type=int, default=2_000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    began = time.monotonic()

    from bench import daemons, http_pages

    page_lines = http_pages.main(
        ["--sizes", "1000", str(args.large), *(["--huge"] if args.huge else [])]
    )
    daemon_lines = daemons.main(
        ["--jobs", str(args.daemon_jobs), "--processes", *map(str, args.processes)]
    )
    print()
    print("=" * 100)
    print("SUMMARY (python bench/run.py)")
    for line in [*page_lines, *daemon_lines]:
        print(line)
    print(f"Machine: {machine()}")
    print(f"Whole run: {time.monotonic() - began:.0f}s")


if __name__ == "__main__":
    main()
