"""The console's records of storage adds and callbacks (``/mrt-console/store-intents``,
``/mrt-console/callbacks``) of a job that a tool which does not know them removed: Merritt's
library deletes a batch with everything below it, and the record stayed for ever. The retention
sweep removes them; the record of a job still there stays, whatever its state."""

from __future__ import annotations

from typing import Any

from queues.daemons.retention import Retention
from queues.zk import jobs, paths
from queues.zk.side_effects import callback_record_path, callback_record_start
from queues.zk.store_intents import store_intent_path, store_intent_record


def _records(zk: Any, job: Any) -> None:
    """Both records, written as Storing and Notify write them: under the job's lock."""
    lock = paths.job_node(job.jid, "lock")
    zk.create(lock, b"", ephemeral=True)
    job = jobs.job_load(zk, job.jid)
    store_intent_record(
        zk,
        job,
        manifest_url="https://example.org/m.checkm",
        manifest_sha256="0" * 64,
        node="9501",
        ark=f"ark:/99999/fk4{job.jid}",
        replace=False,
    )
    callback_record_start(zk, job, "https://hooks.example.org/h", found=None)
    zk.delete(lock)  # a consumer that was SIGKILLed leaves no lock, only its records


def test_records_of_jobs_removed_by_merritts_tools_go_with_the_sweep(
    database: str, zk: Any, finished_batch: Any
) -> None:
    gone_batch, (gone,) = finished_batch(("Storing",), tag="g")
    _kept_batch, (kept,) = finished_batch(("Storing",), tag="k")
    _records(zk, gone)
    _records(zk, kept)
    # Merritt's library deletes a batch and its jobs with everything below them (rm_rf); it
    # knows nothing of /mrt-console.
    zk.delete(paths.job(gone.jid), recursive=True)
    zk.delete(paths.batch(gone_batch.bid), recursive=True)
    records = [store_intent_path(gone.jid), callback_record_path(gone.jid)]
    assert all(zk.exists(p) for p in records)

    daemon = Retention(zk=zk)
    daemon.run_once()
    assert daemon.last is not None and daemon.last.outcome == "ok"
    assert "2 records of storage adds or callbacks of removed jobs removed" in daemon.last.detail
    assert not any(zk.exists(p) for p in records)
    assert zk.exists(store_intent_path(kept.jid)) and zk.exists(callback_record_path(kept.jid))

    daemon.run_once()  # nothing left to remove
    assert "0 records of storage adds" in daemon.last.detail
