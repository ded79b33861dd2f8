"""Assertions on the raw ZooKeeper tree: the exact nodes and bytes of the contract."""

from __future__ import annotations

import json
import re
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from queues.core.states import BATCH_INDEX_FOLDERS, JOB, JOB_STEPS
from queues.zk import jobs
from queues.zk.records import Job

STAMP_RE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}$")
BID_RE = re.compile(r"^bid\d{10}$")
JID_RE = re.compile(r"^jid\d{10}$")
QID_RE = re.compile(r"^qid\d{10}$")


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def raw(zk: KazooClient, path: str) -> bytes:
    return zk.get(path)[0]


def read_json(zk: KazooClient, path: str) -> dict[str, Any]:
    """Decode a JSON node after checking it is compact, exactly as the contract writes it."""
    data = raw(zk, path)
    value = json.loads(data)
    assert data == compact(value), f"{path} is not compact JSON: {data!r}"
    return value


def assert_stamp(value: Any) -> None:
    assert isinstance(value, str) and STAMP_RE.fullmatch(value), f"bad timestamp {value!r}"


def assert_marker(zk: KazooClient, path: str) -> None:
    data, stat = zk.get(path)
    assert data == b"", f"{path} should be an empty marker, holds {data!r}"
    assert stat.ephemeralOwner == 0, f"{path} should be persistent"


def assert_job_status(
    zk: KazooClient,
    jid: str,
    *,
    status: str,
    last_successful: str | None,
    retry: int = 0,
    message: str = "",
) -> dict[str, Any]:
    """The status node is exactly {status, last_modified, last_successful_status, ...}."""
    path = f"/jobs/{jid}/status"
    value = read_json(zk, path)
    assert_stamp(value.get("last_modified"))
    expected = {
        "status": status,
        "last_modified": value["last_modified"],
        "last_successful_status": last_successful,
        "retry_count": retry,
        "message": message,
    }
    assert raw(zk, path) == compact(expected)
    return value


def assert_batch_status(zk: KazooClient, bid: str, *, status: str, message: str = "") -> None:
    path = f"/batches/{bid}/status"
    value = read_json(zk, path)
    assert_stamp(value.get("last_modified"))
    expected = {"status": status, "last_modified": value["last_modified"], "message": message}
    assert raw(zk, path) == compact(expected)


def job_index_paths(zk: KazooClient, jid: str) -> list[str]:
    """Every /jobs/states/*/PP-JID entry of a job, whatever folder it sits in."""
    found = []
    for folder in _children(zk, "/jobs/states"):
        for name in _children(zk, f"/jobs/states/{folder}"):
            if name.endswith(f"-{jid}"):
                found.append(f"/jobs/states/{folder}/{name}")
    return sorted(found)


def batch_index_paths(zk: KazooClient, bid: str, jid: str) -> list[str]:
    found = []
    for folder in _children(zk, f"/batches/{bid}/states"):
        if jid in _children(zk, f"/batches/{bid}/states/{folder}"):
            found.append(f"/batches/{bid}/states/{folder}/{jid}")
    return sorted(found)


def assert_indexed(
    zk: KazooClient, job_or_jid: Job | str, bid: str, state: str, priority: int = 5
) -> None:
    """The job sits in exactly one job-index folder and exactly one batch-index folder."""
    jid = job_or_jid if isinstance(job_or_jid, str) else job_or_jid.jid
    entry = f"/jobs/states/{state.lower()}/{priority:02d}-{jid}"
    assert job_index_paths(zk, jid) == [entry]
    assert_marker(zk, entry)
    folder = {"Completed": "batch-completed", "Failed": "batch-failed"}.get(
        state, "batch-processing"
    )
    assert folder in BATCH_INDEX_FOLDERS
    batch_entry = f"/batches/{bid}/states/{folder}/{jid}"
    assert batch_index_paths(zk, bid, jid) == [batch_entry]
    assert_marker(zk, batch_entry)


def snapshot(zk: KazooClient, *roots: str) -> dict[str, tuple[bytes, int, int]]:
    """Every node below the roots (none given: the whole tree) with its bytes, data version and
    child version: proof that nothing moved."""
    result: dict[str, tuple[bytes, int, int]] = {}

    def walk(path: str) -> None:
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            return
        result[path] = (data, stat.version, stat.cversion)
        for kid in sorted(_children(zk, path)):
            walk(f"{path}/{kid}")

    for root in roots or [f"/{top}" for top in _children(zk, "/")]:
        walk(root)
    return result


def _children(zk: KazooClient, path: str) -> list[str]:
    try:
        return zk.get_children(path)
    except NoNodeError:
        return []


def walk_job(zk: KazooClient, job: Job, target: str, *, priority: int | None = None) -> Job:
    """Move a job along the consumer chain (Pending -> ... -> target) as the daemons would.

    Held and Failed are reached straight from where the job is.
    """
    steps = list(JOB_STEPS)
    if target in ("Held", "Failed"):
        return jobs.job_transition(zk, job, target)
    for state in steps[steps.index(job.state) + 1 : steps.index(target) + 1]:
        job = jobs.job_transition(zk, job, state, priority=priority)
    assert JOB.is_state(job.state)
    return job


def failed_after(zk: KazooClient, job: Job, last_successful: str | None) -> Job:
    """A Failed job whose last_successful_status is ``last_successful``."""
    if last_successful is None:
        return jobs.job_transition(zk, job, "Failed", message="bad manifest")
    steps = list(JOB_STEPS)
    working = steps[steps.index(last_successful) + 1]
    job = walk_job(zk, job, working)
    assert job.status.last_successful_status == last_successful
    return jobs.job_transition(zk, job, "Failed", message=f"{working} broke")
