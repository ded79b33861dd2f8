"""Batch Reporting and Update Reporting: the status report and the summary mail.

Reporting: once every job of a batch is Completed or Failed, write ``status-report`` (the
failed and successful job IDs), mail the summary to the depositor and the profile's contacts,
and move the batch to Completed (no failed job) or Failed. Every SWEEP_EVERY seconds it also
sweeps the Processing batches, so a batch whose last job was finished by another client
(Merritt's own services; a check here that failed) still moves on.

Update Reporting (an operator's move after troubleshooting a Failed batch): wait while any job
of the batch is still being worked on (a resumed job), then report what changed since the last
report the same way.

Mail goes out at least once per report, never silently not at all: the report carries the
status version of the round it belongs to (``round``) and ``mailed``. A re-run of the same round
(a consumer died after mailing) reuses the report and sends no second mail once ``mailed`` is
true. Recording ``mailed`` is tried again through a connection outage of up to
``MAILED_PATIENCE`` seconds; only a crash between sending and recording it, or a longer outage,
can repeat the mail, a duplicate being better than a depositor who never hears. A mail server
that cannot take the mail now (refused, timed out, 4xx), or that answers what every message
would meet (the console's credentials, sender or greeting refused, AUTH or STARTTLS not offered),
leaves the batch waiting in its step, its report written, until it is back or the settings are
mended; only a 5xx rejection of this message (a recipient, its size) fails the batch.
"""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar

from django.conf import settings

from queues.core import transient
from queues.core.states import BatchState
from queues.daemons import clients
from queues.daemons.base import BatchDaemon, Next, Stay, Step, StepFailed
from queues.services import moves
from queues.steps.notify import ATTACHED_JOBS_MOST, report_attachments, send_batch_summary
from queues.steps.profiles import ProfileError, load_profile
from queues.zk.batches import (
    batch_ids,
    batch_job_ids,
    batch_report_update,
    batch_write_report,
    open_batch_states,
    report_changes,
    report_resolve,
)
from queues.zk.errors import MalformedNode, is_connection_error, patiently
from queues.zk.jobs import jobs_load
from queues.zk.records import Batch, Job

log = logging.getLogger("queues.daemons")


class MailUnavailable(Exception):
    """The mail server cannot take the summary now (down, timing out, answering 4xx) or gives
    an answer every message would meet (``transient.mail_refusal``: the console's credentials,
    sender or greeting refused, AUTH or STARTTLS not offered, its certificate not trusted): the
    batch waits in its step, its report written and not mailed, until the server is back or the
    settings are mended."""


# The sweep is the safety net for a batch whose last job was finished by another client (an
# operator's move here already checks the batch): it reads every open batch, so not per claim.
SWEEP_EVERY = 30.0
# How long recording that a summary mail went waits for ZooKeeper to answer again (seconds).
MAILED_PATIENCE = 30.0


def round_key(batch: Batch) -> str:
    # The batch status does not change while it is being reported, and every new round
    # (Reporting, each UpdateReporting) comes with a new status version.
    return f"{batch.state}:{batch.status.version}"


class BatchReporting(BatchDaemon):
    name: ClassVar[str] = "batch-reporting"
    step: ClassVar[str] = "batch-reporting"
    state: ClassVar[str] = BatchState.REPORTING

    _swept: float = float("-inf")
    _sweeping = False  # whether the last sweep found Processing batches to look at

    def claim(self) -> Batch | None:
        if time.monotonic() - self._swept >= SWEEP_EVERY:
            self.sweep()
            self._swept = time.monotonic()
        return super().claim()

    def idle_wait(self) -> float:
        """As a batch daemon's; but while there are Processing batches, no longer than to the
        next sweep."""
        wait = super().idle_wait()
        if self._sweeping:
            wait = min(wait, max(self.poll, SWEEP_EVERY - (time.monotonic() - self._swept)))
        return wait

    def sweep(self) -> None:
        """Move every Processing batch whose jobs have all finished to Reporting."""
        if self._states is not None:  # in the loop: the batches' index, no request at rest
            processing = self._states.in_state(BatchState.PROCESSING)
        else:
            found = open_batch_states(self.zk, batch_ids(self.zk))
            processing = [b for b, state in found.items() if state == BatchState.PROCESSING]
        self._sweeping = bool(processing)
        for bid in processing:
            try:
                if moves.batch_complete_if_done(bid=bid):
                    log.info("%s batch-reporting swept: Processing -> Reporting", bid)
            except Exception as exc:
                if is_connection_error(exc):
                    raise
                log.warning("%s batch-reporting sweep: %s", bid, exc)

    def work(self, item: Batch) -> Step:
        report, previous = self.write_report(item)
        failed = report.get("failed_jobs") or []
        target = BatchState.FAILED if failed else BatchState.COMPLETED
        if not report.get("mailed"):
            self.mail(item, report, previous, target)
            # The mail went: recorded through a short outage (a ZooKeeper restart, a leader
            # election) rather than left to the next claim, which would send it again.
            patiently(
                lambda: batch_report_update(self.zk, item.bid, {"mailed": True}),
                patience=MAILED_PATIENCE,
            )
        succeeded = report.get("successful_jobs") or []
        message = f"{len(succeeded)} completed, {len(failed)} failed"
        if previous is not None:
            changes = report_changes(previous, report)
            message += f"; {len(changes['newly_successful'])} completed since the last report"
        return Next(target, message)

    def write_report(self, batch: Batch) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """This round's report (written now, or found from an interrupted run) and the one
        before it, which an update report is compared with; both with their lists whole (a
        large report keeps them in part nodes, read back here)."""
        current = batch.report
        key = round_key(batch)
        if current is not None and current.get("round") == key:
            try:
                whole = report_resolve(self.zk, batch.bid, current, depth=2) or {}
            except MalformedNode as exc:
                log.warning(
                    "%s batch-reporting: report unreadable, written again: %s", batch.bid, exc
                )
            else:
                history = whole.get("history") or []
                return whole, history[0] if history and isinstance(history[0], dict) else None
        try:
            previous = report_resolve(self.zk, batch.bid, current, depth=1)
        except MalformedNode as exc:
            # Only what changed since it is lost from the mail; the new report is still whole.
            log.warning("%s batch-reporting: earlier report unreadable: %s", batch.bid, exc)
            previous = None
        index = batch_job_ids(self.zk, batch.bid)
        # The round goes in the report's own write: a report the server applied but answered
        # with ConnectionLoss is then this round's, found by the next claim, not written again
        # as a second report (the chaos run's ZooKeeper restart caught a separate write of it
        # in between).
        report = batch_write_report(
            self.zk,
            batch,
            failed=index["batch-failed"],
            successful=index["batch-completed"],
            marks={"round": key, "mailed": False},
        )
        return report, previous

    def mail(
        self, batch: Batch, report: dict[str, Any], previous: dict[str, Any] | None, state: str
    ) -> None:
        try:
            profile = load_profile(batch.profile)
        except ProfileError as exc:
            log.warning("%s batch-reporting: no contacts from profile: %s", batch.bid, exc)
            profile = None
        to = clients.recipients(batch.submission, profile)
        if not to:
            log.info("%s batch-reporting: nobody to mail the summary to", batch.bid)
            return
        try:
            send_batch_summary(
                batch_id=batch.bid,
                title=batch.title or None,
                submitter=batch.submitter or None,
                profile_name=batch.profile,
                to=to,
                report=report,
                previous=previous,
                state=state,
                console_url=settings.MRT_CONSOLE_URL,
                round_key=report.get("round") or round_key(batch),
                batch_uuid=batch.uuid,
                attachments=self.attachments(report),
            )
        except Exception as exc:
            detail = " ".join((str(exc).strip() or type(exc).__name__).split())
            refusal = transient.mail_refusal(exc)
            if refusal is not None:
                # Every batch would meet it (the EMAIL_* settings, MRT_MAIL_FROM): wait, with
                # what the server refuses or does not offer as the reason.
                raise MailUnavailable(f"mail server {refusal}: {detail}") from exc
            if transient.is_mail_outage(exc):
                raise MailUnavailable(f"mail server unavailable: {detail}") from exc
            raise StepFailed(f"summary mail not sent: {detail}") from exc

    def attachments(self, report: dict[str, Any]) -> list[tuple[str, str, str]] | None:
        """Merritt's ``failed.json`` and ``completed.json`` for the report's jobs: each job's
        configuration, a failed one's with its status's ``Status`` and ``Message``
        (docs/merritt-services.md, "Mail"). A job that no longer loads is left out. None for
        a batch of more than ``ATTACHED_JOBS_MOST`` jobs: nothing loaded, nothing attached."""
        jobs = len(report.get("successful_jobs") or []) + len(report.get("failed_jobs") or [])
        if jobs > ATTACHED_JOBS_MOST:
            return None

        def configurations(jids: list[str], failed: bool) -> list[dict[str, Any]]:
            found = []
            for job in jobs_load(self.zk, [str(j) for j in jids]):
                if not isinstance(job, Job):
                    continue
                entry = dict(job.configuration)
                if failed:
                    entry.update(Status=job.status.status, Message=job.status.message)
                found.append(entry)
            return found

        return report_attachments(
            configurations(report.get("successful_jobs") or [], False),
            configurations(report.get("failed_jobs") or [], True),
        )

    def failure(self, item: Batch, exc: Exception) -> Step:
        """A mail server outage is waited out like a database's: the batch stays in its step
        and is tried again after the loop's back-off; the report is not written again, and
        the mail goes once (``mailed``)."""
        if not isinstance(exc, MailUnavailable):
            return super().failure(item, exc)
        backoff = transient.backoff_of(self)
        if backoff.failures == 0:
            log.warning("%s: %s; batches wait in their step until it is back", self.name, exc)
        time.sleep(backoff.next_delay())
        return Stay(str(exc))


class BatchUpdateReporting(BatchReporting):
    name: ClassVar[str] = "batch-update-reporting"
    step: ClassVar[str] = "batch-update-reporting"
    state: ClassVar[str] = BatchState.UPDATE_REPORTING

    def claim(self) -> Batch | None:
        return super(BatchReporting, self).claim()

    def accept(self, bid: str) -> bool:
        # A job resumed during troubleshooting may still be on its way; report when it is done.
        return not batch_job_ids(self.zk, bid)["batch-processing"]
