"""Page times with a small and a large queue: ``python bench/pages.py``.

Starts its own ZooKeeper, loads 1,000 jobs into one chroot and 100,000 into another (the same
state mix; enough batches in each that the batch list shows a full page), and times the
console's pages in-process through Django's test client as a logged-in superuser.

The two sizes are timed in alternating rounds (a few requests on the small queue, then on the
large one, and again), so that whatever else the machine does at the time weighs on both alike;
each round starts with a warm-up request. Prints median and 95th percentile per page and size, the
large/small ratio of the medians, the first view of each page after a start (the read index
still empty), and the web process's memory.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, median, new_chroot, p95, setup_django, throwaway_zookeeper

TARGET_RATIO = 1.5


@dataclass
class Timings:
    times: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def median_ms(self) -> float:
        return median(self.times) * 1000 if self.times else float("nan")

    @property
    def p95_ms(self) -> float:
        return p95(self.times) * 1000 if self.times else float("nan")


@dataclass
class Queue:
    jobs: int
    batches: int
    hosts: str
    result: object  # bench.loader.LoadResult
    load_seconds: float
    client: object = None  # the KazooClient the pages use for this queue


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def logged_in_client():
    """A test client logged in as a superuser of the benchmark's throwaway database."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0, interactive=False)
    user_model = get_user_model()
    user = user_model.objects.filter(username="bench").first()
    if user is None:
        user = user_model.objects.create_superuser("bench", "bench@example.org", "unused-pw-1")
    client = Client()
    client.force_login(user)
    return client


def page_urls(queue: Queue) -> dict[str, Callable[[int], str]]:
    """Page name -> URL of its i-th request (the job page varies its job)."""
    from django.urls import reverse

    result = queue.result
    largest = result.largest_state
    jids = random.Random(7).sample(result.jobs_by_state[largest], 25)
    jobs_url = reverse("jobs")
    return {
        "overview": lambda _i: reverse("overview"),
        "batch list": lambda _i: reverse("batches"),
        "job list, largest state": lambda _i: f"{jobs_url}?state={largest}",
        "job list, one collection": lambda _i: (
            f"{jobs_url}?state={largest}&profile=bench_collection_03"
        ),
        "job page": lambda i: reverse("job", kwargs={"jid": jids[i % len(jids)]}),
    }


def use(queue: Queue) -> None:
    """Point the process's ZooKeeper client at ``queue`` without reconnecting."""
    from django.conf import settings
    from django.core.cache import cache

    # The module, not the function of the same name that queues.zk exports.
    zkclient = importlib.import_module("queues.zk.client")
    settings.ZK_HOSTS = queue.hosts
    zkclient._client = queue.client
    cache.clear()  # cached figures belong to the other queue


def get(web, url: str) -> tuple[float, int]:
    began = time.perf_counter()
    response = web.get(url)
    return time.perf_counter() - began, response.status_code


def time_pages(
    web, small: Queue, large: Queue, *, rounds: int, per_round: int, only: list[str]
) -> dict[str, dict[int, Timings]]:
    urls = {q.jobs: page_urls(q) for q in (small, large)}
    figures: dict[str, dict[int, Timings]] = {}
    for name in urls[small.jobs]:
        if only and not any(word in name for word in only):
            continue
        figures[name] = {small.jobs: Timings(), large.jobs: Timings()}
        for r in range(rounds):
            for queue in (small, large):
                timings = figures[name][queue.jobs]
                if timings.error:
                    continue
                use(queue)
                url_for = urls[queue.jobs][name]
                _elapsed, status = get(web, url_for(r * (per_round + 1)))  # warm-up
                if status != 200:
                    # One broken page must not hide the figures of the others.
                    timings.error = f"{url_for(0)} answered {status}"
                    print(f"  {name}: {timings.error}; not timed", flush=True)
                    continue
                for i in range(per_round):
                    elapsed, status = get(web, url_for(r * (per_round + 1) + 1 + i))
                    if status != 200:
                        timings.error = f"{url_for(0)} answered {status}"
                        break
                    timings.times.append(elapsed)
    return figures


def first_views(web, queue: Queue, only: list[str]) -> dict[str, float]:
    """Each page's first request on a fresh index: what the first visitor after a start pays."""
    from queues.zk import index

    index.reset()
    use(queue)
    found = {}
    for name, url_for in page_urls(queue).items():
        if only and not any(word in name for word in only):
            continue
        elapsed, status = get(web, url_for(0))
        found[name] = elapsed if status == 200 else float("nan")
    return found


def table(figures: dict[str, dict[int, Timings]], small: int, large: int) -> list[str]:
    lines = [
        f"  {'page':<26}{f'{small} jobs: median':>20}{'p95':>9}"
        f"{f'{large} jobs: median':>22}{'p95':>9}{'ratio':>8}",
    ]
    for name, by_size in figures.items():
        s, b = by_size[small], by_size[large]
        if s.error or b.error:
            lines.append(f"  {name:<26}not measured: {s.error or b.error}")
            continue
        ratio = b.median_ms / s.median_ms if s.median_ms else float("inf")
        verdict = "ok" if ratio <= TARGET_RATIO else f"over {TARGET_RATIO}x"
        lines.append(
            f"  {name:<26}{s.median_ms:>17.1f} ms{s.p95_ms:>6.1f} ms"
            f"{b.median_ms:>19.1f} ms{b.p95_ms:>6.1f} ms{ratio:>7.2f}x  {verdict}"
        )
    return lines


def load_queue(hosts: str, jobs: int, batches: int) -> Queue:
    from bench.load import load

    target = new_chroot(hosts, f"bench-pages-{jobs}")
    print(f"loading {jobs} jobs in {batches} batches into {target}", flush=True)
    began = time.monotonic()
    result = load(target, jobs=jobs, batches=batches, quiet=jobs < 10_000)
    return Queue(jobs, batches, target, result, time.monotonic() - began)


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--large-batches", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--per-round", type=int, default=5, help="timed requests per round")
    parser.add_argument("--pages", nargs="*", default=[], help="only pages whose name has one")
    parser.add_argument("--hosts", default="", help="ZooKeeper to use (default: a throwaway one)")
    args = parser.parse_args(argv)

    # A database and var folder of the benchmark's own, never the developer's.
    scratch = tempfile.mkdtemp(prefix="mrt-bench-var-")
    os.environ["MRT_VAR_DIR"] = scratch
    os.environ["MRT_DATABASE_PATH"] = f"{scratch}/bench.sqlite3"
    setup_django()
    from django.test.utils import setup_test_environment

    from queues.zk import client as zkmod

    setup_test_environment()  # lets the test client's host name through ALLOWED_HOSTS
    web = logged_in_client()
    lines: list[str] = []
    with throwaway_zookeeper(args.hosts) as hosts:
        # The small queue gets enough batches for a full batch-list page (50 rows).
        small = load_queue(hosts, args.small, max(1, min(args.small // 10, 100)))
        large = load_queue(hosts, args.large, args.large_batches)
        for queue in (small, large):
            queue.client = zkmod.connect(queue.hosts, timeout=30)
        time.sleep(5)  # let the server finish its snapshot after the load
        rss_before = current_rss_mib()
        try:
            print("timing pages", flush=True)
            figures = time_pages(
                web,
                small,
                large,
                rounds=args.rounds,
                per_round=args.per_round,
                only=args.pages,
            )
            lines.append(
                f"Pages ({args.rounds * args.per_round} timed requests per page and size, "
                "warm read index):"
            )
            lines += table(figures, small.jobs, large.jobs)
            cold = first_views(web, large, args.pages)
            lines.append(
                f"  first view after a start (cold read index), {large.jobs} jobs: "
                + ", ".join(f"{n} {t * 1000:.0f} ms" for n, t in cold.items())
            )
            lines.append(
                f"Web process memory: {rss_before:.0f} MiB before timing, "
                f"{current_rss_mib():.0f} MiB after, peak RSS {peak_rss_mib():.0f} MiB"
            )
            lines.append(
                f"Load: {small.jobs} jobs in {small.load_seconds:.1f}s, {large.jobs} jobs "
                f"({large.result.nodes} nodes) in {large.load_seconds:.1f}s "
                f"({large.jobs / large.load_seconds:.0f} jobs/s)"
            )
        finally:
            importlib.import_module("queues.zk.client")._client = None
            for queue in (small, large):
                queue.client.stop()
                queue.client.close()
            shutil.rmtree(scratch, ignore_errors=True)
    print()
    for line in lines:
        print(line)
    print(f"Machine: {machine()}")
    return lines


if __name__ == "__main__":
    main()
