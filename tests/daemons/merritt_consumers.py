"""Merritt's own queue consumers, written in Python from the rules of the mrt-zk library and of
mrt-ingest's consumers (docs/merritt-ownership.md has each rule with its source):

* ``acquire_pending_batch``: the children of ``/batches`` in name order; the first without a
  ``states`` child whose ``lock`` can be created (an ephemeral node; one that exists means
  "skip") is loaded, gets its ``states`` node and the status Processing.
* ``acquire_batch_for_reporting``: the first batch whose ``states/batch-processing`` exists and
  is empty, whose status is neither Completed nor Failed and whose lock can be created; its
  status becomes Reporting.
* ``acquire_job(state)``: the entries of ``/jobs/states/<state>`` in name order (``PP-JID``);
  the first whose ``/jobs/JID/lock`` can be created.
* A status is written the library's way: the status node, then the job's index entry, then its
  batch index entry, each a separate write.

What a consumer then does is mrt-ingest's: ``BatchConsumer`` looks for the batch in its queue
folder on ingest's disk (``<ingest>/queue/<batchID>``), makes its jobs and moves the batch to
Reporting; a missing folder is an exception it only logs, so the batch stays in Processing under
the consumer's lock. Each job consumer (Pending, Estimating, Provisioning, Downloading,
Processing, Notify) works in ``<ingest>/queue/<batchID>/<jobID>`` and moves the job on, or fails
it when that folder is not there. Merritt's storage service takes Storing jobs (it reads the
``store`` node) and its inventory service Recording jobs (the ``inventory`` node). The batch
report consumer reports a batch from its queue folder and moves it to Completed (Failed when a
job failed).

Every move is recorded in ``moved`` as ``(id, state it left)``, every failure in ``failed``, so a
test can say which side did each step.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote_plus, unquote_plus

from queues.zk.batches import batch_load
from queues.zk.errors import NodeExists, NoNode
from queues.zk.records import Batch

from .merritt_ingest import merritt_batch, merritt_job

JOB_CHAIN = (
    "Pending",
    "Estimating",
    "Provisioning",
    "Downloading",
    "Processing",
    "Storing",
    "Recording",
    "Notify",
    "Completed",
)
# The job states each of Merritt's services acquires (mrt-ingest consumer/*.java, mrt-store's
# storage consumer, mrt-inventory's consumer).
INGEST_JOB_STATES = ("Pending", "Estimating", "Provisioning", "Downloading", "Processing", "Notify")
STORAGE_JOB_STATES = ("Storing",)
INVENTORY_JOB_STATES = ("Recording",)
BATCH_FOLDERS = {
    "Completed": "batch-completed",
    "Failed": "batch-failed",
    "Deleted": "batch-deleted",
}


def now() -> str:
    return datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %z")


@dataclass
class IngestDisk:
    """Merritt ingest's queue folder: the batches its door accepted (batchID -> how many jobs
    their upload makes) and the jobs its batch consumer made (batchID, jobID)."""

    batches: dict[str, int] = field(default_factory=dict)
    jobs: set[tuple[str, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def accept(self, batch_id: str, jobs: int) -> None:
        with self.lock:
            self.batches[batch_id] = jobs

    def has_batch(self, batch_id: str) -> bool:
        with self.lock:
            return batch_id in self.batches

    def has_job(self, batch_id: str, job_id: str) -> bool:
        with self.lock:
            return (batch_id, job_id) in self.jobs


def write_merritt_batch(zk: Any, disk: IngestDisk, jobs: int, **submission: Any) -> Batch:
    """A batch as Merritt's ingest door writes it (its folder on ingest's disk, its node)."""
    batch = merritt_batch(zk, **submission)
    disk.accept(batch.submission["batchID"], jobs)
    return batch


class MerrittConsumers:
    """Merritt's consumers on their own ZooKeeper session; ``services`` picks which run:
    ``ingest`` (batches, reporting and the ingest job states), ``storage``, ``inventory``."""

    def __init__(self, zk: Any, disk: IngestDisk, services: tuple[str, ...]) -> None:
        self.zk = zk
        self.disk = disk
        self.services = services
        self.moved: Counter[tuple[str, str]] = Counter()
        self.failed: dict[str, str] = {}
        self.stranded: list[str] = []  # batches a BatchConsumer took and could not work

    # The library's reads and writes -------------------------------------------------------

    def _json(self, path: str) -> dict[str, Any]:
        data, _ = self.zk.get(path)
        return dict(json.loads(data.decode("utf-8")))

    def _lock(self, path: str) -> bool:
        if self.zk.exists(path) is not None:
            return False
        try:
            self.zk.create(path, b"", ephemeral=True)
        except (NodeExists, NoNode):
            return False
        return True

    def _unlock(self, path: str) -> None:
        self.zk.delete(path)

    def _set_batch_status(self, bid: str, state: str, message: str = "") -> None:
        path = f"/batches/{bid}/status"
        status = self._json(path)
        status.update(status=state, last_modified=now(), message=message)
        self.zk.set(path, json.dumps(status, separators=(",", ":")).encode())

    def _set_job_status(self, jid: str, state: str, message: str = "") -> None:
        base = f"/jobs/{jid}"
        status = self._json(f"{base}/status")
        old = status["status"]
        if state not in ("Failed", "Deleted"):
            status["last_successful_status"] = old
        status.update(status=state, last_modified=now(), message=message)
        self.zk.set(f"{base}/status", json.dumps(status, separators=(",", ":")).encode())
        priority = int(self.zk.get(f"{base}/priority")[0])
        bid = self.zk.get(f"{base}/bid")[0].decode()
        entry = f"{priority:02d}-{jid}"
        self.zk.delete(f"/jobs/states/{old.lower()}/{entry}")
        self.zk.ensure_path(f"/jobs/states/{state.lower()}")
        self.zk.create(f"/jobs/states/{state.lower()}/{entry}", b"")
        before = BATCH_FOLDERS.get(old, "batch-processing")
        after = BATCH_FOLDERS.get(state, "batch-processing")
        if before != after:
            self.zk.delete(f"/batches/{bid}/states/{before}/{jid}")
            self.zk.ensure_path(f"/batches/{bid}/states/{after}")
            self.zk.create(f"/batches/{bid}/states/{after}/{jid}", b"")

    # Acquire, as the library does ---------------------------------------------------------

    def acquire_pending_batch(self) -> str | None:
        for bid in sorted(self.zk.get_children("/batches")):
            if self.zk.exists(f"/batches/{bid}/states") is not None:
                continue
            if self._lock(f"/batches/{bid}/lock"):
                self.zk.create(f"/batches/{bid}/states", b"")
                self._set_batch_status(bid, "Processing")
                return bid
        return None

    def acquire_batch_for_reporting(self) -> str | None:
        for bid in sorted(self.zk.get_children("/batches")):
            folder = f"/batches/{bid}/states/batch-processing"
            if self.zk.exists(folder) is None or self.zk.get_children(folder):
                continue
            if self._json(f"/batches/{bid}/status")["status"] in ("Completed", "Failed"):
                continue
            if self._lock(f"/batches/{bid}/lock"):
                self._set_batch_status(bid, "Reporting")
                return bid
        return None

    def acquire_job(self, state: str) -> str | None:
        folder = f"/jobs/states/{state.lower()}"
        if self.zk.exists(folder) is None:
            return None
        for entry in sorted(self.zk.get_children(folder)):
            jid = entry[3:]
            if self._lock(f"/jobs/{jid}/lock"):
                return jid
        return None

    # What Merritt's services then do ------------------------------------------------------

    def batch_consumer_once(self) -> bool:
        bid = self.acquire_pending_batch()
        if bid is None:
            return False
        submission = self._json(f"/batches/{bid}/submission")
        batch_id = str(submission.get("batchID", ""))
        if not self.disk.has_batch(batch_id):
            # ProcessManager finds no queue folder: the exception is logged, nothing else.
            self.stranded.append(bid)
            return True
        batch = batch_load(self.zk, bid)
        for _ in range(self.disk.batches[batch_id]):
            job = merritt_job(self.zk, batch)
            with self.disk.lock:
                self.disk.jobs.add((batch_id, job.configuration["jobID"]))
        self._set_batch_status(bid, "Reporting")
        self.moved[(bid, "Pending")] += 1
        self._unlock(f"/batches/{bid}/lock")
        return True

    def report_consumer_once(self) -> bool:
        bid = self.acquire_batch_for_reporting()
        if bid is None:
            return False
        submission = self._json(f"/batches/{bid}/submission")
        if not self.disk.has_batch(str(submission.get("batchID", ""))):
            self.stranded.append(bid)
            return True
        folder = f"/batches/{bid}/states/batch-failed"
        has_failure = self.zk.exists(folder) is not None and bool(self.zk.get_children(folder))
        self._set_batch_status(bid, "Failed" if has_failure else "Completed")
        self.moved[(bid, "Reporting")] += 1
        self._unlock(f"/batches/{bid}/lock")
        return True

    def job_consumer_once(self, state: str) -> bool:
        jid = self.acquire_job(state)
        if jid is None:
            return False
        config = self._json(f"/jobs/{jid}/configuration")
        problem = self._problem(jid, state, config)
        if problem:
            self._set_job_status(jid, "Failed", problem)
            self.failed[jid] = problem
        else:
            self._hand_on(jid, state)
            self._set_job_status(jid, JOB_CHAIN[JOB_CHAIN.index(state) + 1], "Success")
            self.moved[(jid, state)] += 1
        self._unlock(f"/jobs/{jid}/lock")
        return True

    def _write(self, path: str, value: dict[str, Any]) -> None:
        data = json.dumps(value, separators=(",", ":")).encode()
        if self.zk.exists(path) is None:
            self.zk.create(path, data)
        else:
            self.zk.set(path, data)

    def _hand_on(self, jid: str, state: str) -> None:
        """What a step leaves for the next service: ingest's Processing mints the ARK and
        writes ``store``, storage writes ``inventory`` (the nodes' forms: docs/merritt-ingest-
        formats.md)."""
        if state == "Processing":
            ark = f"ark:/99999/fk4{jid[3:]}"
            self._write(f"/jobs/{jid}/identifiers", {"primary_id": ark, "local_id": []})
            self._write(
                f"/jobs/{jid}/store",
                {
                    "manifest_url": f"http://ingest.example.org/queue/{jid}/mrt-manifest.txt",
                    "mode": f"add/9501/{quote_plus(ark)}",
                    "delete": "",
                },
            )
        elif state == "Storing":
            ark = self._json(f"/jobs/{jid}/identifiers")["primary_id"]
            url = f"http://store.example.org:35121/manifest/9501/{quote_plus(ark)}"
            self._write(f"/jobs/{jid}/inventory", {"manifest_url": url, "mode": ""})

    def _problem(self, jid: str, state: str, config: dict[str, Any]) -> str:
        if state in STORAGE_JOB_STATES:
            store = self._json(f"/jobs/{jid}/store")
            action, node, ark = str(store["mode"]).split("/")
            int(node)
            if action not in ("add", "update") or not unquote_plus(ark).startswith("ark:/"):
                return f"storage: bad store mode {store['mode']!r}"
            return ""
        if state in INVENTORY_JOB_STATES:
            url = self._json(f"/jobs/{jid}/inventory").get("manifest_url", "")
            return "" if url else "inventory: no manifest_url"
        batch_id, job_id = str(config.get("batchID", "")), str(config.get("jobID", ""))
        if not self.disk.has_job(batch_id, job_id):
            return f"ingest: no queue folder queue/{batch_id}/{job_id} on ingest's disk"
        return ""

    def job_states(self) -> tuple[str, ...]:
        states: tuple[str, ...] = ()
        if "ingest" in self.services:
            states += INGEST_JOB_STATES
        if "storage" in self.services:
            states += STORAGE_JOB_STATES
        if "inventory" in self.services:
            states += INVENTORY_JOB_STATES
        return states

    def run_once(self) -> bool:
        """One pass of every running consumer, each taking what it can; True if any worked."""
        worked = False
        if "ingest" in self.services:
            while self.batch_consumer_once():
                worked = True
        for state in self.job_states():
            while self.job_consumer_once(state):
                worked = True
        if "ingest" in self.services:
            while self.report_consumer_once():
                worked = True
        return worked
