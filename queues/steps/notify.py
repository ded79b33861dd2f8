"""Telling depositors: a job's callback URL, the batch queued mail and the batch summary mail."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import requests

from queues.steps.fetch import USER_AGENT

# How many jobs the queued mail lists by ID; the rest are counted.
QUEUED_LISTED = 1000


class CallbackError(Exception):
    def __init__(self, url: str, message: str, *, status: int | None = None) -> None:
        self.url = url
        self.status = status
        super().__init__(f"callback {url}: {message}")


def post_callback(
    url: str,
    payload: Mapping[str, Any],
    *,
    timeout: float = 10.0,
    retries: int = 2,
    backoff: float = 0.5,
) -> int:
    """POST ``payload`` as JSON to ``url`` and return the 2xx status.

    Connection errors and 5xx are retried; any other non-2xx raises CallbackError at once.
    A depositor's endpoint may see the same job twice (steps are at-least-once), so the payload
    carries the job ID for it to deduplicate.
    """
    attempt = 0
    while True:
        try:
            response = requests.post(
                url, json=dict(payload), timeout=timeout, headers={"User-Agent": USER_AGENT}
            )
        except requests.RequestException as exc:
            error = CallbackError(url, f"unreachable ({exc})")
        else:
            if 200 <= response.status_code < 300:
                return response.status_code
            status = response.status_code
            error = CallbackError(url, f"HTTP {status}", status=status)
            if status < 500:
                raise error
        if attempt >= retries:
            raise error
        time.sleep(backoff * 2**attempt)
        attempt += 1


def _ids(report: Mapping[str, Any] | None, key: str) -> list[str]:
    values = (report or {}).get(key) or []
    return [str(v) for v in values]


def batch_summary(
    *,
    batch_id: str,
    title: str | None,
    submitter: str | None,
    profile_name: str,
    report: Mapping[str, Any],
    previous: Mapping[str, Any] | None,
    state: str,
    console_url: str,
) -> tuple[str, str]:
    """Subject and plain-text body of a batch summary mail.

    ``report`` and ``previous`` are status-report nodes: ``{last_modified, failed_jobs,
    successful_jobs}``. With ``previous`` (an update report) the body starts with what changed.
    """
    succeeded = _ids(report, "successful_jobs")
    failed = _ids(report, "failed_jobs")
    total = len(succeeded) + len(failed)
    label = title or batch_id
    kind = "update" if previous is not None else "report"
    subject = f"Merritt batch {batch_id} {state.lower()}: {label} ({len(succeeded)}/{total} ok)"
    lines = [
        *_header(batch_id, title, submitter, profile_name),
        f"State:     {state}",
        f"Report:    {kind}, {report.get('last_modified', '')}".rstrip(", "),
        "",
    ]
    if previous is not None:
        before_ok = set(_ids(previous, "successful_jobs"))
        before_failed = set(_ids(previous, "failed_jobs"))
        lines += _section(
            "Completed since the last report", [j for j in succeeded if j not in before_ok]
        )
        lines += _section(
            "Failed since the last report", [j for j in failed if j not in before_failed]
        )
        lines += _section("Still failed", [j for j in failed if j in before_failed])
    lines += _section(f"Successful jobs ({len(succeeded)})", succeeded, empty="none")
    lines += _section(f"Failed jobs ({len(failed)})", failed, empty="none")
    lines.append(f"Details: {console_url.rstrip('/')}/batches/{batch_id}/")
    return subject, "\n".join(lines) + "\n"


def batch_queued(
    *,
    batch_id: str,
    title: str | None,
    submitter: str | None,
    profile_name: str,
    jobs: Sequence[tuple[str, str]],
    console_url: str,
) -> tuple[str, str]:
    """Subject and plain-text body of the mail confirming that a batch's jobs are queued.

    ``jobs`` are (job ID, the object as the depositor named it) in the batch's order; a huge
    batch lists its first QUEUED_LISTED jobs and says how many more there are.
    """
    count = f"{len(jobs)} job" + ("" if len(jobs) == 1 else "s")
    subject = f"Merritt batch {batch_id} queued: {title or batch_id} ({count})"
    shown = [f"  {jid}  {name}".rstrip() for jid, name in jobs[:QUEUED_LISTED]]
    if len(jobs) > QUEUED_LISTED:
        shown.append(f"  ... and {len(jobs) - QUEUED_LISTED} more")
    lines = [
        *_header(batch_id, title, submitter, profile_name),
        f"Jobs:      {len(jobs)}",
        "",
        "Queued jobs:",
        *shown,
        "",
        "A summary follows once every job has completed or failed.",
        f"Details: {console_url.rstrip('/')}/batches/{batch_id}/",
    ]
    return subject, "\n".join(lines) + "\n"


def _header(batch_id: str, title: str | None, submitter: str | None, profile: str) -> list[str]:
    return [
        f"Batch:     {batch_id}",
        f"Title:     {title or '(none)'}",
        f"Submitter: {submitter or '(unknown)'}",
        f"Profile:   {profile}",
    ]


def _section(heading: str, ids: Sequence[str], *, empty: str | None = None) -> list[str]:
    if not ids and empty is None:
        return []
    return [f"{heading}:", *(f"  {j}" for j in ids), *([f"  {empty}"] if not ids else []), ""]


def send_batch_summary(
    *,
    batch_id: str,
    title: str | None,
    submitter: str | None,
    profile_name: str,
    to: list[str],
    report: Mapping[str, Any],
    previous: Mapping[str, Any] | None,
    state: str,
    console_url: str,
) -> int:
    """Mail the batch summary to ``to`` with Django's mail backend; returns messages sent."""
    if not to:
        return 0
    subject, body = batch_summary(
        batch_id=batch_id,
        title=title,
        submitter=submitter,
        profile_name=profile_name,
        report=report,
        previous=previous,
        state=state,
        console_url=console_url,
    )
    return send(to, subject, body)


def send(to: Sequence[str], subject: str, body: str) -> int:
    """Mail with Django's backend from MRT_MAIL_FROM; returns messages sent; errors raise."""
    from django.conf import settings
    from django.core.mail import send_mail

    if not to:
        return 0
    sender = settings.MRT_MAIL_FROM or settings.DEFAULT_FROM_EMAIL
    return send_mail(subject, body, sender, list(to), fail_silently=False)
