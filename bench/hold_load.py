"""Hold the machine's 1-minute load average near a target with CPU busy-loops, until stopped.

``python bench/hold_load.py --target 10`` beside a run (the suite's "at load 10" figure in
docs/development.md): every ``--every`` seconds it starts a busy-loop process while the load is
more than 0.7 under the target and stops one while it is more than 0.7 over (at most ``--most``
at once; none while the run alone passes the target), and prints the time, the load and the
number of loops. Ctrl-C or SIGTERM stops the loops and prints the mean load it saw.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time


def _spin() -> None:
    # A fork has its parent's handlers: a loop must die on SIGTERM, and leave Ctrl-C to it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=15.0, help="seconds between looks")
    parser.add_argument("--most", type=int, default=10, help="busy-loops at most")
    args = parser.parse_args()
    if args.target <= 0 or args.every <= 0 or args.most < 0:
        parser.error("--target and --every must be positive, --most at least 0")
    loops: list[multiprocessing.Process] = []
    seen: list[float] = []
    stop = False

    def stopping(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    try:
        while not stop:
            load = os.getloadavg()[0]
            seen.append(load)
            if load < args.target - 0.7 and len(loops) < args.most:
                loop = multiprocessing.Process(target=_spin, daemon=True)
                loop.start()
                loops.append(loop)
            elif load > args.target + 0.7 and loops:
                loops.pop().kill()
            print(f"{time.strftime('%H:%M:%S')} load {load:.2f} loops {len(loops)}", flush=True)
            deadline = time.monotonic() + args.every
            while not stop and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        for loop in loops:
            # SIGKILL: a loop forked a moment ago may still have this process's SIGTERM handler.
            loop.kill()
    if seen:
        print(f"mean load {sum(seen) / len(seen):.2f} over {len(seen)} looks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
