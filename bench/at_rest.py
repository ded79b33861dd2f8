"""What an idle console sends: ``python bench/at_rest.py [--jobs 20000 --batches 400]``.

Starts a ZooKeeper of its own, optionally loads a queue at rest into it (Completed jobs in
batches, Failed jobs, a few Held batches), then runs ``manage.py runconsumer all`` and the web
process (daphne) as shipped, each through a counting proxy of its own to the server, with one
logged-in Chromium page open on the overview. After a settle it counts, per process and per
minute: ZooKeeper requests by opcode (the proxy reads each request's header), database queries
by their first words (a ``connection.execute_wrapper`` installed in the process on each new
connection), log records by logger and level, CPU seconds and RSS growth.

Each process runs under this file's ``probe`` mode, which installs the counters and then runs
the command; it writes its counts to a JSON file every few seconds.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HELD_PROFILE = "bench_held_collection"
SNAPSHOT_EVERY = 2.0  # seconds between a probe's writes of its counts

OPCODES = {
    0: "notification",
    1: "create",
    2: "delete",
    3: "exists",
    4: "getData",
    5: "setData",
    6: "getACL",
    7: "setACL",
    8: "getChildren",
    9: "sync",
    11: "ping",
    12: "getChildren2",
    13: "check",
    14: "multi",
    15: "create2",
    16: "reconfig",
    17: "checkWatches",
    18: "removeWatches",
    19: "createContainer",
    20: "deleteContainer",
    21: "createTTL",
    22: "multiRead",
    100: "auth",
    101: "setWatches",
    102: "sasl",
    103: "getEphemerals",
    104: "getAllChildrenNumber",
    105: "setWatches2",
    106: "addWatch",
    -11: "closeSession",
    -1: "connect",
}


# -- the probe: runs inside the measured process ------------------------------------------


def _sql_kind(sql: str) -> str:
    words = re.sub(r"\s+", " ", sql.strip()).split(" ")
    head = words[0].upper()
    table = ""
    for i, word in enumerate(words[:-1]):
        if word.upper() in ("FROM", "INTO", "UPDATE"):
            table = words[i + 1].strip('"')
            break
    if head == "UPDATE":
        table = words[1].strip('"') if len(words) > 1 else ""
    return f"{head} {table}".strip()


def probe(out: Path, argv: list[str]) -> None:
    """Install the counters, then run ``argv`` (``manage.py ...`` or ``daphne ...``)."""
    import logging
    import resource

    lock = threading.Lock()
    queries: collections.Counter[str] = collections.Counter()
    records: collections.Counter[str] = collections.Counter()

    original_handle = logging.Logger.handle

    def handle(self: logging.Logger, record: logging.LogRecord) -> None:
        with lock:
            records[f"{record.name} {record.levelname}"] += 1
        original_handle(self, record)

    logging.Logger.handle = handle  # type: ignore[method-assign]

    def count(execute, sql, params, many, context):
        with lock:
            queries[_sql_kind(sql)] += 1
        return execute(sql, params, many, context)

    from django.db.backends.signals import connection_created

    def install(sender, connection, **_kw):
        if count not in connection.execute_wrappers:
            connection.execute_wrappers.append(count)

    connection_created.connect(install, weak=False)

    def rss_kib() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def write() -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with lock:
            data = {
                "time": time.monotonic(),
                "cpu": usage.ru_utime + usage.ru_stime,
                "rss_kib": rss_kib(),
                "queries": dict(queries),
                "logs": dict(records),
            }
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(out)

    def writer() -> None:
        while True:
            write()
            time.sleep(SNAPSHOT_EVERY)

    threading.Thread(target=writer, daemon=True, name="at-rest-probe").start()
    sys.argv = argv
    if Path(argv[0]).name == "daphne":
        from daphne.cli import CommandLineInterface

        CommandLineInterface.entrypoint()
    else:
        from django.core.management import execute_from_command_line

        execute_from_command_line(argv)


# -- the driver ---------------------------------------------------------------------------


def _counting_proxy(target_port: int, port: int):
    from tests.zkproxy import ZkProxy

    return ZkProxy(target_port, port)


def _read(path: Path) -> dict:
    for _ in range(50):
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())
        time.sleep(0.1)
    raise RuntimeError(f"no counts in {path}")


def _diff(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=0, help="Completed jobs to load (0: empty)")
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--failed", type=int, default=200)
    parser.add_argument("--held-batches", type=int, default=3)
    parser.add_argument("--settle", type=float, default=60.0, help="seconds before counting")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--port", type=int, default=0, help="daphne's port (default: free)")
    parser.add_argument(
        "--zk-port",
        type=int,
        default=0,
        help="the server's port, the two proxies' the next two (default: free ones)",
    )
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args(argv)
    from bench.common import machine, setup_django

    setup_django()
    from queues.services.zkserver import LocalZooKeeper, free_port

    with tempfile.TemporaryDirectory(prefix="mrt-at-rest-") as tmp_name:
        tmp = Path(tmp_name)
        server = LocalZooKeeper(tmp / "zk", args.zk_port or free_port())
        server.start()
        procs: list[subprocess.Popen] = []
        proxies = []
        try:
            if args.jobs:
                _load(server.hosts, args)
            var = tmp / "var"
            env = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("MRT_", "EMAIL_", "ZK_", "DJANGO_"))
            }
            env.update(
                DJANGO_SETTINGS_MODULE="mrtadmin.settings",
                MRT_VAR_DIR=str(var),
                PYTHONPATH=str(ROOT),
            )
            py = sys.executable
            subprocess.run(
                [py, "manage.py", "migrate", "--noinput"],
                cwd=ROOT,
                env={**env, "ZK_HOSTS": server.hosts},
                check=True,
                capture_output=True,
            )
            subprocess.run(
                [py, "manage.py", "setupconsole"],
                cwd=ROOT,
                env={**env, "ZK_HOSTS": server.hosts},
                check=True,
                capture_output=True,
            )
            password = (var / "admin-password").read_text().strip()
            port = args.port or free_port()
            commands = {
                "consumer": [py, "manage.py", "runconsumer", "all"],
                "web": [
                    py,
                    str(Path(py).parent / "daphne"),
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "mrtadmin.asgi:application",
                ],
            }
            outs = {}
            for i, (name, command) in enumerate(commands.items()):
                proxy = _counting_proxy(server.port, args.zk_port and args.zk_port + 1 + i)
                proxies.append(proxy)
                outs[name] = (tmp / f"{name}.json", proxy)
                log = (tmp / f"{name}.log").open("wb")
                procs.append(
                    subprocess.Popen(
                        [py, __file__, "probe", str(outs[name][0]), "--", *command[1:]],
                        cwd=ROOT,
                        env={**env, "ZK_HOSTS": proxy.hosts},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            _wait(lambda: _healthy(port), 120, "daphne")
            with contextlib.ExitStack() as stack:
                if not args.no_browser:
                    stack.enter_context(_browser(port, password))
                time.sleep(args.settle)  # a rate over a span of time: nothing to wait for
                before = {
                    n: (_read(o), dict(p.counts), dict(p.paths)) for n, (o, p) in outs.items()
                }
                rss: dict[str, list[int]] = {n: [] for n in outs}
                end = time.monotonic() + args.minutes * 60
                while time.monotonic() < end:  # RSS every 30 s across the window
                    for n, (o, _p) in outs.items():
                        rss[n].append(_read(o)["rss_kib"])
                    time.sleep(min(30.0, max(0.0, end - time.monotonic())))
                after = {n: (_read(o), dict(p.counts), dict(p.paths)) for n, (o, p) in outs.items()}
            for proc in procs:
                if proc.poll() is not None:
                    print((tmp / "consumer.log").read_text()[-3000:])
                    raise RuntimeError("a measured process ended")
            _report(args, before, after, rss, machine())
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for proxy in proxies:
                proxy.close()
            server.stop()


def _healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def _browser(port: int, password: str):
    from playwright.sync_api import sync_playwright

    from tests.browser import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/login/?next=/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", password)
            page.press("#id_password", "Enter")
            page.wait_for_selector("#overview-live", timeout=120_000)
            yield page
        finally:
            browser.close()


def _load(hosts: str, args: argparse.Namespace) -> None:
    from bench.load import load
    from queues.core.states import JobState
    from queues.zk.batches import batch_create
    from queues.zk.client import connect
    from queues.zk.locks import collection_hold_set

    load(
        hosts,
        jobs=args.jobs + args.failed,
        batches=args.batches,
        distribution={JobState.COMPLETED: args.jobs, JobState.FAILED: args.failed},
        quiet=True,
    )
    if args.held_batches:
        # Batches of a held collection: the batch step moves them to Held once it runs.
        zk = connect(hosts)
        try:
            collection_hold_set(zk, HELD_PROFILE)
            for i in range(args.held_batches):
                batch_create(
                    zk,
                    submission={
                        "profile": HELD_PROFILE,
                        "submitter": "bench",
                        "title": f"held batch {i}",
                        "type": "file",
                        "payload_url": "http://127.0.0.1:9/a.txt",
                    },
                )
        finally:
            zk.stop()
            zk.close()


def _report(args: argparse.Namespace, before: dict, after: dict, rss: dict, machine: str) -> None:
    minutes = args.minutes
    case = (
        f"{args.jobs} Completed + {args.failed} Failed jobs in {args.batches} batches, "
        f"{args.held_batches} held"
        if args.jobs
        else "empty queue"
    )
    print(f"At rest, {case}: per minute over {minutes:g} min after a {args.settle:g} s settle")
    for name in after:
        (b, bz, bp), (a, az, ap) = before[name], after[name]
        zk = _diff(az, bz)
        print(f"  {name}:")
        total = sum(zk.values())
        ops = ", ".join(
            f"{OPCODES.get(int(k), k)} {v / minutes:.1f}"
            for k, v in sorted(zk.items(), key=lambda kv: -kv[1])
        )
        print(f"    ZooKeeper requests/min: {total / minutes:.1f} ({ops})")
        top = sorted(_diff(ap, bp).items(), key=lambda kv: -kv[1])[:8]
        for (op, path), v in top:
            print(f"      {OPCODES.get(op, op)} {path}: {v / minutes:.1f}")
        q = _diff(a["queries"], b["queries"])
        qs = ", ".join(
            f"{k} {v / minutes:.1f}" for k, v in sorted(q.items(), key=lambda kv: -kv[1])
        )
        print(f"    queries/min: {sum(q.values()) / minutes:.1f} ({qs})")
        lg = _diff(a["logs"], b["logs"])
        ls = ", ".join(
            f"{k} {v / minutes:.1f}" for k, v in sorted(lg.items(), key=lambda kv: -kv[1])
        )
        print(f"    log records/min: {sum(lg.values()) / minutes:.1f} ({ls})")
        print(f"    CPU s/min: {(a['cpu'] - b['cpu']) / minutes:.2f}")
        print(
            f"    RSS: {b['rss_kib'] / 1024:.1f} -> {a['rss_kib'] / 1024:.1f} MiB "
            f"({(a['rss_kib'] - b['rss_kib']) / minutes:+.0f} KiB/min); every 30 s: "
            + " ".join(f"{k / 1024:.1f}" for k in rss[name])
        )
    print(f"Machine: {machine}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "probe":
        out, rest = sys.argv[2], sys.argv[3:]
        if rest and rest[0] == "--":
            rest = rest[1:]
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mrtadmin.settings")
        probe(Path(out), rest)
    else:
        main()
