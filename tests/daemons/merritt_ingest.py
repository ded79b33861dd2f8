"""Batches and jobs written the way Merritt's ingest writes them (read in CDLUC3/mrt-ingest:
the batch handler ``batchProcess/HandlerSubmit`` and the job handler ``queue/HandlerSubmit``,
through the mrt-zk library's ``Batch.createBatch`` / ``Job.createJob``).

Its keys, no ``payload_url``: the payload sits on ingest's own disk under
``queue/<batchID>/<jobID>/producer``.
"""

from __future__ import annotations

import uuid
from typing import Any

from queues.core.states import JOB_STEPS
from queues.zk.batches import batch_create
from queues.zk.jobs import job_create, job_transition
from queues.zk.records import Batch, Job

PROFILE = "merritt_demo_content"


def merritt_submission(**overrides: Any) -> dict[str, Any]:
    """A batch ``submission`` as Merritt's ingest writes it."""
    submission: dict[str, Any] = {
        "batchID": f"bid-{uuid.uuid4()}",
        "profile": PROFILE,
        "type": "file",
        "size": 2048,
        "filename": "letters.pdf",
        "update": False,
        "submitter": "dpr/Ada Lovelace",
        "responseForm": "xml",
        "title": "Letters of Ada",
        "creator": "Lovelace, Ada",
        "date": "1843",
        "localID": "letters-001",
        "digestType": "MD5",  # its DigestEnum value, whatever case the depositor gave
        "digestValue": "9e107d9d372bb6826bd81d3542a419d6",
        "note": "sent from the poster door",
        "notificationFormat": "xml",
        "DCtitle": "Letters of Ada",
        "submissionDate": "Sat Nov 21 10:02:03 PST 2026",
    }
    submission.update(overrides)
    return submission


def merritt_batch(zk: Any, **overrides: Any) -> Batch:
    return batch_create(zk, submission=merritt_submission(**overrides))


def merritt_job(zk: Any, batch: Batch | None = None, *, state: str = "Pending") -> Job:
    """A job of a Merritt batch as its ingest writes it, moved along the steps to ``state``."""
    batch = batch or merritt_batch(zk)
    configuration = {
        key: value
        for key, value in batch.submission.items()
        if key not in ("submissionDate", "size")
    }
    configuration.update(
        jobID=f"jid-{uuid.uuid4()}",
        queuePriority="03",
        type="file",
        retainTargetURL="true",
        update=False,
    )
    job = job_create(
        zk,
        bid=batch.bid,
        configuration=configuration,
        priority=3,
        identifiers={"primary_id": "", "local_id": ["letters-001"]},
    )
    for step in JOB_STEPS[1 : JOB_STEPS.index(state) + 1]:
        job = job_transition(zk, job, step)
    return job
