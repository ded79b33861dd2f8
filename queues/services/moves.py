"""Writes: submit, the operator's moves on jobs, batches and access requests, and cleanup (the
holds, priorities and caps are ``hold_moves``).

Every function takes keyword-only arguments, works on the process's ZooKeeper client, validates
IDs before they touch a path, checks the move against ``states.py`` and raises a DomainError
(InvalidTransition, ItemLocked, Conflict, NotFound, QueueHeld, InvalidID) that the caller turns
into a message. ``expect_version`` is the status version a page was rendered from: when the item
has moved since, the action is refused instead of undoing a newer change.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from queues.core import states
from queues.core.states import JOB_STEPS, AccessState, BatchState, JobState
from queues.services import deployment
from queues.services.depositors import depositor_policy, in_request_policy, payload_roots
from queues.steps import merritt_ingest_client as ingest_client
from queues.steps import submission as submission_steps
from queues.steps.fetch import DownloadError, local_path
from queues.steps.netpolicy import FetchRefused, TooSlow
from queues.steps.profiles import Profile, ProfileError, ProfileNotFound, load_profile
from queues.steps.uploads import remove_uploads
from queues.zk import paths as zpaths
from queues.zk.access import (
    access_ids,
    access_load,
    access_remove,
    access_transition,
    accesses_load,
)
from queues.zk.batches import (
    BEING_DELETED,
    batch_create,
    batch_id_for_uuid,
    batch_ids,
    batch_is_complete,
    batch_job_ids,
    batch_load,
    batch_remove,
    batch_states,
    batch_transition,
)
from queues.zk.client import client
from queues.zk.errors import (
    Conflict,
    DomainError,
    InvalidTransition,
    ItemLocked,
    MalformedNode,
    NotFound,
    QueueHeld,
    StoppedPartway,
    is_connection_error,
)
from queues.zk.jobs import (
    index_entries,
    job_load,
    job_remove,
    job_remove_unreadable,
    job_resume_state,
    job_transition,
    jobs_load,
    transition_apply,
    transition_plan,
)
from queues.zk.locks import collection_held
from queues.zk.records import AccessRequest, Batch, Broken, Job, Status
from queues.zk.servertime import server_moment

log = logging.getLogger("queues.services")


SUBMISSION_TYPES = (
    "file",
    "container",
    "object-manifest",
    "single-file-batch-manifest",
    "container-batch-manifest",
    "batch-manifest",
    # Merritt ingest's names for the same types, accepted as the same thing.
    *submission_steps.MERRITT_TYPE_NAMES,
)


def check_payload_url(url: str) -> None:
    """ValueError, in words for the submitter, unless the daemons may read ``url``.

    The daemons check again when they read it; this only turns a doomed batch away at the door.
    """
    if url.startswith("file://"):
        try:
            local_path(url, file_roots=payload_roots())
        except DownloadError as exc:
            raise ValueError(f"payload URL refused: {exc.reason}") from None
    elif not url.startswith(("http://", "https://")):
        raise ValueError("the payload URL must start with http://, https:// or file://")
    else:
        try:
            depositor_policy().check_url(url)
        except FetchRefused as exc:
            raise ValueError(f"payload URL refused: {exc.reason}") from None


@dataclass(frozen=True)
class Outcome:
    """What an action did: the item, its state before and after, and a line for people."""

    kind: str
    id: str
    before: str
    after: str
    detail: str = ""
    # For the audit entry only: the failure a resume moved the job away from.
    failure: str = ""
    # A submission sent to Merritt's ingest door: the batch state it answered, element by
    # element, and as ingest wrote it (XML), for a door that answers the depositor as ingest.
    ingest_state: tuple[tuple[str, str], ...] = dataclasses.field(default=(), compare=False)
    ingest_document: bytes = dataclasses.field(default=b"", compare=False)

    def __str__(self) -> str:
        text = f"{self.kind} {self.id}: {self.before} -> {self.after}"
        return f"{text} ({self.detail})" if self.detail else text


def _expect(status: Status, expect_version: int | None, item: str) -> None:
    if expect_version is not None and status.version != expect_version:
        raise Conflict(
            f"{item} changed since the page was loaded (it is now {status.raw.get('status')}); "
            "reload and check before acting"
        )


def job_of(jid: str, expect_version: int | None) -> tuple[Any, Job]:
    zk = client()
    job = job_load(zk, zpaths.jid(jid))
    _expect(job.status, expect_version, jid)
    return zk, job


def _batch(bid: str, expect_version: int | None) -> tuple[Any, Batch]:
    zk = client()
    batch = batch_load(zk, zpaths.bid(bid))
    _expect(batch.status, expect_version, bid)
    return zk, batch


def _access(queue: str, qid: str, expect_version: int | None) -> tuple[Any, AccessRequest]:
    zk = client()
    item = access_load(zk, zpaths.access_queue(queue), zpaths.qid(qid))
    _expect(item.status, expect_version, qid)
    return zk, item


def job_hold(*, jid: str, expect_version: int | None = None, message: str = "") -> Outcome:
    zk, job = job_of(jid, expect_version)
    job_transition(zk, job, JobState.HELD, admin=True, message=message or "held by an operator")
    return Outcome("job", jid, job.state, JobState.HELD)


def job_release(*, jid: str, expect_version: int | None = None) -> Outcome:
    """Held -> Pending, once the job's collection is no longer held."""
    zk, job = job_of(jid, expect_version)
    states.JOB.check(job.state, JobState.PENDING, admin=True)
    if collection_held(zk, job.profile):
        raise QueueHeld(f"collection {job.profile} is still held; release the collection first")
    job_transition(zk, job, JobState.PENDING, admin=True)
    return Outcome("job", jid, job.state, JobState.PENDING)


def job_resume(*, jid: str, expect_version: int | None = None, to: str = "") -> Outcome:
    """Failed -> the step after last_successful_status, retry_count + 1; with ``to``, an
    earlier step the operator chose (``job_resume_steps``), whose work is then done again."""
    zk, job = job_of(jid, expect_version)
    failed_in = job_resume_state(job)
    target = _resume_at(job, failed_in, to) if to else failed_in
    if target == failed_in:
        job_transition(zk, job, target, admin=True, retry=True)
    else:
        # Leaving Failed keeps last_successful_status (the contract's rule), which would send
        # the next plain resume past the steps this one repeats: it becomes the step before the
        # chosen one, so "resume" (ours or Merritt's library's) restarts there again.
        plan = transition_plan(job, target, admin=True, retry=True)
        raw = {**plan.raw, "last_successful_status": _step_before(target)}
        transition_apply(zk, dataclasses.replace(plan, raw=raw))
    # The status message is replaced by the move (the contract's rule): the failure being
    # resumed from is kept in the audit entry instead (queues/operator/audit.py, failure_of).
    return Outcome(
        "job",
        jid,
        job.state,
        target,
        f"retry {job.status.retry_count + 1}",
        failure=f"failed in {failed_in}: {job.status.message}",
    )


def job_resume_steps(job: Job) -> tuple[str, ...]:
    """The steps an operator may resume this Failed job at, earliest first: every step the
    state machine resumes to, up to the one the job failed in (a later one would skip work it
    never finished). InvalidTransition when it cannot be resumed at all."""
    failed_in = job_resume_state(job)
    allowed = states.JOB.action_targets("resume", JobState.FAILED)
    return tuple(s for s in JOB_STEPS[: JOB_STEPS.index(failed_in) + 1] if s in allowed)


def _resume_at(job: Job, failed_in: str, to: str) -> str:
    """``to`` when this job may resume there, else InvalidTransition saying which steps it may."""
    states.JOB.check(job.state, to, admin=True)
    choices = job_resume_steps(job)
    if to not in choices:
        skipped = JOB_STEPS[JOB_STEPS.index(failed_in) : JOB_STEPS.index(to)]
        raise InvalidTransition(
            f"job: {job.jid} cannot resume at {to}: it failed in {failed_in}, so that would skip "
            f"{', '.join(skipped)}; it may resume at {', '.join(choices)}"
        )
    return to


def _step_before(step: str) -> str | None:
    index = JOB_STEPS.index(step)
    return JOB_STEPS[index - 1] if index > 0 else None


def job_fail(*, jid: str, message: str, expect_version: int | None = None) -> Outcome:
    zk, job = job_of(jid, expect_version)
    job_transition(zk, job, JobState.FAILED, admin=True, message=message or "failed by an operator")
    _batch_check(job.bid)
    return Outcome("job", jid, job.state, JobState.FAILED)


REMOVED = "removed"  # the "after" of an Outcome whose item's nodes are gone without a move
UNREADABLE = "unreadable"  # the "before" of one whose item could not be read


def job_delete(*, jid: str, expect_version: int | None = None) -> Outcome:
    """Delete a Held, Failed or Completed job; a job already marked Deleted is removed. A job
    that cannot be read (a node another client wrote oddly) is removed whatever it says, when
    the request names no status version (its page has none to give)."""
    try:
        zk, job = job_of(jid, expect_version)
    except MalformedNode as exc:
        if expect_version is not None:
            raise
        job_remove_unreadable(client(), zpaths.jid(jid))
        return Outcome("job", jid, UNREADABLE, REMOVED, f"could not be read: {exc}")
    job_remove(zk, job)
    if job.state == JobState.DELETED:
        return Outcome(
            "job", jid, JobState.DELETED, REMOVED, f"was marked Deleted; batch {job.bid}"
        )
    return Outcome("job", jid, job.state, JobState.DELETED, f"batch {job.bid}")


def job_remove_deleted(*, jid: str, expect_version: int | None = None) -> Outcome:
    """The remove action: every node of a job marked Deleted (by Merritt's library) goes."""
    zk, job = job_of(jid, expect_version)
    states.JOB.check_remove(job.state)
    job_remove(zk, job)
    return Outcome("job", jid, job.state, REMOVED, f"batch {job.bid}")


def _check_submission(
    profile: str, submitter: str, payload_url: str, submission_type: str, **fields: str
) -> None:
    """The cheap checks every submission passes, whichever side then takes it in: those of
    ``steps.submission.submission_problems`` (free text, primary ID, digest, file name: the
    depositor's, else the URL's last part, the name the daemons will give the file)."""
    zpaths.profile(profile)
    if submission_type not in SUBMISSION_TYPES:
        raise ValueError(f"type {submission_type!r} is not one of: {', '.join(SUBMISSION_TYPES)}")
    if not submitter.strip():
        raise ValueError("submitter is required")
    check_payload_url(payload_url)
    problems = submission_steps.submission_problems(
        {"submitter": submitter, "payload_url": payload_url, **fields}
    )
    if problems:
        raise ValueError("; ".join(problems.values()))


def _check_profile_here(name: str) -> Profile:
    """The batch's profile, one this installation has and can read: its batch-pending step
    reads it first, and would fail the batch a moment after the submitter was told it was
    accepted. (Under MRT_BATCH_INTAKE=merritt the profiles are ingest's, not checked here.)"""
    try:
        return load_profile(name)
    except ProfileNotFound:
        raise ValueError(
            f"no profile named {name!r} here (none in this installation's MRT_PROFILES_DIR): "
            "nothing was submitted"
        ) from None
    except ProfileError as exc:
        raise ValueError(f"{exc}: nothing was submitted") from None


def batch_submit(
    *,
    profile: str,
    submitter: str,
    payload_url: str,
    submission_type: str = "file",
    title: str = "",
    creator: str = "",
    date: str = "",
    local_id: str = "",
    primary_id: str = "",
    digest_alg: str = "",
    digest_value: str = "",
    filename: str = "",
    extra: dict[str, Any] | None = None,
) -> str:
    """Create a Pending batch for one payload URL; returns its batch ID.

    Only cheap checks happen here (the step must stay light): the payload itself is read by the
    batch-pending consumer. Refused (DeploymentError) when Merritt's ingest owns intake
    (``MRT_BATCH_INTAKE=merritt``): its consumers would take a batch written here; every door
    submits through ``batch_submit_outcome``, which sends it to ingest's door instead.
    """
    if ingest_client.batch_intake() == ingest_client.MERRITT_INTAKE:
        raise ingest_client.DeploymentError(
            "MRT_BATCH_INTAKE=merritt: Merritt's ingest owns intake, so no batch is written "
            "into the shared queue here (its consumers would take it); submissions go to "
            "ingest's door (services.batch_submit_outcome)"
        )
    _check_submission(
        profile,
        submitter,
        payload_url,
        submission_type,
        title=title,
        creator=creator,
        date=date,
        local_id=local_id,
        primary_id=primary_id,
        digest_alg=digest_alg,
        digest_value=digest_value,
        filename=filename,
    )
    profile_here = _check_profile_here(profile)
    submission_type = submission_steps.canonical_type(submission_type)
    submission: dict[str, Any] = {
        "profile": profile,
        "submitter": submitter.strip(),
        "payload_url": payload_url,
        "type": submission_type,
        "title": title,
        "creator": creator,
        "date": date,
        "localID": local_id,
        "primaryID": primary_id,
        "filename": filename,
        "submission_mode": "add",
        "submitted": datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    if digest_alg and digest_value:
        submission["digest"] = {"alg": digest_alg.lower(), "value": digest_value.lower()}
    submission.update(extra or {})
    # Merritt ingest's keys beside the console's (its readers need them): type, update, ...
    submission.update(
        submission_steps.merritt_submission_keys(
            submission, profile_format=profile_here.notification_format
        )
    )
    return batch_create(client(), submission=submission).bid


# How long a submission sent to Merritt's ingest is looked for in the queue before the answer
# names only ingest's batch ID (its door writes the batch before it answers).
MERRITT_BATCH_WAIT = 5.0


def batch_submit_outcome(**params: Any) -> Outcome:
    """The submit action of every door (form, API, ``/poster/``): a Pending batch made by the
    console, or, beside Merritt with MRT_BATCH_INTAKE=merritt, the submission sent to Merritt's
    ingest door so that its ingest, which owns intake, writes and works the batch."""
    if ingest_client.batch_intake() != ingest_client.MERRITT_INTAKE:
        return Outcome("batch", batch_submit(**params), "", BatchState.PENDING, "submitted")
    return batch_submit_to_merritt(**params)


def batch_submit_to_merritt(
    *,
    profile: str,
    submitter: str,
    payload_url: str,
    submission_type: str = "file",
    title: str = "",
    creator: str = "",
    date: str = "",
    local_id: str = "",
    primary_id: str = "",
    digest_alg: str = "",
    digest_value: str = "",
    filename: str = "",
    extra: dict[str, Any] | None = None,
) -> Outcome:
    """Send one submission to Merritt's ingest service (queues/steps/merritt_ingest_client.py)
    after the checks ``batch_submit`` makes; the outcome names the queue's batch (``bid…``)
    once Merritt's ingest has written it, else ingest's own batch ID (``bid-<uuid>``)."""
    _check_submission(
        profile,
        submitter,
        payload_url,
        submission_type,
        title=title,
        creator=creator,
        date=date,
        local_id=local_id,
        primary_id=primary_id,
        digest_alg=digest_alg,
        digest_value=digest_value,
        filename=filename,
    )
    # A batch manifest given by URL is read while the client waits: under one short deadline
    # for the whole exchange, and before anything is sent to ingest (nothing left behind).
    policy = in_request_policy()
    try:
        answer = ingest_client.submit_to_ingest(
            ingest_client.IngestSubmission(
                profile=profile,
                submitter=submitter.strip(),
                payload_url=payload_url,
                submission_type=submission_type,
                title=title,
                creator=creator,
                date=date,
                local_id=local_id,
                primary_id=primary_id,
                digest_alg=digest_alg,
                digest_value=digest_value,
                filename=filename,
                extra=extra or {},
            ),
            policy=policy,
            file_roots=payload_roots(),
        )
    except (TooSlow, ingest_client.IngestRefused) as exc:
        # The client names a manifest read past its deadline as a refusal caused by TooSlow.
        slow = exc if isinstance(exc, TooSlow) else exc.__cause__
        if not isinstance(slow, TooSlow):
            raise
        raise ValueError(
            f"the payload URL {payload_url} could not be read while the request waited "
            f"({slow.reason}): nothing was submitted; serve it faster, or give the files it "
            "lists by their own URLs"
        ) from None
    detail = f"sent to Merritt's ingest as {answer.batch_id}"
    said = Outcome(
        "batch",
        answer.batch_id,
        "",
        answer.status or "QUEUED",
        detail,
        ingest_state=tuple(answer.fields.items()),
        ingest_document=answer.document,
    )
    zk = client()
    deadline = time.monotonic() + MERRITT_BATCH_WAIT
    while True:
        try:
            bid = batch_id_for_uuid(zk, zpaths.batch_uuid(answer.batch_id))
        except NotFound:
            if time.monotonic() >= deadline:
                return said
            time.sleep(0.1)
            continue
        return dataclasses.replace(said, id=bid, after=BatchState.PENDING)


def batch_release(*, bid: str, expect_version: int | None = None) -> Outcome:
    zk, batch = _batch(bid, expect_version)
    states.BATCH.check(batch.state, BatchState.PENDING, admin=True)
    if collection_held(zk, batch.profile):
        raise QueueHeld(f"collection {batch.profile} is still held; release the collection first")
    batch_transition(zk, batch, BatchState.PENDING, admin=True)
    return Outcome("batch", bid, batch.state, BatchState.PENDING)


def batch_update_reporting(*, bid: str, expect_version: int | None = None) -> Outcome:
    zk, batch = _batch(bid, expect_version)
    batch_transition(zk, batch, BatchState.UPDATE_REPORTING, admin=True)
    return Outcome("batch", bid, batch.state, BatchState.UPDATE_REPORTING)


def batch_delete(*, bid: str, expect_version: int | None = None) -> Outcome:
    """Delete a Held, Failed or Completed batch with every job it lists; a batch already
    marked Deleted is removed the same way."""
    zk, batch = _batch(bid, expect_version)
    deleted = batch_remove(zk, batch)
    remove_batch_uploads(batch)
    after = REMOVED if batch.state == BatchState.DELETED else BatchState.DELETED
    return Outcome("batch", bid, batch.state, after, f"{len(deleted)} jobs deleted")


def batch_remove_deleted(*, bid: str, expect_version: int | None = None) -> Outcome:
    """The remove action: a batch marked Deleted goes, with every job it lists."""
    zk, batch = _batch(bid, expect_version)
    states.BATCH.check_remove(batch.state)
    deleted = batch_remove(zk, batch)
    remove_batch_uploads(batch)
    return Outcome("batch", bid, batch.state, REMOVED, f"{len(deleted)} jobs deleted")


# The detail of a cleanup's outcome for a batch whose removal stopped part-way.
PARTWAY = "stopped part-way"

CLEANUP_BATCH_STATES = (BatchState.COMPLETED, BatchState.DELETED)


def remove_batch_uploads(batch: Batch) -> None:
    """A removed batch's ``/poster/`` uploads go with it (``queues.steps.uploads``)."""
    remove_uploads(settings.MRT_WORK_DIR, batch.submission)


def batches_cleanup(*, older_than: timedelta = timedelta(0)) -> Iterator[Outcome]:
    """Delete Completed batches, and remove Deleted ones, with their jobs, when their status was
    written at least ``older_than`` ago.

    Yields each batch as it goes, so that a cleanup of thousands shows its progress and one
    stopped by an outage has said what it already did. A batch locked or changed meanwhile is
    left alone: its outcome keeps its state and says why. So is a Deleted batch some of whose
    jobs are still at work (as the library's own sweep does). One whose removal stopped part-way
    (``StoppedPartway``) is said as such (marked Deleted, detail ``PARTWAY``), and taken up
    again by the next cleanup whatever its age; ZooKeeper lost ends the sweep after that line.
    """
    zk = client()
    # By the server's clock, which wrote the mtimes (queues/zk/servertime.py).
    cutoff = server_moment(zk) - older_than
    ids = batch_ids(zk)
    for bid, state in batch_states(zk, ids).items():
        if state not in CLEANUP_BATCH_STATES:
            continue
        try:
            batch = batch_load(zk, bid)
        except (NotFound, MalformedNode):
            continue
        if batch.state != state:
            continue
        # A delete that stopped part-way (its batch marked Deleted first) is finished whatever
        # its age and its jobs' states, as that delete would have.
        stopped = state == BatchState.DELETED and batch.status.message == BEING_DELETED
        if batch.status.mtime > cutoff and not stopped:
            continue
        if state == BatchState.DELETED and not stopped:
            working = batch_job_ids(zk, bid)["batch-processing"]
            if working:
                detail = f"left alone: {len(working)} jobs at work"
                yield Outcome("batch", bid, state, state, detail)
                continue
        try:
            deleted = batch_remove(zk, batch)
        except (Conflict, ItemLocked) as exc:
            yield Outcome("batch", bid, state, state, f"left alone: {exc}")
            continue
        except StoppedPartway as exc:
            # Marked Deleted with some of its jobs removed: said (and audited) as such; the
            # next cleanup, or a remove, finishes it. ZooKeeper gone stops the sweep.
            yield Outcome("batch", bid, state, BatchState.DELETED, f"{PARTWAY}: {exc}")
            if is_connection_error(exc):
                raise
            continue
        remove_batch_uploads(batch)
        after = BatchState.DELETED if state == BatchState.COMPLETED else REMOVED
        yield Outcome("batch", bid, state, after, f"{len(deleted)} jobs deleted")


def deleted_cleanup(*, older_than: timedelta = timedelta(0)) -> Iterator[Outcome]:
    """Remove the jobs and access requests marked Deleted at least ``older_than`` ago (Merritt's
    library marks them instead of removing them). A locked or changed one is left alone."""
    zk = client()
    # By the server's clock, which wrote the mtimes (queues/zk/servertime.py).
    cutoff = server_moment(zk) - older_than
    jids = [jid for _p, jid in index_entries(zk, JobState.DELETED)]
    for start in range(0, len(jids), 500):
        for job in jobs_load(zk, jids[start : start + 500]):
            if (
                isinstance(job, Broken)
                or job.state != JobState.DELETED
                or job.status.mtime > cutoff
            ):
                continue
            try:
                job_remove(zk, job)
            except (Conflict, ItemLocked, NotFound) as exc:
                yield Outcome(
                    "job", job.jid, JobState.DELETED, JobState.DELETED, f"left alone: {exc}"
                )
                continue
            yield Outcome("job", job.jid, JobState.DELETED, REMOVED, f"batch {job.bid}")
    for queue in zpaths.ACCESS_QUEUES:
        for item in accesses_load(zk, queue, access_ids(zk, queue)):
            if (
                isinstance(item, Broken)
                or item.state != AccessState.DELETED
                or item.status.mtime > cutoff
            ):
                continue
            try:
                access_remove(zk, item)
            except (Conflict, ItemLocked, NotFound) as exc:
                yield Outcome(
                    "access",
                    item.qid,
                    AccessState.DELETED,
                    AccessState.DELETED,
                    f"left alone: {exc}",
                )
                continue
            yield Outcome("access", item.qid, AccessState.DELETED, REMOVED, f"{queue} queue")


def _batch_check(bid: str) -> None:
    """After an operator failed a job: its batch may be done, and moves on now rather than at
    the reporting consumer's next sweep. A problem here does not undo the job's move (the
    sweep tries again), so it is only logged."""
    try:
        batch_complete_if_done(bid=bid)
    except (DomainError, ValueError) as exc:
        log.warning("%s: completion check after an operator's move: %s", bid, exc)


def batch_complete_if_done(*, bid: str) -> bool:
    """Move a Processing batch whose every job has finished to Reporting.

    Called after a job reaches Completed or Failed, and by the reporting consumer's sweep. Two
    callers racing both see an empty folder; the status version lets only one of them write, and
    the other finds the same move already made (both may return True).
    """
    zk = client()
    # The cheap question first: most jobs finish while others of their batch are still working.
    if not batch_is_complete(zk, zpaths.bid(bid)):
        return False
    return _to_reporting(zk, bid)


def batches_to_reporting(complete: Iterable[str], *, zk: Any = None) -> list[str]:
    """Move the ``complete`` batches (``CompletionCheck`` said so: the daemons' batched loop,
    after a move of jobs of several batches) to Reporting, through ``zk`` (default: the
    process's client); those moved."""
    zk = zk if zk is not None else client()
    return [bid for bid in complete if _to_reporting(zk, bid)]


def _to_reporting(zk: Any, bid: str) -> bool:
    """Move a complete Processing batch to Reporting (False: not Processing, or moved by
    another caller meanwhile)."""
    batch = batch_load(zk, bid)
    if batch.state != BatchState.PROCESSING:
        return False
    try:
        batch_transition(zk, batch, BatchState.REPORTING)
    except (Conflict, ItemLocked):
        return False  # moved meanwhile, or held by a session (the sweep looks again)
    return True


def access_resume(
    *, queue: str, qid: str, to: str = AccessState.PENDING, expect_version: int | None = None
) -> Outcome:
    """Move a Failed request back to Pending, or to Processing when this deployment's own
    consumer serves its queue: only ours takes a Processing request (Merritt's storage claims
    Pending ones only, mrt-zk ``Access.acquirePendingAssembly``), so where the queue is left to
    Merritt a request resumed to Processing would be claimed by nobody, ever: refused
    (DeploymentError, a ValueError), nothing moved. Every door (page, API, ``manage.py queue``)
    comes here through the action catalogue."""
    if to == AccessState.PROCESSING and not deployment.runs_access(zpaths.access_queue(queue)):
        raise deployment.DeploymentError(
            f"access: {qid} cannot be resumed to Processing: "
            f"{deployment.not_owned_reason(deployment.access_step(queue))}, and Merritt's "
            "storage claims only Pending requests, so nothing would ever take it; resume it to "
            "Pending"
        )
    zk, item = _access(queue, qid, expect_version)
    if to not in states.ACCESS.action_targets("resume", item.state):
        raise InvalidTransition(f"access: cannot resume {qid} from {item.state} to {to}")
    access_transition(zk, item, to, admin=True)
    return Outcome("access", qid, item.state, to)


def access_delete(*, queue: str, qid: str, expect_version: int | None = None) -> Outcome:
    """Delete a Failed or Completed request; one already marked Deleted is removed."""
    zk, item = _access(queue, qid, expect_version)
    access_remove(zk, item)
    return Outcome(
        "access",
        qid,
        item.state,
        REMOVED if item.state == AccessState.DELETED else AccessState.DELETED,
    )


def access_remove_deleted(*, queue: str, qid: str, expect_version: int | None = None) -> Outcome:
    """The remove action: a request marked Deleted (by Merritt's library) goes."""
    zk, item = _access(queue, qid, expect_version)
    states.ACCESS.check_remove(item.state)
    access_remove(zk, item)
    return Outcome("access", qid, item.state, REMOVED)


__all__ = [
    "PARTWAY",
    "REMOVED",
    "SUBMISSION_TYPES",
    "Outcome",
    "access_delete",
    "access_remove_deleted",
    "access_resume",
    "batch_complete_if_done",
    "batch_delete",
    "batch_release",
    "batch_remove_deleted",
    "batch_submit",
    "batch_submit_outcome",
    "batch_submit_to_merritt",
    "batch_update_reporting",
    "batches_cleanup",
    "batches_to_reporting",
    "deleted_cleanup",
    "job_delete",
    "job_fail",
    "job_hold",
    "job_release",
    "job_remove_deleted",
    "job_resume",
    "job_resume_steps",
]
