"""Hosting daemons in one process: threads, one shared ZooKeeper client, one stop event."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings

from queues.core import transient
from queues.core.states import JOB, JobState
from queues.daemons.base import Daemon, JobDaemon, Next, SessionGate, Step
from queues.daemons.completions import REPORTING_MOVES
from queues.daemons.pipeline import LockKeeper, run_together
from queues.daemons.registration import ProcessObserver
from queues.daemons.registry import daemon_classes
from queues.daemons.workfolder import FOLDER_REMOVALS
from queues.zk.client import add_state_listener, client, remove_state_listener
from queues.zk.records import Job

log = logging.getLogger("queues.daemons")

SETTLE_SECONDS = 10.0  # a stopping process waits at most this for its batch moves

# The job steps a process runs in the batched loop: those short next to a ZooKeeper round trip
# whatever the object's size, so the jobs of a claimed batch (and those kept for the step) never
# wait long behind one another while another consumer is free.
BATCHED_STEPS = frozenset(
    {
        "pending",  # a collection-hold read and the object's file list
        "estimating",  # a HEAD per file, all at once, each bounded by MRT_HTTP_TIMEOUT
        "provisioning",  # the disk's room, asked under each job's lock
        "notify",  # one callback at most, and the working folder removed
    }
)
# The steps as long as their object (they unpack and digest, store or record a whole object) run
# in the batched loop too, each in a thread of its own, their steps in threads of the loop's own
# (as many as the copies the process would run of them), a claim taking no more jobs than those
# threads can begin soon (``pipeline.LONG_WAIT``), and taking a job with its kept lock only when
# a thread would begin it as soon.
# Downloading's copies are MRT_DOWNLOAD_JOBS; a slot of the depositor server's cap is taken with
# each job it claims (``Downloading.accept``), so no claimed job waits for one.
LONG_STEPS = frozenset({"downloading", "processing", "storing", "recording"})


# The cyclic garbage collector's thresholds for a consumer process. At CPython's default (a young
# collection every 700 allocations) the batched loops spent 1.0-1.2 s of some 8 s of interpreter
# time in the collector moving 12,000 jobs through seven steps, and it found next to nothing:
# the steps make few reference cycles (3,800 objects in those 84,000 transitions;
# docs/benchmarks.md). Young collections every 50,000 allocations, the older generations as
# often relative to them as by default.
COLLECTOR_THRESHOLDS = (50_000, 10, 10)


def tune_collector() -> None:
    """Set the garbage collector for a long-running consumer process, once it has started
    (Django set up, every module imported): what exists then is collected once and left out of
    every later collection (``gc.freeze``), and collections come at COLLECTOR_THRESHOLDS."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


def job_loop(cls: type[JobDaemon], keeper: LockKeeper | None, copies: int) -> dict[str, Any]:
    """The loop a process runs the job daemon ``cls`` in, as its constructor's arguments: the
    batched loop (MRT_CLAIM_BATCH jobs a claim, locks kept with MRT_KEEP_LOCKS) for the steps of
    BATCHED_STEPS, the batched loop with ``copies`` step threads for those of LONG_STEPS (with
    MRT_BATCH_LONG_STEPS), the one-job loop for the others. MRT_CLAIM_BATCH=1 with
    MRT_KEEP_LOCKS and MRT_BATCH_LONG_STEPS off is the one-job loop for every step."""
    if cls.name in LONG_STEPS and settings.MRT_BATCH_LONG_STEPS:
        return {"batch": settings.MRT_CLAIM_BATCH, "keeper": keeper, "workers": copies}
    if cls.name not in BATCHED_STEPS:
        return {"batch": 1, "keeper": None}
    return {"batch": settings.MRT_CLAIM_BATCH, "keeper": keeper}


def instances(cls: type[Any], copies: int) -> int:
    """How many daemons of ``cls`` a process runs for ``copies`` copies: one for a long step in
    the batched loop (its copies are its step threads), ``copies`` otherwise."""
    if cls.name in LONG_STEPS and settings.MRT_BATCH_LONG_STEPS:
        return 1
    return copies


def daemon_threads(
    daemons: list[Daemon], stop: threading.Event, *, shared: bool
) -> list[threading.Thread]:
    """The threads that run ``daemons`` until ``stop`` is set (not started): a thread each, but
    with ``shared`` the batched loops (``JobDaemon.batched``) share one thread a copy (the
    first copy of each step in one, the second in another...; ``run_together``). Their steps
    are short: in one thread they take far less interpreter time than in a thread each."""
    threads = []
    groups: dict[int, list[JobDaemon]] = {}
    copies: dict[str, int] = {}
    for i, daemon in enumerate(daemons):
        copy = copies[daemon.name] = copies.get(daemon.name, -1) + 1
        # A long step's loop has a thread of its own: giving its jobs up (a drain, a lost
        # connection) waits for its steps under way, which would hold up the other loops.
        if shared and isinstance(daemon, JobDaemon) and daemon.batched() and not daemon.workers:
            groups.setdefault(copy, []).append(daemon)
            continue
        name = f"{daemon.name}-{i}"
        threads.append(
            threading.Thread(
                target=_stoppable, args=(stop, daemon.run, stop), name=name, daemon=True
            )
        )
    for copy, group in groups.items():
        loops = [daemon.pipeline() for daemon in group]
        name = f"batched-{copy}"
        threads.append(
            threading.Thread(
                target=_stoppable, args=(stop, run_together, loops, stop), name=name, daemon=True
            )
        )
    return threads


def _stoppable(stop: threading.Event, run: Callable[..., None], *args: Any) -> None:
    """``run(*args)`` with ``stop`` cutting short the back-offs of its thread and of the step
    threads it hands steps to (``transient.pause``)."""
    with transient.stopped_by(stop):
        run(*args)


def no_op(daemon: JobDaemon) -> None:
    """Make ``daemon``'s step move each job on to the next state without working on it
    (MRT_NOOP_STEPS, for benchmarks): its loop, claims and moves stay as shipped."""

    def move_on(item: Job) -> Step:
        return Next(JOB.successor(item.state) or JobState.COMPLETED)

    daemon.work = move_on  # type: ignore[method-assign]
    daemon.unprocessable = lambda item: None  # type: ignore[method-assign]


class Host:
    """The daemons of one ``runconsumer`` process.

    ``threads`` copies of each named daemon, each copy its own instance (a daemon keeps
    per-loop state) in its own thread, but for the batched loops (``daemon_threads``); all
    share the process's ZooKeeper client and its session gate.
    """

    def __init__(
        self, name: str, *, threads: int = 1, poll: float = 5.0, record: bool = True
    ) -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        classes = daemon_classes(name)
        self.zk = client()
        self.gate = SessionGate()
        # A job handed on to this process's next step keeps its lock (MRT_KEEP_LOCKS).
        keeper = LockKeeper() if settings.MRT_KEEP_LOCKS else None
        self.daemons: list[Daemon] = []
        for cls in classes:
            copies = max(threads, cls.default_copies())
            for _ in range(instances(cls, copies)):
                self.daemons.append(
                    cls(zk=self.zk, gate=self.gate, poll=poll, **job_loop(cls, keeper, copies))
                    if issubclass(cls, JobDaemon)
                    else cls(zk=self.zk, gate=self.gate, poll=poll)
                )
        if settings.MRT_NOOP_STEPS:
            log.warning("MRT_NOOP_STEPS: every job step moves its job on without working on it")
            for daemon in self.daemons:
                if isinstance(daemon, JobDaemon):
                    no_op(daemon)
        add_state_listener(self.gate.on_state)
        # Registration under /mrt-console/consumers, drain, step history (registration.py).
        self.observer = ProcessObserver(self.zk, self.daemons, record=record)
        for daemon in self.daemons:
            daemon.observer = self.observer

    def close(self) -> None:
        remove_state_listener(self.gate.on_state)
        self.observer.stop()

    def run_once(self) -> int:
        """One pass: each daemon (first copy) handles at most one item; 1 if any item failed."""
        self.observer.start(background=False)
        seen: set[str] = set()
        failed = False
        for daemon in self.daemons:
            if daemon.name in seen:
                continue
            seen.add(daemon.name)
            try:
                daemon.run_once()
            except Exception:
                log.exception("%s: error", daemon.name)
                failed = True
                continue
            if daemon.last is not None and daemon.last.is_error:
                failed = True
        REPORTING_MOVES.settle(timeout=SETTLE_SECONDS)
        FOLDER_REMOVALS.settle(timeout=SETTLE_SECONDS)
        return 1 if failed else 0

    def run(self, stop: threading.Event) -> None:
        """Run every daemon until ``stop`` is set; each finishes the item in hand first."""
        self.observer.start()
        threads = daemon_threads(self.daemons, stop, shared=settings.MRT_SHARED_LOOPS)
        for thread in threads:
            thread.start()
        # Waiting on the event (not join) keeps the main thread free for signal handlers.
        while not stop.wait(1.0):
            pass
        for thread in threads:
            thread.join()
        # The batches the loops' last moves completed, moved on before the process ends (a
        # batch left behind is moved by the reporting sweep).
        if not REPORTING_MOVES.settle(timeout=SETTLE_SECONDS):
            log.warning("stopping: batches still being moved to Reporting are left to the sweep")
        # The completed jobs' folders still being removed. One that takes longer is left on
        # the disk as far as it got when the process ends.
        if not FOLDER_REMOVALS.settle(timeout=SETTLE_SECONDS):
            log.warning(
                "stopping: completed jobs' working folders not all removed in %gs; what is "
                "left of them stays under MRT_WORK_DIR",
                SETTLE_SECONDS,
            )
