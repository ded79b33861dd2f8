"""Live console latency, ZooKeeper write -> websocket message: ``python bench/live_latency.py``.

Starts its own ZooKeeper (or uses ``--zk-hosts``, in a fresh chroot), the console under daphne
in a subprocess with a throwaway SQLite database, and a websocket client (the ``websockets``
package) logged in with a real session cookie and subscribed to ``jobs:state:Estimating``. A
separate ZooKeeper client then moves jobs Pending -> Estimating with ``job_transition``:

- at rest: ``--rest`` single moves, ``--spacing`` seconds apart (longer than the coalescing
  window, so each one is a quiet topic's first change);
- in a burst: ``--burst`` moves as fast as ``--writers`` threads can make them.

At rest nothing else changes the watched folder, so a move's message is the first one on the
socket after the move's write began, and its bare-watch event the first event after it (the
benchmark counts any message or event that arrives between moves, which would break that, and
prints the count). A move's latency is the time from just before its ``job_transition`` call to
that message; also printed from the write's acknowledgement.

The baseline is the same kind of watch the console keeps, on the same folder: a ZooKeeper
persistent watch in a session of its own, timed at its event (what ZooKeeper itself takes to
tell a watcher, with nothing read). It is the only other ZooKeeper client in this process: a
kazoo ChildrenWatch, which an earlier version ran here beside it, lists the folder per change,
and at 30,000 entries parsing each listing held this process (and so the socket reader's clock)
for tens of milliseconds, which was charged to the console.

In a burst, the messages are coalesced, and neither the console's messages nor a persistent
watch's events say which write they follow (kazoo may also drop an event that arrives while the
previous one is being handed over; the message sent after it covers it). A move's burst
latency is therefore taken to the first message that arrives after the move's write was
acknowledged (ZooKeeper queues a watch event for its watchers before the reply to the write),
or to the burst's last message for a write acknowledged after it (that message may precede the
ack: with no window it leaves as soon as the last event arrives). The burst shows what the
coalescing window costs and how many messages a burst becomes.

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
    """Arrival times of the messages on the socket for TOPIC, in order, and the watch events
    each says it folds in."""

    times: list[float] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def first_after(self, after: float) -> float | None:
        i = bisect.bisect_left(self.times, after)
        return self.times[i] if i < len(self.times) else None

    def between(self, start: float, end: float) -> int:
        return bisect.bisect_left(self.times, end) - bisect.bisect_left(self.times, start)


@dataclass
class Move:
    start: float
    done: float


class BareWatch:
    """A persistent watch on ``path`` in a session of its own, the kind the console keeps:
    ``perf_counter`` at each event's callback."""

    def __init__(self, hosts: str, path: str) -> None:
        from kazoo.client import KazooClient

        from queues.zk.kazoo_private import add_persistent_watch

        self.events: list[float] = []
        self.changed = threading.Condition()
        self.client = KazooClient(hosts=hosts)
        self.client.start(timeout=30)
        self.client.ensure_path(path)
        add_persistent_watch(self.client, path, self._event).get(timeout=30)

    def _event(self, _event: Any) -> bool:
        with self.changed:
            self.events.append(time.perf_counter())
            self.changed.notify_all()
        return True

    def first_after(self, after: float, timeout: float) -> float:
        def found() -> float | None:
            i = bisect.bisect_left(self.events, after)
            return self.events[i] if i < len(self.events) else None

        with self.changed:
            if not self.changed.wait_for(lambda: found() is not None, timeout):
                raise TimeoutError(f"the bare watch had no event within {timeout}s")
            at = found()
            assert at is not None
            return at

    def between(self, start: float, end: float) -> int:
        with self.changed:
            return bisect.bisect_left(self.events, end) - bisect.bisect_left(self.events, start)

    def close(self) -> None:
        self.client.stop()
        self.client.close()


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


async def read_socket(ws: Any, received: Received) -> None:
    async for raw in ws:
        now = time.perf_counter()
        message = json.loads(raw)
        if message.get("topic") == TOPIC and message.get("kind") == "changed":
            received.times.append(now)
            received.events.append(int(message.get("events", 1)))
            received.arrived.set()


async def wait_after(received: Received, after: float, timeout: float) -> float:
    """Arrival time of the first message at or after ``after`` (perf_counter)."""
    deadline = time.perf_counter() + timeout
    while True:
        at = received.first_after(after)
        if at is not None:
            return at
        left = deadline - time.perf_counter()
        if left <= 0:
            raise TimeoutError(f"no message within {timeout}s")
        received.arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(received.arrived.wait(), left)


async def measure(
    args: argparse.Namespace, port: int, cookie: str, zk: Any, hosts: str, window: float
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
        bare_rest: list[float] = []
        console_rest: list[float] = []
        stray = 0  # messages and events between two moves: none expected at rest
        quiet_since = time.perf_counter()
        for job in rest_jobs:
            start = time.perf_counter()
            stray += received.between(quiet_since, start) + bare.between(quiet_since, start)
            await asyncio.to_thread(jobs.job_transition, zk, job, "Estimating")
            move = Move(start, time.perf_counter())
            console_rest.append(await wait_after(received, start, timeout=30))
            bare_rest.append(await asyncio.to_thread(bare.first_after, start, 30))
            rest.append(move)
            # Past the first message and event, anything before the next move is stray.
            quiet_since = max(console_rest[-1], bare_rest[-1]) + 1e-9
            await asyncio.sleep(args.spacing)
        stray += received.between(quiet_since, time.perf_counter())

        await asyncio.sleep(1.0)  # let the last window close before the burst
        first_burst_message = len(received.times)
        burst: list[Move] = []
        lock = threading.Lock()

        def move_one(job: Any) -> None:
            start = time.perf_counter()
            jobs.job_transition(zk, job, "Estimating")
            with lock:
                burst.append(Move(start, time.perf_counter()))

        def move_all() -> float:
            began = time.perf_counter()
            with ThreadPoolExecutor(args.writers) as pool:
                list(pool.map(move_one, burst_jobs))
            return time.perf_counter() - began

        burst_seconds = await asyncio.to_thread(move_all)
        last_ack = max(m.done for m in burst)
        began = min(m.start for m in burst)
        await wait_after(received, began, timeout=60)
        # Until the burst's last window has closed: a quiet spell of two windows (at least 1 s).
        heard = -1
        while heard != len(received.times):
            heard = len(received.times)
            await asyncio.sleep(max(1.0, 2 * window))
        reader.cancel()
    await asyncio.to_thread(bare.close)

    last_message = received.times[-1]

    def after_ack(moves: list[Move]) -> list[float]:
        # A write acknowledged after the burst's last message was told by that message (it is
        # the last one, sent after every event the hub received).
        return [(received.first_after(m.done) or last_message) - m.start for m in moves]

    burst_messages = len(received.times) - first_burst_message
    return {
        "bare_rest": [at - m.start for at, m in zip(bare_rest, rest, strict=True)],
        "rest": (
            [at - m.start for at, m in zip(console_rest, rest, strict=True)],
            [at - m.done for at, m in zip(console_rest, rest, strict=True)],
        ),
        "rest_write": [m.done - m.start for m in rest],
        "stray": stray,
        "burst": after_ack(burst),
        "burst_write": [m.done - m.start for m in burst],
        "burst_seconds": burst_seconds,
        "burst_last": last_message - last_ack,
        "burst_messages": burst_messages,
        "burst_events": sum(received.events[first_burst_message:]),
    }


def ms(values: list[float]) -> str:
    return f"median {median(values) * 1000:7.1f} ms   p95 {p95(values) * 1000:7.1f} ms"


def row(label: str, values: list[float]) -> str:
    return f"  {label:<38} {ms(values)}"


def report(args: argparse.Namespace, runs: dict[float, dict[str, Any]]) -> None:
    print("Live console: ZooKeeper write -> websocket message (daphne, in-memory channel layer),")
    print("beside a bare persistent watch on the same folder in a session of its own (write ->")
    print(f"event); all times from just before the write call; topic {TOPIC}")
    if args.preload:
        print(f"{args.preload:,} jobs preloaded into the watched folder")
    for window, result in runs.items():
        rate = args.burst / result["burst_seconds"]
        print()
        print(f"coalescing window LIVE_COALESCE_SECONDS={window:g} ({window * 1000:.0f} ms)")
        print(f" at rest, {args.rest} single moves {args.spacing:g} s apart")
        print(row("bare persistent watch (write -> event)", result["bare_rest"]))
        print(row("console (write -> websocket message)", result["rest"][0]))
        print(row("  console, from the write's ack", result["rest"][1]))
        print(row("  (the write itself)", result["rest_write"]))
        ratio = median(result["rest"][0]) / median(result["bare_rest"])
        verdict = "within" if ratio <= 2 else "OVER"
        print(f"  console / bare watch, medians: {ratio:.2f}x ({verdict} the 2x target)")
        print(f"  messages or events between moves (none expected): {result['stray']}")
        print(
            f" burst of {args.burst} moves by {args.writers} writer threads in "
            f"{result['burst_seconds']:.2f} s ({rate:,.0f} moves/s)"
        )
        print(row("console (write -> first message after ack)", result["burst"]))
        print(row("  (the write itself)", result["burst_write"]))
        print(
            f"  last write's ack -> last message: {result['burst_last'] * 1000:+.1f} ms; "
            f"{result['burst_messages']} socket messages for {args.burst} moves "
            f"({result['burst_events']} watch events folded in)"
        )

    def cell(values: list[float], base: list[float]) -> str:
        return (
            f"{(median(values) - median(base)) * 1000:+7.1f} ms"
            f" {(p95(values) - p95(base)) * 1000:+7.1f} ms"
        )

    print()
    print("What the console adds at rest (differences of medians, then of p95s):")
    for window, result in runs.items():
        label = f"console {window * 1000:.0f} ms window - bare watch"
        print(f"  {label:<44} {cell(result['rest'][0], result['bare_rest'])}")
    windows = sorted(runs)
    if len(windows) > 1:
        low, high = runs[windows[0]], runs[windows[-1]]
        label = f"the {windows[-1] * 1000:.0f} ms window itself (vs {windows[0] * 1000:.0f} ms)"
        print(f"  {label:<44} {cell(high['rest'][0], low['rest'][0])}   (at rest)")
        print(f"  {label:<44} {cell(high['burst'], low['burst'])}   (burst)")
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
                    runs[window] = asyncio.run(measure(args, port, cookie, writer, hosts, window))
            finally:
                writer.stop()
                writer.close()
        version = zookeeper_version(server)

    report(args, runs)
    print()
    print(f"ZooKeeper {version}; {machine()}")


if __name__ == "__main__":
    main()
