"""``manage.py chaosrun --jobs 1000``: the queue under faults, then a consistency verdict.

Serves ``--jobs`` small files and one single-file batch manifest per batch over a loopback HTTP
server, submits the batches, and runs ``--consumers`` ``manage.py runconsumer all`` processes
while killing random ones with SIGKILL (and starting a replacement), and restarting ZooKeeper
itself ``--zk-restarts`` times (stop, then start on the same data folder). When every batch is
Completed or Failed (or ``--timeout`` passes) the consumers are stopped and the run is judged:

- the consistency check finds nothing;
- every job is Completed or Failed, in exactly one state folder and one batch folder, and every
  manifest line became exactly one job;
- no lock is left (item locks, per-object storage/inventory locks);
- every batch has exactly one status report that lists exactly its jobs, and exactly one
  summary mail went out for it;
- with hostile depositors (the default; ``--no-hostile`` leaves them out): two more batches
  whose objects are a zip bomb, a symbolic-link chain in a zip and in a tar, a server that
  trickles, and a URL at an address the fetch policy refuses. Every good job must be Completed,
  every hostile one Failed with its reason, the refused address never asked, and nothing left
  in the working folders or storage that is a link or reads as a host file.

Everything runs in a scratch folder (ZooKeeper data, working folders, storage, mail, SQLite); by
default a ZooKeeper of its own on a free port, or a fresh chroot of ``ZK_HOSTS`` (which cannot
be restarted, so the restarts are skipped). Exits 1 on any violation.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from queues.states import JOB, BatchState, JobState
from queues.steps.checkm import (
    CONTAINER_BATCH_MANIFEST,
    SINGLE_FILE_BATCH_MANIFEST,
    ManifestRow,
    write_checkm,
)
from queues.zk.client import connect
from queues.zkserver import LocalZooKeeper, free_port

PROFILE = "merritt_demo_content"
SUBJECT_RE = re.compile(r"^Subject: Merritt batch (bid[0-9]{10}) ", re.MULTILINE)
TERMINAL_BATCH = frozenset({BatchState.COMPLETED, BatchState.FAILED})
MANAGE = Path(settings.BASE_DIR) / "manage.py"


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


# Hostile depositors: local ID -> (what is served, the words its failure must contain).
HOSTILE_FAILURES = {
    "hostile-bomb": "the compression-ratio limit",
    "hostile-chain-zip": "links are not accepted in containers",
    "hostile-chain-tar": "links are not accepted in containers",
    "hostile-trickle": "below the minimum of",
    "hostile-ssrf": "a loopback address, which is not fetched for depositors",
}
# The consumers' fetch policy in a chaos run: the good server's address only, and a trickle
# found out within seconds rather than a minute.
CHAOS_FETCH_ENV = {
    "MRT_FETCH_ALLOW": "127.0.0.1/32",
    "MRT_DOWNLOAD_MIN_RATE": "1024",
    "MRT_DOWNLOAD_RATE_WINDOW": "5",
}


class HostileRoutes(QuietHandler):
    """The good file server, plus /trickle (one byte every second, never finishing)."""

    stop = threading.Event()

    def do_GET(self) -> None:
        if not self.path.startswith("/trickle"):
            super().do_GET()
            return
        self.send_response(200)
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        with contextlib.suppress(OSError):
            while not self.stop.wait(1.0):
                self.wfile.write(b"x")
                self.wfile.flush()


class Sentinel(BaseHTTPRequestHandler):
    """Stands where a depositor must never make us go (127.0.0.2); counts who came anyway."""

    hits = 0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Length", "7")
        self.end_headers()
        self.wfile.write(b"private")

    do_HEAD = do_GET


def _zip(entries: dict[str, bytes], links: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        for name, target in links.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16
            zf.writestr(info, target)
    return buffer.getvalue()


def _link_tar(links: dict[str, str]) -> bytes:
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
    return buffer.getvalue()


@dataclass
class Consumer:
    """One ``runconsumer all`` process and its log."""

    number: int
    log: Path
    proc: subprocess.Popen | None = None
    starts: int = 0


@dataclass
class Tally:
    kills: int = 0
    restarts: int = 0
    zk_restarts: int = 0
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fail(self, line: str) -> None:
        self.violations.append(line)


class Command(BaseCommand):
    help = "Run jobs through every daemon while killing consumers and restarting ZooKeeper."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--jobs", type=int, default=1000)
        parser.add_argument("--batches", type=int, default=0, help="default: one per 100 jobs")
        parser.add_argument("--consumers", type=int, default=3, help="runconsumer all processes")
        parser.add_argument("--zk-restarts", type=int, default=2)
        parser.add_argument(
            "--kill-every",
            type=float,
            nargs=2,
            default=(2.0, 6.0),
            metavar=("MIN", "MAX"),
            help="seconds between SIGKILLs, drawn uniformly (default 2 6)",
        )
        parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait at most")
        parser.add_argument("--seed", type=int, default=None)
        parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
        parser.add_argument(
            "--no-hostile",
            dest="hostile",
            action="store_false",
            help="leave out the hostile depositors (zip bomb, link chains, trickle, SSRF URL)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        jobs: int = options["jobs"]
        if jobs < 1 or options["consumers"] < 1:
            raise CommandError("--jobs and --consumers must be at least 1")
        batches = options["batches"] or max(1, round(jobs / 100))
        batches = min(batches, jobs)
        seed = (
            options["seed"]
            if options["seed"] is not None
            else random.SystemRandom().randrange(1 << 30)
        )
        rng = random.Random(seed)
        # The monitor's own reconnects during ZooKeeper restarts are expected, not news.
        logging.getLogger("kazoo").setLevel(logging.ERROR)
        scratch = Path(tempfile.mkdtemp(prefix="mrt-chaos-"))
        self.say(
            f"chaos run: {jobs} jobs in {batches} batches, {options['consumers']} consumers, "
            f"seed {seed}, scratch {scratch}"
        )
        server: LocalZooKeeper | None = None
        try:
            if settings.ZK_HOSTS.strip() not in ("", "local"):
                hosts = self.chroot(settings.ZK_HOSTS)
                self.say(f"using ZK_HOSTS chroot {hosts}; ZooKeeper restarts skipped")
            else:
                server = LocalZooKeeper(scratch / "zookeeper", free_port())
                server.start()
                hosts = server.hosts
            tally = self.run(
                hosts=hosts,
                server=server,
                scratch=scratch,
                jobs=jobs,
                batches=batches,
                rng=rng,
                options=options,
            )
        finally:
            if server is not None:
                server.stop()
            if options["keep"]:
                self.say(f"scratch folder kept: {scratch}")
            else:
                shutil.rmtree(scratch, ignore_errors=True)
        for note in sorted(set(tally.notes)):
            self.say(f"note: {note} ({tally.notes.count(note)}x); restarted")
        if tally.violations:
            self.say(f"VERDICT: FAILED, {len(tally.violations)} violation(s):")
            for line in tally.violations[:50]:
                self.say(f"  - {line}")
            raise SystemExit(1)
        self.say(
            f"VERDICT: OK: {jobs} jobs and {batches} batches consistent after {tally.kills} "
            f"SIGKILLs and {tally.zk_restarts} ZooKeeper restarts"
            + (
                f", {len(HOSTILE_FAILURES)} hostile depositors failed for their reasons"
                if options["hostile"]
                else ""
            )
        )

    def chroot(self, hosts: str) -> str:
        """A fresh chroot of ``hosts`` (itself maybe a chroot), so nothing else is touched."""
        chroot = f"/chaos-{uuid.uuid4().hex[:8]}"
        zk = connect(hosts)
        try:
            zk.ensure_path(chroot)
        finally:
            zk.stop()
            zk.close()
        return f"{hosts}{chroot}"

    def say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    # The run ---------------------------------------------------------------------------------

    def run(
        self,
        *,
        hosts: str,
        server: LocalZooKeeper | None,
        scratch: Path,
        jobs: int,
        batches: int,
        rng: random.Random,
        options: dict[str, Any],
    ) -> Tally:
        tally = Tally()
        var = scratch / "var"
        var.mkdir()
        env = self.child_env(hosts, var)
        subprocess.run(
            [sys.executable, str(MANAGE), "migrate", "--noinput", "-v", "0"],
            env=env,
            check=True,
        )
        payload = scratch / "payload"
        HostileRoutes.stop.clear()
        http = ThreadingHTTPServer(("127.0.0.1", 0), partial(HostileRoutes, directory=str(payload)))
        http.daemon_threads = True
        threading.Thread(target=http.serve_forever, daemon=True).start()
        base_url = f"http://127.0.0.1:{http.server_address[1]}"
        Sentinel.hits = 0
        sentinel = ThreadingHTTPServer(("127.0.0.2", 0), Sentinel)
        sentinel.daemon_threads = True
        threading.Thread(target=sentinel.serve_forever, daemon=True).start()
        sentinel_url = f"http://127.0.0.2:{sentinel.server_address[1]}"
        zk = connect(hosts, timeout=30)
        consumers = [
            Consumer(n, scratch / f"consumer-{n}.log") for n in range(options["consumers"])
        ]
        try:
            expected = self.submit(zk, payload, base_url, jobs=jobs, batches=batches)
            if options["hostile"]:
                expected.update(self.submit_hostile(zk, payload, base_url, sentinel_url))
            for consumer in consumers:
                self.start(consumer, env)
            self.chaos(zk, server, consumers, env, expected, tally, rng, options)
            for consumer in consumers:
                self.stop(consumer)
            self.judge(zk, var, expected, tally, lock_wait=settings_timeout(env) * 3 + 5)
            if options["hostile"]:
                self.judge_hostile(zk, var, tally)
        finally:
            HostileRoutes.stop.set()
            sentinel.shutdown()
            for consumer in consumers:
                if consumer.proc is not None and consumer.proc.poll() is None:
                    consumer.proc.kill()
                    consumer.proc.wait()
            http.shutdown()
            with contextlib.suppress(Exception):
                zk.stop()
                zk.close()
        return tally

    def child_env(self, hosts: str, var: Path) -> dict[str, str]:
        env = dict(os.environ)
        # Local storage, inventory, minter and file mail, all under the scratch folder.
        for name in (
            "MRT_STORAGE_URL",
            "MRT_INVENTORY_URL",
            "MRT_EZID_URL",
            "EMAIL_HOST",
            "MRT_DATABASE_PATH",
            "MRT_WORK_DIR",
            "MRT_STORAGE_ROOT",
            "MRT_FILE_ROOTS",
            "MRT_DOWNLOADS_DIR",
        ):
            env.pop(name, None)
        env.update(
            {
                "ZK_HOSTS": hosts,
                "MRT_VAR_DIR": str(var),
                # Short sessions: a killed consumer's locks go within seconds, not minutes.
                "ZK_TIMEOUT": env.get("CHAOS_ZK_TIMEOUT", "4"),
                "PYTHONUNBUFFERED": "1",
                "LOG_LEVEL": "WARNING",
                **CHAOS_FETCH_ENV,
            }
        )
        return env

    def submit(
        self, zk: Any, payload: Path, base_url: str, *, jobs: int, batches: int
    ) -> dict[str, set[str]]:
        """Write the files and manifests, submit the batches; returns bid -> local IDs."""
        from queues.zk.batches import batch_create

        payload.mkdir()
        expected: dict[str, set[str]] = {}
        sizes = [jobs // batches + (1 if i < jobs % batches else 0) for i in range(batches)]
        number = 0
        for b, size in enumerate(sizes):
            rows = []
            for _ in range(size):
                data = f"chaos file {number}\n".encode() + os.urandom(64).hex().encode()
                name = f"b{b}/f{number:05d}.txt"
                (payload / name).parent.mkdir(parents=True, exist_ok=True)
                (payload / name).write_bytes(data)
                rows.append(
                    ManifestRow(
                        url=f"{base_url}/{name}",
                        hash_alg="md5",
                        hash_value=hashlib.md5(data, usedforsecurity=False).hexdigest(),
                        size=len(data),
                        filename=f"f{number:05d}.txt",
                        local_id=f"chaos-{number:05d}",
                        creator="Chaos run",
                        title=f"Chaos object {number}",
                        date="2026",
                    )
                )
                number += 1
            manifest = f"batch-{b}.checkm"
            (payload / manifest).write_text(write_checkm(rows, kind=SINGLE_FILE_BATCH_MANIFEST))
            # Created with the service module directly: the process's own client is not ours.
            batch = batch_create(
                zk,
                submission={
                    "profile": PROFILE,
                    "submitter": "chaos@example.org",
                    "payload_url": f"{base_url}/{manifest}",
                    "type": "single-file-batch-manifest",
                    "title": f"Chaos batch {b}",
                    "submission_mode": "add",
                },
            )
            expected[batch.bid] = {row.local_id for row in rows}
        self.say(f"submitted {len(expected)} batches, {number} manifest lines")
        return expected

    def submit_hostile(
        self, zk: Any, payload: Path, base_url: str, sentinel_url: str
    ) -> dict[str, set[str]]:
        """Two batches of hostile objects among the good ones; returns bid -> local IDs."""
        from queues.zk.batches import batch_create

        chain = {"l1": "l2/l2/l2/../../../../../../../etc/passwd", "l2": "."}
        (payload / "hostile").mkdir()
        served = {
            "bomb.zip": _zip({"zeros.bin": b"\0" * (50 * 1024 * 1024)}, {}),
            "chain.zip": _zip({}, chain),
            "chain.tgz": _link_tar(chain),
        }
        for name, data in served.items():
            (payload / "hostile" / name).write_bytes(data)
        batches = {
            CONTAINER_BATCH_MANIFEST: [
                ("hostile-bomb", f"{base_url}/hostile/bomb.zip"),
                ("hostile-chain-zip", f"{base_url}/hostile/chain.zip"),
                ("hostile-chain-tar", f"{base_url}/hostile/chain.tgz"),
            ],
            SINGLE_FILE_BATCH_MANIFEST: [
                ("hostile-trickle", f"{base_url}/trickle"),
                ("hostile-ssrf", f"{sentinel_url}/django-admin/"),
            ],
        }
        expected: dict[str, set[str]] = {}
        for kind, rows in batches.items():
            name = f"hostile/{kind}.checkm"
            manifest = [
                ManifestRow(url=url, filename=lid, local_id=lid, title=lid) for lid, url in rows
            ]
            (payload / name).write_text(write_checkm(manifest, kind=kind))
            batch_type = (
                "container-batch-manifest"
                if kind == CONTAINER_BATCH_MANIFEST
                else "single-file-batch-manifest"
            )
            batch = batch_create(
                zk,
                submission={
                    "profile": PROFILE,
                    "submitter": "chaos@example.org",
                    "payload_url": f"{base_url}/{name}",
                    "type": batch_type,
                    "title": f"Hostile depositors ({kind})",
                    "submission_mode": "add",
                },
            )
            expected[batch.bid] = {lid for lid, _url in rows}
        self.say(f"submitted {len(expected)} hostile batches, {len(HOSTILE_FAILURES)} objects")
        return expected

    def judge_hostile(self, zk: Any, var: Path, tally: Tally) -> None:
        """Good jobs Completed, hostile ones Failed for their reason, nothing escaped."""
        from queues.zk import paths
        from queues.zk.jobs import jobs_load
        from queues.zk.nodes import children
        from queues.zk.records import Job

        jids = sorted(j for j in children(zk, paths.JOBS) if paths.JID_RE.fullmatch(j))
        seen: set[str] = set()
        for start in range(0, len(jids), 500):
            for job in jobs_load(zk, jids[start : start + 500]):
                if not isinstance(job, Job):
                    continue
                lid = str(job.configuration.get("localID") or (job.local_ids or [""])[0])
                reason = HOSTILE_FAILURES.get(lid)
                if reason is None:
                    if job.state != JobState.COMPLETED:
                        tally.fail(f"good job {job.jid} ({lid}) ended {job.state}")
                    continue
                seen.add(lid)
                if job.state != JobState.FAILED or reason not in job.status.message:
                    tally.fail(
                        f"hostile job {job.jid} ({lid}) ended {job.state}: "
                        f"{job.status.message[:200]!r}, expected a failure with {reason!r}"
                    )
        for lid in sorted(set(HOSTILE_FAILURES) - seen):
            tally.fail(f"hostile object {lid} made no job")
        if Sentinel.hits:
            tally.fail(f"the refused address was asked {Sentinel.hits} time(s)")
        for folder in (var / "work", var / "storage"):
            for path in folder.rglob("*") if folder.is_dir() else ():
                if path.is_symlink():
                    tally.fail(f"a link was left in {path}")
                elif path.is_file() and b"root:x:0:0" in path.read_bytes()[:65536]:
                    tally.fail(f"a host file was copied into {path}")
        self.say(
            f"hostile depositors: {len(seen)} failed for their reasons, the refused address "
            f"asked {Sentinel.hits} times"
        )

    def start(self, consumer: Consumer, env: dict[str, str]) -> None:
        log = consumer.log.open("ab")
        consumer.proc = subprocess.Popen(
            [sys.executable, str(MANAGE), "runconsumer", "all", "--poll", "0.5"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        consumer.starts += 1

    def stop(self, consumer: Consumer) -> None:
        proc = consumer.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def chaos(
        self,
        zk: Any,
        server: LocalZooKeeper | None,
        consumers: list[Consumer],
        env: dict[str, str],
        expected: dict[str, set[str]],
        tally: Tally,
        rng: random.Random,
        options: dict[str, Any],
    ) -> None:
        total = sum(len(v) for v in expected.values())
        restarts_left = options["zk_restarts"] if server is not None else 0
        # Restart ZooKeeper when these shares of the jobs have finished.
        restart_at = [(i + 1) / (restarts_left + 1) for i in range(restarts_left)]
        low, high = sorted(options["kill_every"])
        began = time.monotonic()
        next_kill = began + rng.uniform(low, high)
        next_report = began
        deadline = began + options["timeout"]
        while True:
            now = time.monotonic()
            progress = self.progress(zk, expected)
            if progress is not None:
                finished, done_batches, line = progress
                if now >= next_report:
                    self.say(
                        f"[{now - began:6.0f}s] {line} | killed {tally.kills}, "
                        f"ZooKeeper restarts {tally.zk_restarts}"
                    )
                    next_report = now + 5
                if done_batches == len(expected) and not restart_at:
                    self.say(f"[{now - began:6.0f}s] every batch finished: {line}")
                    return
                if restart_at and finished >= restart_at[0] * total and server is not None:
                    restart_at.pop(0)
                    self.restart_zookeeper(server, rng, tally)
                    continue
            if now >= deadline:
                tally.fail(f"not finished within {options['timeout']:.0f}s")
                return
            if now >= next_kill:
                victim = rng.choice(consumers)
                if victim.proc is not None and victim.proc.poll() is None:
                    victim.proc.send_signal(signal.SIGKILL)
                    victim.proc.wait()
                    tally.kills += 1
                time.sleep(rng.uniform(0.2, 1.5))
                self.start(victim, env)
                tally.restarts += 1
                next_kill = time.monotonic() + rng.uniform(low, high)
            for consumer in consumers:
                if consumer.proc is not None and consumer.proc.poll() not in (None, -9):
                    self.exited(consumer, tally)
                    self.start(consumer, env)
            time.sleep(0.25)

    def exited(self, consumer: Consumer, tally: Tally) -> None:
        """A consumer that ended by itself: expected only when it started while ZooKeeper was
        away (runconsumer then exits with a clear error and its supervisor starts it again)."""
        tail = consumer.log.read_text(errors="replace").strip().splitlines()[-3:]
        last = " / ".join(tail)[-400:]
        if any("cannot reach ZooKeeper" in line for line in tail):
            tally.notes.append(f"consumer {consumer.number} found ZooKeeper away at start")
            return
        tally.fail(
            f"consumer {consumer.number} exited by itself with status "
            f"{consumer.proc.returncode if consumer.proc else '?'}: {last}"
        )

    def restart_zookeeper(self, server: LocalZooKeeper, rng: random.Random, tally: Tally) -> None:
        self.say("restarting ZooKeeper")
        server.stop()
        time.sleep(rng.uniform(0.5, 3.0))
        server.start()
        tally.zk_restarts += 1
        self.say(f"ZooKeeper is back (restart {tally.zk_restarts})")

    def progress(self, zk: Any, expected: dict[str, set[str]]) -> tuple[int, int, str] | None:
        """(finished jobs, finished batches, a line), or None while ZooKeeper is away."""
        from queues.zk import paths
        from queues.zk.batches import batch_states
        from queues.zk.nodes import exists_many

        try:
            folders = {s: paths.job_state_folder(s) for s in JOB.states}
            stats = exists_many(zk, list(folders.values()))
            counts = {s: st.numChildren for s, f in folders.items() if (st := stats[f]) is not None}
            states = batch_states(zk, list(expected))
        except Exception:  # ZooKeeper is restarting: report again once it is back
            return None
        finished = counts.get(JobState.COMPLETED, 0) + counts.get(JobState.FAILED, 0)
        done = sum(1 for s in states.values() if s in TERMINAL_BATCH)
        working = ", ".join(
            f"{s} {n}"
            for s, n in counts.items()
            if n and s not in (JobState.COMPLETED, JobState.FAILED)
        )
        line = (
            f"jobs: {counts.get(JobState.COMPLETED, 0)} Completed, "
            f"{counts.get(JobState.FAILED, 0)} Failed"
            + (f", {working}" if working else "")
            + f" | batches: {done}/{len(expected)} finished"
        )
        return finished, done, line

    # The verdict ----------------------------------------------------------------------------

    def judge(
        self, zk: Any, var: Path, expected: dict[str, set[str]], tally: Tally, *, lock_wait: float
    ) -> None:
        from queues.check import run_check
        from queues.zk import paths
        from queues.zk.batches import batch_ids, batch_job_ids, batches_load
        from queues.zk.jobs import jobs_load
        from queues.zk.nodes import children, children_many
        from queues.zk.records import Batch, Broken

        # Locks of killed consumers go when their sessions expire; wait for that, no longer.
        deadline = time.monotonic() + lock_wait
        while True:
            locks = self.locks(zk)
            if not locks or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for path in locks:
            tally.fail(f"lock left: {path}")

        # A consumer killed between reserving a job ID (the sequential create the contract
        # prescribes) and the transaction that writes the job leaves an empty /jobs/jid node.
        # That window cannot be closed; listings skip such nodes and `queuecheck --repair`
        # removes them once abandoned. Every consumer is stopped now, so none is in creation.
        empty = self.empty_jobs(zk)
        for path in empty:
            zk.delete(path)
        if empty:
            self.say(
                f"removed {len(empty)} empty job node(s) left by consumers killed during job "
                f"creation: {', '.join(empty[:5])}"
            )

        report = run_check(zk, stale_lock_seconds=0)
        for finding in report.findings:
            if finding.kind == "stale-lock":
                continue  # counted above, after waiting for sessions to expire
            tally.fail(f"consistency check: {finding.kind} {finding.path}: {finding.detail}")

        # Every job in exactly one state folder, and that folder is Completed or Failed.
        folders = children(zk, paths.JOB_STATES)
        listed = children_many(zk, [f"{paths.JOB_STATES}/{f}" for f in folders])
        entries: dict[str, list[str]] = defaultdict(list)
        for folder in folders:
            for name in listed[f"{paths.JOB_STATES}/{folder}"] or []:
                match = paths.INDEX_ENTRY_RE.fullmatch(name)
                if match:
                    entries[match.group(2)].append(folder)
        jids = sorted(j for j in children(zk, paths.JOBS) if paths.JID_RE.fullmatch(j))
        jobs = {}
        for start in range(0, len(jids), 500):
            for item in jobs_load(zk, jids[start : start + 500]):
                if isinstance(item, Broken):
                    tally.fail(f"job {item.id} does not load: {item.path}: {item.reason}")
                else:
                    jobs[item.jid] = item
        failures: Counter[str] = Counter()
        for jid, job in jobs.items():
            if job.state not in (JobState.COMPLETED, JobState.FAILED):
                tally.fail(f"job {jid} ended {job.state}")
            if job.state == JobState.FAILED:
                failures[job.status.message[:120]] += 1
            if len(entries.get(jid, [])) != 1:
                tally.fail(f"job {jid} is in {len(entries.get(jid, []))} state folders")

        # Every manifest line exactly one job; every batch reported exactly once.
        loaded = {b.bid: b for b in batches_load(zk, list(expected)) if isinstance(b, Batch)}
        for bid, local_ids in expected.items():
            batch = loaded.get(bid)
            if batch is None:
                tally.fail(f"batch {bid} is gone or broken")
                continue
            if batch.state not in TERMINAL_BATCH:
                tally.fail(f"batch {bid} ended {batch.state}")
            index = batch_job_ids(zk, bid)
            members = sorted({j for js in index.values() for j in js})
            seen = Counter(
                lid
                for j in members
                if j in jobs
                for lid in (jobs[j].local_ids or [str(jobs[j].configuration.get("localID", ""))])
            )
            duplicated = sorted(lid for lid, n in seen.items() if n > 1)
            missing = sorted(local_ids - set(seen))
            if duplicated:
                tally.fail(f"batch {bid}: manifest lines made more than one job: {duplicated[:5]}")
            if missing:
                tally.fail(f"batch {bid}: manifest lines without a job: {missing[:5]}")
            report_node = batch.report or {}
            reported_ok = report_node.get("successful_jobs") or []
            reported_failed = report_node.get("failed_jobs") or []
            if not batch.report:
                tally.fail(f"batch {bid} has no status report")
            elif sorted(reported_ok + reported_failed) != members:
                tally.fail(f"batch {bid}: status report does not list exactly its jobs")
            elif batch.report.get("history"):
                tally.fail(f"batch {bid} was reported {1 + len(batch.report['history'])} times")
            want = BatchState.FAILED if reported_failed else BatchState.COMPLETED
            if batch.report and batch.state != want:
                tally.fail(f"batch {bid} is {batch.state} but its report says {want}")
        for bid in sorted(set(batch_ids(zk)) - set(expected)):
            tally.fail(f"unexpected batch {bid}")
        lines = sum(len(v) for v in expected.values())
        if len(jids) != lines:
            tally.fail(f"{len(jids)} jobs exist for {lines} manifest lines")

        mails = self.mails(var / "mail")
        for bid in expected:
            if mails[bid] != 1:
                tally.fail(f"batch {bid}: {mails[bid]} summary mails, expected exactly 1")
        for bid in set(mails) - set(expected):
            tally.fail(f"summary mail for unknown batch {bid}")

        completed = sum(1 for j in jobs.values() if j.state == JobState.COMPLETED)
        self.say(
            f"checked {len(jobs)} jobs ({completed} Completed, {len(jobs) - completed} Failed), "
            f"{len(expected)} batches, {sum(mails.values())} summary mails; "
            f"consistency check: {len(report.findings)} findings"
        )
        for message, count in failures.most_common(5):
            self.say(f"  failed jobs: {count} x {message}")

    def empty_jobs(self, zk: Any) -> list[str]:
        from queues.zk import paths
        from queues.zk.nodes import exists_many

        candidates = [
            paths.job(j) for j in zk.get_children(paths.JOBS) if paths.JID_RE.fullmatch(j)
        ]
        return sorted(
            p for p, stat in exists_many(zk, candidates).items() if stat and stat.numChildren == 0
        )

    def locks(self, zk: Any) -> list[str]:
        from queues.zk import paths
        from queues.zk.nodes import children, exists_many

        candidates = [
            paths.job_node(j, "lock") for j in children(zk, paths.JOBS) if paths.JID_RE.fullmatch(j)
        ]
        candidates += [
            paths.batch_node(b, "lock")
            for b in children(zk, paths.BATCHES)
            if paths.BID_RE.fullmatch(b)
        ]
        found = [p for p, stat in exists_many(zk, candidates).items() if stat is not None]
        for folder in (paths.STORAGE_LOCKS, paths.INVENTORY_LOCKS):
            found += [f"{folder}/{name}" for name in children(zk, folder)]
        return found

    def mails(self, folder: Path) -> Counter[str]:
        """Summary mails per batch ID, from the file mail backend's folder."""
        found: Counter[str] = Counter()
        if folder.is_dir():
            for path in folder.iterdir():
                found.update(SUBJECT_RE.findall(path.read_text(errors="replace")))
        return found


def settings_timeout(env: dict[str, str]) -> float:
    try:
        return float(env.get("ZK_TIMEOUT", "10"))
    except ValueError:
        return 10.0
