"""Every page and API view timed over HTTP through daphne: ``python bench/http_pages.py``.

For each queue size (default 1,000 and 100,000 jobs; ``--huge`` adds 1,000,000) it starts a
ZooKeeper of its own, loads it with the bulk loader (``bench/loader.py``, the same queue as
``bench/pages.py``), restarts ZooKeeper once (so the snapshot it writes at start holds the whole
tree, and its size can be printed) and starts a real daphne process on loopback serving the
console (``mrtadmin.asgi``, with its background fill of the read index), logged in over HTTP as
a superuser (pages) and with an API token (API views, ``/metrics``).

Cold: for each page (``/stuck/`` included), daphne is stopped and started again (a real
restart: a new process, an empty read index), and the page is asked for as soon as ``/healthz``
answers; the time of that first request is printed, with whether the answer said the index was
still loading and whether the index was in fact still filling right after it (``/api/failed``
asked next), and flagged when over 2 s. Warm: once the fill is done (``/api/failed`` no longer
says ``loading``), the sizes are timed in alternating rounds (a warm-up request, then
``--per-round`` timed requests per page and size), so that whatever else the machine does
weighs on both alike. Printed: median and 95th percentile per page and size, the ratio of the
largest size's median to the smallest's (and of the cold times), flagged when over 1.5x;
daphne's resident memory (after the fill, after timing, peak); ZooKeeper's node count,
snapshot size and data folder per size; for each search, how many of its answers named the job
searched for ("20 of 20"). The search page (``/search/``) opens the single exact match: its
answer is that redirect, found when it names the job (the job page it opens is timed as "job
page"). Then the consistency check, start to findings: started from ``/consistency/`` as an
admin would, walked by a ``runconsumer consistency`` process, the page polled until it shows
the findings (``--no-check`` skips it).

Grown (``--grown N``, default 19,000; 0 skips it): a queue that grows under a running console
is not a fresh one. A ZooKeeper of its own (never a kept one) with an empty queue, a daphne
started on it, then ``N`` jobs loaded by ``bench/loader.py`` while it runs and a viewer
reloads the overview, the batch list, ``/api/batches``, ``/failed/`` and ``/stuck/`` (its read
index kept current by watches); once the load is done and daphne has gone idle again (its CPU
time stops growing), a second daphne is started fresh on the same data, and both are timed on
every page in alternating rounds: grown against fresh, the ratio flagged over 1.5x.
``--sizes`` with no size runs the grown pass alone.

``--zk-dir DIR`` keeps each size's loaded ZooKeeper in ``DIR/zk-<size>`` and leaves it running
when the run ends: the next run with the same ``--zk-dir`` uses it as it is instead of loading
the queue again (loading and reading back 1,000,000 jobs takes about 15 minutes). The pages only
read, so a kept queue stays the queue that was loaded. ``--stop-zk`` stops the kept servers at
the end; the data stays in ``DIR`` for the next run.

Views not timed, and why:

- every POST (job, batch, access, hold, priority, cap and consumer actions, bulk actions, token
  create and revoke, alert rules and the test alert, notes, the consistency repair, the
  depositors' ``/poster/`` door, logout): they write, and a kept queue must stay the queue that
  was loaded (the consistency check's start is the one POST, timed start to findings);
- ``/bulk/<pk>/`` and ``/api/bulk/<pk>``: no bulk run exists in the benchmark's database;
- ``/reports/<bid>.csv|json``: the loader writes a status report on every batch not left
  Processing, and what it returns does not say which those are (``/reports/`` and
  ``/api/reports``, which list them, are timed);
- ``/downloads/<name>`` (static files) and ``/django-admin/`` (Django's own admin): nothing
  of the queue.

Why one module (about 1,200 lines): it is one command, and its passes (cold, warm, grown, the
consistency check) share the daphne they start, the logged-in sessions, the kept ZooKeeper
folders and the way a request is timed and printed; each pass is a function of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, machine, median, p95, setup_django

TARGET_RATIO = 1.5
USER, PASSWORD = "bench", "bench-password-1"
FILL_TIMEOUT = 1800.0
TICK = os.sysconf("SC_CLK_TCK")
IDLE_SHARE = 0.02  # a process using less CPU than this share of the wall time is idle
COLD_TARGET = 1.5  # s: every page answers within this of a cold start, saying what is loading


@dataclass
class Timings:
    times: list[float] = field(default_factory=list)
    error: str = ""
    missed: int = 0  # searches whose answer did not name the job searched for
    kib: float = 0.0  # size of the last answer (what the page shows)
    cold: float | None = None
    cold_loading: bool = False  # the cold answer said the read index was still loading
    cold_filling: bool = False  # the index was still filling right after the cold answer
    # The cold answer was a 503 saying only what is still loading (the page asks again).
    cold_waiting: bool = False

    @property
    def median_ms(self) -> float:
        return median(self.times) * 1000 if self.times else float("nan")

    @property
    def p95_ms(self) -> float:
        return p95(self.times) * 1000 if self.times else float("nan")


# name -> (kind, url template); kind "page" (session), "search" (session; a single exact match
# answers with a redirect to the job's page, which counts as found when it names the job) or
# "api" (token). Templates use the fields of Targets; {i} varies the job, batch or search target
# per request. Views left out, and why, are listed in the module's docstring.
PAGES: list[tuple[str, str, str]] = [
    ("overview", "page", "/"),
    ("batch list", "page", "/batches/"),
    ("batch page", "page", "/batches/{bid}/"),
    ("batch priority", "page", "/batches/{bid}/priority/"),
    ("fixed batches", "page", "/batches/fixed/"),
    ("job list, largest state", "page", "/jobs/?state={largest}"),
    ("job list, one collection", "page", "/jobs/?state={largest}&profile=bench_collection_03"),
    ("job page", "page", "/jobs/{jid}/"),
    ("job priority", "page", "/jobs/{jid}/priority/"),
    ("job list, one submitter", "page", "/jobs/?state={largest}&submitter=user007"),
    ("job list, every state, one submitter", "page", "/jobs/?submitter=user007"),
    ("job list, one batch", "page", "/jobs/?bid={bid}"),
    ("job list, priority", "page", "/jobs/?state={largest}&priority=5"),
    ("job list, in state an hour", "page", "/jobs/?state={largest}&min_age_hours=1"),
    ("job list, newest first", "page", "/jobs/?state={largest}&sort=newest"),
    ("job list, stuck only", "page", "/jobs/?stuck=on"),
    ("batch list, one state", "page", "/batches/?state=Completed"),
    ("batch list, one collection", "page", "/batches/?profile=bench_collection_03"),
    ("batch list, one submitter", "page", "/batches/?submitter=user007"),
    ("batch list, title", "page", "/batches/?q={batch_title}"),
    ("search by local id", "search", "/search/?q={local}"),
    ("search by ARK", "search", "/search/?q={ark}"),
    ("search by title", "search", "/search/?q={title}&field=title"),
    ("search by file name", "search", "/search/?q={filename}&field=filename"),
    ("search by error text", "search", "/search/?q={error}&field=error"),
    ("search by submitter", "page", "/search/?q=user007&field=submitter"),
    ("search, no field", "search", "/search/?q={title}"),
    ("job list search, local id", "page", "/jobs/?q={local}"),
    ("job list search, ARK", "page", "/jobs/?q={ark}"),
    ("failed, by batch", "page", "/failed/"),
    ("failed, by step", "page", "/failed/?group=step"),
    ("failed, one batch open", "page", "/failed/?group=batch&open={failed_bid}"),
    ("failed, one batch", "page", "/failed/?bid={failed_bid}"),
    ("failed, one collection", "page", "/failed/?profile=bench_collection_03"),
    ("failed, one step", "page", "/failed/?step=Storing"),
    ("failed causes", "page", "/failed/causes/"),
    ("stuck", "page", "/stuck/"),
    ("consumers", "page", "/consumers/"),
    ("history", "page", "/history/"),
    ("reports", "page", "/reports/"),
    ("holds", "page", "/holds/"),
    ("holds, node failed", "page", "/holds/node-failed/"),
    ("collections", "page", "/collections/"),
    ("collection page", "page", "/collections/bench_collection_03/"),
    ("alerts", "page", "/alerts/"),
    ("access", "page", "/access/"),
    ("audit", "page", "/audit/"),
    ("bulk runs", "page", "/bulk/"),
    ("tokens", "page", "/tokens/"),
    ("submit", "page", "/submit/"),
    ("consistency page", "page", "/consistency/"),
    ("zk health", "page", "/health/zk/"),
    ("login page", "page", "/login/"),
    ("/metrics", "api", "/metrics"),
    ("/healthz", "api", "/healthz"),
    ("api overview", "api", "/api/overview"),
    ("api jobs, largest state", "api", "/api/jobs?state={largest}"),
    ("api jobs, search", "api", "/api/jobs?q={local}"),
    ("api job", "api", "/api/jobs/{jid}"),
    ("api failed", "api", "/api/failed"),
    ("api failed causes", "api", "/api/failed/causes"),
    ("api batches", "api", "/api/batches"),
    ("api batch", "api", "/api/batches/{bid}"),
    ("api access", "api", "/api/access"),
    ("api holds", "api", "/api/holds"),
    ("api caps", "api", "/api/caps"),
    ("api consumers", "api", "/api/consumers"),
    ("api reports", "api", "/api/reports"),
    ("api consistency", "api", "/api/consistency"),
    ("api audit", "api", "/api/audit"),
    ("api notes", "api", "/api/notes?kind=job&item={jid}"),
]
SEARCHES = (
    "search by local id",
    "search by ARK",
    "search by title",
    "search by file name",
    "search by error text",
    "search, no field",
    "job list search, local id",
    "job list search, ARK",
    "api jobs, search",
)


@dataclass
class Targets:
    """What the URLs of one queue name: jobs, batches and search keys picked from the load."""

    largest: str
    jids: list[str]
    bids: list[str]
    failed_bids: list[str]
    searched: list[str]  # Completed jobs searched for (they have a local ID and an ARK)
    failed_jids: list[str] = field(default_factory=list)  # Failed jobs searched for by error

    def url(self, template: str, i: int) -> tuple[str, str]:
        """The URL of the i-th request, and the job ID it must show ("" when none)."""
        jid = self.searched[i % len(self.searched)]
        if "{error}" in template:
            jid = self.failed_jids[i % len(self.failed_jids)]
        values = {
            "largest": self.largest,
            "jid": self.jids[i % len(self.jids)],
            "bid": self.bids[i % len(self.bids)],
            "failed_bid": self.failed_bids[i % len(self.failed_bids)],
            "local": f"local-{jid[-7:]}",
            "ark": f"ark:/99999/fk4{jid[-8:]}",
            # The loader's texts (bench/loader.py): each names its job; a title names the last
            # six digits, so at 1,000,000 jobs two jobs may share one.
            "title": f"Object {jid[-6:]}".replace(" ", "+"),
            "filename": f"{jid}.bin",
            "error": f"benchmark+of+{jid}",
            "batch_title": f"Benchmark+batch+{self.bids[i % len(self.bids)][-6:]}",
        }
        searched = ("{local}", "{ark}", "{title}", "{filename}", "{error}")
        wanted = jid if any(key in template for key in searched) else ""
        return template.format(**values), wanted


def own_database(env: dict[str, str], hosts: str) -> Path:
    """The database of the consoles of one ZooKeeper: a copy of the prepared one (its user and
    token), made on first use. Consoles of different queues never share one: a database
    belongs to one queue, as in production, and the text index keys its rows by job number, so
    a console sharing another queue's rows would take them for its own jobs' (and take away
    those its ZooKeeper does not list, while the other console writes)."""
    prepared = Path(env["MRT_DATABASE_PATH"])
    own = prepared.with_name(f"{prepared.stem}-{re.sub(r'[^0-9A-Za-z]+', '-', hosts)}.sqlite3")
    if not own.exists():
        with (
            contextlib.closing(sqlite3.connect(prepared)) as source,
            contextlib.closing(sqlite3.connect(own)) as copy,
        ):
            source.backup(copy)
    return own


class Console:
    """One daphne process serving the console against one queue (the consoles of one
    ZooKeeper share a database of their own)."""

    def __init__(
        self, size: int, hosts: str, env: dict[str, str], scratch: Path, label: str = ""
    ) -> None:
        self.size = size
        self.hosts = hosts
        self.env = {**env, "ZK_HOSTS": hosts, "MRT_DATABASE_PATH": str(own_database(env, hosts))}
        self.log = scratch / f"daphne-{label or size}.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.session: Any = None
        self.token = ""
        self.started_at = 0.0
        self.first_answer = 0.0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        from queues.services.zkserver import free_port

        self.port = free_port()
        self.started_at = time.monotonic()
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(ROOT / ".venv/bin/daphne"),
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "mrtadmin.asgi:application",
                ],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        import requests

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne exited; see {self.log}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.base}/healthz", timeout=5).status_code == 200:
                    self.first_answer = time.monotonic() - self.started_at
                    return
            time.sleep(0.05)
        raise RuntimeError(f"daphne did not answer within 120 s; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def rss_mib(self, field_name: str = "VmRSS") -> float:
        if self.proc is None:
            return float("nan")
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field_name}:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self) -> float:
        """User and system CPU time the process has used so far."""
        if self.proc is None:
            return float("nan")
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    def wait_idle(self, *, step: float = 2.0, timeout: float = 1800.0) -> tuple[float, float]:
        """Wait until the process has gone idle: its CPU time grew by less than ``IDLE_SHARE``
        of the wall time in two steps in a row. Returns (seconds waited, CPU seconds used)."""
        began, cpu = time.monotonic(), self.cpu_seconds()
        quiet = 0
        last = cpu
        while quiet < 2:
            if time.monotonic() - began > timeout:
                raise RuntimeError(f"daphne ({self.log.name}) did not go idle in {timeout:.0f} s")
            time.sleep(step)
            now = self.cpu_seconds()
            quiet = quiet + 1 if now - last < IDLE_SHARE * step else 0
            last = now
        return time.monotonic() - began, last - cpu

    def log_in(self) -> None:
        """A browser's login: the form's CSRF cookie and token, then the session cookie."""
        import requests

        session = requests.Session()
        form = session.get(f"{self.base}/login/", timeout=30)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        answer = session.post(
            f"{self.base}/login/",
            data={
                "username": USER,
                "password": PASSWORD,
                "csrfmiddlewaretoken": token.group(1) if token else "",
            },
            headers={"Referer": f"{self.base}/login/"},
            timeout=30,
            allow_redirects=False,
        )
        if answer.status_code != 302:
            raise RuntimeError(f"login answered {answer.status_code}")
        self.session = session

    def get(self, kind: str, url: str) -> tuple[float, int, str]:
        """Time one request; (seconds, status, body). A search's redirect to the single exact
        match is its answer (status 200, the body naming where it sends the browser): the
        job's page it opens is timed as "job page"."""
        import requests

        headers = {"Authorization": f"Bearer {self.token}"} if kind == "api" else {}
        client = requests if kind == "api" else self.session
        began = time.perf_counter()
        response = client.get(
            f"{self.base}{url}", headers=headers, timeout=600, allow_redirects=kind != "search"
        )
        body = response.text  # read to the end: the whole answer is timed
        elapsed = time.perf_counter() - began
        if kind == "search" and response.status_code == 302:
            return elapsed, 200, f"redirected to {response.headers.get('Location', '')}"
        return elapsed, response.status_code, body

    def wait_until_written(self, timeout: float = FILL_TIMEOUT) -> float:
        """Seconds from the start until the search's text index in the database has every
        job the fill read (its "caught up" line in daphne's log since this start)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.log.open("rb") as log:
                log.seek(self.log_offset)
                if b"search text index: caught up" in log.read():
                    return time.monotonic() - self.started_at
            time.sleep(1.0)
        raise RuntimeError("the search text index did not catch up")

    def filling(self) -> bool:
        """Whether the read index's background fill is still under way (``/api/failed``)."""
        _t, status, body = self.get("api", "/api/failed")
        return status == 200 and '"loading": "' in body and '"loading": ""' not in body

    def wait_until_filled(self) -> float:
        """Seconds from the start until the read index's background fill is done."""
        deadline = time.monotonic() + FILL_TIMEOUT
        while time.monotonic() < deadline:
            _t, status, body = self.get("api", "/api/failed")
            # (a console from before the background fill has no "loading": filled at once)
            if status == 200 and ('"loading": ""' in body or '"loading"' not in body):
                return time.monotonic() - self.started_at
            time.sleep(0.25)
        raise RuntimeError(f"the read index of {self.size} jobs was not filled in time")


@dataclass
class CheckRun:
    """One consistency check started from the page and walked by a consistency daemon."""

    seconds: float = float("nan")  # the page's POST to the page showing the findings
    state: str = ""
    jobs: int = 0
    findings: int = 0
    walker_peak_mib: float = float("nan")  # the daemon process's peak RSS (VmHWM)
    web_before_mib: float = float("nan")
    web_after_mib: float = float("nan")
    web_peak_mib: float = float("nan")


def _proc_mib(pid: int, field_name: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _forget_var_dir(hosts: str) -> None:
    """Let this run's walker name its own shared folder: a queue kept from an earlier run
    (``--zk-dir``) names that run's scratch folder, long gone, and daemons refuse another one
    (``queues.daemons.vardir``); no daemon of that run is left to share it with."""
    from queues.zk import client as zkmod
    from queues.zk.consumers import VAR_DIR

    client = zkmod.connect(hosts)
    try:
        if client.exists(VAR_DIR) is not None:
            client.delete(VAR_DIR)
    finally:
        client.stop()
        client.close()


def time_check(console: Console, env: dict[str, str], scratch: Path) -> CheckRun:
    """Start the check from the page as an admin would (POST with the form's CSRF token), with
    a ``runconsumer consistency`` process running beside daphne, and poll the page until it
    shows the run finished: the time from the click to the findings, and both processes' RSS."""
    from django.core.management import call_command

    # runconsumer refuses a database with migrations pending (a checkout updated mid-run).
    call_command("migrate", verbosity=0, interactive=False)
    _forget_var_dir(console.env["ZK_HOSTS"])
    figures = CheckRun(web_before_mib=console.rss_mib())
    log = scratch / f"walker-{console.size}.log"
    with log.open("ab") as out:
        walker = subprocess.Popen(
            [
                str(ROOT / ".venv/bin/python"),
                "manage.py",
                "runconsumer",
                "consistency",
                "--poll",
                "0.2",
            ],
            cwd=ROOT,
            env=console.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 120
        while b"consistency: started" not in log.read_bytes():
            if walker.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"runconsumer consistency did not start:\n{tail}")
            time.sleep(0.1)
        page = console.session.get(f"{console.base}/consistency/", timeout=60).text
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        began = time.monotonic()
        answer = console.session.post(
            f"{console.base}/consistency/",
            data={"csrfmiddlewaretoken": token.group(1) if token else ""},
            headers={"Referer": f"{console.base}/consistency/"},
            timeout=60,
            allow_redirects=False,
        )
        if answer.status_code != 303:
            raise RuntimeError(f"starting the check answered {answer.status_code}")
        while True:
            body = console.session.get(f"{console.base}/consistency/", timeout=60).text
            state = re.search(r'id="consistency-run"[^>]*data-state="([a-z]+)"', body)
            figures.state = state.group(1) if state else "?"
            if figures.state in ("finished", "failed", "interrupted"):
                break
            if walker.poll() is not None:
                raise RuntimeError(f"runconsumer consistency exited; see {log}")
            time.sleep(0.2)
        figures.seconds = time.monotonic() - began
        checked = re.search(r"Checked (\d+) jobs", body)
        found = re.search(r"✖ (\d+) finding", body)
        figures.jobs = int(checked.group(1)) if checked else 0
        figures.findings = int(found.group(1)) if found else 0
        figures.walker_peak_mib = _proc_mib(walker.pid, "VmHWM")
        figures.web_after_mib = console.rss_mib()
        figures.web_peak_mib = console.rss_mib("VmHWM")
    finally:
        walker.send_signal(signal.SIGTERM)
        try:
            walker.wait(30)
        except subprocess.TimeoutExpired:
            walker.kill()
            walker.wait(10)
    print(
        f"  {console.size}: {figures.state} after {figures.seconds:.1f} s, walker peak "
        f"{figures.walker_peak_mib:.0f} MiB",
        flush=True,
    )
    return figures


def check_table(checks: dict[int, CheckRun], sizes: list[int]) -> list[str]:
    """The consistency check per size; the time per job flagged when it grows by over 1.5x."""
    lines = [
        "Consistency check started from the page (POST) until the page shows its findings, "
        "walked by a `runconsumer consistency` process (daphne only records the run):",
        f"  {'jobs':>9}{'start to findings':>19}{'per 1,000 jobs':>16}{'walker peak RSS':>17}"
        f"{'web RSS before / after / peak':>32}  result",
    ]
    small = checks[sizes[0]]
    for size in sizes:
        c = checks[size]
        per = c.seconds / size * 1000
        ratio = per / (small.seconds / sizes[0] * 1000)
        lines.append(
            f"  {size:>9}{c.seconds:>17.1f} s{per:>13.2f} s{c.walker_peak_mib:>13.0f} MiB"
            f"{c.web_before_mib:>14.0f} / {c.web_after_mib:.0f} / {c.web_peak_mib:.0f} MiB"
            f"  {c.state}, {c.jobs} jobs, {c.findings} findings"
            + (
                f"; per job {ratio:.2f}x the smallest: {_verdict(ratio)}"
                if size != sizes[0]
                else ""
            )
        )
    return lines


def loading_said(body: str) -> bool:
    """Whether an answer says the read index is still loading: a page's notice, an API
    answer's ``loading``, or ``/metrics``'s gauge."""
    return (
        'id="index-loading"' in body
        or ('"loading": "' in body and '"loading": ""' not in body)
        or "\nmrt_index_loading 1.0" in body
    )


@dataclass
class Queue:
    size: int
    batches: int
    server: Any  # LocalZooKeeper
    targets: Targets
    load_seconds: float
    nodes: int
    znodes: str = "?"
    snapshot_mib: float = float("nan")
    data_mib: float = float("nan")


def batches_for(size: int) -> int:
    """100 batches for 1,000 jobs (a full batch-list page), 50 jobs a batch from 100,000 on."""
    return max(1, min(size // 10, max(100, size // 50)))


def _folder_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1024**2


def load_queue(size: int, batches: int, scratch: Path) -> Queue:
    from bench.load import load
    from queues.services.zkserver import LocalZooKeeper, free_port

    server = LocalZooKeeper(scratch / f"zk-{size}", free_port())
    kept = server.directory / "queue.json"
    if kept.exists():  # loaded by an earlier run (--zk-dir): started as it is
        return _kept_queue(server, json.loads(kept.read_text()))
    if (server.directory / "data").exists():
        raise RuntimeError(f"{server.directory} holds a load that did not finish: remove it")
    server.start()
    print(f"loading {size} jobs in {batches} batches", flush=True)
    began = time.monotonic()
    result = load(server.hosts, jobs=size, batches=batches, quiet=size < 10_000)
    seconds = time.monotonic() - began
    # A restart makes the server write a snapshot of the whole tree as it starts.
    server.stop()
    _start_loaded(server, size)
    rng = random.Random(7)
    states = result.jobs_by_state
    failed = set(states.get("Failed", []))
    failed_bids: list[str] = []
    if failed:
        from queues.zk import client as zkmod

        client = zkmod.connect(server.hosts)
        try:
            for jid in rng.sample(sorted(failed), min(25, len(failed))):
                failed_bids.append(client.get(f"/jobs/{jid}/bid")[0].decode())
        finally:
            client.stop()
            client.close()
    targets = Targets(
        largest=result.largest_state,
        jids=rng.sample(states[result.largest_state], 25),
        bids=rng.sample(result.batches, min(25, len(result.batches))),
        failed_bids=failed_bids or result.batches[:1],
        searched=rng.sample(states["Completed"], 25),
        failed_jids=rng.sample(sorted(failed), min(25, len(failed))),
    )
    facts = {
        "size": size,
        "batches": batches,
        "targets": dataclasses.asdict(targets),
        "load_seconds": seconds,
        "nodes": result.nodes,
    }
    kept.write_text(json.dumps(facts))
    return _kept_queue(server, facts)


def _start_loaded(server: Any, size: int) -> None:
    # Reading back a million jobs' snapshot and log takes minutes on a busy machine.
    try:
        server.start(wait=max(60.0, size / 1_000))
    except BaseException:
        server.stop()  # a server that started but was not waited for long enough
        raise


def _kept_queue(server: Any, facts: dict[str, Any]) -> Queue:
    """The queue a loaded server holds (``facts``: what its load wrote to queue.json)."""
    from queues.services.zkserver import four_letter

    if not server.is_serving():
        server.follow_running()  # still running from the last run, on its own port
    if not server.is_serving():
        print(f"starting the kept ZooKeeper of {facts['size']} jobs", flush=True)
        _start_loaded(server, facts["size"])
    snapshots = sorted(
        (server.directory / "data" / "version-2").glob("snapshot.*"),
        key=lambda p: p.stat().st_mtime,
    )
    mntr = four_letter(server.port, "mntr") or ""
    count = re.search(r"zk_znode_count\s+(\d+)", mntr)
    targets = Targets(**facts["targets"])
    if not targets.failed_jids:  # a queue.json written before they were picked
        targets.failed_jids = _failed_jids(server.hosts)
    return Queue(
        size=facts["size"],
        batches=facts["batches"],
        server=server,
        targets=targets,
        load_seconds=facts["load_seconds"],
        nodes=facts["nodes"],
        znodes=count.group(1) if count else "?",
        snapshot_mib=snapshots[-1].stat().st_size / 1024**2 if snapshots else float("nan"),
        data_mib=_folder_mib(server.directory / "data"),
    )


def _failed_jids(hosts: str) -> list[str]:
    """25 Failed jobs of a loaded queue, picked as the other targets are."""
    from queues.zk import client as zkmod

    client = zkmod.connect(hosts)
    try:
        names = client.get_children("/jobs/states/failed")
    finally:
        client.stop()
        client.close()
    jids = sorted(name.rsplit("-", 1)[-1] for name in names)
    return random.Random(7).sample(jids, min(25, len(jids)))


def prepare_database(env: dict[str, str]) -> str:
    """Migrate the benchmark's own database, create its superuser; returns an API token."""
    os.environ.update(env)
    setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from queues.operator.audit import ApiToken

    call_command("migrate", verbosity=0, interactive=False)
    call_command("setupconsole", stdout=io.StringIO())
    user_model = get_user_model()
    user = user_model.objects.filter(username=USER).first()
    if user is None:
        user = user_model.objects.create_superuser(USER, "bench@example.org", PASSWORD)
    _token, key = ApiToken.issue(user=user, name="bench")
    return key


def wanted_page(name: str, only: list[str], skip: list[str]) -> bool:
    if only and not any(word in name for word in only):
        return False
    return not any(word in name for word in skip)


def time_cold(
    console: Console, queue: Queue, figures: dict[str, Timings], only: list[str], skip: list[str]
) -> None:
    for i, (name, kind, template) in enumerate(PAGES):
        if not wanted_page(name, only, skip):
            continue
        console.restart()
        url, _wanted = queue.targets.url(template, i)
        elapsed, status, body = console.get(kind, url)
        timing = figures[name]
        # A page that needs what the fill is still reading answers 503 saying so (and asks
        # again by itself): an answer in time, counted apart from one with content.
        waiting = status == 503 and loading_said(body)
        if status != 200 and not waiting:
            timing.error = f"{url} answered {status} cold"
            continue
        timing.cold = elapsed
        timing.cold_waiting = waiting
        timing.cold_loading = loading_said(body)
        timing.cold_filling = console.filling()
        said = (
            "503: only that it was loading"
            if waiting
            else "said it was loading"
            if timing.cold_loading
            else "did not say it was loading"
        )
        filling = "still filling after it" if timing.cold_filling else "filled"
        print(
            f"  cold {queue.size}: {name} {elapsed * 1000:.0f} ms ({said}; index {filling})",
            flush=True,
        )


def time_warm(
    runs: list[tuple[Console, Queue, dict[str, Timings]]],
    *,
    rounds: int,
    per_round: int,
    only: list[str],
    skip: list[str],
) -> None:
    """Time every page on each (console, queue) in alternating rounds, into its figures."""
    for r in range(rounds):
        for name, kind, template in PAGES:
            if not wanted_page(name, only, skip):
                continue
            for console, queue, figures in runs:
                timing = figures[name]
                if timing.error:
                    continue
                base = r * (per_round + 1)
                url, _w = queue.targets.url(template, base)
                _t, status, _b = console.get(kind, url)  # warm-up
                if status != 200:
                    timing.error = f"{url} answered {status}"
                    continue
                for k in range(per_round):
                    url, wanted = queue.targets.url(template, base + 1 + k)
                    elapsed, status, body = console.get(kind, url)
                    if status != 200:
                        timing.error = f"{url} answered {status}"
                        break
                    if wanted and wanted not in body:
                        timing.missed += 1
                    timing.times.append(elapsed)
                    timing.kib = len(body.encode()) / 1024


def _kib(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def _verdict(ratio: float) -> str:
    return "ok" if ratio <= TARGET_RATIO else f"OVER {TARGET_RATIO}x"


def table(figures: dict[int, dict[str, Timings]], sizes: list[int]) -> list[str]:
    small, large = sizes[0], sizes[-1]
    head = f"  {'page / API view':<26}"
    for size in sizes:
        head += f"{f'{size} jobs: median':>22}{'p95':>9}"
    head += f"{'ratio':>8}      answer size"
    lines = [head]
    for name, _kind, _t in PAGES:
        if not any(figures[s][name].times or figures[s][name].error for s in sizes):
            continue
        row = f"  {name:<26}"
        errors = [figures[s][name].error for s in sizes if figures[s][name].error]
        if errors:
            lines.append(f"{row}not measured: {errors[0]}")
            continue
        for size in sizes:
            t = figures[size][name]
            row += f"{t.median_ms:>19.1f} ms{t.p95_ms:>6.1f} ms"
        ratio = figures[large][name].median_ms / figures[small][name].median_ms
        row += f"{ratio:>7.2f}x  {_verdict(ratio):<10}"
        row += " / ".join(_kib(figures[s][name].kib) for s in sizes) + " KiB"
        if name in SEARCHES:
            row += "  " + found_note([figures[s][name] for s in sizes])
        lines.append(row)
    return lines


def found_note(timings: list[Timings]) -> str:
    """'20 of 20 found' per column of a search's figures, flagged when one missed."""
    found = " / ".join(f"{len(t.times) - t.missed} of {len(t.times)}" for t in timings)
    return f"found {found}" + ("  SEARCH MISSED" if any(t.missed for t in timings) else "")


def cold_table(figures: dict[int, dict[str, Timings]], sizes: list[int]) -> list[str]:
    small, large = sizes[0], sizes[-1]
    lines = [
        f"  {'page / API view':<26}"
        + "".join(f"{f'{s} jobs':>16}" for s in sizes)
        + f"{'ratio':>8}"
    ]
    for name, _kind, _t in PAGES:
        if name not in figures[small] or any(figures[s][name].cold is None for s in sizes):
            continue
        row = f"  {name:<26}"
        cold = {s: figures[s][name].cold or 0.0 for s in sizes}
        for size in sizes:
            t = figures[size][name]
            note = (
                "~" if t.cold_waiting else "*" if t.cold_loading else "!" if t.cold_filling else " "
            )
            row += f"{cold[size] * 1000:>13.0f} ms{note}"
        ratio = cold[large] / cold[small]
        row += f"{ratio:>7.2f}x  {_verdict(ratio)}"
        if cold[large] > COLD_TARGET:
            row += f"  OVER {COLD_TARGET:.1f} s"
        lines.append(row)
    waiting = sum(1 for t in figures[large].values() if t.cold_waiting)
    lines.append(
        "  * the answer said the read index was still loading; ~ a 503 saying only that (the "
        "page asks again by itself); ! it did not say so, and the index was still filling "
        f"right after it. {waiting} views answered ~ at {large} jobs."
    )
    return lines


def targets_of(result: Any, hosts: str) -> Targets:
    """What the URLs name on a queue ``bench/loader.py`` loaded (``result``: its LoadResult):
    the jobs, batches and searches picked as for the loaded sizes."""
    from queues.zk import client as zkmod

    rng = random.Random(7)
    states = result.jobs_by_state
    failed = sorted(states.get("Failed", []))
    client = zkmod.connect(hosts)
    try:
        failed_bids = [
            client.get(f"/jobs/{jid}/bid")[0].decode()
            for jid in rng.sample(failed, min(25, len(failed)))
        ]
    finally:
        client.stop()
        client.close()
    return Targets(
        largest=result.largest_state,
        jids=rng.sample(states[result.largest_state], 25),
        bids=rng.sample(result.batches, min(25, len(result.batches))),
        failed_bids=failed_bids or result.batches[:1],
        searched=rng.sample(states["Completed"], 25),
        failed_jids=rng.sample(sorted(failed), min(25, len(failed))),
    )


@dataclass
class GrownRun:
    """A queue loaded under a running console, and a console started fresh on it."""

    size: int
    load_seconds: float
    idle_after: float  # s from the load's end until the grown console was idle
    cpu_load: float  # CPU seconds the grown console used from the load's start until idle
    figures: dict[str, dict[str, Timings]]  # "grown" | "fresh" -> page -> timings
    rss: dict[str, tuple[float, float]]  # "grown" | "fresh" -> (before timing, after) MiB
    fresh_filled: float


VIEWED = ("/", "/batches/", "/api/batches", "/failed/", "/stuck/")  # what the viewer reloads


def view_while(console: Console, done: threading.Event, pause: float = 0.5) -> None:
    """An operator's open console while the queue grows: the overview, the batch list, the
    batches API, the failed and stuck pages, reloaded in turn every ``pause`` seconds until
    ``done``, so the read index refreshes what the watches marked stale as it goes."""
    for url in itertools.cycle(VIEWED):
        if done.wait(pause):
            return
        console.get("api" if url.startswith("/api/") else "page", url)


def grown_pass(
    size: int,
    env: dict[str, str],
    token: str,
    scratch: Path,
    *,
    rounds: int,
    per_round: int,
    only: list[str],
    skip: list[str],
) -> GrownRun:
    """A console started on an empty queue of a throwaway ZooKeeper of its own, ``size`` jobs
    loaded by ``bench/loader.py`` while it runs (its read index kept current by watches), timed
    once it has gone idle again; beside it, a console started afresh on the same data. Both
    run at once and are timed in alternating rounds."""
    from bench.load import load
    from queues.services.zkserver import LocalZooKeeper, free_port
    from queues.zk import client as zkmod

    server = LocalZooKeeper(scratch / "zk-grown", free_port())
    server.start()
    consoles: dict[str, Console] = {}
    try:
        zk = zkmod.connect(server.hosts)
        try:
            zkmod.ensure_layout(zk)
        finally:
            zk.stop()
            zk.close()
        for label in ("grown", "fresh"):
            consoles[label] = Console(size, server.hosts, env, scratch, label=label)
            consoles[label].token = token
        grown = consoles["grown"]
        grown.start()
        grown.log_in()
        grown.wait_until_filled()
        grown.wait_idle()
        cpu = grown.cpu_seconds()
        print(f"grown pass: loading {size} jobs while daphne runs, viewed", flush=True)
        viewing = threading.Event()
        viewer = threading.Thread(target=view_while, args=(grown, viewing), daemon=True)
        viewer.start()
        began = time.monotonic()
        try:
            result = load(server.hosts, jobs=size, batches=batches_for(size), quiet=size < 10_000)
        finally:
            viewing.set()
            viewer.join()
        load_seconds = time.monotonic() - began
        idle_after, _used = grown.wait_idle()
        cpu_load = grown.cpu_seconds() - cpu
        print(
            f"  loaded in {load_seconds:.1f} s; daphne idle {idle_after:.1f} s later, "
            f"{cpu_load:.1f} s of its CPU since the load began",
            flush=True,
        )
        queue = Queue(
            size=size,
            batches=batches_for(size),
            server=server,
            targets=targets_of(result, server.hosts),
            load_seconds=load_seconds,
            nodes=result.nodes,
        )
        fresh = consoles["fresh"]
        fresh.start()
        fresh.log_in()
        fresh_filled = fresh.wait_until_filled()
        fresh.wait_idle()
        figures = {label: {n: Timings() for n, _k, _t in PAGES} for label in consoles}
        rss = {label: c.rss_mib() for label, c in consoles.items()}
        print("grown pass: timing the grown and the fresh console", flush=True)
        time_warm(
            [(c, queue, figures[label]) for label, c in consoles.items()],
            rounds=rounds,
            per_round=per_round,
            only=only,
            skip=skip,
        )
        return GrownRun(
            size=size,
            load_seconds=load_seconds,
            idle_after=idle_after,
            cpu_load=cpu_load,
            figures=figures,
            rss={label: (rss[label], c.rss_mib()) for label, c in consoles.items()},
            fresh_filled=fresh_filled,
        )
    finally:
        for console in consoles.values():
            console.stop()
        server.stop()


def grown_table(run: GrownRun) -> list[str]:
    """Grown against fresh, page by page, the ratio flagged when over 1.5x."""
    grown, fresh = run.figures["grown"], run.figures["fresh"]
    lines = [
        f"A queue grown under a running console ({run.size} jobs loaded in "
        f"{run.load_seconds:.1f} s into an empty ZooKeeper while daphne ran, its read index "
        f"kept current by watches, a viewer reloading {', '.join(VIEWED)} in turn every "
        f"0.5 s; daphne idle {run.idle_after:.1f} s after the load, "
        f"{run.cpu_load:.1f} s of its CPU) against a daphne started fresh on the same data "
        f"(index filled {run.fresh_filled:.1f} s after its start); both running, timed in "
        "alternating rounds:",
        f"  {'page / API view':<26}{'grown: median':>16}{'p95':>9}{'fresh: median':>17}"
        f"{'p95':>9}{'grown/fresh':>13}",
    ]
    for name, _kind, _t in PAGES:
        g, f = grown[name], fresh[name]
        if not (g.times or g.error or f.times or f.error):
            continue
        row = f"  {name:<26}"
        if g.error or f.error:
            lines.append(f"{row}not measured: {g.error or f.error}")
            continue
        ratio = g.median_ms / f.median_ms
        row += (
            f"{g.median_ms:>13.1f} ms{g.p95_ms:>6.1f} ms{f.median_ms:>14.1f} ms"
            f"{f.p95_ms:>6.1f} ms{ratio:>12.2f}x  {_verdict(ratio)}"
        )
        if name in SEARCHES:
            row += "  " + found_note([g, f])
        lines.append(row)
    for label in ("grown", "fresh"):
        before, after = run.rss[label]
        lines.append(f"  {label} daphne RSS: {before:.0f} MiB before timing, {after:.0f} MiB after")
    return lines


@contextlib.contextmanager
def scratch_folder() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="mrt-bench-http-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="*", default=[1_000, 100_000], help="none: the grown pass only"
    )
    parser.add_argument("--huge", action="store_true", help="add 1,000,000 jobs (long)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--per-round", type=int, default=5, help="timed requests per round")
    parser.add_argument("--pages", nargs="*", default=[], help="only pages whose name has one")
    parser.add_argument("--skip", nargs="*", default=[], help="leave out pages whose name has one")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold (restart) pass")
    parser.add_argument(
        "--no-check", action="store_true", help="skip the consistency check (start to findings)"
    )
    parser.add_argument(
        "--grown",
        type=int,
        default=19_000,
        metavar="N",
        help="also load N jobs into an empty queue while a console runs and time it against a "
        "console started fresh on the same data (0: skip)",
    )
    parser.add_argument(
        "--zk-dir",
        default="",
        help="keep each size's loaded ZooKeeper here, running, and use it again in later runs",
    )
    parser.add_argument(
        "--stop-zk", action="store_true", help="with --zk-dir: stop the kept servers at the end"
    )
    args = parser.parse_args(argv)
    began_load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    sizes = sorted(set(args.sizes + ([1_000_000] if args.huge else [])))
    # 10.5 million nodes at 1,000,000 jobs: with 3 GB the server's collector paused long
    # enough for the loader's session to drop at 776,000 jobs.
    largest = max([*sizes, args.grown])
    os.environ.setdefault("ZK_LOCAL_HEAP", "8g" if largest >= 1_000_000 else "3g")
    if largest >= 1_000_000:
        # A state folder of 600,000 jobs is listed in one answer of about 12 MB: past the
        # default 4 MiB packet limit of the local server (ZK_JUTE_MAXBUFFER,
        # queues/services/zkserver.py).
        os.environ.setdefault("ZK_JUTE_MAXBUFFER", str(64 * 1024**2))
    lines: list[str] = []
    with scratch_folder() as scratch:
        env = {
            **os.environ,
            "MRT_VAR_DIR": str(scratch / "var"),
            "MRT_DATABASE_PATH": str(scratch / "bench.sqlite3"),
            "DJANGO_SECRET_KEY": "bench-" + "x" * 50,
            "DJANGO_SETTINGS_MODULE": "mrtadmin.settings",
            "MRT_OWN_STEPS": "",
        }
        env.pop("DATABASE_URL", None)
        (scratch / "var").mkdir()  # made by manage.py for a console; here by the benchmark
        token = prepare_database(env)
        queues: list[Queue] = []
        consoles: list[Console] = []
        try:
            zk_dir = Path(args.zk_dir).resolve() if args.zk_dir else scratch
            for size in sizes:
                queues.append(load_queue(size, batches_for(size), zk_dir))
            for queue in queues:
                console = Console(queue.size, queue.server.hosts, env, scratch)
                console.token = token
                consoles.append(console)
            figures = {q.size: {n: Timings() for n, _k, _t in PAGES} for q in queues}
            starts: dict[int, tuple[float, float]] = {}
            written: dict[int, float] = {}
            for console, queue in zip(consoles, queues, strict=True):
                console.start()
                console.log_in()
                # The first start on an empty database writes every job's texts (as the first
                # start of a console of this version does); the restarts below find them.
                console.wait_until_filled()
                written[queue.size] = console.wait_until_written()
                print(
                    f"  {queue.size}: search texts written {written[queue.size]:.0f} s after "
                    "the first start",
                    flush=True,
                )
                console.restart()
                console.log_in()
                if not args.no_cold:
                    print(f"cold pass, {queue.size} jobs (daphne restarted before each page)")
                    time_cold(console, queue, figures[queue.size], args.pages, args.skip)
                    console.restart()
                starts[queue.size] = (console.first_answer, console.wait_until_filled())
            rss_filled = {c.size: c.rss_mib() for c in consoles}
            print("warm pass", flush=True)
            time_warm(
                [(c, q, figures[q.size]) for c, q in zip(consoles, queues, strict=True)],
                rounds=args.rounds,
                per_round=args.per_round,
                only=args.pages,
                skip=args.skip,
            )
            rss_timed = {c.size: c.rss_mib() for c in consoles}
            checks: dict[int, CheckRun] = {}
            if not args.no_check:
                for console, queue in zip(consoles, queues, strict=True):
                    print(f"consistency check, {queue.size} jobs", flush=True)
                    try:
                        checks[queue.size] = time_check(console, env, scratch)
                    except Exception as exc:  # the tables above are still printed
                        print(f"  {queue.size}: the check failed: {exc}", flush=True)
                        checks[queue.size] = CheckRun(state=f"failed: {str(exc)[:200]}")
            if queues:
                lines.append(
                    f"Every page and API view over HTTP through daphne (a real server process on "
                    f"loopback), {args.rounds * args.per_round} timed requests per page and size "
                    f"after the read index is filled:"
                )
                lines += table(figures, sizes)
                if not args.no_cold:
                    lines.append(
                        "First request right after a real restart of daphne (cold: a new process, "
                        "its read index filling in the background):"
                    )
                    lines += cold_table(figures, sizes)
                if checks:
                    lines += check_table(checks, sizes)
                if len(queues) > 1:
                    small, large = queues[0].size, queues[-1].size
                    per_job = (rss_filled[large] - rss_filled[small]) * 1024**2 / (large - small)
                    lines.append(
                        f"Web RSS per job once filled: {per_job:.0f} bytes "
                        f"(({rss_filled[large]:.0f} - {rss_filled[small]:.0f} MiB) / "
                        f"({large} - {small} jobs))"
                    )
                for console, queue in zip(consoles, queues, strict=True):
                    first, filled = starts[queue.size]
                    lines.append(
                        f"{queue.size} jobs: daphne answered {first:.1f} s after it was started, "
                        f"read index filled after {filled:.1f} s; on an empty database, the "
                        f"search's text index held every job {written[queue.size]:.0f} s after "
                        "the first start"
                    )
                    lines.append(
                        f"  web RSS: {rss_filled[queue.size]:.0f} MiB once filled, "
                        f"{rss_timed[queue.size]:.0f} MiB after timing every page, "
                        f"{console.rss_mib():.0f} MiB after the consistency check too, peak "
                        f"{console.rss_mib('VmHWM'):.0f} MiB"
                    )
                    lines.append(
                        f"  ZooKeeper: {queue.znodes} znodes, snapshot "
                        f"{queue.snapshot_mib:.1f} MiB, data folder {queue.data_mib:.1f} MiB; "
                        f"loaded {queue.nodes} nodes in "
                        f"{queue.load_seconds:.1f} s ({queue.batches} batches)"
                    )
            if args.grown:
                run = grown_pass(
                    args.grown,
                    env,
                    token,
                    scratch,
                    rounds=args.rounds,
                    per_round=args.per_round,
                    only=args.pages,
                    skip=args.skip,
                )
                lines += grown_table(run)
        finally:
            for console in consoles:
                console.stop()
            for queue in queues:
                if args.zk_dir and not args.stop_zk:
                    print(
                        f"ZooKeeper of {queue.size} jobs left running on {queue.server.hosts} "
                        f"(pid {queue.server.running()}; data in {queue.server.directory})"
                    )
                else:
                    queue.server.stop()
    print()
    for line in lines:
        print(line)
    print(f"Machine: {machine()}")
    # The machine is shared: its load average beside the figures, at the start and the end.
    ended = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"Load average (1, 5, 15 min): {began_load} at the start, {ended} at the end")
    return lines


if __name__ == "__main__":
    main()
