"""Jobs: the job list (filters, search, archived matches), a job's page (its path with earlier
failures, its timeline of steps and operator actions) and the actions on one job.

An action's GET shows the confirmation of a destructive one; its POST goes through
``actions.perform``. An htmx POST gets back the updated row or panel plus the messages; a plain
POST is redirected. Bulk job actions are in ``bulk.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.http import HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET

from queues.console import diagrams, job_reads, notes
from queues.core.states import JOB, JOB_STEPS, JobState
from queues.models import Note
from queues.operator import actions, archive, history
from queues.operator.audit import AuditEntry, EarlierFailure, earlier_failures, failure_of
from queues.operator.auth import VIEWER
from queues.operator.history import fmt_seconds
from queues.services import moves
from queues.web.forms import ActionForm, JobFilterForm
from queues.zk import paths as zpaths
from queues.zk.errors import DomainError
from queues.zk.records import Job

from .common import (
    GONE,
    HtmxHttpRequest,
    act,
    bad_form,
    bulk_actions,
    confirm,
    console_view,
    fragment,
    job_or_archived,
    job_state_link,
    querystring_without,
    redirect_after_post,
    safe_next,
)

log = logging.getLogger("queues.views")

NOTE_ACTIONS = ("note", "note-edit", "note-delete")


@require_GET
@console_view(VIEWER)
def jobs(request: HtmxHttpRequest) -> HttpResponse:
    form = JobFilterForm(request.GET or None)
    context: dict[str, Any] = {"form": form, "states": JOB.states}
    if request.GET and not form.is_valid():
        return bad_form(request, "queues/jobs.html", context)
    if form.is_bound and zpaths.JID_RE.fullmatch(form.cleaned_data["q"]):
        return redirect("job", jid=form.cleaned_data["q"])
    flt = form.to_filter() if form.is_bound else job_reads.JobFilter()
    page = job_reads.jobs_page(
        flt=flt, page=(form.cleaned_data.get("page") or 1) if form.is_bound else 1
    )
    context.update(
        {
            "flt": flt,
            "page": page,
            "query": querystring_without(request, "page"),
            "next": request.get_full_path(),
            "bulk_actions": bulk_actions(request.user, flt.state),
            # Jobs archived out of ZooKeeper by retention: exact IDs, ARK, local ID.
            "archived": archive.archived_jobs_matching(flt.q or flt.bid),
        }
    )
    if request.htmx and request.htmx.target == "job-table":
        table = render(request, "queues/jobs.html#job-table", context)
        table.write(render_to_string("queues/_archived_jobs.html", {**context, "oob": True}))
        return table
    return render(request, "queues/jobs_archived.html", context)


# A job's story --------------------------------------------------------------------------------


def path_with_failures(job: Job, current_path: list[str], failures: list[EarlierFailure]) -> list:
    """The states the job went through: each earlier failure as a visit to Failed after the
    step it failed in, then on from where the resume restarted it, up to where it is now."""
    if not failures or job.state not in (*JOB_STEPS, JobState.FAILED):
        return current_path
    path: list[str] = []
    start = 0
    for failure in failures:
        if failure.step in JOB_STEPS:
            end = JOB_STEPS.index(failure.step)
            path += list(JOB_STEPS[start : end + 1]) if end >= start else [failure.step]
        path.append(JobState.FAILED)
        target = failure.resumed_to or failure.step
        start = JOB_STEPS.index(target) if target in JOB_STEPS else 0
    restart = JOB_STEPS[start]
    tail = current_path[current_path.index(restart) :] if restart in current_path else current_path
    return path + tail


@dataclass(frozen=True)
class TimelineEvent:
    at: datetime
    what: str
    who: str = ""
    reason: str = ""
    detail: str = ""
    ok: bool = True
    kind: str = "state"  # "state", "action", "refused"
    sort_at: datetime | None = None  # where it goes in the order, when not ``at``


def timeline(
    job: Job,
    entries: list[AuditEntry],
    steps: Sequence[Any] = (),
    job_notes: Sequence[Note] = (),
) -> list[TimelineEvent]:
    """Every time we know of in the job's life, oldest first: its creation, each step a
    consumer ran (the step history: start, duration, host, outcome), each operator action from
    the audit log (with actor and reason), the operators' notes and the last change of its
    status."""
    events = [TimelineEvent(job.created, f"Created ({JobState.PENDING})", kind="state")]
    for note in job_notes:
        events.append(
            TimelineEvent(
                note.created,
                "Note" + (" (edited)" if note.edited else ""),
                who=note.author_name or "(unknown)",
                detail=note.text,
                kind="note",
            )
        )
    for step in steps:
        took = fmt_seconds(step.duration)
        events.append(
            TimelineEvent(
                step.started,
                f"{step.step} in {step.state}: {step.outcome}, {took}",
                who=step.host,
                detail=step.detail,
                ok=step.outcome != "failed",
                kind="step" if step.outcome != "failed" else "refused",
            )
        )
    for entry in entries:
        if entry.ok and entry.action in NOTE_ACTIONS:
            continue  # the note itself is on the timeline; its audit entries stay in the log
        failure = failure_of(entry)
        if entry.before or entry.after:
            what = f"{entry.action}: {entry.before or '?'} → {entry.after or '?'}"
        else:
            what = entry.action
        events.append(
            TimelineEvent(
                entry.at,
                what if entry.ok else f"{entry.action} refused",
                who=entry.username or "(unknown)",
                reason=entry.reason,
                detail=(
                    f"was {JobState.FAILED} in {failure.step}: {failure.message}"
                    if failure
                    else entry.detail
                ),
                ok=entry.ok,
                kind="action" if entry.ok else "refused",
            )
        )
    # The status node's own modification time: to the millisecond, where last_modified in it
    # is to the second (and would sort before the audit entry of the move that wrote it).
    last = job.status.mtime or job.status.last_modified
    if last is not None:
        # The operator's move into the current state is written to ZooKeeper a moment before
        # its audit entry: the state it entered is listed after it.
        entered = [
            e.at
            for e in entries
            if e.ok and e.after == job.state and abs((e.at - last).total_seconds()) < 5
        ]
        text = f"Entered {job.state} (status last modified)"
        events.append(
            TimelineEvent(
                last,
                text,
                detail=job.status.message,
                kind="state",
                sort_at=max([last, *entered]),
            )
        )
    return sorted(events, key=lambda e: e.sort_at or e.at)


def _step_records(jid: str) -> list[Any]:
    """The job's step records for its timeline; none when the database cannot say."""
    try:
        return history.item_steps(jid)
    except Exception as exc:  # no table yet, database away: the rest of the page still shows
        log.warning("step records of %s not read: %s", jid, exc)
        return []


def job_context(detail: job_reads.JobDetail) -> dict[str, Any]:
    """What the job page shows; also re-rendered in place after an htmx action on it."""
    jid = detail.jid
    svg = None
    audit = list(AuditEntry.objects.filter(item_id=jid)[:50])
    failures = earlier_failures(jid)
    path = detail.path
    if detail.job is not None:
        # Earlier failures (kept in the audit log) are visits to Failed on the path too.
        path = path_with_failures(detail.job, detail.path, failures)
        svg = diagrams.render(
            JOB,
            current=detail.job.state,
            path=path,
            href=job_state_link,
            title=f"Where {jid} is",
            id_prefix="jobpath",
            admin_from=detail.job.state,
        )
    return {
        "detail": detail,
        "j": detail.job,
        "svg": svg,
        "path": path,
        "audit": audit,
        "failures": failures,
        "timeline": (
            timeline(detail.job, audit[::-1], _step_records(jid), notes.notes_for("job", jid))
            if detail.job
            else []
        ),
        "resume_steps": _resume_steps(detail.job),
        "next": reverse("job", args=[jid]),
    }


def _resume_steps(job: Job | None) -> tuple[str, ...]:
    """The steps this job may resume at, for the page's "resume from" choice; none when it
    cannot be resumed (the page says why) or has only one."""
    if job is None or job.state != JobState.FAILED:
        return ()
    try:
        steps = moves.job_resume_steps(job)
    except DomainError:
        return ()
    return steps if len(steps) > 1 else ()


def _resume_step(form: ActionForm) -> dict[str, Any]:
    """The step a resume was asked to start from, when one was chosen."""
    return {"to": form.cleaned_data["to"]} if form.cleaned_data["to"] else {}


@require_GET
@console_view(VIEWER)
def job(request: HtmxHttpRequest, jid: str) -> HttpResponse:
    detail, archived = job_or_archived(jid)
    if detail is None:
        return render(request, "queues/archived_job.html", {"row": archived})
    return render(request, "queues/job.html", job_context(detail))


@console_view(VIEWER)
def job_action(request: HtmxHttpRequest, jid: str, action: str) -> HttpResponse:
    if request.method == "GET":
        if not actions.is_destructive("job", action):
            return HttpResponseNotAllowed(["POST"])
        return confirm(
            request,
            kind="job",
            action=action,
            item_id=jid,
            preview={"detail": job_reads.job_detail(jid=jid)},
        )
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    form = act(request, kind="job", action=action, item_id=jid, params=_resume_step)
    render_as = form.cleaned_data["render"]
    if request.htmx and render_as == "row":
        if action in GONE:
            return fragment(request, "queues/jobs.html#job-gone", {"jid": jid})
        return fragment(
            request,
            "queues/jobs.html#job-row",
            {"job": job_reads.job_one(jid=jid), "next": form.cleaned_data["next"]},
        )
    if request.htmx and render_as == "panel" and action not in GONE:
        detail = job_reads.job_detail(jid=jid)
        return fragment(request, "queues/job.html#job-body", job_context(detail))
    default = reverse("jobs") if action in GONE else reverse("job", args=[jid])
    return redirect_after_post(safe_next(request, form.cleaned_data["next"], default))
