"""Bulk loading and raw write-rate probes, for benchmarks and chaos runs.

``bulk_load`` fills a (chroot of a) ZooKeeper with a realistic queue in the contract's layout:
every node a job or batch made through ``job_create``/``batch_create`` and a run of the daemons
would leave behind, written with pipelined asynchronous requests (one multi-operation per job,
thousands in flight) instead of the several round trips per item the service functions make.
``transition_rate`` measures the server's rate for the multi-operation shape of a job transition,
so the daemons' throughput can be judged against what the same server can do at all.
"""

from __future__ import annotations

import posixpath
import random
import threading
import time
import uuid as uuidlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from queues.core.states import (
    BATCH_INDEX_FOLDERS,
    JOB,
    JOB_STEPS,
    BatchState,
    JobState,
    job_batch_folder,
)
from queues.zk import paths
from queues.zk.client import Client, connect, ensure_layout
from queues.zk.codecs import encode_int, encode_json, now_stamp

# A queue the size the issue asks for: most jobs done long ago, thousands in every other state.
DEFAULT_DISTRIBUTION: dict[str, float] = {
    JobState.COMPLETED: 0.60,
    JobState.FAILED: 0.08,
    JobState.PENDING: 0.12,
    JobState.HELD: 0.02,
    JobState.ESTIMATING: 0.03,
    JobState.PROVISIONING: 0.03,
    JobState.DOWNLOADING: 0.04,
    JobState.PROCESSING: 0.03,
    JobState.STORING: 0.02,
    JobState.RECORDING: 0.015,
    JobState.NOTIFY: 0.015,
}
# Terminal states first: older batches (lower IDs) hold finished jobs, the newest hold the queue.
STATE_ORDER = (
    JobState.COMPLETED,
    JobState.FAILED,
    *JOB_STEPS[-2:0:-1],
    JobState.HELD,
    JobState.PENDING,
)
PROFILES = tuple(f"bench_collection_{i:02d}" for i in range(12))
SUBMITTERS = tuple(f"user{i:03d}" for i in range(40))
# The last successful step a Failed job is given (it failed in the one after): every step but
# the last two (a test narrows it so that one failing step holds a page of jobs).
FAILED_AFTER = JOB_STEPS[:-2]
# Requests in flight at once: enough to keep the server busy, few enough to bound memory.
WINDOW = 4000


@dataclass
class LoadResult:
    batches: list[str] = field(default_factory=list)
    jobs_by_state: dict[str, list[str]] = field(default_factory=dict)
    nodes: int = 0
    seconds: float = 0.0

    @property
    def jobs(self) -> int:
        return sum(len(v) for v in self.jobs_by_state.values())

    @property
    def largest_state(self) -> str:
        return max(self.jobs_by_state, key=lambda s: len(self.jobs_by_state[s]))


def counts_for(jobs: int, distribution: Mapping[str, float]) -> dict[str, int]:
    """Whole job counts per state that add up to ``jobs`` exactly."""
    for state in distribution:
        if not JOB.is_state(state) or state == JobState.DELETED:
            raise ValueError(f"{state!r} is not a job state a queue can hold")
    total = sum(distribution.values())
    counts = {s: int(jobs * f / total) for s, f in distribution.items()}
    largest = max(counts, key=lambda s: counts[s])
    counts[largest] += jobs - sum(counts.values())
    return counts


def _pipelined(
    requests: Iterable[Callable[[], Any]],
    *,
    window: int = WINDOW,
    on_result: Callable[[int, Any], None] | None = None,
) -> int:
    """Issue async requests keeping at most ``window`` in flight; raise the first failure."""
    in_flight: deque[tuple[int, Any]] = deque()
    done = 0

    def drain(keep: int) -> None:
        nonlocal done
        while len(in_flight) > keep:
            index, result = in_flight.popleft()
            value = result.get()
            if isinstance(value, list):
                errors = [r for r in value if isinstance(r, Exception)]
                if errors:
                    raise errors[0]
            if on_result is not None:
                on_result(index, value)
            done += 1

    for index, issue in enumerate(requests):
        in_flight.append((index, issue()))
        if len(in_flight) >= window:
            drain(window // 2)
    drain(0)
    return done


def _sequential(zk: Client, prefix: str, count: int, *, per_request: int = 250) -> list[str]:
    """``count`` new sequential nodes under ``prefix``; the server picks the IDs.

    Sequential creates go many to a multi-operation: one request (and one log entry) for a few
    hundred IDs instead of one each.
    """
    found: list[str] = [""] * count
    sizes = [min(per_request, count - start) for start in range(0, count, per_request)]

    def issue(size: int) -> Callable[[], Any]:
        txn = zk.transaction()
        for _ in range(size):
            txn.create(prefix, b"", sequence=True)
        commit: Callable[[], Any] = txn.commit_async
        return commit

    def keep(index: int, created: list[str]) -> None:
        base = index * per_request
        for offset, path in enumerate(created):
            found[base + offset] = posixpath.basename(path)

    _pipelined((issue(size) for size in sizes), on_result=keep)
    return found


def _job_status(state: str, rng: random.Random, stamp: str, jid: str = "") -> dict[str, Any]:
    steps = JOB_STEPS
    if state == JobState.FAILED:
        last = rng.choice(FAILED_AFTER)
        # The job's ID makes each message findable by error text alone; the failed causes page
        # takes job IDs out of a message, so its groups are those of one message per step.
        message = f"{steps[steps.index(last) + 1]}: simulated failure for the benchmark of {jid}"
    elif state == JobState.HELD:
        last, message = None, "collection held"
    elif state == JobState.PENDING:
        last, message = None, ""
    else:
        last, message = steps[steps.index(state) - 1], ""
    return {
        "status": state,
        "last_modified": stamp,
        "last_successful_status": last,
        "retry_count": 0,
        "message": message,
    }


def _batch_state(job_states: Sequence[str]) -> str:
    if any(job_batch_folder(s) == "batch-processing" for s in job_states):
        return BatchState.PROCESSING
    return BatchState.FAILED if JobState.FAILED in job_states else BatchState.COMPLETED


def bulk_load(
    zk: Client,
    *,
    batches: int,
    jobs: int,
    distribution: Mapping[str, float] | None = None,
    seed: int = 1,
    progress: Callable[[str], None] | None = None,
) -> LoadResult:
    """Create ``batches`` batches holding ``jobs`` jobs in the contract's layout.

    Jobs are spread evenly over the batches in creation order, with the finished states in the
    oldest batches and the queue in the newest, as a long-running ingest queue looks. Batches are
    Completed/Failed (with a status report) when all their jobs finished, else Processing.
    """
    if batches < 1 or jobs < batches:
        raise ValueError("need at least one batch and at least one job per batch")
    say = progress or (lambda _m: None)
    rng = random.Random(seed)
    started = time.monotonic()
    result = LoadResult()
    ensure_layout(zk)
    for state in JOB.states:
        zk.ensure_path(paths.job_state_folder(state))

    counts = counts_for(jobs, distribution or DEFAULT_DISTRIBUTION)
    plan = [s for s in STATE_ORDER if s in counts for _ in range(counts[s])]
    plan += [s for s in counts if s not in STATE_ORDER for _ in range(counts[s])]
    per_batch = [jobs // batches + (1 if i < jobs % batches else 0) for i in range(batches)]

    bids = _sequential(zk, f"{paths.BATCHES}/bid", batches)
    say(f"created {batches} batch nodes ({time.monotonic() - started:.1f}s)")
    stamp = now_stamp()
    jids_all: list[str] = []
    batch_plan: list[tuple[str, list[str]]] = []
    position = 0
    for bid, size in zip(bids, per_batch, strict=True):
        batch_plan.append((bid, plan[position : position + size]))
        position += size

    def batch_request(bid: str, states: list[str], jids: list[str]) -> Callable[[], Any]:
        batch_state = _batch_state(states)
        batch_uuid = str(uuidlib.UUID(int=rng.getrandbits(128), version=4))
        profile = rng.choice(PROFILES)
        submission = {
            "batchID": batch_uuid,
            "profile": profile,
            "submitter": rng.choice(SUBMITTERS),
            "title": f"Benchmark batch {bid[-6:]}",
            "type": "single-file-batch-manifest",
            "payload_url": f"https://example.org/bench/{bid}.checkm",
            "submitted": stamp,
        }
        profiles[bid] = profile
        txn = zk.transaction()
        txn.create(paths.batch_node(bid, "submission"), encode_json(submission))
        txn.create(
            paths.batch_node(bid, "status"),
            encode_json({"status": batch_state, "last_modified": stamp, "message": ""}),
        )
        txn.create(paths.uuid_entry(batch_uuid), bid.encode())
        txn.create(paths.batch_node(bid, "states"), b"")
        for folder in BATCH_INDEX_FOLDERS:
            txn.create(paths.batch_index(bid, folder), b"")
        if batch_state != BatchState.PROCESSING:
            txn.create(
                paths.batch_node(bid, "status-report"),
                encode_json(
                    {
                        "last_modified": stamp,
                        "failed_jobs": sorted(
                            j for j, s in zip(jids, states, strict=True) if s == JobState.FAILED
                        ),
                        "successful_jobs": sorted(
                            j for j, s in zip(jids, states, strict=True) if s == JobState.COMPLETED
                        ),
                    }
                ),
            )
        result.nodes += len(txn.operations)
        commit: Callable[[], Any] = txn.commit_async
        return commit

    # Jobs first (their IDs are needed by the batch's report), batch by batch in chunks.
    chunk_batches = max(1, 4000 // max(1, jobs // batches))
    profiles: dict[str, str] = {}
    for start in range(0, len(batch_plan), chunk_batches):
        part = batch_plan[start : start + chunk_batches]
        need = sum(len(states) for _bid, states in part)
        new_jids = _sequential(zk, f"{paths.JOBS}/jid", need)
        jids_all += new_jids
        requests: list[Callable[[], Any]] = []
        offset = 0
        for bid, states in part:
            jids = new_jids[offset : offset + len(states)]
            offset += len(states)
            # One session's requests are applied in order: the batch's index folders exist
            # before its jobs' entries are created in them.
            requests.append(batch_request(bid, states, jids))
            for jid, state in zip(jids, states, strict=True):
                result.jobs_by_state.setdefault(state, []).append(jid)
                requests.append(
                    _job_request(
                        zk,
                        result,
                        bid=bid,
                        jid=jid,
                        state=state,
                        profile=profiles[bid],
                        rng=rng,
                        stamp=stamp,
                    )
                )
        _pipelined(requests)
        done = len(jids_all)
        elapsed = time.monotonic() - started
        say(
            f"loaded {done}/{jobs} jobs in {start + len(part)}/{batches} batches "
            f"({elapsed:.1f}s, {done / elapsed:.0f} jobs/s)"
        )
    result.batches = bids
    result.nodes += batches + jobs
    result.seconds = time.monotonic() - started
    return result


def _job_request(
    zk: Client,
    result: LoadResult,
    *,
    bid: str,
    jid: str,
    state: str,
    profile: str,
    rng: random.Random,
    stamp: str,
) -> Callable[[], Any]:
    """One job's nodes and index entries as one multi-operation, ready to be sent."""
    priority = 5 if rng.random() < 0.85 else rng.randint(1, 9)
    title = f"Object {jid[-6:]}"
    configuration = {
        "profile": profile,
        "submitter": rng.choice(SUBMITTERS),
        "payload_url": f"https://example.org/bench/{jid}/content.bin",
        "type": "file",
        "localID": f"local-{jid[-7:]}",
        "title": title,
        "filename": f"{jid}.bin",
        "batch_id": bid,
    }
    status = _job_status(state, rng, stamp, jid)
    reached = (
        state if state in JOB_STEPS else (status["last_successful_status"] or JobState.PENDING)
    )
    txn = zk.transaction()
    txn.create(paths.job_node(jid, "bid"), bid.encode())
    txn.create(paths.job_node(jid, "priority"), encode_int(priority))
    txn.create(paths.job_node(jid, "space_needed"), encode_int(rng.randint(10_000, 50_000_000)))
    txn.create(paths.job_node(jid, "configuration"), encode_json(configuration))
    txn.create(paths.job_node(jid, "status"), encode_json(status))
    # Processing mints the ARK and writes the ERC: jobs past it carry both nodes.
    if JOB_STEPS.index(reached) >= JOB_STEPS.index(JobState.STORING):
        ark = f"ark:/99999/fk4{jid[-8:]}"
        txn.create(
            paths.job_node(jid, "identifiers"),
            encode_json({"primary_id": ark, "local_id": [configuration["localID"]]}),
        )
        txn.create(
            paths.job_node(jid, "metadata"),
            encode_json(
                {"erc_who": "Benchmark", "erc_what": title, "erc_when": "2026", "erc_where": ark}
            ),
        )
    txn.create(paths.job_index_entry(state, priority, jid), b"")
    txn.create(paths.batch_index_entry(bid, state, jid), b"")
    result.nodes += len(txn.operations)
    commit: Callable[[], Any] = txn.commit_async
    return commit


# Raw rate -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RateResult:
    threads: int
    transactions: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.transactions / self.seconds if self.seconds else 0.0


def probe_transition(zk: Any, base: str, where: list[str], n: int, *, locked: bool) -> None:
    """The rate probe's ``n``-th transition: item ``n % len(where)`` moved between folders
    ``a`` and ``b`` (its status written, its state and batch index entries moved, its lock taken
    first and deleted in the same transaction when ``locked``), as one transaction."""
    i = n % len(where)
    src = where[i]
    dst = "b" if src == "a" else "a"
    lock = f"{base}/status/{i}/lock"
    if locked:
        zk.create(lock, b"", ephemeral=True)
    txn = zk.transaction()
    txn.set_data(f"{base}/status/{i}", encode_json({"status": dst, "n": n}))
    txn.delete(f"{base}/{src}/{i}")
    txn.create(f"{base}/{dst}/{i}", b"")
    txn.delete(f"{base}/b{src}/{i}")
    txn.create(f"{base}/b{dst}/{i}", b"")
    if locked:
        txn.delete(lock)
    results = txn.commit()
    if any(isinstance(r, Exception) for r in results):
        raise RuntimeError(f"rate probe transaction failed: {results}")
    where[i] = dst


def transition_rate(
    hosts: str,
    *,
    threads: int = 4,
    seconds: float = 10.0,
    items: int = 200,
    start_at: float | None = None,
    locked: bool = False,
) -> RateResult:
    """Synchronous multi-operations in the shape of a job transition, from ``threads`` clients.

    Each thread owns ``items`` fake jobs under ``/bench-rate/<thread>`` and moves one after
    another between two index folders: set the status data, delete the old index entry, create
    the new one, and the same for the batch index entry -- the five operations ``job_transition``
    commits. Every thread has its own session, as separate daemon processes do.
    ``start_at`` (a ``time.time()``) lines up the measuring windows of several processes.

    With ``locked`` each move is what the contract asks of a consumer at the least: create the
    job's ephemeral lock, then the same multi-operation deleting the lock too -- two writes.
    """
    root = f"/bench-rate-{uuidlib.uuid4().hex[:8]}"
    setup = connect(hosts)
    counts = [0] * threads
    try:
        creates: list[Callable[[], Any]] = []
        for t in range(threads):
            for i in range(items):
                base = f"{root}/t{t}"
                for path in (f"{base}/status/{i}", f"{base}/a/{i}", f"{base}/ba/{i}"):
                    creates.append(partial(setup.create_async, path, b"{}", makepath=True))
        # makepath issues its parents serially: create one per folder first, then pipeline.
        for t in range(threads):
            for folder in ("status", "a", "b", "ba", "bb"):
                setup.ensure_path(f"{root}/t{t}/{folder}")
        _pipelined(creates)
        stop = threading.Event()
        go = threading.Barrier(threads + 1)

        def worker(t: int) -> None:
            zk = connect(hosts)
            base = f"{root}/t{t}"
            where = ["a"] * items
            try:
                go.wait()
                n = 0
                while not stop.is_set():
                    probe_transition(zk, base, where, n, locked=locked)
                    n += 1
                    counts[t] = n
            finally:
                zk.stop()
                zk.close()

        workers = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
        for w in workers:
            w.start()
        go.wait()
        if start_at is not None:
            time.sleep(max(0.0, start_at - time.time()))
        before = sum(counts)
        began = time.monotonic()
        time.sleep(seconds)
        total = sum(counts) - before
        elapsed = time.monotonic() - began
        stop.set()
        for w in workers:
            w.join(timeout=30)
        return RateResult(threads, total, elapsed)
    finally:
        setup.delete(root, recursive=True)
        setup.stop()
        setup.close()


# Jobs that wait ---------------------------------------------------------------------------------


def load_waiting(
    zk: Client,
    *,
    bid: str,
    state: str,
    count: int,
    configuration: Mapping[str, Any],
    store_node: int | None = None,
    retry_next: float | None = None,
) -> list[str]:
    """``count`` jobs of batch ``bid`` (made by ``batch_create``) in ``state``, one multi each,
    pipelined: what a queue of jobs that wait looks like. ``store_node``: the jobs carry the
    ``store`` node Processing writes, bound for that storage node (Storing, Recording);
    ``retry_next``: their status says a service outside is to be tried again then (epoch
    seconds; ``queues.core.retries``). Returns the job IDs in creation order."""
    from queues.core.retries import RETRY_KEY

    stamp = now_stamp()
    jids = _sequential(zk, f"{paths.JOBS}/jid", count)
    status: dict[str, Any] = {
        "status": state,
        "last_successful_status": None,
        "last_modified": stamp,
        "message": "",
        "retry_count": 0,
    }
    if retry_next is not None:
        status[RETRY_KEY] = {
            "state": state,
            "service": "storage node 9501",
            "attempt": 1,
            "first": round(time.time(), 3),
            "next": retry_next,
            "reasons": [f"{int(time.time())} HTTP 503"],
        }

    def request(jid: str) -> Callable[[], Any]:
        txn = zk.transaction()
        txn.create(paths.job_node(jid, "bid"), bid.encode())
        txn.create(paths.job_node(jid, "priority"), encode_int(5))
        txn.create(paths.job_node(jid, "space_needed"), encode_int(0))
        txn.create(paths.job_node(jid, "configuration"), encode_json(dict(configuration)))
        txn.create(paths.job_node(jid, "status"), encode_json(status))
        if store_node is not None:
            ark = f"ark:/99999/fk4{jid[-8:]}"
            txn.create(
                paths.job_node(jid, "identifiers"),
                encode_json({"primary_id": ark, "local_id": []}),
            )
            mode = f"add/{store_node}/ark%3A%2F99999%2Ffk4{jid[-8:]}"
            txn.create(
                paths.job_node(jid, "store"),
                encode_json({"manifest_url": "http://127.0.0.1:9/m", "mode": mode, "delete": ""}),
            )
            txn.create(
                paths.job_node(jid, "inventory"),
                encode_json({"manifest_url": "http://127.0.0.1:9/m", "mode": ""}),
            )
        txn.create(paths.job_index_entry(state, 5, jid), b"")
        txn.create(paths.batch_index_entry(bid, state, jid), b"")
        commit: Callable[[], Any] = txn.commit_async
        return commit

    zk.ensure_path(paths.job_state_folder(state))
    zk.ensure_path(paths.batch_index(bid, job_batch_folder(state)))
    _pipelined(request(jid) for jid in jids)
    return jids
