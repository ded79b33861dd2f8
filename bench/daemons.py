"""Consumer daemons against the pipelined raw rate: ``python bench/daemons.py``.

Loads ``--jobs`` jobs in Estimating, then runs ``--processes`` daemon processes. Each hosts one
daemon per job step (Estimating ... Notify) running the project's own batched loop
(``queues.daemons.pipeline``: the queue-hold read, one lock multi and one multiRead for up to
``--batch`` jobs in one round trip, the step, one move multi for all of them, locks kept from
one step to the next inside the process, the batch's completion checked at the end) with a step
that does no work, so what is measured is the loop and ZooKeeper, not downloads. Every job
makes 7 transitions on its way to Completed.

In the same run and on the same server, a raw probe with the SAME concurrency: the same number
of client processes, each keeping as many single-job transitions in flight (pipelined with
kazoo's async API) as its daemons keep jobs in hand (7 loops x ``--batch``). A raw transition
is the five-operation multi of ``job_transition`` (status JSON of the contract's size, index
entry and batch entry moved); the raw probe claims nothing, reads nothing and checks no hold.

Requests per transition come from the server's own count (``mntr``: ``zk_packets_received``
before and after, over the transitions made meanwhile): pings and start-up included. Where the
CPU goes is printed beside each rate: the client processes' CPU time per transition (from
``/proc/<pid>/stat`` over the timed window) and how busy the whole machine was meanwhile (from
``/proc/stat``), so a rate limited by the machine's cores shows as such.
"""

from __future__ import annotations

import argparse
import collections
import logging
import multiprocessing
import os
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, median, new_chroot, setup_django, throwaway_zookeeper

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


def _daemon_process(
    hosts: str,
    poll: float,
    stop_at: float,
    record: bool = False,
    batch: int = 16,
    keep: bool = True,
) -> None:
    setup_django()
    from django.conf import settings

    from queues.daemons.base import JobDaemon, Next
    from queues.daemons.pipeline import LockKeeper
    from queues.states import JOB, JOB_WORKING, JobState

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
    observer = None
    if record:
        # What runconsumer's Host adds: registration, and every step recorded in the database
        # (in batches, by a writer thread).
        from queues.daemons.registration import ProcessObserver

        observer = ProcessObserver(daemons[0].zk, daemons, record=True)
        for daemon in daemons:
            daemon.observer = observer
        observer.start()
    stop = threading.Event()
    threads = [threading.Thread(target=daemon.run, args=(stop,), daemon=True) for daemon in daemons]
    for thread in threads:
        thread.start()
    stop.wait(max(0.0, stop_at - time.time()))
    stop.set()
    for thread in threads:
        thread.join()
    if observer is not None:
        observer.stop()


def packets_received(hosts: str) -> int | None:
    """The server's count of requests received (``mntr``), or None when it cannot be asked."""
    from queues.zkserver import four_letter

    host, _, rest = hosts.partition(":")
    if host not in ("127.0.0.1", "localhost"):
        return None
    port = int(rest.split(",")[0].split("/")[0])
    found = re.search(r"zk_packets_received\s+(\d+)", four_letter(port, "mntr") or "")
    return int(found.group(1)) if found else None


@dataclass
class DaemonRun:
    processes: int
    jobs: int
    transitions: int
    seconds: float
    packets: int | None = None
    cpu: CpuWindow | None = None

    @property
    def per_second(self) -> float:
        return self.transitions / self.seconds if self.seconds else 0.0

    @property
    def requests_per_transition(self) -> float | None:
        if self.packets is None or not self.transitions:
            return None
        return self.packets / self.transitions


def run_daemons(
    hosts: str,
    *,
    jobs: int,
    processes: int,
    timeout: float = 600,
    record: bool = False,
    batch: int = 16,
    keep: bool = True,
) -> DaemonRun:
    """Move ``jobs`` Estimating jobs to Completed with ``processes`` daemon processes."""
    from bench.load import load
    from queues.states import JOB_WORKING, JobState
    from queues.zk import client as zkmod
    from queues.zk import paths

    target = new_chroot(hosts, f"bench-daemons-{processes}{'-recorded' if record else ''}")
    # Only jobs waiting for Estimating: every one of them makes all seven transitions.
    load(
        target,
        jobs=jobs,
        batches=max(1, jobs // 50),
        distribution={JobState.ESTIMATING: 1.0},
        quiet=True,
    )
    watcher = zkmod.connect(target)
    done_folder = paths.job_state_folder(JobState.COMPLETED)
    watcher.ensure_path(done_folder)
    context = multiprocessing.get_context("spawn")
    stop_at = time.time() + timeout
    packets_before = packets_received(hosts)
    children = [
        context.Process(target=_daemon_process, args=(target, 1.0, stop_at, record, batch, keep))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    cpu = CpuWindow([c.pid for c in children if c.pid is not None])
    # The clock starts at the first transition, so process start-up is not counted. The
    # folder is looked at every 0.2 s (those requests are counted with the daemons').
    began = None
    estimating = paths.job_state_folder(JobState.ESTIMATING)
    while time.time() < stop_at:
        stat = watcher.exists(estimating)
        done = watcher.exists(done_folder).numChildren
        if began is None and (stat is None or stat.numChildren < jobs):
            began = time.monotonic()
            cpu.start()
        if done >= jobs:
            break
        time.sleep(0.2 if began else 0.01)
    cpu.stop()
    elapsed = time.monotonic() - (began or time.monotonic())
    packets_after = packets_received(hosts)
    completed = watcher.exists(done_folder).numChildren
    watcher.stop()
    watcher.close()
    # Let the children see the deadline and go.
    for child in children:
        child.terminate()
        child.join(timeout=30)
    packets = (
        packets_after - packets_before
        if packets_before is not None and packets_after is not None
        else None
    )
    return DaemonRun(processes, completed, completed * len(JOB_WORKING), elapsed, packets, cpu)


def _raw_child(
    hosts: str, inflight: int, seconds: float, start_at: float, out: multiprocessing.Queue
) -> None:
    """``inflight`` single-job transitions kept in flight on one session for ``seconds``."""
    setup_django()
    from queues.zk import client as zkmod
    from queues.zk.codecs import encode_json
    from queues.zk.jobs import new_status

    zk = zkmod.connect(hosts)
    root = f"/bench-raw-{uuid.uuid4().hex[:8]}"
    for folder in ("status", "a", "b", "ba", "bb"):
        zk.ensure_path(f"{root}/{folder}")
    status = encode_json({**new_status(), "last_successful_status": "Estimating"})
    creates = [
        zk.create_async(f"{root}/{folder}/{i}", status if folder == "status" else b"")
        for i in range(inflight)
        for folder in ("status", "a", "ba")
    ]
    for answer in creates:
        answer.get()
    where = ["a"] * inflight

    def send(i: int):
        src = where[i]
        dst = "b" if src == "a" else "a"
        txn = zk.transaction()
        txn.set_data(f"{root}/status/{i}", status)
        txn.delete(f"{root}/{src}/{i}")
        txn.create(f"{root}/{dst}/{i}", b"")
        txn.delete(f"{root}/b{src}/{i}")
        txn.create(f"{root}/b{dst}/{i}", b"")
        where[i] = dst
        return txn.commit_async()

    time.sleep(max(0.0, start_at - time.time()))
    end = start_at + seconds
    pending = collections.deque((i, send(i)) for i in range(inflight))
    done = 0
    while pending:
        i, answer = pending.popleft()
        results = answer.get()
        if any(isinstance(r, Exception) for r in results):
            raise RuntimeError(f"raw probe transaction failed: {results}")
        now = time.time()
        if now <= end:
            done += 1
            pending.append((i, send(i)))
    out.put((done, seconds))
    zk.delete(root, recursive=True)
    zk.stop()
    zk.close()


@dataclass
class RawRun:
    per_second: float
    requests_per_transition: float | None
    transitions: int = 0
    cpu: CpuWindow | None = None


def measure_raw(hosts: str, *, processes: int, inflight: int, seconds: float) -> RawRun:
    """Transitions per second summed over ``processes`` pipelined client processes."""
    context = multiprocessing.get_context("spawn")  # kazoo's threads do not survive a fork
    out = context.Queue()
    start_at = time.time() + 4.0 + 0.3 * processes  # after every child has connected and set up
    children = [
        context.Process(target=_raw_child, args=(hosts, inflight, seconds, start_at, out))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    cpu = CpuWindow([c.pid for c in children if c.pid is not None])
    time.sleep(max(0.0, start_at - time.time()))
    before = packets_received(hosts)
    cpu.start()
    time.sleep(seconds)
    cpu.stop()
    after = packets_received(hosts)
    results = [out.get(timeout=seconds + 120) for _ in children]
    for child in children:
        child.join(timeout=30)
    total = sum(n for n, _ in results)
    per_request = (after - before) / total if before is not None and after is not None else None
    return RawRun(sum(n / s for n, s in results), per_request, total, cpu)


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
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch", type=int, default=16, help="jobs per claim and per move")
    parser.add_argument(
        "--no-keep", action="store_true", help="release every lock with its move (no keeping)"
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each raw probe")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each; medians are shown")
    parser.add_argument("--hosts", default="", help="ZooKeeper to use (default: a throwaway one)")
    parser.add_argument(
        "--recorder",
        choices=("off", "on", "both"),
        default="off",
        help="step history: off (the raw comparison below), on, or both: the daemons' rate "
        "without and with every step recorded in the database, side by side",
    )
    args = parser.parse_args(argv)
    if args.recorder != "off":
        return compare_recorder(args)
    setup_django()
    inflight = LOOPS * args.batch
    keep = not args.no_keep
    lines = [
        f"Daemon throughput ({args.jobs} jobs, each Estimating -> ... -> Completed, 7 "
        f"transitions; one loop per step in each process, {args.batch} jobs a claim and a move, "
        f"locks {'kept between steps' if keep else 'released with every move'}, the ingest "
        "hold read with every claim) against a raw probe of the same concurrency: the same "
        f"processes, each keeping {inflight} single-job five-operation transitions in flight "
        f"(median of {args.rounds} alternating rounds). 'req/t': ZooKeeper requests per "
        "transition, from the server's mntr count; 'us/t': the client processes' CPU time per "
        "transition; 'busy': the whole machine's CPU use meanwhile.",
        f"  {'processes':>9}{'daemons':>14}{'req/t':>7}{'us/t':>6}{'busy':>6}"
        f"{'raw pipelined':>17}{'req/t':>7}{'us/t':>6}{'busy':>6}{'share':>8}",
    ]
    with throwaway_zookeeper(args.hosts) as hosts:
        for processes in args.processes:
            daemon_rates, raw_rates, finished = [], [], args.jobs
            daemon_req, raw_req = [], []
            daemon_cpu: list[tuple[float, float]] = []
            raw_cpu: list[tuple[float, float]] = []
            for _ in range(args.rounds):
                run = run_daemons(
                    hosts, jobs=args.jobs, processes=processes, batch=args.batch, keep=keep
                )
                daemon_rates.append(run.per_second)
                if run.requests_per_transition is not None:
                    daemon_req.append(run.requests_per_transition)
                finished = min(finished, run.jobs)
                if run.cpu is not None and run.transitions:
                    daemon_cpu.append((run.cpu.client / run.transitions, run.cpu.busy))
                raw = measure_raw(
                    hosts, processes=processes, inflight=inflight, seconds=args.seconds
                )
                raw_rates.append(raw.per_second)
                if raw.cpu is not None and raw.transitions:
                    raw_cpu.append((raw.cpu.client / raw.transitions, raw.cpu.busy))
                if raw.requests_per_transition is not None:
                    raw_req.append(raw.requests_per_transition)
            rate, raw_rate = median(daemon_rates), median(raw_rates)
            share = rate / raw_rate if raw_rate else 0.0
            verdict = "ok" if share >= TARGET_SHARE else f"under {TARGET_SHARE:.0%}"
            line = (
                f"  {processes:>9}{rate:>10.0f} t/s"
                f"{_figure(median(daemon_req) if daemon_req else None, '>7.2f')}"
                f"{_cpu_figures(daemon_cpu)}"
                f"{raw_rate:>13.0f} t/s"
                f"{_figure(median(raw_req) if raw_req else None, '>7.2f')}"
                f"{_cpu_figures(raw_cpu)}"
                f"{share:>8.0%}  {verdict}"
                + ("" if finished >= args.jobs else f" (only {finished} jobs finished)")
            )
            print(line, flush=True)
            lines.append(line)
    print()
    for line in lines:
        print(line)
    print(f"Machine: {machine()}")
    return lines


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
