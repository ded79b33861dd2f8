"""Live console latency, ZooKeeper write -> websocket message: ``python bench/live_latency.py``.

Starts its own ZooKeeper (or uses ``--zk-hosts``, in a fresh chroot), the console under daphne
in a subprocess with a throwaway SQLite database, and a websocket client (the ``websockets``
package) logged in with a real session cookie and subscribed to ``jobs:state:Estimating``. A
separate ZooKeeper client then moves jobs Pending -> Estimating with ``job_transition``:

- at rest: ``--rest`` single moves, ``--spacing`` seconds apart (longer than the coalescing
  window, so each one is a quiet topic's first change);
- in a burst: ``--burst`` moves as fast as ``--writers`` threads can make them.

Which message reflects which write is decided by ZooKeeper's own transaction ids, not by
guessing: every message carries the folder's ``pzxid`` (the transaction that last changed its
children) and a move's transaction id is its status node's ``mzxid``. A move's latency is the
time from just before its ``job_transition`` call to the first message with ``zxid`` >= the
move's. Prints median and 95th percentile, also measured from the write's acknowledgement.

Beside it, the bare-watch baselines, in sessions of their own on the folder the console
watches, timed from the same write: at rest, the first event of a persistent watch (what
ZooKeeper itself takes to tell a watcher, with nothing read); in the burst, the first callback
of a kazoo ``ChildrenWatch`` whose children include the moved job (it lists the folder per
change, so at a large folder it is slower than the console). What the console adds is the
difference.

``--preload N`` first loads N jobs into the watched folder (``bench/loader.py``), so the
figures are those of a large queue: 30,000 is the Estimating folder of a 1,000,000-job queue.

The console runs once per ``--windows`` value (``LIVE_COALESCE_SECONDS``; default 0.25 and 0),
so the table also separates what the coalescing window costs from what delivery through daphne,
the channel layer and the websocket costs.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    machine,
    median,
    new_chroot,
    p95,
    setup_django,
    throwaway_zookeeper,
    zookeeper_version,
)

TOPIC = "jobs:state:Estimating"


@dataclass
class Received:
    """Messages on the socket for TOPIC: arrival time and the folder's pzxid, in order."""

    times: list[float] = field(default_factory=list)
    zxids: list[int] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def first_reflecting(self, zxid: int, after: float = 0.0) -> float | None:
        """Arrival time of the first message at or after ``after`` whose zxid >= ``zxid``."""
        start = bisect.bisect_left(self.times, after)
        for i in range(start, len(self.times)):
            if self.zxids[i] >= zxid:
                return self.times[i]
        return None


@dataclass
class Move:
    start: float
    done: float
    zxid: int = 0


class BareWatch:
    """Raw watches on ``path``, each in a session of its own: a kazoo ChildrenWatch (when each
    job first appeared among the children) and a persistent watch (when each event arrived),
    ``perf_counter`` at the callback."""

    def __init__(self, hosts: str, path: str) -> None:
        from kazoo.client import KazooClient

        from queues.zk.kazoo_private import add_persistent_watch

        self.seen: dict[str, float] = {}
        self.events: list[float] = []
        self.callbacks = 0
        self.changed = threading.Condition()
        self.client = KazooClient(hosts=hosts)
        self.client.start(timeout=30)
        # A ChildrenWatch on a missing folder stops for good; a fresh chroot has none yet.
        self.client.ensure_path(path)
        self.client.ChildrenWatch(path, self._children)
        # Not in the ChildrenWatch's session: a one-shot watch on the path would make the
        # persistent one one-shot too (ZOOKEEPER-4466).
        self.raw = KazooClient(hosts=hosts)
        self.raw.start(timeout=30)
        add_persistent_watch(self.raw, path, self._event).get(timeout=30)

    def _event(self, _event: Any) -> bool:
        self.events.append(time.perf_counter())
        return True

    def first_event(self, after: float) -> float:
        return self.events[bisect.bisect_left(self.events, after)]

    def _children(self, children: list[str]) -> None:
        now = time.perf_counter()
        with self.changed:
            self.callbacks += 1
            for name in children:
                jid = name.rpartition("-")[2]  # index entries are <priority>-<jid>
                self.seen.setdefault(jid, now)
            self.changed.notify_all()

    def wait_for(self, jids: list[str], timeout: float) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: all(j in self.seen for j in jids), timeout):
                missing = [j for j in jids if j not in self.seen]
                raise TimeoutError(f"the bare watch never saw {len(missing)} moves: {missing[:3]}")

    def close(self) -> None:
        for client in (self.client, self.raw):
            client.stop()
            client.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def console(env: dict[str, str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    """The ASGI app under daphne, like production; stopped on exit."""
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [*command, "mrtadmin.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    url = f"http://127.0.0.1:{port}/healthz"
                    with urllib.request.urlopen(url, timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"daphne did not start:\n{log.read().decode()[-3000:]}")
                time.sleep(0.2)
            try:
                yield proc
            except BaseException:
                log.seek(0)
                print(f"daphne's log:\n{log.read().decode(errors='replace')[-4000:]}")
                raise
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def session_cookie() -> str:
    """A logged-in superuser's session, written straight into the console's database."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth.models import User
    from django.contrib.sessions.backends.db import SessionStore
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    user = User.objects.create_superuser("bench", "bench@example.org", secrets.token_urlsafe(16))
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    assert session.session_key is not None
    return session.session_key


def make_jobs(zk: Any, count: int) -> list[Any]:
    from queues.zk import batches, jobs

    batch = batches.batch_create(zk, submission={"profile": "bench", "type": "container"})
    configuration = {"profile": "bench", "submitter": "bench", "type": "container"}
    with ThreadPoolExecutor(8) as pool:
        return list(
            pool.map(
                lambda _: jobs.job_create(zk, bid=batch.bid, configuration=configuration),
                range(count),
            )
        )


def wait_until_filled(port: int, cookie: str, timeout: float = 1800.0) -> float:
    """Seconds until the console's read index is filled (its background fill competes with
    the live updates for the interpreter: a queue of 1,000,000 jobs takes minutes), found by
    the failed page no longer saying it is still loading."""
    began = time.monotonic()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/failed/", headers={"Cookie": f"sessionid={cookie}"}
    )
    while time.monotonic() - began < timeout:
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 (loopback)
                if answer.status == 200 and b'id="index-loading"' not in answer.read():
                    return time.monotonic() - began
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the console's read index was not filled within {timeout:.0f} s")


def preload(zk: Any, count: int) -> None:
    """``count`` jobs in the watched folder, 50 a batch, as the bulk loader writes them."""
    from bench.loader import bulk_load

    began = time.monotonic()
    bulk_load(zk, batches=max(1, count // 50), jobs=count, distribution={"Estimating": 1.0})
    print(f"preloaded {count:,} jobs into Estimating in {time.monotonic() - began:.1f} s")


def status_zxids(zk: Any, jids: list[str]) -> list[int]:
    from queues.zk import paths

    pending = [zk.exists_async(paths.job_node(j, "status")) for j in jids]
    return [p.get().mzxid for p in pending]


async def read_socket(ws: Any, received: Received) -> None:
    async for raw in ws:
        now = time.perf_counter()
        message = json.loads(raw)
        if message.get("topic") == TOPIC and "zxid" in message:
            received.times.append(now)
            received.zxids.append(int(message["zxid"]))
            received.events.append(int(message.get("events", 1)))
            received.arrived.set()


async def wait_reflecting(received: Received, zxid: int, after: float, timeout: float) -> float:
    deadline = time.perf_counter() + timeout
    while True:
        at = received.first_reflecting(zxid, after)
        if at is not None:
            return at
        left = deadline - time.perf_counter()
        if left <= 0:
            raise TimeoutError(f"no message reflecting zxid {zxid:#x} within {timeout}s")
        received.arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(received.arrived.wait(), left)


async def measure(
    args: argparse.Namespace, port: int, cookie: str, zk: Any, hosts: str
) -> dict[str, Any]:
    import websockets

    from queues.zk import jobs, paths

    filled = await asyncio.to_thread(wait_until_filled, port, cookie)
    print(f"  the console's read index was filled after {filled:.1f} s", flush=True)
    todo = await asyncio.to_thread(make_jobs, zk, args.rest + args.burst)
    bare = await asyncio.to_thread(BareWatch, hosts, paths.job_state_folder("Estimating"))
    rest_jobs, burst_jobs = todo[: args.rest], todo[args.rest :]
    received = Received()
    async with websockets.connect(
        f"ws://127.0.0.1:{port}/ws/live/",
        additional_headers={"Cookie": f"sessionid={cookie}", "Origin": f"http://127.0.0.1:{port}"},
        max_queue=None,
    ) as ws:
        hello = json.loads(await ws.recv())
        assert hello["kind"] == "hello", hello
        await ws.send(json.dumps({"subscribe": [TOPIC]}))
        ack = json.loads(await ws.recv())
        assert ack == {"kind": "subscribed", "topics": [TOPIC]}, ack
        reader = asyncio.create_task(read_socket(ws, received))

        rest: list[Move] = []
        for job in rest_jobs:
            start = time.perf_counter()
            await asyncio.to_thread(jobs.job_transition, zk, job, "Estimating")
            move = Move(start, time.perf_counter())
            move.zxid = (await asyncio.to_thread(status_zxids, zk, [job.jid]))[0]
            await wait_reflecting(received, move.zxid, move.start, timeout=30)
            await asyncio.to_thread(bare.wait_for, [job.jid], 30)
            rest.append(move)
            await asyncio.sleep(args.spacing)

        await asyncio.sleep(1.0)  # let the last window close before the burst
        first_burst_message = len(received.times)
        burst: dict[str, Move] = {}
        lock = threading.Lock()

        def move_one(job: Any) -> None:
            start = time.perf_counter()
            jobs.job_transition(zk, job, "Estimating")
            with lock:
                burst[job.jid] = Move(start, time.perf_counter())

        def move_all() -> float:
            began = time.perf_counter()
            with ThreadPoolExecutor(args.writers) as pool:
                list(pool.map(move_one, burst_jobs))
            return time.perf_counter() - began

        burst_seconds = await asyncio.to_thread(move_all)
        zxids = await asyncio.to_thread(status_zxids, zk, [j.jid for j in burst_jobs])
        for job, zxid in zip(burst_jobs, zxids, strict=True):
            burst[job.jid].zxid = zxid
        last = max(zxids)
        await wait_reflecting(received, last, 0.0, timeout=60)
        await asyncio.to_thread(bare.wait_for, [j.jid for j in burst_jobs], 60)
        reader.cancel()
    await asyncio.to_thread(bare.close)

    def latencies(moves: list[Move]) -> tuple[list[float], list[float]]:
        from_start, from_ack = [], []
        for m in moves:
            at = received.first_reflecting(m.zxid, m.start)
            assert at is not None
            from_start.append(at - m.start)
            from_ack.append(at - m.done)
        return from_start, from_ack

    def bare_latencies(moves: dict[str, Move]) -> list[float]:
        return [bare.seen[jid] - m.start for jid, m in moves.items()]

    burst_messages = len(received.times) - first_burst_message
    return {
        "bare_rest": [bare.first_event(m.start) - m.start for m in rest],
        "bare_rest_children": bare_latencies(
            {j.jid: m for j, m in zip(rest_jobs, rest, strict=True)}
        ),
        "bare_burst": bare_latencies(burst),
        "bare_callbacks": bare.callbacks,
        "rest": latencies(rest),
        "rest_write": [m.done - m.start for m in rest],
        "burst": latencies(list(burst.values())),
        "burst_write": [m.done - m.start for m in burst.values()],
        "burst_seconds": burst_seconds,
        "burst_messages": burst_messages,
        "burst_events": sum(received.events[first_burst_message:]),
    }


def ms(values: list[float]) -> str:
    return f"median {median(values) * 1000:7.1f} ms   p95 {p95(values) * 1000:7.1f} ms"


def row(label: str, values: list[float]) -> str:
    return f"  {label:<38} {ms(values)}"


def report(args: argparse.Namespace, runs: dict[float, dict[str, Any]]) -> None:
    print("Live console: ZooKeeper write -> websocket message (daphne, in-memory channel layer),")
    print("beside bare watches on the same folder (a persistent watch's event; a kazoo")
    print(f"ChildrenWatch's callback); all times from just before the write call; topic {TOPIC}")
    if args.preload:
        print(f"{args.preload:,} jobs preloaded into the watched folder")
    for window, result in runs.items():
        rate = args.burst / result["burst_seconds"]
        print()
        print(f"coalescing window LIVE_COALESCE_SECONDS={window:g} ({window * 1000:.0f} ms)")
        print(f" at rest, {args.rest} single moves {args.spacing:g} s apart")
        print(row("bare watch (write -> event)", result["bare_rest"]))
        print(row("bare ChildrenWatch (write -> callback)", result["bare_rest_children"]))
        print(row("console (write -> websocket message)", result["rest"][0]))
        print(row("  console, from the write's ack", result["rest"][1]))
        print(row("  (the write itself)", result["rest_write"]))
        print(
            f" burst of {args.burst} moves by {args.writers} writer threads in "
            f"{result['burst_seconds']:.2f} s ({rate:,.0f} moves/s)"
        )
        print(row("bare ChildrenWatch (write -> callback)", result["bare_burst"]))
        print(row("console (write -> websocket message)", result["burst"][0]))
        print(row("  console, from the write's ack", result["burst"][1]))
        print(row("  (the write itself)", result["burst_write"]))
        print(
            f"  {result['bare_callbacks']} bare-watch callbacks; {result['burst_messages']} "
            f"socket messages for {args.burst} moves ({result['burst_events']} watch events "
            "folded in)"
        )

    def cell(values: list[float], base: list[float]) -> str:
        return (
            f"{(median(values) - median(base)) * 1000:+7.1f} ms"
            f" {(p95(values) - p95(base)) * 1000:+7.1f} ms"
        )

    print()
    print("What the console adds (differences of medians, then of p95s):")
    print(f"  {'':<44} {'at rest':>19}   {'burst':>19}")
    for window, result in runs.items():
        print(
            f"  {f'console {window * 1000:.0f} ms window - bare watch':<44} "
            f"{cell(result['rest'][0], result['bare_rest'])}   "
            f"{cell(result['burst'][0], result['bare_burst'])}"
        )
    windows = sorted(runs)
    if len(windows) > 1:
        low, high = runs[windows[0]], runs[windows[-1]]
        label = f"the {windows[-1] * 1000:.0f} ms window itself (vs {windows[0] * 1000:.0f} ms)"
        print(
            f"  {label:<44} {cell(high['rest'][0], low['rest'][0])}   "
            f"{cell(high['burst'][0], low['burst'][0])}"
        )
        print(
            f"  socket messages in the burst: {high['burst_messages']} with the "
            f"{windows[-1] * 1000:.0f} ms window, {low['burst_messages']} with "
            f"{windows[0] * 1000:.0f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zk-hosts", default="", help="an existing ZooKeeper (default: own)")
    parser.add_argument("--rest", type=int, default=50, help="single moves at rest")
    parser.add_argument("--spacing", type=float, default=0.5, help="seconds between them")
    parser.add_argument("--burst", type=int, default=1000, help="moves in the burst")
    parser.add_argument("--writers", type=int, default=8, help="threads writing the burst")
    parser.add_argument(
        "--preload", type=int, default=0, help="jobs loaded into the watched folder first"
    )
    parser.add_argument(
        "--windows",
        type=float,
        nargs="+",
        default=[0.25, 0.0],
        help="LIVE_COALESCE_SECONDS values to run the console with, one daphne each",
    )
    args = parser.parse_args()

    runs: dict[float, dict[str, Any]] = {}
    with (
        throwaway_zookeeper(args.zk_hosts) as server,
        tempfile.TemporaryDirectory(prefix="mrt-bench-live-") as tmp,
    ):
        # Settings come from the environment: set it before Django reads it, for this process
        # (session, ZooKeeper writes) and for daphne alike.
        os.environ.update(
            {
                "MRT_VAR_DIR": str(Path(tmp) / "var"),
                "MRT_DATABASE_PATH": str(Path(tmp) / "console.sqlite3"),
                "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
                "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
                "LOG_LEVEL": "WARNING",
            }
        )
        setup_django()
        from django.conf import settings

        from queues.zk import client as zkmod

        cookie = session_cookie()
        for window in args.windows:
            # A fresh chroot per run: each console starts on an empty Estimating folder.
            hosts = new_chroot(server, "bench-live")
            settings.ZK_HOSTS = hosts
            env = {**os.environ, "ZK_HOSTS": hosts, "LIVE_COALESCE_SECONDS": repr(window)}
            port = free_port()
            writer = zkmod.connect(hosts)
            if args.preload:
                preload(writer, args.preload)
            try:
                with console(env, port):
                    runs[window] = asyncio.run(measure(args, port, cookie, writer, hosts))
            finally:
                writer.stop()
                writer.close()
        version = zookeeper_version(server)

    report(args, runs)
    print()
    print(f"ZooKeeper {version}; {machine()}")


if __name__ == "__main__":
    main()
