"""The backlog forecast against what happened (issue 53): a replayed run of the job pipeline, the
forecast the console would show at each minute, and the time the jobs waiting then actually took.

A pipeline of the eight job steps is simulated event by event: each step has a number of
consumer threads and a time per job (seeded, with spread), jobs go through the steps in order,
first come first served, and every run becomes a step record (start, duration) once it ends, as
the daemons write them. At each checkpoint the console's own code
(``queues.console.backlog.pace_of``, over the runs it would read: ended by then, started in the last
``PACE_WINDOW``, at most
``PACE_SAMPLE`` a step; and ``queues.console.backlog.forecast``) gives its estimate; the simulation
knows when the last of the jobs waiting at that moment actually finished. Printed: the error
of each checkpoint, and the median and worst, beside the estimate of the rule the console used
before (jobs waiting over the jobs finished in the last three hours, divided by three).

    .venv/bin/python bench/forecast_replay.py [--seed 7]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import setup_django

STEPS = [
    "pending",
    "estimating",
    "provisioning",
    "downloading",
    "processing",
    "storing",
    "recording",
    "notify",
]


@dataclass
class Step:
    name: str
    threads: int
    seconds: float  # mean time per job
    spread: float  # sigma of the log-normal factor on it


@dataclass
class Scenario:
    name: str
    steps: list[Step]
    batches: list[tuple[float, int]]  # (submitted at, jobs)
    down: list[tuple[float, float]] = field(default_factory=list)  # consumers down (from, to)


@dataclass
class Run:
    step: str
    start: float
    took: float


def simulate(sc: Scenario, seed: int) -> tuple[list[Run], dict[int, list[float]]]:
    """Every run, and for each job the time it left each step (index 0: submitted)."""
    rng = random.Random(seed)
    jobs: dict[int, list[float]] = {}
    queues: list[list[int]] = [[] for _ in STEPS]
    free = [s.threads for s in sc.steps]
    events: list[tuple[float, int, str, int, int]] = []  # (time, order, kind, step, job)
    order = 0
    jid = 0
    for at, n in sc.batches:
        for _ in range(n):
            jobs[jid] = [at]
            heapq.heappush(events, (at, order, "arrive", 0, jid))
            order += 1
            jid += 1
    runs: list[Run] = []

    def up_at(t: float) -> float:
        for start, end in sc.down:
            if start <= t < end:
                return end
        return t

    def start_work(t: float, k: int) -> None:
        nonlocal order
        while free[k] and queues[k]:
            j = queues[k].pop(0)
            free[k] -= 1
            step = sc.steps[k]
            took = step.seconds * rng.lognormvariate(0, step.spread)
            begin = up_at(t)
            runs.append(Run(step.name, begin, took))
            heapq.heappush(events, (begin + took, order, "done", k, j))
            order += 1

    while events:
        t, _o, kind, k, j = heapq.heappop(events)
        if kind == "arrive":
            queues[k].append(j)
            start_work(t, k)
            continue
        free[k] += 1
        jobs[j].append(t)
        if k + 1 < len(STEPS):
            queues[k + 1].append(j)
            start_work(t, k + 1)
        start_work(t, k)
    return runs, jobs


def counts_at(jobs: dict[int, list[float]], t: float) -> tuple[dict[str, int], list[int]]:
    """Jobs per state at ``t`` (a job is in step k from leaving step k-1), and which wait."""
    counts: dict[str, int] = {}
    waiting = []
    for j, times in jobs.items():
        if times[0] > t:
            continue
        done = sum(1 for x in times[1:] if x <= t)
        if done >= len(STEPS):
            continue
        state = STEPS[done].capitalize()
        counts[state] = counts.get(state, 0) + 1
        waiting.append(j)
    return counts, waiting


def old_rule(runs: list[Run], counts: dict[str, int], t: float, console_up: float) -> float | None:
    """The estimate before issue 53: done over the last 3 h (only what the console saw) / 3."""
    since = max(t - 3 * 3600, console_up)
    done: dict[str, int] = {}
    for r in runs:
        if since <= r.start and r.start + r.took <= t:
            done[r.step] = done.get(r.step, 0) + 1
    waiting = sum(counts.values())
    rate = done.get("notify", 0) / 3
    if rate <= 0:
        return None
    whole = waiting / rate * 3600
    per_step = [counts.get(s.capitalize(), 0) / (done[s] / 3) * 3600 for s in STEPS if done.get(s)]
    return max([whole, *per_step])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--every", type=float, default=60.0, help="seconds between checkpoints")
    args = parser.parse_args()
    setup_django()
    from queues.console.backlog import PACE_SAMPLE, PACE_WINDOW, forecast, pace_of

    window = PACE_WINDOW.total_seconds()
    fast = [Step(s, 1, 0.25, 0.3) for s in STEPS]
    scenarios = [
        Scenario(
            "issue 53: 300 jobs, about 2,900 an hour, console up 18 min, a batch 2 h before",
            [
                *fast[:3],
                Step("downloading", 4, 4.6, 0.4),
                Step("processing", 2, 1.0, 0.3),
                Step("storing", 2, 2.45, 0.3),
                *fast[6:],
            ],
            batches=[(-7200.0, 40), (0.0, 300)],
        ),
        Scenario(
            "mixed sizes: 600 jobs, downloads spread widely, consumers down 5 min mid-run",
            [
                *fast[:3],
                Step("downloading", 4, 6.0, 1.0),
                Step("processing", 2, 1.5, 0.5),
                Step("storing", 2, 2.0, 0.5),
                *fast[6:],
            ],
            batches=[(0.0, 400), (240.0, 200)],
            down=[(300.0, 600.0)],
        ),
    ]
    for sc in scenarios:
        runs, jobs = simulate(sc, args.seed)
        console_up = -18 * 60.0 if sc.name.startswith("issue") else -3600.0
        end = max(times[-1] for times in jobs.values())
        print(f"\n{sc.name}: all through at {end / 60:.1f} min")
        print(f"{'at':>7} {'waiting':>8} {'actual':>9} {'forecast':>9} {'error':>7} {'before':>9}")
        errors, before_errors = [], []
        t = args.every
        while t < end:
            counts, waiting = counts_at(jobs, t)
            actual = max(jobs[j][-1] for j in waiting) - t
            paces = {}
            for step in STEPS:
                seen = [
                    (r.start, r.took)
                    for r in runs
                    if r.step == step and t - window <= r.start and r.start + r.took <= t
                ]
                seen = sorted(seen)[-PACE_SAMPLE:]
                paces[step] = pace_of(step, seen)
            f = forecast(counts, [], paces, now=t)
            old = old_rule(runs, counts, t, console_up)
            err = None if f.seconds is None else (f.seconds - actual) / actual
            before = None if old is None else (old - actual) / actual
            if err is not None:
                errors.append(abs(err))
            if before is not None:
                before_errors.append(abs(before))
            print(
                f"{t / 60:6.1f}m {sum(counts.values()):8d} {actual / 60:8.1f}m "
                f"{'-' if f.seconds is None else f'{f.seconds / 60:8.1f}m':>9} "
                f"{'-' if err is None else f'{err:+.0%}':>7} "
                f"{'-' if old is None else f'{old / 60:8.1f}m':>9}"
                + (f"  idle: {', '.join(st for st, _ in f.stalled)}" if f.stalled else "")
            )
            t += args.every
        if errors:
            print(
                f"forecast error: median {statistics.median(errors):.0%}, worst {max(errors):.0%} "
                f"over {len(errors)} checkpoints"
            )
        if before_errors:
            print(
                f"the rule before: median {statistics.median(before_errors):.0%}, worst "
                f"{max(before_errors):.0%}"
            )


if __name__ == "__main__":
    main()
