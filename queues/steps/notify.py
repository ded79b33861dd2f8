"""Telling depositors: a job's callback URL, the batch queued mail and the batch summary mail."""

from __future__ import annotations

import json
import logging
import re
import smtplib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from email.utils import parseaddr
from typing import Any
from urllib.parse import quote

from queues.core.clock import clock_text
from queues.core.outside_text import for_log, url_shown
from queues.core.retries import is_unavailable_status, origin_of, service_at, unavailable
from queues.steps.erc import XML_ILLEGAL
from queues.steps.merritt import merritt_digest_name
from queues.steps.netpolicy import (
    SYSTEM,
    FetchPolicy,
    FetchRefused,
    TooSlow,
    TransferFailed,
    exchange_deadline,
)

log = logging.getLogger(__name__)

# How many jobs the queued mail lists by ID; the rest are counted.
QUEUED_LISTED = 1000
# Seconds a mail server may take to answer when Django's EMAIL_TIMEOUT is not set.
MAIL_TIMEOUT = 60.0
# A whole send (connect, TLS, login, the message) may take this many times the timeout.
MAIL_EXCHANGES = 4


class CallbackError(Exception):
    def __init__(self, url: str, message: str, *, status: int | None = None) -> None:
        self.url = url
        self.status = status
        super().__init__(f"callback {url_shown(url)}: {message}")


# Merritt's job state, as its ingest formats it for a callback (docs/merritt-services.md).
JOB_STATE_NAMESPACE = "http://uc3.cdlib.org/ontology/mrt/ingest/job"

# The names Merritt's FormatType has (mrt-core2 formatter/FormatType.java): a notificationFormat
# is taken only when it spells one of them exactly (Java's Enum.valueOf: "XML" is none of them).
MERRITT_FORMAT_TYPES = frozenset(
    {
        *("anvl", "csv", "json", "json2", "serial", "octet"),
        *("tar", "targz", "txt", "xml", "xhtml", "zip"),
    }
)
# Merritt's ingest labels every callback JSON, whatever its format (HandlerCallback).
CALLBACK_CONTENT_TYPE = "application/json"


def post_callback(
    url: str,
    payload: Mapping[str, Any],
    *,
    timeout: float = 10.0,
    retries: int = 2,
    backoff: float = 0.5,
    policy: FetchPolicy | None = None,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
) -> int:
    """POST ``payload`` as JSON (or ``body``, already encoded, when given) to ``url`` under
    ``policy`` and return the 2xx status; every attempt carries ``headers``.

    The callback URL is the depositor's (their profile's), so it goes through the depositor
    fetch policy like their payloads: a callback to a refused address fails at once, naming
    it. Connection errors and 5xx are retried (``retries`` times, the receiver deduplicates by
    job ID), waiting ``backoff`` doubling, inside the policy's deadline, which bounds the whole
    callback, every attempt (``netpolicy.Repeats``): a repeat whose wait would end past it is
    not made, and the receiver counts as unavailable for now; any other non-2xx raises
    CallbackError at once. User and password in the URL
    (``https://u:p@host/...``) are sent as HTTP Basic authentication, as Merritt's ingest does.
    """
    rules = policy or replace(SYSTEM, timeout=timeout)
    if body is None:
        body = json.dumps(dict(payload)).encode()
    started = time.monotonic()
    repeats = rules.repeats(retries, backoff, started)
    while True:
        try:
            with rules.open(
                url,
                method="POST",
                started=started,
                body=body,
                content_type=CALLBACK_CONTENT_TYPE,
                headers=headers,
            ) as response:
                status = response.status
        except FetchRefused as exc:
            raise CallbackError(url, exc.reason) from None
        except (TransferFailed, TooSlow) as exc:
            answered, problem = None, f"unreachable ({exc})"
        else:
            if 200 <= status < 300:
                return status
            answered, problem = status, f"HTTP {status}"
            if not is_unavailable_status(status):
                raise CallbackError(url, problem, status=answered)
        # "": no repeat left; None: waited for the next; else why the next is not made.
        why = "" if repeats.spent else repeats.wait()
        if why is not None:
            # The receiver is away or overloaded: the job's notify step is tried again later
            # (queues.core.retries), not failed.
            words = f"{problem} (gave up after {repeats.attempts}: {why})" if why else problem
            raise CallbackError(url, words, status=answered) from unavailable(
                service_at("callback", url), problem, probe=origin_of(url)
            )


def job_callback_url(callback_url: str, job_id: str) -> str:
    """``{CallbackURL}/mc/{jobID}``: where Merritt's ingest posts a job's state."""
    return f"{callback_url.rstrip('/')}/mc/{quote(job_id, safe='')}"


# The Dublin Core elements Merritt's job state carries (``getDCcontributor`` ... ``getDCtype``),
# each shown as ``dC<element>`` and read from the job configuration's ``DC<element>``.
DUBLIN_CORE = (
    *("contributor", "coverage", "creator", "date", "description", "format", "identifier"),
    *("language", "publisher", "relation", "rights", "source", "subject", "title", "type"),
)
# Merritt's DigestEnum names (mrt-ingest utility/DigestEnum.java): ``digestType`` upper-cased is
# looked up among them; "Alder-32" (sic) can never match an upper-cased name.
MERRITT_HASH_ALGORITHMS = ("CRC-32", "MD2", "MD5", "SHA-1", "SHA-256", "SHA-384", "SHA-512")


def merritt_hash_algorithm(digest_type: object) -> str | None:
    """The ``hashAlgorithm`` Merritt's job state shows for a configuration's ``digestType``:
    its DigestEnum name when the type, upper-cased, is one (``md5`` -> ``MD5``, ``sha-256`` ->
    ``SHA-256``). A job this console wrote before it wrote Merritt's names has its own spelling
    (``sha256``), read as the algorithm it means (``SHA-256``). Any other name gives None
    (Merritt's getter then throws and the property is left out)."""
    if not isinstance(digest_type, str):
        return None
    name = digest_type.upper()
    if name not in MERRITT_HASH_ALGORITHMS:
        name = merritt_digest_name(digest_type)
    return name if name in MERRITT_HASH_ALGORITHMS else None


def _date_text(moment: datetime | None) -> str | None:
    # DateState's text: ISO 8601 to the second with the zone's offset.
    return moment.astimezone().isoformat(timespec="seconds") if moment else None


def merritt_job_state(
    *,
    job_id: str,
    status: str = "COMPLETED",
    label: str | None = None,
    package_name: str | None = None,
    submitted: datetime | None = None,
    consumed: datetime | None = None,
    completed: datetime | None = None,
    message: str | None = None,
    primary_id: str | None = None,
    local_ids: Sequence[str] = (),
    version: int | None = None,
    hash_algorithm: str | None = None,
    hash_value: str | None = None,
    creator: str | None = None,
    title: str | None = None,
    date: str | None = None,
    object_note: str | None = None,
    object_type: str | None = None,
    note: str | None = None,
    metacat_status: str | None = None,
    persistent_url: str | None = None,
    dublin_core: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """The JSON job state Merritt's ingest posts to a callback: one ``job:jobState`` object
    whose keys are the properties Merritt's ``JobState`` displays, with the ``job:`` prefix,
    absent ones left out (docs/merritt-services.md, "Callbacks"). The order is that of
    JobState's getters in its source (Merritt's own order is not established). Local ids are
    joined with ``;`` as Merritt's ingest joins a job's local ids, repeats dropped;
    ``dublin_core`` maps an element (``title``) to its value (shown as ``dCtitle``)."""
    dc = dublin_core or {}
    fields: dict[str, Any] = {
        "jobID": job_id,
        "jobLabel": label,
        "packageName": package_name,
        "submissionDate": _date_text(submitted),
        "consumptionDate": _date_text(consumed),
        "completionDate": _date_text(completed),
        "jobStatus": status,
        "jobStatusMessage": message,
        "primaryID": primary_id,
        "localID": ";".join(dict.fromkeys(i for i in local_ids if i)) or None,
        "versionID": version,
        "hashAlgorithm": hash_algorithm,
        "hashValue": hash_value,
        "objectCreator": creator,
        "objectTitle": title,
        "objectDate": date,
        "objectNote": object_note,
        "objectType": object_type,
        "note": note,
        "metacatStatus": metacat_status,
        "persistentURL": persistent_url,
        **{f"dC{element}": dc.get(element) for element in DUBLIN_CORE},
    }
    state: dict[str, Any] = {"xmlns:job": JOB_STATE_NAMESPACE}
    state.update({f"job:{k}": v for k, v in fields.items() if v not in (None, "")})
    return {"job:jobState": state}


def notification_format(job_value: object, profile_value: object, *, default: str = "json") -> str:
    """The format of a job's callback, chosen as Merritt's ingest chooses it: the job's
    ``notificationFormat`` when it names one of Merritt's format types exactly, else the
    profile's ``NotificationFormat`` likewise, else ``json``. A value that names none (``XML``,
    ``turtle``, a number) counts as not given. Merritt's batch handler chooses a batch's
    ``notificationFormat`` the same way from the request's and the profile's, with ``xml``
    as its ``default`` (docs/merritt-services.md, "Callbacks")."""
    for value in (job_value, profile_value):
        if isinstance(value, str) and value in MERRITT_FORMAT_TYPES:
            return value
    return default


def _state_fields(state: Mapping[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """The root name and the ``(name, text)`` properties of a ``merritt_job_state``, in its
    order; namespace declarations and absent values left out."""
    root, fields = next(iter(state.items()), ("job:jobState", {}))
    pairs = []
    for name, value in (fields if isinstance(fields, Mapping) else {}).items():
        if name.startswith("xmlns") or value is None or value == "":
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        pairs.append((str(name), text))
    return str(root), pairs


# Merritt's value escaping: the five XML entities, then every control character as a
# character reference (so a newline or CR in a title survives a parser's line-end handling).
_XML_ESCAPES = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    '"': "&quot;",
    "'": "&apos;",
    "\t": "&#9;",
    "\n": "&#10;",
    "\r": "&#13;",
}
_XML_SPECIAL = re.compile("[&<>\"'\t\n\r]")
# Merritt's element-name rule: a character outside these becomes "__".
_NOT_NAME = re.compile(r"[^._\-A-Za-z0-9]")


def _xml_text(text: str) -> str:
    # What XML 1.0 cannot carry even as a reference is dropped (Merritt's &#1; would not parse).
    return _XML_SPECIAL.sub(lambda m: _XML_ESCAPES[m.group()], XML_ILLEGAL.sub("", text))


def _xml_name(name: str) -> str:
    prefix, _, local = name.rpartition(":")
    return (prefix + ":" if prefix else "") + _NOT_NAME.sub("__", local)


def job_state_xml(state: Mapping[str, Any]) -> str:
    """A ``merritt_job_state`` as Merritt's XML formatter writes it: the XML declaration on a
    line of its own, the ``job:jobState`` root declaring the ``job`` namespace (single quotes),
    one ``<job:name>text</job:name>`` a line indented four spaces, the root closed on the last
    line with no newline after it."""
    root, pairs = _state_fields(state)
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f"<{_xml_name(root)} xmlns:job='{JOB_STATE_NAMESPACE}'>",
    ]
    for name, text in pairs:
        element = _xml_name(name)
        lines.append(f"    <{element}>{_xml_text(text)}</{element}>")
    lines.append(f"</{_xml_name(root)}>")
    return "\n".join(lines)


def job_state_anvl(state: Mapping[str, Any]) -> str:
    """A ``merritt_job_state`` as Merritt's ANVL formatter writes it: ``name: text`` a line,
    the bare property name (no ``job:``), every line ended by a newline. Merritt writes a value
    as it is; here a value's line breaks become spaces, so a title cannot forge a line (a
    ``jobStatus: COMPLETED`` of its own)."""
    _root, pairs = _state_fields(state)
    return "".join(
        f"{name.rpartition(':')[2]}: {' '.join(text.splitlines())}\n" for name, text in pairs
    )


def job_state_body(state: Mapping[str, Any], fmt: str = "json") -> bytes:
    """The callback's body: ``state`` in ``fmt`` (``notification_format``), UTF-8. JSON, XML
    and ANVL are established from Merritt's source; any other format (xhtml, csv, ...) goes as
    JSON (docs/merritt-services.md, "Callbacks")."""
    if fmt == "xml":
        return job_state_xml(state).encode()
    if fmt == "anvl":
        return job_state_anvl(state).encode(errors="replace")  # a lone surrogate: "?"
    return json.dumps(dict(state)).encode()


def post_job_callback(
    callback_url: str,
    job_id: str,
    state: Mapping[str, Any],
    *,
    timeout: float = 10.0,
    retries: int = 2,
    backoff: float = 0.5,
    policy: FetchPolicy | None = None,
    key: str = "",
    fmt: str = "json",
) -> int:
    """POST a job's state (``merritt_job_state``) in ``fmt`` (``notification_format``) to
    ``{CallbackURL}/mc/{jobID}``, labelled ``application/json`` whatever the format, as
    Merritt's ingest does, with ``key`` (``delivery_key``) as its ``Idempotency-Key`` header
    when given."""
    return post_callback(
        job_callback_url(callback_url, job_id),
        state,
        timeout=timeout,
        retries=retries,
        backoff=backoff,
        policy=policy,
        headers={IDEMPOTENCY_HEADER: key} if key else None,
        body=job_state_body(state, fmt),
    )


IDEMPOTENCY_HEADER = "Idempotency-Key"


def delivery_key(job_id: str, resumes: int, outcome: str) -> str:
    """The key of one outcome of one job, the same in every attempt to deliver it (a retry, a
    later claim after a crash or a lost session): the job's ID, how many times an operator has
    resumed it (the status's ``retry_count``: a resumed job's next outcome is a new one) and the
    outcome's state. A receiver that has seen the key drops the repeat (docs/daemons.md)."""
    return f"{job_id}.{resumes}.{outcome.lower()}"


def _ids(report: Mapping[str, Any] | None, key: str) -> list[str]:
    values = (report or {}).get(key) or []
    return [str(v) for v in values]


# Merritt's ingest mail (docs/merritt-services.md, "Mail"): its subject reads
# ``Ingest: <status> -- <step>: <batchID>;`` (FormatterUtil.getSubject), the status ``OK``, or
# ``Fail`` for a failed batch's report; the batch report carries its jobs as JSON attachments.
MERRITT_SERVICE = "Ingest"
MERRITT_OK = "OK"
MERRITT_FAIL = "Fail"
PROCESSED_STEP = "Submission Processed"
QUEUED_STEP = "Submission Queued"
REPORT_CONTENT_TYPE = "application/json; header=present"
FAILED_ATTACHMENT = "failed.json"
COMPLETED_ATTACHMENT = "completed.json"
# (file name, content, content type) of one attachment.
Attachment = tuple[str, str, str]
# The most jobs whose configurations the report attaches: each is a kilobyte or two, and a batch
# of tens of thousands would make a mail of tens of megabytes, past what mail servers take (a
# permanent refusal) or past the exchange's deadline (an outage, for ever). Above it the body
# says where the lists are instead.
ATTACHED_JOBS_MOST = 2_000


def merritt_subject(step: str, status: str, batch_uuid: str) -> str:
    """The subject Merritt's production ingest gives its mail about a batch: ``Ingest: OK --
    Submission Processed: bid-...;`` (no instance tag: that is for its stage and development
    hosts; no ``[aggregate]`` tag: that is for a profile's aggregate objects)."""
    return f"{MERRITT_SERVICE}: {status} -- {step}: {batch_uuid};"


def merritt_status_word(state: str) -> str:
    """``Fail`` for a Failed batch, else ``OK``, as Merritt's batch report spells them."""
    return MERRITT_FAIL if state.lower() == "failed" else MERRITT_OK


def report_attachments(
    completed: Sequence[Mapping[str, Any]], failed: Sequence[Mapping[str, Any]]
) -> list[Attachment]:
    """The batch report's attachments as Merritt's ingest makes them: ``failed.json``
    (``{"failedJobs": [...]}``, when a job failed), then ``completed.json``
    (``{"completedJobs": [...]}``, when one completed), each entry a job's configuration (a
    failed one with its ``Status`` and ``Message`` added by the caller), compact JSON, labelled
    ``application/json; header=present``."""

    def dump(key: str, jobs: Sequence[Mapping[str, Any]]) -> str:
        return json.dumps({key: [dict(j) for j in jobs]}, separators=(",", ":"), default=str)

    found: list[Attachment] = []
    if failed:
        found.append((FAILED_ATTACHMENT, dump("failedJobs", failed), REPORT_CONTENT_TYPE))
    if completed:
        found.append((COMPLETED_ATTACHMENT, dump("completedJobs", completed), REPORT_CONTENT_TYPE))
    return found


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
    batch_uuid: str = "",
    unattached: bool = False,
) -> tuple[str, str]:
    """Subject and plain-text body of a batch summary mail; ``unattached``: the job lists were
    left out of the mail (more than ``ATTACHED_JOBS_MOST`` jobs), which the body says.

    The subject starts with Merritt's (``merritt_subject``: ``Ingest: OK -- Submission
    Processed: <batch_uuid>;``, ``Fail`` for a Failed batch), the batch's external id
    ``batch_uuid`` (its ``batchID``; ``batch_id`` when not given), then the console's own words
    (``Merritt batch <bid> <state>: <title> (<ok>/<jobs> ok)``), which its pages look for.

    ``report`` and ``previous`` are status reports with their lists whole: ``{last_modified,
    failed_jobs, successful_jobs}`` (a large report keeps its lists in part nodes; the reporting
    daemon reads them back with ``batches.report_resolve`` before it mails). With ``previous``
    (an update report) the body starts with what changed.
    """
    succeeded = _ids(report, "successful_jobs")
    failed = _ids(report, "failed_jobs")
    total = len(succeeded) + len(failed)
    label = title or batch_id
    kind = "update" if previous is not None else "report"
    merritt = merritt_subject(PROCESSED_STEP, merritt_status_word(state), batch_uuid or batch_id)
    ours = f"Merritt batch {batch_id} {state.lower()}: {label} ({len(succeeded)}/{total} ok)"
    subject = f"{merritt} {ours}"
    lines = [
        *_header(batch_id, title, submitter, profile_name),
        f"State:     {state}",
        f"Report:    {kind}, {clock_text(report.get('last_modified'))}".rstrip(", "),
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
    if unattached:
        lines.append(
            f"Attached:  nothing: {FAILED_ATTACHMENT} and {COMPLETED_ATTACHMENT} are left out for "
            f"a batch of {total:,} jobs; the page below lists them"
        )
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
    batch_uuid: str = "",
) -> tuple[str, str]:
    """Subject and plain-text body of the mail confirming that a batch's jobs are queued.

    The subject starts with Merritt's (``Ingest: OK -- Submission Queued: <batch_uuid>;``),
    then the console's own words (``Merritt batch <bid> queued: <title> (<n> jobs)``).

    ``jobs`` are (job ID, the object as the depositor named it) in the batch's order; a huge
    batch lists its first QUEUED_LISTED jobs and says how many more there are.
    """
    count = f"{len(jobs)} job" + ("" if len(jobs) == 1 else "s")
    merritt = merritt_subject(QUEUED_STEP, MERRITT_OK, batch_uuid or batch_id)
    subject = f"{merritt} Merritt batch {batch_id} queued: {title or batch_id} ({count})"
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
    round_key: str = "",
    batch_uuid: str = "",
    attachments: Sequence[Attachment] | None = (),
) -> int:
    """Mail the batch summary to ``to`` with Django's mail backend, with ``attachments``
    (``report_attachments``; None: left out for the batch's size, as the body says); returns
    messages sent.
    ``round_key`` names the report (a batch's status and its version): the mail's Message-ID
    is made of it (``summary_message_id``), so a summary sent again for the same report, by a
    consumer that took the batch over from one killed between sending it and recording it,
    is the same message to every mail system and reader that drops a repeated Message-ID."""
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
        batch_uuid=batch_uuid,
        unattached=attachments is None,
    )
    message_id = summary_message_id(batch_id, round_key) if round_key else None
    return send(to, subject, body, message_id=message_id, attachments=attachments or ())


def summary_message_id(batch_id: str, round_key: str) -> str:
    """The Message-ID of a batch's summary for one report: the same on every host and every
    try (RFC 5322 ``msg-id``: a dot-atom, then the domain of MRT_MAIL_FROM)."""
    from django.conf import settings

    sender = settings.MRT_MAIL_FROM or settings.DEFAULT_FROM_EMAIL
    domain = parseaddr(sender)[1].rpartition("@")[2]
    domain = _NOT_ATOM.sub("-", domain) or "merritt-queue-console"
    left = _NOT_ATOM.sub("-", f"batch-summary.{batch_id}.{round_key}")
    return f"<{left}@{domain}>"


# Characters outside an RFC 5322 dot-atom (and "." kept): each becomes "-".
_NOT_ATOM = re.compile(r"[^A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]")


def mail_addresses(values: Iterable[object]) -> list[str]:
    """The values that are one mail address each, as a mail server takes them (Django's
    ``validate_email``), stripped, each once. A depositor's submission names its own: one
    written ``a@example.org,b@example.org`` made the whole send raise, the profile's
    contacts' mail with it."""
    from django.core.exceptions import ValidationError
    from django.core.validators import validate_email

    found: list[str] = []
    for value in values:
        if not isinstance(value, str):
            continue
        address = value.strip()
        try:
            validate_email(address)
        except ValidationError:
            continue
        found.append(address)
    return list(dict.fromkeys(found))


def one_line(text: str) -> str:
    """``text`` as one header line: its whitespace runs (newlines too) one space, any other
    control character a visible escape. A batch's title or a hold's reason, from outside, with
    a newline made Django refuse the header, and the batch's step failed on it."""
    return for_log(" ".join(text.split()))


def send(
    to: Sequence[str],
    subject: str,
    body: str,
    *,
    message_id: str | None = None,
    attachments: Sequence[Attachment] = (),
) -> int:
    """Mail with Django's backend from MRT_MAIL_FROM to those of ``to`` that are addresses
    (``mail_addresses``), under ``message_id`` when given (else one of Django's, new each
    time), with ``attachments`` (file name, text, content type); returns messages sent; errors
    raise. The exchange with the mail server has
    MAIL_EXCHANGES x its timeout in all (``queues.steps.smtp``)."""
    from django.conf import settings
    from django.core.mail import EmailMessage, get_connection

    addresses = mail_addresses(to)
    left = [value for value in to if str(value).strip() not in addresses]
    if left:
        log.warning("mail: not an address, left out: %s", ", ".join(map(str, left)))
    if not addresses:
        return 0
    sender = settings.MRT_MAIL_FROM or settings.DEFAULT_FROM_EMAIL
    # Without EMAIL_TIMEOUT Django's SMTP connection waits for ever on a server that accepts
    # and says nothing, and the daemon with it; timing out makes it an outage to wait out.
    timeout = getattr(settings, "EMAIL_TIMEOUT", None) or MAIL_TIMEOUT
    connection = get_connection(fail_silently=False, timeout=timeout)
    with exchange_deadline(MAIL_EXCHANGES * timeout) as alarm:
        try:
            message = EmailMessage(
                one_line(subject),
                body,
                sender,
                addresses,
                connection=connection,
                headers={"Message-ID": message_id} if message_id else None,
            )
            for name, content, content_type in attachments:
                message.attach(name, content, content_type)
            return message.send()
        except OSError as exc:
            if alarm.fired:
                raise smtplib.SMTPServerDisconnected(f"mail exchange {alarm.reason}") from exc
            raise
