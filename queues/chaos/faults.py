"""The faults of a chaos run, each caused for real and healed, one at a time, in the fault log.

The good batches are submitted in waves, one a strike where there are batches enough: a fault
strikes once its share of its wave's jobs has finished, with the rest of them in flight, and the
next one waits until it has healed. Consumer SIGKILLs are not here: they go on all through the
run, in the engine's loop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from random import Random

from queues.chaos import txnlog
from queues.chaos.flapping import FLAP_KINDS, FLAPPING_SERVICES, Flapping
from queues.chaos.infra import Postgres, Redis, WorkDisk
from queues.chaos.servers import BlackHoleProxy
from queues.chaos.standins import StorageStandIn
from queues.core.states import JobState
from queues.services.zkserver import LocalEnsemble, LocalZooKeeper


@dataclass
class Consumer:
    """One ``runconsumer all`` process, its environment and its log."""

    number: int
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    exited: float | None = None  # when it was found to have ended by itself (monotonic)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, manage: Path) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(manage), "runconsumer", "all", "--poll", "0.5"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.starts += 1


@dataclass
class FaultLog:
    """What was done when, printed as it happens; ``last_heal`` is when the last fault ended
    (monotonic), from which the judge gives locks and stuck jobs their grace."""

    say: Callable[[str], None]
    began: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)
    last_heal: float = field(default_factory=time.monotonic)
    # When a fault last did something (struck, went on, healed): a run is not stalled while
    # a fault is at work, however long it takes.
    last_event: float = field(default_factory=time.monotonic)
    counts: dict[str, int] = field(default_factory=dict)

    def note(self, text: str) -> None:
        self.last_event = time.monotonic()
        line = f"[{time.monotonic() - self.began:6.0f}s] fault: {text}"
        self.lines.append(line)
        self.say(line)

    def healed(self, name: str, text: str) -> None:
        self.last_heal = time.monotonic()
        self.counts[name] = self.counts.get(name, 0) + 1
        self.note(text)

    def summary(self) -> str:
        return ", ".join(f"{n} x {name}" for name, n in sorted(self.counts.items())) or "none"


@dataclass
class Stage:
    """What the faults act on."""

    consumers: list[Consumer]
    rng: Random
    log: FaultLog
    session_timeout: float
    zookeeper: LocalZooKeeper | None = None
    ensemble: LocalEnsemble | None = None
    proxies: list[BlackHoleProxy] = field(default_factory=list)
    postgres: Postgres | None = None
    sqlite_path: Path | None = None
    redis: Redis | None = None
    disk: WorkDisk | None = None
    storage: StorageStandIn | None = None
    # The services outside (storage, inventory, EZID, the depositors' server and callback
    # receiver) answer as this says; None: they are not made to flap.
    flapping: Flapping | None = None
    # Jobs per state at the last look.
    counts: dict[str, int] = field(default_factory=dict)
    # Consumers a fault is acting on, which the SIGKILLs leave alone meanwhile.
    busy: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Where each server's transaction logs are copied before it starts again (a server purges
    # old logs at start), for the judge of the logs; None: not copied.
    kept_logs: Path | None = None

    def keep_logs(self, *servers: LocalZooKeeper) -> None:
        """Copy the servers' transaction logs aside: call before starting them again."""
        if self.kept_logs is not None:
            for server in servers:
                txnlog.keep_logs(server.directory, self.kept_logs / server.directory.name)


class Fault:
    name = "fault"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def strike(self, stage: Stage) -> None:
        raise NotImplementedError


class ZooKeeperRestart(Fault):
    """Every server stopped, then started again on its data after ``seconds`` (shorter than the
    session timeout by default: sessions must survive it)."""

    name = "ZooKeeper restart"

    def strike(self, stage: Stage) -> None:
        servers = (
            list(stage.ensemble.members.values())
            if stage.ensemble is not None
            else [stage.zookeeper]
            if stage.zookeeper is not None
            else []
        )
        stage.log.note(f"ZooKeeper stopped ({len(servers)} server(s)) for {self.seconds:g}s")
        for server in servers:
            server.stop()
        time.sleep(self.seconds)
        stage.keep_logs(*[s for s in servers if s is not None])
        if stage.ensemble is not None:
            stage.ensemble.start()
            stage.ensemble.wait_for_leader()
        else:
            for server in servers:
                server.start()
        stage.log.healed(self.name, "ZooKeeper is back")


class LeaderKill(Fault):
    """The ensemble's leader killed (SIGKILL), started again ``seconds`` after a new leader
    was elected. When none is elected within ``elect_within`` seconds the fault could not be
    caused as meant: the killed server is started again at once all the same, so the run goes
    on to its verdict (which fails on the fault) instead of waiting without a quorum."""

    name = "leader kill"
    elect_within = 60.0

    def strike(self, stage: Stage) -> None:
        ensemble = stage.ensemble
        assert ensemble is not None, "leader kills need the ensemble"
        leader = ensemble.wait_for_leader(wait=self.elect_within)
        ensemble.kill(leader)
        stage.log.note(f"killed the ensemble's leader, server {leader}")
        try:
            elected = ensemble.wait_for_leader(wait=self.elect_within, other_than=leader)
            stage.log.note(f"server {elected} leads; server {leader} stays down {self.seconds:g}s")
            time.sleep(self.seconds)
        finally:
            stage.keep_logs(ensemble.members[leader])
            ensemble.start_one(leader)
        stage.log.healed(self.name, f"server {leader} rejoined")


class LeaderStorm(Fault):
    """The ensemble's leader killed (SIGKILL) ``kills`` times, one kill every ``every`` seconds:
    each killed server is started again ``seconds`` after a new leader was elected (or as soon
    as the next kill is due), so elections follow one another while the consumers work and
    the quorum holds between them."""

    name = "leader-kill storm"
    elect_within = LeaderKill.elect_within

    def __init__(self, seconds: float, *, kills: int = 9, every: float = 9.0) -> None:
        super().__init__(seconds)
        self.kills = kills
        self.every = every

    def strike(self, stage: Stage) -> None:
        ensemble = stage.ensemble
        assert ensemble is not None, "leader-kill storms need the ensemble"
        stage.log.note(f"leader-kill storm: {self.kills} kills, {self.every:g}s apart")
        for number in range(1, self.kills + 1):
            due = time.monotonic() + self.every
            leader = ensemble.wait_for_leader(wait=self.elect_within)
            ensemble.kill(leader)
            try:
                elected = ensemble.wait_for_leader(wait=self.elect_within, other_than=leader)
                stage.log.note(
                    f"storm kill {number}/{self.kills}: server {leader} killed, "
                    f"server {elected} leads"
                )
                time.sleep(max(0.0, min(self.seconds, due - time.monotonic())))
            finally:  # as a leader kill's: started again even when nobody was elected
                stage.keep_logs(ensemble.members[leader])
                ensemble.start_one(leader)
            time.sleep(max(0.0, due - time.monotonic()))
        stage.log.healed(self.name, f"leader-kill storm over: {self.kills} leaders killed")


def _pick(stage: Stage, candidates: list[Consumer]) -> Consumer | None:
    with stage.lock:
        free = [c for c in candidates if c.alive() and c.number not in stage.busy]
        if not free:
            return None
        chosen = stage.rng.choice(free)
        stage.busy.add(chosen.number)
        return chosen


def socket_owner(port: int, consumers: list[Consumer]) -> Consumer | None:
    """The consumer whose loopback TCP connection has the local ``port`` (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for consumer in consumers:
        if not consumer.alive() or consumer.proc is None:
            continue
        fds = Path(f"/proc/{consumer.proc.pid}/fd")
        with contextlib.suppress(OSError):
            for fd in fds.iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return consumer
    return None


def _sender_of_an_add(stage: Stage, wait: float) -> Consumer | None:
    """A consumer whose storage add has been made and not yet answered, within ``wait``."""
    if stage.storage is None or not stage.storage.add_seconds:
        return None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        with stage.storage.lock:
            ports = list(stage.storage.answering)
        for port in ports:
            consumer = socket_owner(port, stage.consumers)
            if consumer is not None:
                with stage.lock:
                    if consumer.number not in stage.busy:
                        stage.busy.add(consumer.number)
                        return consumer
        time.sleep(0.05)
    return None


class Pause(Fault):
    """A consumer stopped with SIGSTOP past its session timeout, then continued: every other
    time the one whose storage add has just been made and not yet answered (the version is
    there, the consumer does not know it), otherwise any."""

    name = "SIGSTOP pause"

    def __init__(self, seconds: float, *, after_add: bool) -> None:
        super().__init__(seconds)
        self.after_add = after_add

    def strike(self, stage: Stage) -> None:
        consumer = _sender_of_an_add(stage, 20.0) if self.after_add else None
        if consumer is not None:
            stage.log.note(
                f"consumer {consumer.number} caught between a storage add and its answer"
            )
        else:
            consumer = _pick(stage, stage.consumers)
        if consumer is None or consumer.proc is None:
            stage.log.note("no running consumer to pause")
            return
        pid = consumer.proc.pid
        try:
            consumer.proc.send_signal(signal.SIGSTOP)
            stage.log.note(f"consumer {consumer.number} (pid {pid}) paused for {self.seconds:g}s")
            time.sleep(self.seconds)
            with contextlib.suppress(ProcessLookupError):
                consumer.proc.send_signal(signal.SIGCONT)
        finally:
            with stage.lock:
                stage.busy.discard(consumer.number)
        stage.log.healed(self.name, f"consumer {consumer.number} (pid {pid}) continued")


class BlackHole(Fault):
    """The proxy in front of consumer 0's ZooKeeper connection stops forwarding, without
    closing anything, past the session timeout; then forwards again."""

    name = "black hole"

    def strike(self, stage: Stage) -> None:
        with stage.lock:
            stage.busy.add(0)
        try:
            for proxy in stage.proxies:
                proxy.hole()
            stage.log.note(f"consumer 0 cut off from ZooKeeper for {self.seconds:g}s")
            time.sleep(self.seconds)
            for proxy in stage.proxies:
                proxy.heal()
        finally:
            with stage.lock:
                stage.busy.discard(0)
        stage.log.healed(self.name, "consumer 0's connection forwards again")


class DatabaseOutage(Fault):
    """PostgreSQL stopped for ``seconds`` then started; or the SQLite file held by another
    writer (an open write transaction) for ``seconds``."""

    name = "database outage"

    def strike(self, stage: Stage) -> None:
        if stage.postgres is not None:
            stage.postgres.stop()
            stage.log.note(f"PostgreSQL stopped for {self.seconds:g}s")
            time.sleep(self.seconds)
            stage.postgres.start()
            stage.log.healed(self.name, "PostgreSQL is back")
            return
        assert stage.sqlite_path is not None
        writer = sqlite3.connect(stage.sqlite_path, timeout=60, isolation_level=None)
        try:
            writer.execute("BEGIN IMMEDIATE")
            stage.log.note(f"SQLite held by another writer for {self.seconds:g}s")
            time.sleep(self.seconds)
            writer.execute("ROLLBACK")
        finally:
            writer.close()
        stage.log.healed(self.name, "SQLite's writer let go")


class RedisStop(Fault):
    name = "Redis stop"

    def strike(self, stage: Stage) -> None:
        assert stage.redis is not None
        stage.redis.stop()
        stage.log.note(f"Redis stopped for {self.seconds:g}s")
        time.sleep(self.seconds)
        stage.redis.start()
        stage.log.healed(self.name, "Redis is back")


WRITING_STATES = (JobState.DOWNLOADING, JobState.PROCESSING)


class DiskFull(Fault):
    name = "full disk"

    def strike(self, stage: Stage) -> None:
        assert stage.disk is not None
        # The disk matters to the steps that write the working folders: strike while one of
        # them has work (waiting 30 s at most, then anyway).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
            stage.counts.get(state) for state in WRITING_STATES
        ):
            time.sleep(0.1)
        written = stage.disk.fill()
        stage.log.note(
            f"working disk filled ({written // (1 << 20)} MiB written) for {self.seconds:g}s"
        )
        try:
            time.sleep(self.seconds)
        finally:
            stage.disk.free()
        stage.log.healed(self.name, "working disk freed")


# Seconds of one phase of a flapping spell (one kind of bad answer).
FLAP_PHASE = 2.5


class Flap(Fault):
    """The services outside flap for ``seconds``, then answer well again: the spell is cut into
    phases of about ``FLAP_PHASE`` seconds, and each service (``flapping.FLAPPING_SERVICES``)
    answers every request of a phase with one kind of bad answer (``flapping.FLAP_KINDS``: 503,
    503 with Retry-After, connections reset, slow answers) or well; each service has an order
    of its own, drawn from the run's seed, with every kind and one good phase in it at least
    once. Orders of their own let a step that asks two services in turn (inventory, then EZID)
    meet the second one's bad answers while the first answers well."""

    name = "flapping services"

    def strike(self, stage: Stage) -> None:
        flapping = stage.flapping
        assert flapping is not None, "flaps need the flapping stand-ins"
        choices: list[str | None] = [*FLAP_KINDS, None]
        phases = max(len(choices), round(self.seconds / FLAP_PHASE))
        orders: dict[str, list[str | None]] = {}
        for service in FLAPPING_SERVICES:
            order: list[str | None] = []
            while len(order) < phases:
                drawn = list(choices)
                stage.rng.shuffle(drawn)
                order += drawn
            orders[service] = order[:phases]
        stage.log.note(
            f"services outside flap for {self.seconds:g}s, {phases} phases: "
            + "; ".join(
                f"{service} " + ", ".join(kind or "well" for kind in order)
                for service, order in orders.items()
            )
        )
        try:
            for phase in range(phases):
                flapping.set(None, **{s: order[phase] for s, order in orders.items()})
                time.sleep(self.seconds / phases)
        finally:
            flapping.set(None)
        stage.log.healed(self.name, "services outside answer well again")


@dataclass(frozen=True)
class Strike:
    """A fault's place in the run: the wave of good batches it strikes in, and the share of
    that wave's jobs that must have finished, counted from the wave's submission, before it
    strikes."""

    fault: Fault
    wave: int
    share: float


def schedule(strikes: list[Fault], waves: int = 1) -> list[Strike]:
    """The strikes in order, the kinds taking turns, spread evenly over ``waves`` waves of
    batches. A wave is submitted when its first strike's turn comes, so each strike finds its
    wave's jobs in flight however long the strikes before it took (strikes come one after the
    other, and each takes a while); within a wave, the strikes are spread over the first two
    thirds of its jobs."""
    kinds: dict[str, list[Fault]] = {}
    for fault in strikes:
        kinds.setdefault(fault.name, []).append(fault)
    ordered: list[Fault] = []
    while any(kinds.values()):
        for queue in kinds.values():
            if queue:
                ordered.append(queue.pop(0))
    placed: dict[int, list[Fault]] = {}
    for number, fault in enumerate(ordered):
        placed.setdefault(number * waves // len(ordered), []).append(fault)
    return [
        Strike(fault, wave, (i + 0.5) / len(faults) * 2 / 3)
        for wave, faults in placed.items()
        for i, fault in enumerate(faults)
    ]
