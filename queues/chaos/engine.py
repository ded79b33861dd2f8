"""One chaos run, from the scratch folder to the verdict.

The run serves the depositors' files on loopback, submits hostile depositors and the good
batches (in waves, one a strike: ``schedule``), starts ``--consumers`` ``runconsumer all``
processes (and a daphne web worker when a fault concerns the web), kills random consumers with
SIGKILL until every good batch has finished, strikes the selected faults one after another, each
with its wave's jobs in flight, and when every batch has finished (or no job has moved and no
fault acted for ``stall`` seconds: stalled, a violation; there is no limit of time unless
``limit`` is given) judges, consumers still running: every lock gone within ``lock_grace`` of
the last heal, nothing stuck; then, consumers stopped by SIGTERM within ``stop_timeout``: the
queue consistent and complete, one storage version per object, no good job Failed, none by the
infrastructure, every hostile depositor Failed for its own reason; last, the servers' own
transaction logs (``txnlog``): no lock deleted by a session that did not create it, none taken
over a standing one, no consumer write to a job whose lock it did not hold.

ZooKeeper away for good (an ensemble that elects no leader) does not hold the run: the monitor's
and the judge's reads fail once the connection has been down a second (``FailWhileDown``), the
run fails as stalled, and when ZooKeeper does not answer within ``stall`` of the run's end either,
the verdict says that the queue was not judged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from queues.chaos import depositors, judge
from queues.chaos.faults import (
    BlackHole,
    Consumer,
    DatabaseOutage,
    DiskFull,
    Fault,
    FaultLog,
    Flap,
    LeaderKill,
    LeaderStorm,
    Pause,
    RedisStop,
    Stage,
    Strike,
    ZooKeeperRestart,
    schedule,
)
from queues.chaos.flapping import Flapping
from queues.chaos.infra import Postgres, Redis, WebWorker, WorkDisk
from queues.chaos.servers import (
    BlackHoleProxy,
    DepositorRoutes,
    Sentinel,
    depositor_server,
    files_server,
    sentinel_server,
)
from queues.chaos.standins import EzidStandIn, InventoryStandIn, StorageStandIn
from queues.services.zkserver import LocalEnsemble, LocalZooKeeper, free_port
from queues.zk.client import FailWhileDown, connect
from queues.zk.consumers import consumer_name
from queues.zk.errors import is_connection_error

# The consumers' fetch policy in a chaos run: the good server's address only, and slow
# depositors found out within seconds rather than minutes.
FETCH_ENV = {
    "MRT_FETCH_ALLOW": "127.0.0.1/32",
    "MRT_DOWNLOAD_MIN_RATE": "1024",
    "MRT_DOWNLOAD_RATE_WINDOW": "5",
    "MRT_DOWNLOAD_DEADLINE": "20",
    # Outages of the services outside are tried again on a run's scale (seconds, not the
    # production policies' minutes): a depositor that refuses every connection fails after
    # three quick tries, for its own reason, as the judge expects.
    "MRT_RETRY_DEPOSITOR": "attempts=3 first=1s most=2s",
    "MRT_RETRY_STORAGE": "attempts=12 first=1s most=5s",
    "MRT_RETRY_INVENTORY": "attempts=12 first=1s most=5s",
    "MRT_RETRY_EZID": "attempts=12 first=1s most=5s",
    "MRT_RETRY_CALLBACK": "attempts=12 first=1s most=5s",
}
# With flapping services (``--flaps``), every policy outlasts a spell several times over: the
# shortest way through 16 tries (each wait drawn between half and all of 1 s doubling up to 8 s)
# waits 51.5 s, the longest 103 s, against a spell of 20 s by default; a spell's 503s and resets
# also open the storage node's breaker, whose held jobs spend no tries meanwhile. A depositor's
# server is given 2 minutes from its first failure as well: a job's last failure in a spell comes
# at most a spell and one request after its first, and the hostile depositor whose port refuses
# every connection fails within minutes, not after 16 tries spaced out by a loaded machine.
FLAP_RETRY_ENV = {
    f"MRT_RETRY_{service}": "attempts=16 first=1s most=8s"
    for service in ("STORAGE", "INVENTORY", "EZID", "CALLBACK")
}
FLAP_RETRY_ENV["MRT_RETRY_DEPOSITOR"] = "attempts=16 first=1s most=8s within=2m"
# The owner the run's profile names when Merritt's inventory (its stand-in) keeps local ids.
CHAOS_OWNER = "ark:/99999/j2chaos"
EZID_USER, EZID_PASSWORD = "chaos", "chaos-password"
# Seconds before a consumer that exited by itself is started again.
RESTART_DELAY = 2.0
# How long a run that ended waits for the fault being caused to heal before its verdict: a
# leader kill's election and restart take up to two minutes when the ensemble is slow.
FAULT_END_WAIT = 180.0
# Tries of a wave's batch submission, a second apart, while the monitor's connection to
# ZooKeeper comes back after a fault.
SUBMIT_TRIES = 60
# Settings of the operator's shell that would point a run at real services or folders.
CLEARED_ENV = (
    "MRT_STORAGE_URL", "MRT_INVENTORY_URL", "MRT_EZID_URL", "EMAIL_HOST", "MRT_DATABASE_PATH",
    "MRT_WORK_DIR", "MRT_STORAGE_ROOT", "MRT_FILE_ROOTS", "MRT_DOWNLOADS_DIR", "MRT_WORK_URL",
    "DATABASE_URL", "REDIS_URL", "MRT_CLAIM_BATCH", "MRT_KEEP_LOCKS", "MRT_UNKNOWN_SIZE_BYTES",
    "MRT_BATCH_LONG_STEPS",
)  # fmt: skip


@dataclass
class Options:
    jobs: int = 1000
    batches: int = 0  # 0: one per 100 jobs, and at least one a strike
    consumers: int = 3
    kills: bool = True
    kill_every: tuple[float, float] = (2.0, 6.0)
    session_timeout: float = 4.0
    zk_restarts: int = 2
    zk_down: float | None = None  # None: half the session timeout
    ensemble: bool = False
    leader_kills: int = 0
    leader_down: float = 2.0
    leader_storms: int = 0
    storm_kills: int = 9
    storm_every: float = 9.0
    pauses: int = 0
    pause_seconds: float | None = None  # None: twice the session timeout and 2 s
    black_holes: int = 0
    black_hole_seconds: float | None = None  # as pauses
    database: str = "sqlite"  # or "postgres"
    db_outages: int = 0
    db_outage_seconds: float = 10.0
    web: bool = False
    redis_stops: int = 0
    redis_down: float = 10.0
    disk_fills: int = 0
    disk_full_seconds: float = 7.0
    work_disk_mb: int = 64
    flaps: int = 0
    flap_seconds: float = 20.0
    loop: str = "batched"  # the default's batched steps, or "one": every step one job a time
    # MRT_CLAIM_BATCH of the consumers: this installation's (the shipped default) unless given.
    claim_batch: int = field(default_factory=lambda: settings.MRT_CLAIM_BATCH)
    storage: str = "http"  # or "local"
    storage_add_seconds: float = 0.5
    hostile: bool = True
    lock_grace: float = 60.0
    stall: float = 180.0
    stop_timeout: float = 60.0
    limit: float | None = None  # None: no limit but the stall
    seed: int | None = None
    keep: bool = False
    zk_hosts: str = ""  # an existing ensemble (a chroot of it is used); empty: our own
    zk_port: int = 0
    files_port: int = 0
    storage_port: int = 0
    work_port: int = 0
    web_port: int = 0
    redis_port: int = 0
    pg_port: int = 0
    proxy_port: int = 0

    def strikes(self) -> list[Fault]:
        """Every strike asked for, the kinds in the order they take turns in (``schedule``).
        Flaps come first: theirs is the one verdict that needs requests made while they strike
        (a spell that spoils no answer proved nothing), and with every fault asked of a few
        hundred jobs, the last kinds' turns come after the last job has finished."""
        outage = self.session_timeout * 2 + 2
        found: list[Fault] = [Flap(self.flap_seconds)] * self.flaps
        found += [ZooKeeperRestart(self.zk_down or self.session_timeout / 2)] * self.zk_restarts
        found += [LeaderKill(self.leader_down)] * self.leader_kills
        found += [
            LeaderStorm(self.leader_down, kills=self.storm_kills, every=self.storm_every)
        ] * self.leader_storms
        found += [
            Pause(self.pause_seconds or outage, after_add=n % 2 == 0) for n in range(self.pauses)
        ]
        found += [BlackHole(self.black_hole_seconds or outage)] * self.black_holes
        found += [DatabaseOutage(self.db_outage_seconds)] * self.db_outages
        found += [RedisStop(self.redis_down)] * self.redis_stops
        found += [DiskFull(self.disk_full_seconds)] * self.disk_fills
        return found


class ChaosError(RuntimeError):
    """The run cannot be made as asked (a missing program, a fault that needs root)."""


@dataclass
class Run:
    options: Options
    say: Callable[[str], None]
    manage: Path
    scratch: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="mrt-chaos-")))
    verdict: judge.Verdict = field(default_factory=judge.Verdict)
    kills: int = 0
    last_kill: float = 0.0
    hostile_batches: set[str] = field(default_factory=set)
    summary: str = ""
    throughput: str = ""
    _acting: str = ""  # the fault being caused, if any
    in_flight: list[int] = field(default_factory=list)  # the jobs in flight at each strike
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _expected_lock: threading.Lock = field(default_factory=threading.Lock)

    def execute(self) -> judge.Verdict:
        opts = self.options
        seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(1 << 30)
        self.rng = random.Random(seed)
        strikes = opts.strikes()
        batches = min(opts.batches or max(1, round(opts.jobs / 100), len(strikes)), opts.jobs)
        # The monitor's own reconnects during ZooKeeper faults are expected, not news.
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
        self.say(
            f"chaos run: {opts.jobs} jobs in {batches} batches, {opts.consumers} consumers, "
            f"{opts.loop} loop, {opts.storage} storage, {opts.database}, seed {seed}, "
            f"scratch {self.scratch}"
        )
        try:
            with self._stack:
                self._prepare()
                self._run(batches, strikes)
        finally:
            if opts.keep or self.verdict.violations:
                self.say(f"scratch folder kept, with each consumer's log: {self.scratch}")
            else:
                shutil.rmtree(self.scratch, ignore_errors=True)
        return self.verdict

    # Setting up -----------------------------------------------------------------------------

    def _prepare(self) -> None:
        opts = self.options
        self.log = FaultLog(self.say)
        self.var = self.scratch / "var"
        self.var.mkdir()
        # The consumers' profiles: this shell's, the run's own profile given a callback once
        # the depositors' server (its receiver) is up.
        self.profiles = self.scratch / "profiles"
        shutil.copytree(settings.MRT_PROFILES_DIR, self.profiles)
        self.stage = Stage(
            consumers=[],
            rng=self.rng,
            log=self.log,
            session_timeout=opts.session_timeout,
            kept_logs=self.scratch / "kept-txn-logs",
        )
        self.hosts = self._zookeeper()
        env = self._base_env()
        if opts.database == "postgres":
            pg = Postgres.create(port=opts.pg_port)
            self._stack.callback(pg.remove)
            pg.start()
            self._stack.callback(pg.stop)
            self.stage.postgres = pg
            env["DATABASE_URL"] = pg.url
        else:
            self.stage.sqlite_path = self.var / "console.sqlite3"
        if opts.disk_fills:
            disk = WorkDisk(self.scratch / "work-disk", opts.work_disk_mb)
            try:
                disk.mount()
            except (OSError, subprocess.CalledProcessError, RuntimeError) as exc:
                raise ChaosError(f"cannot make a small working disk: {exc}") from None
            self._stack.callback(disk.unmount)
            self.stage.disk = disk
            env["MRT_WORK_DIR"] = str(disk.mount_point)
            # A file whose size no server tells is reserved as 1 GiB by default, more than
            # the small disk holds: provisioning would hold such jobs for ever.
            env["MRT_UNKNOWN_SIZE_BYTES"] = str(1 << 20)
        work_dir = Path(env.get("MRT_WORK_DIR") or self.var / "work")
        work_dir.mkdir(parents=True, exist_ok=True)
        if opts.flaps:
            if opts.storage != "http":
                raise ChaosError("flapping services need the storage stand-in (--storage http)")
            flapping = Flapping(self.rng.randrange(1 << 30))
            self.stage.flapping = flapping
            # Merritt's inventory and EZID as stand-ins, which flap (without flaps the run
            # keeps the local inventory and minter).
            inventory = InventoryStandIn(flapping=flapping, record=False).start()
            self._stack.callback(inventory.stop)
            ezid = EzidStandIn(EZID_USER, EZID_PASSWORD, flapping=flapping, record=False).start()
            self._stack.callback(ezid.stop)
            env.update(FLAP_RETRY_ENV)
            env["MRT_INVENTORY_URL"] = inventory.url
            env["MRT_EZID_URL"] = ezid.url
            env["MRT_EZID_USER"], env["MRT_EZID_PASSWORD"] = EZID_USER, EZID_PASSWORD
            depositors.own_profile(self.profiles, CHAOS_OWNER)
            self.say(
                f"flapping: storage, inventory ({inventory.url}), EZID ({ezid.url}), the "
                "depositors' files and the callback receiver"
            )
        if opts.storage == "http":
            storage = StorageStandIn(
                None,  # every storage node the profiles name
                port=opts.storage_port,
                add_seconds=opts.storage_add_seconds,
                flapping=self.stage.flapping,
                record=False,
            ).start()
            self._stack.callback(storage.stop)
            self.storage: StorageStandIn | None = storage
            self.stage.storage = storage
            work = files_server(str(work_dir), port=opts.work_port)
            self._stack.callback(work.stop)
            env["MRT_STORAGE_URL"] = storage.url
            env["MRT_WORK_URL"] = work.url
        else:
            self.storage = None
        if opts.loop == "batched":
            env["MRT_CLAIM_BATCH"] = str(opts.claim_batch)
            env["MRT_KEEP_LOCKS"] = "1"
            env["MRT_BATCH_LONG_STEPS"] = "1"
        else:
            env["MRT_CLAIM_BATCH"] = "1"
            env["MRT_KEEP_LOCKS"] = "0"
            env["MRT_BATCH_LONG_STEPS"] = "0"
        self.env = env
        subprocess.run(
            [sys.executable, str(self.manage), "migrate", "--noinput", "-v", "0"],
            env=env,
            check=True,
        )
        self.web: WebWorker | None = None
        if opts.web or opts.redis_stops:
            web_env = dict(env)
            if opts.redis_stops:
                redis = Redis(self.scratch / "redis", port=opts.redis_port)
                redis.start()
                self._stack.callback(redis.stop)
                self.stage.redis = redis
                web_env["REDIS_URL"] = redis.url
            self.web = WebWorker(self.manage, web_env, self.scratch / "web.log", port=opts.web_port)
            self.web.start()
            self._stack.callback(self.web.stop)
            self.say(f"web worker at {self.web.url}" + (" with Redis" if opts.redis_stops else ""))

    def _zookeeper(self) -> str:
        opts = self.options
        if opts.zk_hosts:
            hosts = _chroot(opts.zk_hosts)
            if opts.zk_restarts or opts.leader_kills or opts.leader_storms:
                self.say(f"using {hosts}: ZooKeeper restarts and leader kills skipped")
                opts.zk_restarts = opts.leader_kills = opts.leader_storms = 0
            return hosts
        if opts.ensemble:
            ensemble = LocalEnsemble(self.scratch / "ensemble")
            ensemble.start()
            self._stack.callback(ensemble.stop)
            ensemble.wait_for_leader()
            self.stage.ensemble = ensemble
            return ensemble.hosts
        if opts.leader_kills or opts.leader_storms:
            raise ChaosError("leader kills and storms need the ensemble (--ensemble)")
        server = LocalZooKeeper(self.scratch / "zookeeper", opts.zk_port or free_port())
        server.start()
        self._stack.callback(server.stop)
        self.stage.zookeeper = server
        return server.hosts

    def _base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
        env.update(
            {
                "ZK_HOSTS": self.hosts,
                "MRT_VAR_DIR": str(self.var),
                "MRT_PROFILES_DIR": str(self.profiles),
                # Short sessions: a killed consumer's locks go within seconds, not minutes.
                "ZK_TIMEOUT": f"{self.options.session_timeout:g}",
                "PYTHONUNBUFFERED": "1",
                "LOG_LEVEL": "WARNING",
                **FETCH_ENV,
            }
        )
        return env

    def _proxied_hosts(self) -> str:
        """Consumer 0's ZK_HOSTS: each server behind a black-hole proxy of its own."""
        servers, slash, chroot = self.hosts.partition("/")
        proxied = []
        for number, server in enumerate(servers.split(",")):
            host, _colon, port = server.rpartition(":")
            wanted = self.options.proxy_port + number if self.options.proxy_port else 0
            proxy = BlackHoleProxy((host, int(port)), port=wanted)
            self._stack.callback(proxy.close)
            self.stage.proxies.append(proxy)
            proxied.append(f"127.0.0.1:{proxy.port}")
        return ",".join(proxied) + slash + chroot

    # The run --------------------------------------------------------------------------------

    def _run(self, batches: int, strikes: list[Fault]) -> None:
        opts = self.options
        payload = self.scratch / "payload"
        payload.mkdir()
        files = depositor_server(str(payload), port=opts.files_port, flapping=self.stage.flapping)
        self._stack.callback(files.stop)
        depositors.call_back_to(self.profiles, f"{files.url}/callback")
        self._stack.callback(DepositorRoutes.stop.set)
        sentinel = sentinel_server()
        self._stack.callback(sentinel.stop)
        zk = connect(self.hosts, timeout=30)
        self._stack.callback(lambda: (zk.stop(), zk.close()))
        # The monitor and the judge go on while ZooKeeper is away: a read made then fails
        # instead of waiting (for ever, if the ensemble elects no leader), so the stall is seen.
        self._stack.callback(FailWhileDown(zk).stop)
        good = depositors.write_good(payload, files.url, jobs=opts.jobs, batches=batches)
        waves = _waves(good, min(len(good), len(strikes)) or 1)
        plan = schedule(strikes, len(waves))
        sizes = [sum(len(b.local_ids) for b in wave) for wave in waves]
        expected: dict[str, set[str]] = {}
        self._submit(zk, files.url, waves[0], expected)
        self.say(
            f"submitted {len(expected)} batches, {sizes[0]} manifest lines"
            + (f"; {len(waves) - 1} more waves of batches to come" if len(waves) > 1 else "")
        )
        total = sum(sizes)  # the good batches' jobs: what the run waits for and counts
        if opts.hostile:
            hostile = depositors.submit_hostile(
                zk, payload, files.url, sentinel.url, f"http://127.0.0.1:{free_port()}"
            )
            expected.update(hostile)
            self.hostile_batches = set(hostile)
            self.say(f"submitted {len(hostile)} hostile batches, {len(depositors.HOSTILE)} objects")
        for number in range(opts.consumers):
            env = dict(self.env)
            if number == 0 and opts.black_holes:
                env["ZK_HOSTS"] = self._proxied_hosts()
            consumer = Consumer(number, self.scratch / f"consumer-{number}.log", env)
            consumer.start(self.manage)
            self.stage.consumers.append(consumer)
        self._stack.callback(self._kill_all)

        self._chaos(
            zk,
            expected,
            total,
            plan,
            sizes,
            lambda wave: self._submit(zk, files.url, waves[wave], expected),
        )
        if not self._answering(zk):
            self.verdict.fail(
                f"ZooKeeper did not answer within {opts.stall:.0f}s of the run's end: "
                "the locks, the queue and the callbacks were not judged"
            )
        else:
            try:
                self._judge(zk, expected)
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                self.verdict.fail(f"ZooKeeper went away while the run was judged: {exc!r}")
        for consumer in self.stage.consumers:
            self._stop(consumer)  # each once: a consumer stopped already is left alone
        if self.web is not None:
            self._judge_web()
        judge.judge_txnlog(self._data_dirs(), self.stage.kept_logs, "", self.verdict, self.say)
        self.say(f"faults: {self.log.summary()}; {self.kills} SIGKILLs")
        busy = sum(1 for jobs in self.in_flight if jobs > 0)
        self.say(f"faults struck with jobs in flight: {busy} of {len(self.in_flight)}")
        self.summary = (
            f"{opts.jobs} jobs and {batches} batches consistent ({self.throughput}) "
            f"after {self.kills} SIGKILLs "
            f"and these faults: {self.log.summary()}"
            + (
                f"; {len(depositors.HOSTILE)} hostile depositors failed for their reasons"
                if opts.hostile
                else ""
            )
        )

    def _judge(self, zk: Any, expected: dict[str, set[str]]) -> None:
        """The queue as the run left it, with ZooKeeper answering: locks, stuck jobs, every
        batch and job, the stored versions, the failures, the callbacks (and the flaps and the
        hostile depositors when the run had them)."""
        opts = self.options
        # Every lock must go within the grace after the last fault, the consumers still
        # running: stopping them first would end the sessions of orphan locks and hide them.
        healed = max(self.log.last_heal, self.last_kill + opts.session_timeout)
        judge.wait_for_locks(zk, self.verdict, until=healed + opts.lock_grace, say=self.say)
        judge.judge_stuck(zk, self.verdict)
        for consumer in self.stage.consumers:
            self._stop(consumer)
        jobs = judge.judge_queue(zk, self.var, expected, self.verdict, self.say)
        if self.storage is not None:
            judge.judge_versions(self.storage.versions(), self.verdict, self.say)
        else:
            judge.judge_versions(judge.local_versions(self.var / "storage"), self.verdict, self.say)
        judge.judge_failures(jobs, self.verdict, self.say)
        judge.judge_callbacks(
            zk,
            jobs,
            DepositorRoutes.callbacks,
            self.verdict,
            self.say,
            DepositorRoutes.keys,
            DepositorRoutes.told,
        )
        if self.stage.flapping is not None:
            judge.judge_flaps(self.stage.flapping.figures(), self.verdict, self.say)
        if opts.hostile:
            judge.judge_hostile(jobs, self.var, Sentinel.hits, self.verdict, self.say)

    def _answering(self, zk: Any) -> bool:
        """Whether ZooKeeper answers ``zk`` within the run's ``stall`` (a fault just healed may
        take a moment to); False when it does not, and the run cannot be judged."""
        deadline = time.monotonic() + self.options.stall
        while not zk.connected:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.25)
        return True

    def _data_dirs(self) -> list[Path]:
        """The folders of the ZooKeeper servers this run started (none on an existing one)."""
        if self.stage.ensemble is not None:
            return [member.directory for member in self.stage.ensemble.members.values()]
        if self.stage.zookeeper is not None:
            return [self.stage.zookeeper.directory]
        return []

    def conclude(self) -> bool:
        """Print the notes and the verdict; True when the run is clean."""
        verdict = self.verdict
        for note in sorted(set(verdict.notes)):
            self.say(f"note: {note} ({verdict.notes.count(note)}x); restarted")
        if verdict.violations:
            self.say(f"VERDICT: FAILED, {len(verdict.violations)} violation(s):")
            distinct = Counter(verdict.violations)
            for line, count in list(distinct.items())[:60]:
                self.say(f"  - {line}" + (f" ({count}x)" if count > 1 else ""))
            if len(distinct) > 60:
                self.say(f"  ... and {len(distinct) - 60} more")
            return False
        self.say(f"VERDICT: OK: {self.summary}")
        return True

    def _submit(
        self,
        zk: Any,
        base_url: str,
        wave: list[depositors.GoodBatch],
        expected: dict[str, set[str]],
    ) -> None:
        """Submit a wave of good batches, each entered in ``expected`` once submitted (the
        monitor reads it from its own thread)."""
        for batch in wave:
            for attempt in range(SUBMIT_TRIES):
                try:
                    bid = depositors.submit_good(zk, base_url, batch)
                    break
                except Exception as exc:
                    # The monitor's connection, back from the fault just healed a moment later.
                    if not is_connection_error(exc) or attempt == SUBMIT_TRIES - 1:
                        raise
                    time.sleep(1.0)
            with self._expected_lock:
                expected[bid] = set(batch.local_ids)

    def _chaos(
        self,
        zk: Any,
        expected: dict[str, set[str]],
        total: int,
        plan: list[Strike],
        sizes: list[int],
        submit: Callable[[int], None],
    ) -> None:
        """Kill consumers and strike the faults until every batch has finished, each wave of
        batches submitted (``submit``) when its first strike comes; a fault being caused when
        the run ends is healed first, the ones not yet due are dropped. ``total``: the jobs of
        every wave; ``sizes``: each wave's."""
        finished = [0]
        ending = threading.Event()
        striking = threading.Thread(
            target=self._strike_all,
            args=(plan, total, sizes, submit, finished, ending),
            daemon=True,
        )
        striking.start()
        try:
            self._watch(zk, expected, total, finished, striking)
        finally:
            ending.set()
            # A fault heals before the verdict; one that cannot (a server that never serves
            # again) would hold the run without one: it is waited for a bounded time, and
            # then the run fails on it instead.
            striking.join(FAULT_END_WAIT)
            if striking.is_alive():
                acting = self._acting or "a fault"
                self.verdict.fail(
                    f"{acting} did not end within {FAULT_END_WAIT:.0f}s of the run's end: "
                    "not waited for further"
                )
                self.log.note(f"{acting} still acting at the verdict")

    def _watch(
        self,
        zk: Any,
        expected: dict[str, set[str]],
        total: int,
        finished: list[int],
        striking: threading.Thread,
    ) -> None:
        opts = self.options
        low, high = sorted(opts.kill_every)
        began = self.log.began
        next_kill = began + self.rng.uniform(low, high)
        next_report = began
        meter = Throughput(began)
        last_move, last_counts = began, None
        done_batches: set[str] = set()
        while True:
            now = time.monotonic()
            with self._expected_lock:
                submitted = dict(expected)
            progress = judge.progress(zk, submitted, self.hostile_batches)
            if progress is not None:
                finished[0], done_batches, line, counts = progress
                self.stage.counts = counts
                meter.add(now, finished[0])
                # Any job changing state is progress, not only a job finishing: on a loaded
                # machine a step may take long, and the run waits while work moves.
                if (counts, done_batches) != last_counts:
                    last_move, last_counts = now, (counts, done_batches)
                if now >= next_report:
                    rate = meter.line(total)
                    self.say(f"[{now - began:6.0f}s] {line} | {rate} | SIGKILLs {self.kills}")
                    next_report = now + 5
                if len(done_batches) == len(submitted) and not striking.is_alive():
                    self.throughput = meter.summary()
                    self.say(f"[{now - began:6.0f}s] every batch finished: {line}")
                    self.say(f"throughput: {meter.summary()}")
                    return
            # Stalled: no job moved, no fault acted, for the whole stretch. That, not the
            # clock, fails a run: a slow machine finishes later, a broken queue never does.
            quiet_since = max(last_move, self.log.last_event, self.log.last_heal)
            if now - quiet_since > opts.stall:
                self.throughput = meter.summary()
                self.verdict.fail(
                    f"stalled: no job moved and no fault acted for {opts.stall:.0f}s "
                    f"({finished[0]} of {total} good jobs finished; {meter.summary()}); "
                    "the run cannot finish"
                )
                return
            if opts.limit is not None and now - began > opts.limit:
                self.throughput = meter.summary()
                self.verdict.fail(
                    f"not finished within the --limit of {opts.limit:.0f}s, jobs still moving "
                    f"({finished[0]} of {total} good jobs finished; {meter.summary()})"
                )
                return
            if (
                opts.kills
                and now >= next_kill
                and not self._only_hostile_left(submitted, done_batches)
            ):
                self._kill_one(zk)
                next_kill = time.monotonic() + self.rng.uniform(low, high)
            for consumer in self.stage.consumers:
                if consumer.proc is None or consumer.proc.poll() in (None, -9):
                    continue
                if consumer.exited is None:
                    self._exited(consumer)
                    consumer.exited = now
                elif now - consumer.exited >= RESTART_DELAY:
                    # As a supervisor would: again after a pause, not in a tight loop.
                    consumer.exited = None
                    consumer.start(self.manage)
            time.sleep(0.25)

    def _strike_all(
        self,
        plan: list[Strike],
        total: int,
        sizes: list[int],
        submit: Callable[[int], None],
        finished: list[int],
        ending: threading.Event,
    ) -> None:
        wave, base = 0, 0  # the wave submitted last, and the jobs finished when it was
        for number, strike in enumerate(plan):
            fault = strike.fault
            if strike.wave != wave:
                # Its wave's turn: submitted now, however long the strikes before it took, so
                # that the strike finds those jobs in flight, not an idle queue.
                wave, base = strike.wave, finished[0]
                try:
                    submit(wave)
                except Exception as exc:
                    self.verdict.fail(f"wave {wave} of the good batches not submitted: {exc!r}")
                    return
            while finished[0] < base + strike.share * sizes[wave]:
                if ending.wait(0.2):
                    self.log.note(f"{len(plan) - number} fault(s) not caused: the run ended")
                    return
            # The good jobs submitted and not finished when it strikes.
            self.in_flight.append(total - sum(sizes[wave + 1 :]) - finished[0])
            self._acting = fault.name
            try:
                fault.strike(self.stage)
            except Exception as exc:  # a fault that could not be caused is the run's failure
                self.verdict.fail(f"the fault {fault.name} could not be caused: {exc}")
                self.log.healed(fault.name, f"{fault.name} abandoned: {exc}")
            self._acting = ""

    def _only_hostile_left(self, expected: dict[str, set[str]], finished: set[str]) -> bool:
        """Whether every good batch has finished, leaving only hostile depositors: SIGKILLs
        stop then. The slowest hostile verdict (the trickle's, a rate window after its first
        byte, and only once the killed holder's session has expired) takes longer than a
        consumer lives between kills every few seconds on a loaded machine, and the run would
        stall on its own kills, not on the queue."""
        return all(bid in finished for bid in expected if bid not in self.hostile_batches)

    def _kill_one(self, zk: Any) -> None:
        """SIGKILL a random consumer that has registered since it started (so has begun its
        work): on a loaded machine a consumer may take longer to start than the interval
        between kills, and killing it before it works would stall the run on our own clock."""
        try:
            working = set(judge.consumer_sessions(zk).values())
        except Exception:  # ZooKeeper away: no kill this time
            return
        host = socket.gethostname()
        with self.stage.lock:
            victims = [
                c
                for c in self.stage.consumers
                if c.alive()
                and c.number not in self.stage.busy
                and c.proc is not None
                and consumer_name(host, c.proc.pid) in working
            ]
            if not victims:
                return
            victim = self.rng.choice(victims)
            self.stage.busy.add(victim.number)
        try:
            assert victim.proc is not None
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait()
            self.kills += 1
            self.last_kill = time.monotonic()
            time.sleep(self.rng.uniform(0.2, 1.5))
            victim.start(self.manage)
        finally:
            with self.stage.lock:
                self.stage.busy.discard(victim.number)

    def _exited(self, consumer: Consumer) -> None:
        """A consumer that ended by itself: expected only when it started while ZooKeeper was
        away (runconsumer then exits with a clear error and its supervisor starts it again)."""
        tail = consumer.log.read_text(errors="replace").strip().splitlines()[-3:]
        if any("cannot reach ZooKeeper" in line for line in tail):
            self.verdict.notes.append(f"consumer {consumer.number} found ZooKeeper away at start")
            return
        code = consumer.proc.returncode if consumer.proc else "?"
        self.verdict.fail(
            f"consumer {consumer.number} exited by itself with status {code}: "
            + " / ".join(tail)[-400:]
        )

    def _stop(self, consumer: Consumer) -> None:
        """SIGTERM; a consumer still running after the stop timeout is a violation."""
        proc = consumer.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)  # a paused one must be able to hear the SIGTERM
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=self.options.stop_timeout)
        except subprocess.TimeoutExpired:
            self.verdict.fail(
                f"consumer {consumer.number} (pid {proc.pid}) ignored SIGTERM for "
                f"{self.options.stop_timeout:.0f}s"
            )
            proc.kill()
            proc.wait()

    def _kill_all(self) -> None:
        for consumer in self.stage.consumers:
            if consumer.alive() and consumer.proc is not None:
                consumer.proc.kill()
                consumer.proc.wait()

    def _judge_web(self) -> None:
        web = self.web
        assert web is not None
        for error, count in Counter(web.errors).most_common():
            self.verdict.fail(f"web: {error} ({count}x)")
        outages = self.log.counts.get(RedisStop.name, 0)
        tracebacks = web.tracebacks()
        if outages and tracebacks > outages:
            self.verdict.fail(
                f"web: {tracebacks} tracebacks logged over {outages} Redis outage(s); "
                "one line per outage expected"
            )
        answers = ", ".join(f"{k}: {n}" for k, n in sorted(web.answers.items()))
        self.say(f"web worker answers: {answers}; tracebacks logged: {tracebacks}")


class Throughput:
    """Jobs finished per second over the run, and over the last minute."""

    WINDOW = 60.0

    def __init__(self, began: float) -> None:
        self.began = began
        self.samples: list[tuple[float, int]] = [(began, 0)]
        self.last_gain = (began, 0)  # when the last job finished, and how many had by then

    def add(self, now: float, finished: int) -> None:
        if finished > self.last_gain[1]:
            self.last_gain = (now, finished)
        self.samples.append((now, finished))
        while len(self.samples) > 2 and self.samples[1][0] < now - self.WINDOW:
            self.samples.pop(0)

    def rate(self) -> float:
        now, finished = self.samples[-1]
        return finished / max(now - self.began, 1e-9)

    def recent(self) -> float:
        (then, before), (now, finished) = self.samples[0], self.samples[-1]
        return (finished - before) / max(now - then, 1e-9)

    def line(self, total: int) -> str:
        rate, recent = self.rate(), self.recent()
        _now, finished = self.samples[-1]
        left = total - finished
        eta = f", ~{left / recent:.0f}s to go" if recent > 0 and left > 0 else ""
        return f"{rate:.2f} jobs/s ({recent:.2f} over the last minute{eta})"

    def summary(self) -> str:
        """Up to the last job finished (a fault may go on after it)."""
        then, finished = self.last_gain
        took = max(then - self.began, 1e-9)
        return f"{finished} jobs in {took:.0f}s, {finished / took:.2f} jobs/s"


def _waves(good: list[depositors.GoodBatch], count: int) -> list[list[depositors.GoodBatch]]:
    """``good`` in ``count`` runs of batches in their order, as even as can be."""
    bounds = [len(good) * n // count for n in range(count + 1)]
    return [good[bounds[n] : bounds[n + 1]] for n in range(count)]


def _chroot(hosts: str) -> str:
    """A fresh chroot of ``hosts`` (itself maybe a chroot), so nothing else is touched."""
    chroot = f"/chaos-{uuid.uuid4().hex[:8]}"
    zk = connect(hosts)
    try:
        zk.ensure_path(chroot)
    finally:
        zk.stop()
        zk.close()
    return f"{hosts}{chroot}"
