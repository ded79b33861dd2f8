"""Consumer daemons against the pipelined raw rate: ``python bench/daemons.py``.

Loads ``--jobs`` jobs in Estimating, then runs ``--processes`` daemon processes. Each hosts one
daemon per job step (Estimating ... Notify) running the project's own batched loop
(``queues.daemons.pipeline``: one lock multi and one multiRead of the queue hold and up to
``--batch`` jobs in one round trip, the step, one move multi for all of them, locks kept from
one step to the next inside the process, the batch's completion checked at the end), all the
loops of a process in one thread as ``runconsumer`` runs them (``--thread-each``: a thread each),
with a step that does no work, so what is measured is the loop and ZooKeeper, not downloads.
Every job makes 7 transitions on its way to Completed.

In the same run and on the same server, a raw probe on the same kind of jobs: the same number
of client processes, each sending only the contract's requests for every transition -- a claim
(each job's index entry checked and its ephemeral lock created), a read of the job's nodes and
the move (status, state and batch index entries, the lock deleted) -- as many jobs a request as
the daemons claim at once (``--batch``, by default the installation's MRT_CLAIM_BATCH; one
multi, one multiRead, one multi) and with as many batches under way as the daemons may
have, each sent without waiting for the others. It reads no hold and keeps no lock.

Every child of a run is started, connected and set up before any of them starts; the window
opens once 5% of the transitions are made and closes when the first state is empty (what
follows is the pipeline's drain) or after ``--seconds``. Only the window counts: transitions
from the state folders' counts, requests, CPU.

Requests per transition come from the server's own count (``mntr``: ``zk_packets_received``
at the window's opening and close, over the transitions made meanwhile; pings included). Where the
CPU goes is printed beside each rate: the client processes' CPU time per transition (from
``/proc/<pid>/stat`` over the timed window) and how busy the whole machine was meanwhile (from
``/proc/stat``), so a rate limited by the machine's cores shows as such. The server's own time
in fsync (``mntr``: ``zk_sum_fsynctime``) over the window is printed too: a run held by the
disk under the server's log (a run moving a tenth of its usual rate with the machine idle) shows
as such, not as the clients'.

``--shipped`` runs ``manage.py runconsumer all`` as shipped instead, every step's work a no-op;
``--shipped --real`` the same command doing every step's own work: each job a small file
(``--file-bytes``) from loopback depositors, stored, recorded and minted through the project's
stand-ins of storage, inventory and EZID, its callback posted to a loopback receiver
(``RealServices``).

Why one module (about 1,100 lines): it is one command whose parts must measure alike. The
daemons' runs (one-job, batched, the shipped command), the raw probe and the recorder's
comparison share the window, the CPU and request counts and the table they print; apart, a
change to how one side is counted could leave the other counted the old way.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import logging
import multiprocessing
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    BenchError,
    drop_chroot,
    machine,
    median,
    new_chroot,
    setup_django,
    start_together,
    throwaway_zookeeper,
)

TARGET_SHARE = 0.8
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes have used so far (gone ones count 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def machine_ticks() -> tuple[int, int]:
    """(busy, all) CPU ticks of the machine so far, from /proc/stat's first line."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


@dataclass
class CpuWindow:
    """CPU used by some processes and by the machine between ``start`` and ``stop``."""

    pids: list[int]
    client: float = 0.0
    busy: float = 0.0
    _start: tuple[float, tuple[int, int]] | None = None

    def start(self) -> None:
        self._start = (cpu_seconds(self.pids), machine_ticks())

    def stop(self) -> None:
        if self._start is None:
            return
        cpu, (busy, total) = self._start
        now_busy, now_total = machine_ticks()
        self.client = cpu_seconds(self.pids) - cpu
        self.busy = (now_busy - busy) / max(1, now_total - total)


LOOPS = 7  # one daemon per job step after Pending: Estimating ... Notify
WARM_UP = 0.05  # share of all transitions made before the window opens (start-up left out)
WARMED = ", after one untimed run of each side with as many processes on the same server"
POLL = 0.05  # s between two looks at the state folders while timing


class Progress:
    """Transitions made so far by jobs loaded in Estimating: a job in the n-th state after it
    has made n. The state folders' child counts, read in one round trip."""

    def __init__(self, zk) -> None:
        from queues.core.states import JOB_WORKING, JobState
        from queues.zk import paths

        self.zk = zk
        self.folders = [paths.job_state_folder(s) for s in (*JOB_WORKING, JobState.COMPLETED)]
        zk.ensure_path(self.folders[-1])

    def read(self) -> tuple[int, int]:
        """(transitions made, jobs still waiting in the first state)."""
        answers = [self.zk.exists_async(folder) for folder in self.folders]
        counts = [
            (stat.numChildren if stat is not None else 0) for stat in (a.get() for a in answers)
        ]
        return sum(i * n for i, n in enumerate(counts)), counts[0]


@dataclass
class Window:
    """What happened between the window's opening and its close."""

    transitions: int
    seconds: float
    packets: int | None
    cpu: CpuWindow
    # The server's time spent writing its transaction log to disk (``mntr``'s
    # ``zk_sum_fsynctime``, milliseconds) inside the window; None when it cannot be asked.
    fsync_ms: int | None = None

    @property
    def per_second(self) -> float:
        return self.transitions / self.seconds

    @property
    def requests_per_transition(self) -> float | None:
        return None if self.packets is None else self.packets / self.transitions

    @property
    def cpu_per_transition(self) -> float:
        return self.cpu.client / self.transitions

    @property
    def fsync_share(self) -> float | None:
        """The share of the window the server spent in fsync: a window that moved little
        while the machine idled because the disk held every write shows it here."""
        return None if self.fsync_ms is None else self.fsync_ms / 1000 / self.seconds


def timed_window(
    hosts: str,
    watcher,
    jobs: int,
    pids: list[int],
    *,
    seconds: float,
    timeout: float,
    until: float | None = None,
) -> Window:
    """Time the clients ``pids`` moving ``jobs`` jobs from Estimating to Completed, every one of
    them started and told to go before this is called. The window opens once ``WARM_UP`` of
    the transitions are made (every client connected, the pipeline filled) and closes after
    ``seconds``, or earlier once the first state is empty: what follows is the pipeline's drain,
    not its rate. With ``until`` (a share of all transitions), it closes once that share is
    made instead of when the first state empties: where the steps' loops go at different paces
    (``runconsumer all`` as shipped), the first state empties long before the slowest step has
    had its say. Only what happened inside it counts: transitions, requests, CPU."""
    progress = Progress(watcher)
    deadline = time.monotonic() + timeout
    while True:
        done, waiting = progress.read()
        if done >= WARM_UP * jobs * LOOPS:
            break
        if time.monotonic() > deadline:
            raise BenchError(f"{done} transitions after {timeout:.0f}s: the clients are not moving")
        time.sleep(POLL / 5)
    cpu = CpuWindow(pids)
    cpu.start()
    before = server_counters(hosts)
    opened, first = time.monotonic(), done

    def open_() -> bool:
        if until is not None:
            return done < until * jobs * LOOPS
        return bool(waiting)

    while open_() and time.monotonic() < opened + seconds:
        time.sleep(POLL)
        done, waiting = progress.read()
    closed = time.monotonic()
    cpu.stop()
    after = server_counters(hosts)
    if done <= first:
        raise BenchError("no transition inside the window: give more --jobs")

    def grown(name: str) -> int | None:
        if before is None or after is None or name not in before or name not in after:
            return None
        return after[name] - before[name]

    return Window(
        done - first,
        closed - opened,
        grown("zk_packets_received"),
        cpu,
        fsync_ms=grown("zk_sum_fsynctime"),
    )


def _daemon_process(
    hosts: str,
    poll: float,
    ready,
    go,
    stop,
    record: bool = False,
    batch: int = 16,
    keep: bool = True,
    shared: bool = True,
) -> None:
    setup_django()
    from django.conf import settings

    from queues.core.states import JOB, JOB_WORKING, JobState
    from queues.daemons.base import JobDaemon, Next
    from queues.daemons.pipeline import LockKeeper
    from queues.daemons.runner import daemon_threads, tune_collector
    from queues.zk.client import client

    logging.getLogger("queues").setLevel(logging.WARNING)
    settings.ZK_HOSTS = hosts

    class NoWork(JobDaemon):
        """A step that has nothing to do: the job moves on to the next state at once. The
        ingest queue's hold is read as every real job daemon reads it."""

        def work(self, item):  # the base class's signature
            return Next(JOB.successor(item.state) or JobState.COMPLETED)

    keeper = LockKeeper() if keep else None
    daemons = [
        type(f"NoWork{s}", (NoWork,), {"name": f"bench-{s}", "step": s, "state": s})(
            poll=poll, batch=batch, keeper=keeper
        )
        for s in JOB_WORKING
    ]
    client().get_children("/")  # connected before it says it is ready
    tune_collector()  # as runconsumer does before its loops start
    observer = None
    if record:
        # What runconsumer's Host adds: registration, and every step recorded in the database
        # (in batches, by a writer thread).
        from queues.daemons.registration import ProcessObserver

        observer = ProcessObserver(daemons[0].zk, daemons, record=True)
        for daemon in daemons:
            daemon.observer = observer
        observer.start()
    ready.put(os.getpid())
    go.wait()
    halt = threading.Event()
    threads = daemon_threads(daemons, halt, shared=shared)  # as runconsumer's Host runs them
    for thread in threads:
        thread.start()
    stop.wait()
    halt.set()
    for thread in threads:
        thread.join()
    if observer is not None:
        observer.stop()


SERVER_COUNTERS = ("zk_packets_received", "zk_sum_fsynctime")


def server_counters(hosts: str) -> dict[str, int] | None:
    """The server's running counts (``mntr``) of requests received and of milliseconds spent
    in fsync, or None when it cannot be asked (not a local server)."""
    from queues.services.zkserver import four_letter

    host, _, rest = hosts.partition(":")
    if host not in ("127.0.0.1", "localhost"):
        return None
    port = int(rest.split(",")[0].split("/")[0])
    answer = four_letter(port, "mntr")
    if answer is None:
        return None
    found = dict(re.findall(r"^(zk_\w+)\s+(-?\d+)\s*$", answer, re.MULTILINE))
    return {name: int(found[name]) for name in SERVER_COUNTERS if name in found}


@dataclass
class Run:
    """One timed run, of the daemons or of the raw probe."""

    processes: int
    window: Window

    @property
    def per_second(self) -> float:
        return self.window.per_second


def _load_estimating(hosts: str, name: str, jobs: int) -> str:
    """A fresh chroot holding ``jobs`` jobs waiting in Estimating (every one makes all seven
    transitions), in 50-job batches."""
    from bench.load import load
    from queues.core.states import JobState

    target = new_chroot(hosts, name)
    load(
        target,
        jobs=jobs,
        batches=max(1, jobs // 50),
        distribution={JobState.ESTIMATING: 1.0},
        quiet=True,
    )
    return target


def _timed_children(
    hosts: str,
    target: str,
    jobs: int,
    start,
    *,
    processes: int,
    seconds: float,
    timeout: float,
    until: float | None = None,
) -> Window:
    """Start ``processes`` children (``start(ready, go, stop)`` makes one), wait until every one
    has connected and set up, tell them to go together, and time the window. The run's chroot
    is deleted afterwards: every run, of either side, meets a server holding only its own jobs."""
    from queues.zk import client as zkmod

    context = multiprocessing.get_context("spawn")  # kazoo's threads do not survive a fork
    ready, go, stop = context.Queue(), context.Event(), context.Event()
    children = [start(context, ready, go, stop) for _ in range(processes)]
    watcher = zkmod.connect(target)
    try:
        start_together(children, ready, go, timeout)
        window = timed_window(
            hosts,
            watcher,
            jobs,
            [c.pid for c in children if c.pid is not None],
            seconds=seconds,
            timeout=timeout,
            until=until,
        )
        failed = [c.exitcode for c in children if c.exitcode not in (None, 0)]
        if failed:
            raise BenchError(f"children exited with {failed} inside the window")
        return window
    finally:
        stop.set()
        for child in (c for c in children if c.pid is not None):
            child.join(timeout=30)
            if child.is_alive():
                child.terminate()
                child.join(timeout=10)
        watcher.stop()
        watcher.close()
        try:
            drop_chroot(target)
        except Exception as exc:  # the figures stand; the next runs meet a bigger tree
            print(f"warning: {target} was not deleted: {exc!r}", file=sys.stderr, flush=True)


def run_daemons(
    hosts: str,
    *,
    jobs: int,
    processes: int,
    seconds: float = 30.0,
    timeout: float = 120,
    record: bool = False,
    batch: int = 16,
    keep: bool = True,
    poll: float = 1.0,
    shared: bool = True,
) -> Run:
    """``processes`` daemon processes moving ``jobs`` Estimating jobs towards Completed."""
    target = _load_estimating(
        hosts, f"bench-daemons-{processes}{'-recorded' if record else ''}", jobs
    )

    def start(context, ready, go, stop):
        return context.Process(
            target=_daemon_process,
            args=(target, poll, ready, go, stop, record, batch, keep, shared),
        )

    window = _timed_children(
        hosts, target, jobs, start, processes=processes, seconds=seconds, timeout=timeout
    )
    return Run(processes, window)


def _noop_payload(made: int) -> str:
    return f"http://127.0.0.{made % 250 + 1}:9/b.bin"


def _depositors_payload(depositors: int) -> Callable[[int], str]:
    """``--depositors N``: each 50-job batch's payloads on one of N loopback servers in turn,
    as a batch manifest's usually are on one depositor's server."""

    def payload(made: int) -> str:
        return f"http://127.0.0.{made // 50 % depositors + 1}:9/b.bin"

    return payload


def _load_loopback(
    hosts: str, name: str, jobs: int, payload: Callable[[int], str] = _noop_payload
) -> str:
    """A fresh chroot holding ``jobs`` jobs waiting in Estimating, in 50-job Processing batches,
    each job's payload on a loopback address (the shipped Downloading loop resolves the payload's
    host before it claims a job: no lookup of a name outside). The jobs' payloads are on 250
    servers in turn (127.0.0.1 to 127.0.0.250, the next job on the next): Downloading takes at
    most MRT_DOWNLOADS_PER_HOST (2) jobs of one server at once, a politeness cap that, with
    every job on one server (or a batch's 50 on one), and not the loops, would set the pace.
    ``payload`` gives the n-th job's payload URL (``--real``: a file its servers serve)."""
    from bench.loader import load_waiting
    from queues.core.states import BatchState, JobState
    from queues.zk import client as zkmod
    from queues.zk.batches import batch_create, batch_transition

    target = new_chroot(hosts, name)
    zk = zkmod.connect(target)
    try:
        from queues.zk.client import ensure_layout

        ensure_layout(zk)
        made = 0
        for start in range(0, jobs, 50):
            batch = batch_create(zk, submission={"profile": SHIPPED_PROFILE, "submitter": "bench"})
            batch_transition(zk, batch, BatchState.PROCESSING)
            for _ in range(min(50, jobs - start)):
                load_waiting(
                    zk,
                    bid=batch.bid,
                    state=JobState.ESTIMATING,
                    count=1,
                    configuration={
                        "profile": SHIPPED_PROFILE,
                        "submitter": "bench",
                        "payload_url": payload(made),
                        "type": "file",
                    },
                )
                made += 1
    finally:
        zk.stop()
        zk.close()
    return target


class RealServices:
    """``--real``: what the shipped steps talk to, on loopback, for every run of the command.

    The depositors: ``PAYLOAD_SERVERS`` file servers on 127.0.0.1, .2, ... (Downloading's
    per-server cap, two at once, would otherwise set the pace), each serving ``FILES`` files of
    ``size`` random bytes; the n-th job's payload is file n on server n, in turn. Storage,
    inventory and EZID: the project's stand-ins (``queues.chaos.standins``, answering as
    Merritt's services do, keeping nothing of what they were sent). The collection's callback
    receiver: the chaos run's (``queues.chaos.servers.depositor_server``). All of them are
    threads of this process, on the same two cores as the daemons and ZooKeeper: on Merritt's
    hosts these services are elsewhere."""

    PAYLOAD_SERVERS = 16
    FILES = 64
    EZID = ("bench", "bench-password")
    OWNER = "ark:/13030/j2bench"

    def __init__(self, size: int) -> None:
        import tempfile

        from django.conf import settings

        from queues.chaos import depositors
        from queues.chaos.servers import QuietFiles, Served, depositor_server, files_server
        from queues.chaos.standins import EzidStandIn, InventoryStandIn, StorageStandIn

        self.root = Path(tempfile.mkdtemp(prefix="mrt-bench-real-"))
        self._stop: list[Callable[[], None]] = []
        try:
            payload = self.root / "payload"
            payload.mkdir()
            for n in range(self.FILES):
                (payload / f"f{n}.bin").write_bytes(os.urandom(size))
            self.servers = []
            for n in range(self.PAYLOAD_SERVERS):
                served = Served(
                    functools.partial(QuietFiles, directory=str(payload)), host=f"127.0.0.{n + 1}"
                )
                self._stop.append(served.stop)
                self.servers.append(served.url)
            receiver = depositor_server(str(payload))
            self._stop.append(receiver.stop)
            work_dir = self.root / "work"
            work_dir.mkdir()
            work = files_server(str(work_dir))
            self._stop.append(work.stop)
            storage = StorageStandIn(None, record=False).start()
            self._stop.append(storage.stop)
            self.storage = storage
            inventory = InventoryStandIn(record=False).start()
            self._stop.append(inventory.stop)
            ezid = EzidStandIn(*self.EZID, record=False).start()
            self._stop.append(ezid.stop)
            self.profiles = self.root / "profiles"
            shutil.copytree(settings.MRT_PROFILES_DIR, self.profiles)
            depositors.call_back_to(self.profiles, f"{receiver.url}/callback")
            depositors.own_profile(self.profiles, self.OWNER)
        except BaseException:
            self.stop()
            raise
        self.env = {
            "MRT_PROFILES_DIR": str(self.profiles),
            "MRT_WORK_DIR": str(work_dir),
            "MRT_WORK_URL": work.url,
            "MRT_STORAGE_URL": storage.url,
            "MRT_INVENTORY_URL": inventory.url,
            "MRT_EZID_URL": ezid.url,
            "MRT_EZID_USER": self.EZID[0],
            "MRT_EZID_PASSWORD": self.EZID[1],
            # The depositors are on loopback, which the fetch policy refuses unless told.
            "MRT_FETCH_ALLOW": "127.0.0.0/24",
        }

    def payload_url(self, made: int) -> str:
        return f"{self.servers[made % len(self.servers)]}/f{made % self.FILES}.bin"

    def stop(self) -> None:
        for stop in reversed(self._stop):
            with contextlib.suppress(Exception):
                stop()
        shutil.rmtree(self.root, ignore_errors=True)


SHIPPED_PROFILE = "merritt_demo_content"
SHIPPED_TIMEOUT = 180.0  # s a shipped process may take to start and register
SHIPPED_UNTIL = 0.9  # the share of all transitions at which a --shipped comparison's window closes


class _Shipped:
    """``manage.py runconsumer all`` processes as shipped, every step's work a no-op
    (MRT_NOOP_STEPS), in the shape ``_timed_children`` starts: ``start()``, ``pid``,
    ``exitcode``, ``join``, ``terminate``. They share one var folder and database, as the hosts of
    one installation do. None claims before every one has registered: the ingest queue is held
    while they start, and released as the go."""

    def __init__(
        self, target: str, var: Path, log: Path, services: dict[str, str] | None = None
    ) -> None:
        import subprocess

        self._subprocess = subprocess
        self.target = target
        self.log = log
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MRT_", "EMAIL_", "ZK_", "DJANGO_"))
        }
        self.env.update(
            DJANGO_SETTINGS_MODULE="mrtadmin.settings",
            ZK_HOSTS=target,
            MRT_VAR_DIR=str(var),
            MRT_DATABASE_PATH=str(var / "console.sqlite3"),
            MRT_PROVISION_HIGH_WATER="0.99",
        )
        # Every step's work a no-op, or (``--real``) done against the services' stand-ins.
        self.env.update(services if services is not None else {"MRT_NOOP_STEPS": "1"})
        self.proc = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = self._subprocess.Popen(
                [sys.executable, "manage.py", "runconsumer", "all"],
                cwd=Path(__file__).resolve().parent.parent,
                env=self.env,
                stdout=out,
                stderr=self._subprocess.STDOUT,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def exitcode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def join(self, timeout: float | None = None) -> None:
        if self.proc is not None:
            import signal as signals

            if self.proc.poll() is None:
                self.proc.send_signal(signals.SIGTERM)
            with contextlib.suppress(self._subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()


def run_shipped(
    hosts: str,
    *,
    jobs: int,
    processes: int,
    seconds: float = 30.0,
    timeout: float = 120,
    real: RealServices | None = None,
    keep: list[Path] | None = None,
    depositors: int | None = None,
) -> Run:
    """``processes`` ``runconsumer all`` processes as shipped (steps no-ops, or with ``real``
    the steps' own work against its servers) moving ``jobs`` Estimating jobs towards Completed,
    timed as ``run_daemons``. With ``keep``, their folder (log, database) is left for the caller
    and added to it; with ``depositors``, the no-op jobs' payloads are on that many servers, a
    batch's on one."""
    import subprocess
    import tempfile

    from queues.zk import client as zkmod
    from queues.zk.consumers import CONSUMERS
    from queues.zk.locks import queue_hold_clear, queue_hold_set

    payload = (
        real.payload_url
        if real is not None
        else _depositors_payload(depositors)
        if depositors
        else _noop_payload
    )
    target = _load_loopback(hosts, f"bench-shipped-{processes}", jobs, payload)
    var = Path(tempfile.mkdtemp(prefix="mrt-bench-shipped-"))
    log = var / "consumers.log"
    services = real.env if real is not None else None
    children = [_Shipped(target, var, log, services) for _ in range(processes)]
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=Path(__file__).resolve().parent.parent,
        env=children[0].env,
        check=True,
        capture_output=True,
    )
    watcher = zkmod.connect(target)
    try:
        queue_hold_set(watcher, "ingest")
        for child in children:
            child.start()
        deadline = time.monotonic() + SHIPPED_TIMEOUT
        while len(watcher.get_children(CONSUMERS) if watcher.exists(CONSUMERS) else []) < len(
            children
        ):
            if time.monotonic() > deadline or any(c.exitcode is not None for c in children):
                raise BenchError(f"runconsumer did not start: see {log}")
            time.sleep(POLL)
        queue_hold_clear(watcher, "ingest")  # the go
        window = timed_window(
            hosts,
            watcher,
            jobs,
            [c.pid for c in children if c.pid is not None],
            seconds=seconds,
            timeout=timeout,
            until=SHIPPED_UNTIL,
        )
        failed = [c.exitcode for c in children if c.exitcode not in (None, 0)]
        if failed:
            raise BenchError(f"runconsumer exited with {failed} inside the window: see {log}")
        run = Run(processes, window)
    finally:
        for child in children:
            child.join(timeout=60)
            child.terminate()
        watcher.stop()
        watcher.close()
        try:
            drop_chroot(target)
        except Exception as exc:
            print(f"warning: {target} was not deleted: {exc!r}", file=sys.stderr, flush=True)
    if keep is not None:
        keep.append(var)
    else:
        shutil.rmtree(var, ignore_errors=True)  # kept, with its log, only when the run failed
    return run


def _raw_child(
    hosts: str, index: int, processes: int, batch: int, streams: int, ready, go, stop
) -> None:
    """The contract's requests for every transition, and nothing else: claim (each job's index
    entry checked and its lock created, one multi a batch), read (the job's nodes, one
    multiRead a batch) and move (status, index and batch entries, lock deleted: one multi a
    batch), ``streams`` batches under way at once, each sent without waiting for the others.
    This child takes every ``processes``-th job of the Estimating listing, so the children never
    race for a job; each batch walks its jobs through every state to Completed."""
    setup_django()
    from queues.core.states import JOB_WORKING, JobState
    from queues.daemons.runner import tune_collector
    from queues.zk import client as zkmod
    from queues.zk import multiread, paths
    from queues.zk.codecs import encode_json, now_stamp
    from queues.zk.jobs import load_paths
    from queues.zk.kazoo_private import Multi
    from queues.zk.paths import job_batch_folder

    zk = zkmod.connect(hosts)
    states = (*JOB_WORKING, JobState.COMPLETED)
    folders = [paths.job_state_folder(s) for s in states]
    batch_folders = [job_batch_folder(s) for s in states]
    names = sorted(zk.get_children(folders[0]))[index::processes]
    waiting = collections.deque(names[i : i + batch] for i in range(0, len(names), batch))
    tune_collector()  # the garbage collector set as the daemons' processes set it

    class Walk:
        """One batch of jobs on its way through the states."""

        def __init__(self, entries: list[str]) -> None:
            self.entries = entries
            self.jids = [e.partition("-")[2] for e in entries]
            self.locks = [paths.job_node(j, "lock") for j in self.jids]
            self.statuses = [paths.job_node(j, "status") for j in self.jids]
            self.reads = load_paths(self.jids)
            self.batches: list[str] = []  # each job's batch folder, once read
            self.at = 0  # the state's place
            self.answers: tuple = ()

        def claim_and_read(self) -> None:
            txn = Multi(zk)
            folder = folders[self.at]
            for entry, lock in zip(self.entries, self.locks, strict=True):
                txn.check(f"{folder}/{entry}", -1)
                txn.create(lock, b"", ephemeral=True)
            self.answers = (txn.commit_async(), multiread.start(zk, self.reads))

        def move(self) -> None:
            claim, reads = self.answers
            if any(isinstance(r, Exception) for r in claim.get()):
                raise RuntimeError(f"raw probe claim failed: {claim.get()}")
            loaded = reads.collect()
            if not self.batches:
                bids = [loaded[paths.job_node(j, "bid")][0].decode() for j in self.jids]
                self.batches = [f"{paths.batch(b)}/states" for b in bids]
            old, new = self.at, self.at + 1
            status = encode_json(
                {
                    "status": states[new],
                    "last_modified": now_stamp(),
                    "last_successful_status": states[old],
                    "retry_count": 0,
                    "message": "",
                }
            )
            txn = Multi(zk)
            for i, entry in enumerate(self.entries):
                txn.set_data(self.statuses[i], status, version=loaded[self.statuses[i]][1].version)
                txn.delete(f"{folders[old]}/{entry}")
                txn.create(f"{folders[new]}/{entry}", b"")
                if batch_folders[old] != batch_folders[new]:
                    base = self.batches[i]
                    txn.delete(f"{base}/{batch_folders[old]}/{self.jids[i]}")
                    txn.create(f"{base}/{batch_folders[new]}/{self.jids[i]}", b"")
                txn.delete(self.locks[i])
            self.at = new
            self.answers = (txn.commit_async(),)

    ready.put(os.getpid())
    go.wait()
    under_way: collections.deque[Walk] = collections.deque()
    while (waiting or under_way) and not stop.is_set():
        while waiting and len(under_way) < streams:
            walk = Walk(waiting.popleft())
            walk.claim_and_read()
            under_way.append(walk)
        walk = under_way.popleft()
        if len(walk.answers) == 2:
            walk.move()
            under_way.append(walk)
            continue
        results = walk.answers[0].get()
        if any(isinstance(r, Exception) for r in results):
            raise RuntimeError(f"raw probe move failed: {results}")
        if walk.at < len(states) - 1:
            walk.claim_and_read()
            under_way.append(walk)
    stop.wait()
    zk.stop()
    zk.close()


def measure_raw(
    hosts: str,
    *,
    jobs: int,
    processes: int,
    batch: int,
    seconds: float,
    timeout: float = 120,
    until: float | None = None,
) -> Run:
    """The raw probe's rate on the same jobs as the daemons, timed the same way."""
    from queues.daemons.pipeline import AHEAD

    target = _load_estimating(hosts, f"bench-raw-{processes}", jobs)
    # As many batches under way as the daemons may have: each loop's batches sent ahead of
    # the one it works on, and the one whose move is on its way.
    streams = LOOPS * (AHEAD + 2)
    count = iter(range(processes))

    def start(context, ready, go, stop):
        return context.Process(
            target=_raw_child,
            args=(target, next(count), processes, batch, streams, ready, go, stop),
        )

    window = _timed_children(
        hosts,
        target,
        jobs,
        start,
        processes=processes,
        seconds=seconds,
        timeout=timeout,
        until=until,
    )
    return Run(processes, window)


def _figure(value: float | None, spec: str) -> str:
    return "?" if value is None else format(value, spec)


def _cpu_figures(rounds: list[tuple[float, float]]) -> str:
    """Median client CPU per transition (microseconds) and machine busy share."""
    if not rounds:
        return f"{'?':>6}{'?':>6}"
    per = median([r[0] for r in rounds]) * 1e6
    busy = median([r[1] for r in rounds])
    return f"{per:>6.0f}{busy:>6.0%}"


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3_000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--batch",
        type=int,
        default=0,
        help="jobs per claim and per move, of the probe and of the loops run in this process "
        "(default: MRT_CLAIM_BATCH, what runconsumer claims at once)",
    )
    parser.add_argument(
        "--no-keep", action="store_true", help="release every lock with its move (no keeping)"
    )
    parser.add_argument(
        "--seconds", type=float, default=30.0, help="the longest timed window of a run"
    )
    parser.add_argument(
        "--thread-each",
        action="store_true",
        help="each loop in a thread of its own (MRT_SHARED_LOOPS=0), not all in one",
    )
    parser.add_argument("--rounds", type=int, default=9, help="runs of each; medians are shown")
    parser.add_argument("--hosts", default="", help="ZooKeeper to use (default: a throwaway one)")
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="time from the first run on (by default one untimed run of each side comes first, "
        "at each number of processes)",
    )
    parser.add_argument(
        "--shipped",
        action="store_true",
        help="the daemons' side is manage.py runconsumer all as shipped, every step's work a "
        "no-op (MRT_NOOP_STEPS), against the same raw probe",
    )
    parser.add_argument(
        "--real",
        action="store_true",
        help="with --shipped: every step does its own work, on files of --file-bytes from "
        "loopback depositors, against stand-ins of storage, inventory and EZID",
    )
    parser.add_argument("--file-bytes", type=int, default=4096, help="each payload's size")
    parser.add_argument(
        "--depositors",
        type=int,
        default=None,
        help="with --shipped (no-op steps): the payloads on this many depositor servers, each "
        "50-job batch's on one (default: 250 servers, one job each in turn); a server's downloads "
        "at once stay capped at MRT_DOWNLOADS_PER_HOST",
    )
    parser.add_argument(
        "--recorder",
        choices=("off", "on", "both"),
        default="off",
        help="step history: off (the raw comparison below), on, or both: the daemons' rate "
        "without and with every step recorded in the database, side by side",
    )
    args = parser.parse_args(argv)
    if args.batch < 0:
        parser.error("--batch must be 0 (MRT_CLAIM_BATCH) or more")
    if args.real and not args.shipped:
        parser.error("--real is a way to run the shipped command: give --shipped too")
    if args.depositors is not None and (
        not args.shipped or args.real or not 1 <= args.depositors <= 250
    ):
        parser.error("--depositors is 1 to 250, with --shipped and without --real")
    if args.recorder != "off":
        return compare_recorder(args)
    setup_django()
    from django.conf import settings

    args.batch = args.batch or settings.MRT_CLAIM_BATCH
    keep = not args.no_keep
    work = (
        f"every step doing its own work (each job a {args.file_bytes}-byte file from one of "
        f"{RealServices.PAYLOAD_SERVERS} loopback depositors; storage, inventory, EZID and the "
        "callback receiver stand-ins in the benchmark's process, on the same cores)"
        if args.real
        else "every step's work a no-op: MRT_NOOP_STEPS"
        + (
            f", each 50-job batch's payloads on one of {args.depositors} depositor servers"
            if args.depositors
            else ", the payloads on 250 depositor servers in turn"
        )
    )
    shipped = (
        f"manage.py runconsumer all as shipped (default settings, {work}; window from "
        f"{WARM_UP:.0%} to {SHIPPED_UNTIL:.0%} of the transitions)"
    )
    lines = [
        f"Daemon throughput ({args.jobs} jobs, each Estimating -> ... -> Completed, 7 "
        "transitions; "
        + (
            "the daemons as runconsumer all runs them, below"
            if args.shipped
            else f"one loop per step in each process, "
            f"{'each in its own thread' if args.thread_each else 'all in one thread'}, "
            f"{args.batch} jobs a claim and a move, "
            f"locks {'kept between steps' if keep else 'released with every move'}, the ingest "
            "hold read with every claim"
        )
        + ") against a raw probe on the same jobs: the same processes, "
        f"each sending the contract's requests for every transition (claim, read, move), "
        f"{args.batch} jobs a request, as many batches under way as the daemons may have. "
        f"Every process is started and connected before the window opens; only the window "
        f"counts (from {WARM_UP:.0%} of the transitions made until the first state is empty; "
        f"median of {args.rounds} rounds, each side first in every other round"
        f"{'' if args.no_warm_up else WARMED}). "
        "'req/t': ZooKeeper requests per transition, from the server's mntr count; 'us/t': "
        "the client processes' CPU time per transition; 'busy': the whole machine's CPU use "
        "meanwhile; 'server fsync': the largest share of a window, daemons / probe, the server "
        "spent writing its log to disk (mntr's zk_sum_fsynctime): a slow run with an idle "
        "machine and a large share here was held by the disk, not by the clients.",
        *([f"Daemons' side: {shipped}."] if args.shipped else []),
        f"Load (uptime) at the start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
        f"{os.getloadavg()[2]:.2f}.",
        f"  {'processes':>9}{'daemons':>14}{'req/t':>7}{'us/t':>6}{'busy':>6}"
        f"{'raw probe':>13}{'req/t':>7}{'us/t':>6}{'busy':>6}{'share':>8}",
    ]
    with contextlib.ExitStack() as stack:
        hosts = stack.enter_context(throwaway_zookeeper(args.hosts))
        real = RealServices(args.file_bytes) if args.real else None
        if real is not None:
            stack.callback(real.stop)

        def daemons(processes: int) -> Window:
            if args.shipped:
                return run_shipped(
                    hosts,
                    jobs=args.jobs,
                    processes=processes,
                    seconds=args.seconds,
                    real=real,
                    depositors=args.depositors,
                ).window
            return run_daemons(
                hosts,
                jobs=args.jobs,
                processes=processes,
                seconds=args.seconds,
                batch=args.batch,
                keep=keep,
                shared=not args.thread_each,
            ).window

        def raw(processes: int) -> Window:
            return measure_raw(
                hosts,
                jobs=args.jobs,
                processes=processes,
                batch=args.batch,
                seconds=args.seconds,
                until=SHIPPED_UNTIL if args.shipped else None,
            ).window

        round_number = 0
        for processes in args.processes:
            if not args.no_warm_up:
                # A fresh server runs its request paths interpreted until the JVM has compiled
                # them: the first runs on it cost the server about twice the CPU a transition
                # of the later ones. And the first run with more processes than any before it
                # was slow again: the daemons' first run at two or four processes made 30-40%
                # fewer transitions a second than the next ones in each of the four sequences
                # measured (2026-11-28). Whichever side ran first paid for that; neither does.
                daemons(processes)
                raw(processes)
            daemon_runs, raw_runs = [], []
            for _ in range(args.rounds):
                # Each side goes first in every other round.
                if round_number % 2 == 0:
                    daemon_runs.append(daemons(processes))
                    raw_runs.append(raw(processes))
                else:
                    raw_runs.append(raw(processes))
                    daemon_runs.append(daemons(processes))
                round_number += 1
            line = _table_line(processes, daemon_runs, raw_runs)
            line += f" load {os.getloadavg()[0]:.2f}"
            print(line, flush=True)
            lines.append(line)
    print()
    for line in lines:
        print(line)
    print(f"Machine: {machine()}")
    return lines


def _table_line(processes: int, daemons: list[Window], raw: list[Window]) -> str:
    def figures(windows: list[Window]) -> str:
        rate = median([w.per_second for w in windows])
        requests = [r for w in windows if (r := w.requests_per_transition) is not None]
        cpu = [(w.cpu_per_transition, w.cpu.busy) for w in windows]
        return (
            f"{rate:>9.0f} t/s"
            f"{_figure(median(requests) if requests else None, '>7.2f')}"
            f"{_cpu_figures(cpu)}"
        )

    share = median([w.per_second for w in daemons]) / median([w.per_second for w in raw])
    verdict = "ok" if share >= TARGET_SHARE else f"under {TARGET_SHARE:.0%}"
    window = median([w.seconds for w in daemons + raw])
    return (
        f"  {processes:>9}{figures(daemons):>14}{figures(raw):>13}{share:>8.0%}  {verdict}"
        f" (windows of {window:.1f}s; server fsync {_fsync_figure(daemons)}"
        f" / {_fsync_figure(raw)})"
    )


def _fsync_figure(windows: list[Window]) -> str:
    """The largest share of a window the server spent in fsync, over these windows."""
    shares = [f for w in windows if (f := w.fsync_share) is not None]
    return f"{max(shares):.0%}" if shares else "?"


RECORDER_BUDGET = 0.05  # the step history may cost the daemons at most this share


def compare_recorder(args: argparse.Namespace) -> list[str]:
    """The daemons' throughput without and with the step history, alternating rounds, on a
    throwaway SQLite database (the children read MRT_DATABASE_PATH when they start)."""
    import subprocess
    import tempfile

    tmp = tempfile.mkdtemp(prefix="mrt-bench-history-")
    db = Path(tmp) / "history.sqlite3"
    os.environ["MRT_DATABASE_PATH"] = str(db)
    os.environ.setdefault("MRT_VAR_DIR", tmp)
    root = Path(__file__).resolve().parent.parent
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=root,
        env=os.environ.copy(),
        check=True,
        capture_output=True,
    )
    setup_django()
    modes = [False, True] if args.recorder == "both" else [True]
    lines = [
        f"Step history's cost: daemon throughput ({args.jobs} jobs, 7 transitions each) without "
        "and with every step recorded in the database (SQLite, batched by a writer thread), "
        f"median of {args.rounds} alternating rounds.",
        f"  {'processes':>9}{'without':>14}{'with history':>16}{'cost':>8}{'records':>10}",
    ]
    with throwaway_zookeeper(args.hosts) as hosts:
        for processes in args.processes:
            rates: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.rounds):
                for record in modes:
                    run = run_daemons(hosts, jobs=args.jobs, processes=processes, record=record)
                    rates[record].append(run.per_second)
            without = median(rates[False]) if rates[False] else 0.0
            with_history = median(rates[True])
            cost = 1 - with_history / without if without else 0.0
            records = _records(db)
            verdict = (
                ""
                if not without
                else "ok"
                if cost < RECORDER_BUDGET
                else f"over {RECORDER_BUDGET:.0%}"
            )
            line = (
                f"  {processes:>9}{without:>10.0f} t/s{with_history:>12.0f} t/s"
                f"{cost:>8.1%}{records:>10}  {verdict}"
            )
            print(line, flush=True)
            lines.append(line)
    per_step, hooks, write = recorder_work_per_step()
    rate = with_history / max(1, args.processes[-1])
    lines.append(
        f"Recorder work per step, measured alone (steady, unlike the rates above on a shared "
        f"machine): {per_step * 1e6:.1f} us ({hooks * 1e6:.1f} us in the daemon thread, "
        f"{write * 1e6:.1f} us in the writer); at {rate:.0f} transitions/s per process that is "
        f"{per_step * rate:.1%} of a process's time."
    )
    print()
    for line in lines:
        print(line)
    print(f"Machine: {machine()}")
    return lines


def recorder_work_per_step(n: int = 20_000) -> tuple[float, float, float]:
    """Seconds the step history costs per step, in this process: the hooks around a step
    (registration's bookkeeping, the record appended) and the writer's share of a flush."""
    from types import SimpleNamespace

    from queues.daemons.base import ItemResult
    from queues.daemons.registration import ProcessObserver
    from queues.daemons.stephistory import StepRecorder

    daemon = SimpleNamespace(name="bench", step="bench", item_id=lambda item: item.jid)
    item = SimpleNamespace(
        jid="jid0000000001", state="Estimating", status=SimpleNamespace(mtime=None)
    )
    observer = ProcessObserver(None, [daemon], record=False, host="bench", pid=1)
    observer.recorder = StepRecorder(consumer="bench-1", host="bench")
    result = ItemResult("jid0000000001", "bench", "ok", 0.001, "-> Provisioning")
    started = time.perf_counter()
    for _ in range(n):
        observer.end(observer.begin(daemon, item), result)
    hooks = time.perf_counter() - started
    started = time.perf_counter()
    observer.recorder.flush()
    write = time.perf_counter() - started
    return (hooks + write) / n, hooks / n, write / n


def _records(db: Path) -> int:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT COUNT(*) FROM queues_steprecord").fetchone()[0]


if __name__ == "__main__":
    main()
