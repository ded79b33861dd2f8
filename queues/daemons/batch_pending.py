"""Batch Pending: turn a submitted batch into one Pending job per object.

A collection hold on the batch's profile, or a held ingest queue, parks the batch as Held (an
operator releases it). Otherwise the payload is read: a file, a container or an object manifest
is one object; the three batch manifests give one object per line. A corrupt manifest, or one of
the wrong kind, fails the batch with a message naming the line; so does a batch manifest of
more objects than one batch may hold (``BATCH_JOBS_MAX``, about 60,000: its job folders must stay
listable by Merritt's clients), before any job is made.

Each job's ``configuration`` is the batch submission's own keys (profile, submitter, batchID,
submissionDate, update, ..., with the batch's type in the console's naming as
``submission_type``) overlaid with the object's keys (ObjectSpec.to_configuration: Merritt's
``type``, ``filename``, ``objectID``, ``digestType``/``digestValue``, ... beside the console's
``payload_url``), plus ``queuePriority`` and, as Merritt's ingest writes them, ``jobID`` and
``update`` (a boolean), and the console's ``batch_id``, ``batch_uuid``, ``batch_seq`` (1-based
place in the batch) and ``working_dir`` (MRT_WORK_DIR/<bid>/<jid>).

A batch written by Merritt's ingest (no ``payload_url``: the payload is on ingest's own disk)
is left untouched for Merritt's own batch consumer.

Job priority comes from the profile's priority (5 by default) and the batch size, so a single
deposit overtakes a bulk load: 1 object -2, 2..10 objects +0, 11..100 +1, more +2 (clamped to
0..99). With the default profile priority that is 3, 5, 6 and 7.

When the profile says ``queued_mail``, the depositor and the profile's contacts get the list of
queued jobs before the batch moves on. A mail that cannot be sent is logged and named in the
batch's status message; it does not hold the jobs back, and the summary mail still follows.

Restart-safe: a batch that already has jobs (a consumer died half-way) gets only the jobs whose
``batch_seq`` is missing, then moves to Processing (its queued mail may then go out twice).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from django.conf import settings

from queues.core import retries
from queues.core.states import INGEST_HELD_MESSAGE, BatchState
from queues.daemons import clients
from queues.daemons.base import BatchDaemon, Next, Stay, Step, StepFailed, describe
from queues.daemons.breakers import note_outage
from queues.daemons.retrying import RetryWaits, policy_for, when
from queues.daemons.workfolder import fetch, work_root
from queues.steps.checkm import ManifestError, TooManyRows
from queues.steps.fetch import DownloadError
from queues.steps.notify import batch_queued, send
from queues.steps.profiles import Profile, ProfileError, load_profile
from queues.steps.submission import (
    ObjectSpec,
    canonical_type,
    expand_submission,
    merritt_job_keys,
    processing_problem,
)
from queues.zk.batches import batch_job_ids, batch_retry_later
from queues.zk.errors import Conflict, StaleVersion
from queues.zk.jobs import job_create, job_create_check, jobs_load
from queues.zk.locks import collection_held, queue_held
from queues.zk.records import Batch, Job
from queues.zk.servertime import server_now
from queues.zk.sized import BATCH_JOBS_MAX, TooLarge

log = logging.getLogger("queues.daemons")

# Submission keys that describe the payload, not the batch: never copied into a job, where the
# object's own values (or their absence) must stand.
OBJECT_KEYS = frozenset(
    {
        "payload_url",
        "type",
        "filename",
        "title",
        "creator",
        "date",
        "localID",
        "primaryID",
        "objectID",
        "digest",
        "digestType",
        "digestValue",
        "size",
    }
)


def batch_priority(base: int, objects: int) -> int:
    if objects <= 1:
        offset = -2
    elif objects <= 10:
        offset = 0
    elif objects <= 100:
        offset = 1
    else:
        offset = 2
    return min(99, max(0, base + offset))


def object_name(spec: ObjectSpec) -> str:
    """The object as its depositor knows it: title, local id, or the payload's file name."""
    return spec.title or spec.local_id or spec.filename or spec.payload_url.rsplit("/", 1)[-1]


def _text(submission: dict[str, Any], key: str) -> str | None:
    value = submission.get(key)
    return value if isinstance(value, str) and value.strip() else None


def batch_type(batch: Batch) -> str:
    """The batch's submission type in the console's naming (the submission may give Merritt's)."""
    given = batch.submission.get("submission_type") or batch.type or "file"
    try:
        return canonical_type(str(given))
    except ValueError as exc:
        raise StepFailed(str(exc)) from exc


def expand(batch: Batch) -> list[ObjectSpec]:
    sub = batch.submission
    given = sub.get("digest")
    digest: dict[str, Any] = given if isinstance(given, dict) else {}
    payload_url = _text(sub, "payload_url")
    if not payload_url:
        raise StepFailed("the submission has no payload_url")
    try:
        return expand_submission(
            submission_type=batch_type(batch),
            payload_url=payload_url,
            fetch_text=fetch,
            filename=_text(sub, "filename"),
            title=_text(sub, "title"),
            creator=_text(sub, "creator"),
            date=_text(sub, "date"),
            local_id=_text(sub, "localID"),
            primary_id=_text(sub, "primaryID"),
            digest_alg=digest.get("alg"),
            digest_value=digest.get("value"),
            most_objects=BATCH_JOBS_MAX,
        )
    except TooManyRows as exc:
        raise StepFailed(
            f"the manifest lists more than {exc.most:,} objects; one batch holds at most "
            f"{exc.most:,} (the listing of its jobs must stay within ZooKeeper's default 1 MiB, "
            "which Merritt's clients read): submit it as several batches"
        ) from exc
    except ManifestError as exc:
        raise StepFailed(f"manifest {payload_url}: {exc}") from exc
    except DownloadError as exc:
        raise StepFailed(f"cannot read the payload: {exc}") from exc
    except ValueError as exc:
        raise StepFailed(str(exc)) from exc


class BatchPending(BatchDaemon):
    name: ClassVar[str] = "batch-pending"
    step: ClassVar[str] = "batch-pending"
    state: ClassVar[str] = BatchState.PENDING
    # A held ingest queue does not stop this daemon: it parks new batches as Held instead.
    queue_hold: ClassVar[str | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Batches whose manifest is to be read again later; their times are the server's.
        self.retry_waits = RetryWaits(clock=lambda: server_now(self.zk))

    def unprocessable(self, item: Batch) -> str | None:
        return processing_problem(item.submission)

    def accept(self, bid: str) -> bool:
        return not self.retry_waits.waits(bid)

    def failure(self, item: Batch, exc: Exception) -> Step:
        """As for a job's step: a manifest whose server cannot answer now (``queues.core.retries``)
        leaves the batch Pending, its next try on its status, until the depositor's policy is
        spent; only then, or for a permanent answer, does the batch fail."""
        outage = retries.outage_of(exc)
        if outage is None:
            return super().failure(item, exc)
        note_outage(self.zk, outage)
        decision = retries.decide(
            policy_for(outage.service), item.status.raw, outage, now=self.retry_waits.now()
        )
        if not decision.retry:
            tries = retries.history_text(decision.reasons, when)
            return Next(
                BatchState.FAILED,
                f"{self.step}: {describe(exc)} (gave up after {decision.attempt} tries of "
                f"{outage.service}: {tries})",
                error=True,
            )
        message = (
            f"{self.step}: waiting to try again, try {decision.attempt + 1} of "
            f"{decision.attempts} at {when(decision.next_at)}: {describe(exc)}"
        )
        try:
            batch_retry_later(self.zk, item, decision.state, message)
        except (Conflict, StaleVersion) as exc2:
            return Stay(f"not tried again: {describe(exc2)}")
        self.retry_waits.note(item.bid, decision.next_at)
        return Stay(message, outcome="retry")

    def work(self, item: Batch) -> Step:
        until = retries.next_try(item.status.raw)
        if until is not None and until > self.retry_waits.now():
            self.retry_waits.note(item.bid, until)  # another process's wait: passed over
            return Stay(f"waiting to try again at {when(until)}", outcome="retry")
        if collection_held(self.zk, item.profile):
            return Next(BatchState.HELD, f"collection {item.profile} is held")
        if queue_held(self.zk, "ingest"):
            return Next(BatchState.HELD, INGEST_HELD_MESSAGE)
        try:
            profile = load_profile(item.profile)
        except ProfileError as exc:
            raise StepFailed(str(exc)) from exc
        specs = expand(item)
        priority = batch_priority(profile.priority, len(specs))
        existing = self.existing_jobs(item)
        base = {k: v for k, v in item.submission.items() if k not in OBJECT_KEYS}
        base.update(submission_type=batch_type(item), batch_id=item.bid, batch_uuid=item.uuid)
        base["update"] = base.get("update") is True
        base["queuePriority"] = f"{priority:02d}"
        base.update(merritt_job_keys(item.submission))
        arguments = [
            job_arguments(item, base, spec, seq, priority) for seq, spec in enumerate(specs, 1)
        ]
        for seq, spec in enumerate(specs, start=1):
            try:
                job_create_check(**arguments[seq - 1])
            except TooLarge as exc:
                raise StepFailed(f"object {seq} ({object_name(spec)[:80]}): {exc}") from exc
        queued = []
        for seq, spec in enumerate(specs, start=1):
            jid = existing.get(seq) or job_create(self.zk, **arguments[seq - 1]).jid
            queued.append((jid, object_name(spec)))
        message = f"{len(specs)} jobs"
        if profile.queued_mail:
            message += "; " + self.mail_queued(item, profile, queued)
        return Next(BatchState.PROCESSING, message)

    def existing_jobs(self, batch: Batch) -> dict[int, str]:
        """The batch's jobs already created, by ``batch_seq``."""
        index = batch_job_ids(self.zk, batch.bid)
        jids = sorted({j for folder in index.values() for j in folder})
        found = {}
        for job in jobs_load(self.zk, jids):
            if isinstance(job, Job) and isinstance(job.configuration.get("batch_seq"), int):
                found[job.configuration["batch_seq"]] = job.jid
        return found

    def mail_queued(self, batch: Batch, profile: Profile, jobs: list[tuple[str, str]]) -> str:
        """Mail the list of queued jobs; returns a few words on it for the status message."""
        to = clients.recipients(batch.submission, profile)
        if not to:
            return "nobody to mail the queued jobs to"
        subject, body = batch_queued(
            batch_id=batch.bid,
            title=batch.title or None,
            submitter=batch.submitter or None,
            profile_name=batch.profile,
            jobs=jobs,
            console_url=settings.MRT_CONSOLE_URL,
            batch_uuid=batch.uuid,
        )
        try:
            send(to, subject, body)
        except (OSError, ValueError) as exc:  # smtplib's errors are OSErrors; a bad header
            log.warning("%s batch-pending: queued mail not sent: %s", batch.bid, exc)
            return f"queued mail not sent: {exc}"
        return f"queued mail sent to {len(to)}"


def job_arguments(
    batch: Batch, base: dict[str, Any], spec: ObjectSpec, seq: int, priority: int
) -> dict[str, Any]:
    """``job_create``'s arguments for the batch's ``seq``th object."""
    configuration = {**base, **spec.to_configuration(), "batch_seq": seq}
    # The job's working folder is named after its ID, known once the job's node is made:
    # written in the job's creating transaction (workfolder.workdir() reads it).
    folder = work_root() / batch.bid
    return {
        "bid": batch.bid,
        "configuration": configuration,
        "priority": priority,
        "identifiers": {
            "primary_id": spec.primary_id or "",
            "local_id": [spec.local_id] if spec.local_id else [],
        },
        "metadata": {
            "erc_who": spec.creator or "",
            "erc_what": spec.title or "",
            "erc_when": spec.date or "",
            "erc_where": spec.primary_id or "",
        },
        "configure": lambda jid: {"working_dir": str(folder / jid), "jobID": jid},
    }
