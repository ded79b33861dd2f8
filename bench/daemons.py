"""The consumer daemons' throughput next to the server's raw rate: ``python bench/daemons.py``.

Loads ``--jobs`` jobs in Estimating, then runs ``--processes`` daemon processes. Each hosts one
daemon per job step (Estimating ... Notify) running the project's own loop
(``queues.daemons.base.Daemon.run``: claim the first job in priority order under its ephemeral
lock, run the step, one transition, unlock, check the batch; when idle, wait on the folder's
watch) with a step that does no work, so what is measured is the loop and ZooKeeper, not
downloads. Every job makes 7 transitions on its way to Completed. In the same run and on the
same server, ``bench/zk_rate.py`` measures the raw rate of the transition's five-operation multi
with the same number of client processes, and the rate of lock + move, the contract's least."""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, median, new_chroot, setup_django, throwaway_zookeeper

TARGET_SHARE = 0.5


def _daemon_process(hosts: str, poll: float, stop_at: float, record: bool = False) -> None:
    setup_django()
    from django.conf import settings

    from queues.daemons.base import JobDaemon, Next
    from queues.states import JOB, JOB_WORKING

    logging.getLogger("queues").setLevel(logging.WARNING)
    settings.ZK_HOSTS = hosts

    class NoWork(JobDaemon):
        """A step that has nothing to do: the job moves on to the next state at once."""

        queue_hold = None

        def work(self, item):  # the base class's signature
            return Next(JOB.successor(item.state) or "Completed")

    daemons = [
        type(f"NoWork{s}", (NoWork,), {"name": f"bench-{s}", "step": s, "state": s})(poll=poll)
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


@dataclass
class DaemonRun:
    processes: int
    jobs: int
    transitions: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.transitions / self.seconds if self.seconds else 0.0


def run_daemons(
    hosts: str, *, jobs: int, processes: int, timeout: float = 600, record: bool = False
) -> DaemonRun:
    """Move ``jobs`` Estimating jobs to Completed with ``processes`` daemon processes."""
    from bench.load import load
    from queues import zk as zkmod
    from queues.states import JOB_WORKING
    from queues.zk import paths

    target = new_chroot(hosts, f"bench-daemons-{processes}{'-recorded' if record else ''}")
    # Only jobs waiting for Estimating: every one of them makes all seven transitions.
    load(
        target,
        jobs=jobs,
        batches=max(1, jobs // 50),
        distribution={"Estimating": 1.0},
        quiet=True,
    )
    watcher = zkmod.connect(target)
    done_folder = paths.job_state_folder("Completed")
    context = multiprocessing.get_context("spawn")
    stop_at = time.time() + timeout
    children = [
        context.Process(target=_daemon_process, args=(target, 1.0, stop_at, record))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    # The clock starts at the first transition, so process start-up is not counted.
    began = None
    while time.time() < stop_at:
        stat = watcher.exists(paths.job_state_folder("Provisioning"))
        moved = (stat.numChildren if stat else 0) + watcher.exists(done_folder).numChildren
        if began is None and moved:
            began = time.monotonic()
        if watcher.exists(done_folder).numChildren >= jobs:
            break
        time.sleep(0.05)
    elapsed = time.monotonic() - (began or time.monotonic())
    completed = watcher.exists(done_folder).numChildren
    watcher.stop()
    watcher.close()
    # Let the children see the deadline and go.
    for child in children:
        child.terminate()
        child.join(timeout=30)
    return DaemonRun(processes, completed, completed * len(JOB_WORKING), elapsed)


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each raw probe")
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
    from bench import zk_rate

    lines = [
        f"Daemon throughput ({args.jobs} jobs, each Estimating -> ... -> Completed, 7 "
        "transitions; one thread per step in each process) against the raw rate of the same "
        "five-operation transaction, same server, same number of client processes (median of "
        f"{args.rounds} alternating rounds). 'lock+move' is the least a consumer's transition "
        "costs by the contract: the ephemeral lock created, then the move deleting it.",
        "'ceiling' is lock+move over raw: the share no consumer following the contract can "
        "pass once the server is the bottleneck.",
        f"  {'processes':>9}{'daemons':>14}{'raw ZooKeeper':>17}{'share':>7}"
        f"{'raw lock+move':>17}{'share':>7}{'ceiling':>9}",
    ]
    with throwaway_zookeeper(args.hosts) as hosts:
        for processes in args.processes:
            daemon_rates, raw_rates, floor_rates, finished = [], [], [], args.jobs
            for _ in range(args.rounds):
                run = run_daemons(hosts, jobs=args.jobs, processes=processes)
                daemon_rates.append(run.per_second)
                finished = min(finished, run.jobs)
                raw_rates.append(zk_rate.measure(hosts, processes=processes, seconds=args.seconds))
                floor_rates.append(
                    zk_rate.measure(hosts, processes=processes, seconds=args.seconds, locked=True)
                )
            rate, raw, floor = median(daemon_rates), median(raw_rates), median(floor_rates)
            share = rate / raw if raw else 0.0
            verdict = "ok" if share >= TARGET_SHARE else f"under {TARGET_SHARE:.0%}"
            line = (
                f"  {processes:>9}{rate:>10.0f} t/s{raw:>13.0f} t/s{share:>7.0%}"
                f"{floor:>13.0f} t/s{rate / floor if floor else 0:>7.0%}"
                f"{floor / raw if raw else 0:>9.0%}  {verdict}"
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
