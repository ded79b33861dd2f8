"""Telling depositors: a job's callback URL, and the batch summary mail."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import requests

from queues.steps.fetch import USER_AGENT


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
        f"Batch:     {batch_id}",
        f"Title:     {title or '(none)'}",
        f"Submitter: {submitter or '(unknown)'}",
        f"Profile:   {profile_name}",
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
    from django.conf import settings
    from django.core.mail import send_mail

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
    sender = settings.MRT_MAIL_FROM or settings.DEFAULT_FROM_EMAIL
    return send_mail(subject, body, sender, to, fail_silently=False)
