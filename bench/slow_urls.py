"""One bad URL holds up nobody else: ``python bench/slow_urls.py``.

Runs the shipped ``manage.py runconsumer estimating`` (default settings but the loopback
address allowed for depositors) against a throwaway ZooKeeper and one depositor server on
loopback, which serves ``--jobs`` good files and, on the same host and port, ``--hostile`` URLs
that never answer a HEAD: half trickle their response headers one byte a second (the chaos run's
``/slow-headers``), half read the request and stay silent. Each HEAD of those takes
``MRT_HTTP_TIMEOUT`` (30 s) to give up.

The jobs (single files, one batch per 100) are made in Pending first, then moved into
Estimating one after another at ``--rate`` jobs a second, the hostile ones spread evenly among
the good ones, as Pending hands them over in a running queue. A job's wait is from just before
its move into Estimating to the creation of its entry in the Provisioning folder (ZooKeeper's
clock, this machine's: the server runs here). The
same run without the hostile URLs comes first, then with them, ``--rounds`` times each; the
figures are the good jobs' waits: median, p90, max, and how many waited over 1 s and over 30 s,
and the ratio of the medians with and without, flagged over 2x.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    BenchError,
    drop_chroot,
    machine,
    median,
    new_chroot,
    setup_django,
    throwaway_zookeeper,
)

TARGET = 2.0  # the good jobs' median wait with the hostile URLs, at most this many times without
MANAGE = ROOT / "manage.py"
SETTLE = 300.0  # s the good jobs of a run may take at most before the run is called failed


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _silent_routes() -> type:
    """The chaos run's depositor routes, plus ``/silent/...``: the request is read and never
    answered (until the run's end sets ``stop``)."""
    from queues.chaos.servers import DepositorRoutes

    class Routes(DepositorRoutes):
        def do_HEAD(self) -> None:
            if self.path.startswith("/silent"):
                self.close_connection = True
                self.stop.wait(600)
                return
            super().do_HEAD()

        def do_GET(self) -> None:
            if self.path.startswith("/silent"):
                self.do_HEAD()
            else:
                super().do_GET()

    return Routes


@contextlib.contextmanager
def depositor(folder: Path) -> Iterator[Any]:
    from functools import partial

    from queues.chaos.servers import DepositorRoutes, Served

    DepositorRoutes.stop.clear()
    served = Served(partial(_silent_routes(), directory=str(folder)))
    try:
        yield served
    finally:
        DepositorRoutes.stop.set()  # the hostile handlers give up
        served.stop()


@contextlib.contextmanager
def consumer(target: str, var: Path, log: Path) -> Iterator[subprocess.Popen]:
    """``manage.py runconsumer estimating`` on ``target``, as shipped but for the loopback
    address allowed for depositors."""
    env = dict(os.environ)
    for name in ("MRT_DATABASE_PATH", "DATABASE_URL", "MRT_CLAIM_BATCH", "MRT_KEEP_LOCKS"):
        env.pop(name, None)
    env.update(
        {
            "ZK_HOSTS": target,
            "MRT_VAR_DIR": str(var),
            "MRT_FETCH_ALLOW": "127.0.0.1/32",
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if not (var / "console.sqlite3").exists():
        subprocess.run(
            [sys.executable, str(MANAGE), "migrate", "--noinput", "-v", "0"], env=env, check=True
        )
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, str(MANAGE), "runconsumer", "estimating"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Departures:
    """When each job left Estimating: the creation time of its entry in the Provisioning folder,
    made in the move that deleted its Estimating entry (ZooKeeper's clock, which is this
    machine's: the server runs here)."""

    def __init__(self, zk: Any) -> None:
        from queues.zk import paths as zpaths

        self.zk = zk
        self.folder = zpaths.job_state_folder("Provisioning")

    def left(self, jids: set[str]) -> dict[str, float]:
        """jid -> when it left Estimating (time.time() seconds), for those of ``jids`` gone."""
        names = {n.rpartition("-")[2]: n for n in self.zk.get_children(self.folder)}
        found = {}
        for jid in jids & names.keys():
            stat = self.zk.exists(f"{self.folder}/{names[jid]}")
            if stat is not None:
                found[jid] = stat.ctime / 1000
        return found

    def wait_gone(self, jids: set[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            names = {n.rpartition("-")[2] for n in self.zk.get_children(self.folder)}
            if jids <= names:
                return True
            time.sleep(0.5)
        return False


def _pending_jobs(zk: Any, urls: list[str]) -> list[Any]:
    """A Pending job for each URL (single files, one batch per 100)."""
    from queues.zk.batches import batch_create
    from queues.zk.jobs import job_create

    jobs = []
    for start in range(0, len(urls), 100):
        submission = {"profile": "merritt_demo_content", "submitter": "bench"}
        batch = batch_create(zk, submission=submission)
        for url in urls[start : start + 100]:
            configuration = {**submission, "payload_url": url, "type": "file"}
            jobs.append(job_create(zk, bid=batch.bid, configuration=configuration))
    return jobs


def run_once(
    hosts: str, served: Any, var: Path, log: Path, *, jobs: int, hostile: int, rate: float
) -> tuple[dict[str, float], dict[str, float]]:
    """One run; the good and the hostile jobs' waits, jid -> seconds."""
    from queues.zk import client as zkmod
    from queues.zk.jobs import job_transition

    target = new_chroot(hosts, "slow-urls")
    zk = zkmod.connect(target)
    try:
        good = [f"{served.url}/good/f{i:05d}.txt" for i in range(jobs)]
        bad = [
            f"{served.url}/{'slow-headers' if k % 2 == 0 else 'silent'}/{k}" for k in range(hostile)
        ]
        order = list(good)
        for k, url in enumerate(bad):
            order.insert(int((k + 0.5) * len(order) / hostile), url)
        warm = _pending_jobs(zk, [good[0]])  # the consumer is up once this one has left
        made = _pending_jobs(zk, order)
        hostile_jids = {job.jid for job, url in zip(made, order, strict=True) if url in bad}
        departures = Departures(zk)
        zk.ensure_path(departures.folder)
        with consumer(target, var, log):
            job_transition(zk, warm[0], "Estimating")
            if not departures.wait_gone({warm[0].jid}, 120):
                raise BenchError(f"the consumer took no job within 120 s (see {log})")
            arrived: dict[str, float] = {}
            began = time.monotonic()
            for n, job in enumerate(made):
                pause = began + n / rate - time.monotonic() if rate else 0
                if pause > 0:
                    time.sleep(pause)
                arrived[job.jid] = time.time()  # its entry is made during the call
                job_transition(zk, job, "Estimating")
            good_jids = {j for j in arrived if j not in hostile_jids}
            if not departures.wait_gone(good_jids, SETTLE):
                raise BenchError(f"good jobs still in Estimating after {SETTLE:.0f} s")
            departures.wait_gone(hostile_jids, 120)
        left = departures.left(set(arrived))
        waits = {j: left[j] - t for j, t in arrived.items() if j in left}
        return (
            {j: w for j, w in waits.items() if j not in hostile_jids},
            {j: w for j, w in waits.items() if j in hostile_jids},
        )
    finally:
        zk.stop()
        zk.close()
        drop_chroot(target)


def _line(label: str, waits: list[float]) -> str:
    return (
        f"{label:<22} {len(waits):>5}  {median(waits):7.3f}  {_percentile(waits, 0.9):7.3f}  "
        f"{max(waits):7.3f}  {sum(w > 1 for w in waits):>5}  {sum(w > 30 for w in waits):>5}"
    )


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=400, help="good jobs (default 400)")
    parser.add_argument("--hostile", type=int, default=6, help="hostile URLs (default 6)")
    parser.add_argument(
        "--rate", type=float, default=100.0, help="jobs moved into Estimating a second (0: at once)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each kind (default 1)")
    parser.add_argument("--zk", default="", help="a ZooKeeper to use (default: a throwaway one)")
    args = parser.parse_args(argv)
    setup_django()
    lines = [
        f"{args.jobs} good jobs on one host, {args.hostile} hostile URLs on the same host and "
        f"port, moved into Estimating at {args.rate:g} a second; `runconsumer estimating`",
        f"{'run':<22} {'jobs':>5}  {'median':>7}  {'p90':>7}  {'max':>7}  {'>1 s':>5}  "
        f"{'>30 s':>5}   (good jobs' waits to leave Estimating, s)",
    ]
    print("\n".join(lines), flush=True)
    medians: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="mrt-bench-slow-urls-") as tmp:
        folder = Path(tmp) / "served"
        for i in range(args.jobs):
            path = folder / "good" / f"f{i:05d}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"good file {i}\n".encode())
        var = Path(tmp) / "var"
        var.mkdir()
        log = Path(tmp) / "consumer.log"
        with throwaway_zookeeper(args.zk) as hosts, depositor(folder) as served:
            for round_ in range(args.rounds):
                for with_hostile in (False, True):
                    good, bad = run_once(
                        hosts,
                        served,
                        var,
                        log,
                        jobs=args.jobs,
                        hostile=args.hostile if with_hostile else 0,
                        rate=args.rate,
                    )
                    medians[with_hostile].append(median(list(good.values())))
                    label = f"{round_ + 1}: " + (
                        f"with {args.hostile} hostile" if with_hostile else "without"
                    )
                    line = _line(label, list(good.values()))
                    if bad:
                        waits = ", ".join(f"{w:.1f}" for w in sorted(bad.values()))
                        line += f"   hostile jobs: {waits} s"
                    print(line, flush=True)
                    lines.append(line)
        said = log.read_text(errors="replace").splitlines()
        warnings = [line for line in said if "has not answered a step" in line]
    ratio = median(medians[True]) / median(medians[False])
    verdict = "within" if ratio <= TARGET else "OVER"
    tail = [
        f"median of the good jobs' medians: {median(medians[False]):.3f} s without, "
        f"{median(medians[True]):.3f} s with the hostile URLs: {ratio:.2f}x ({verdict} "
        f"{TARGET:g}x)",
        f"the consumer's warnings of a URL or server that has not answered: {len(warnings)}",
        *warnings[:10],
        machine(),
    ]
    print("\n".join(tail), flush=True)
    return lines + tail


if __name__ == "__main__":
    main()
