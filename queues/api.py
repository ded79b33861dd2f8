"""The JSON API under /api/: the console's reads and actions for scripts.

Authentication is by token only (``Authorization: Bearer <key>`` or ``Token <key>``, checked by
``auth.token_from``, the one token check), never by session cookie, so the endpoints can be
CSRF-exempt without a browser being able to forge them. The reads are the pages' selectors and
forms, the actions go through the same ``actions.perform`` (roles, state checks, audit log), and
a refusal gets the status the pages give it (``views.common.refusal_for``), as JSON.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import re_path, reverse
from django.views.decorators.csrf import csrf_exempt

from queues import (
    actions,
    archive,
    backlog,
    bulkrun,
    clock,
    failure_causes,
    notes,
    retries,
    selectors,
    waits,
)
from queues.audit import AuditEntry
from queues.auth import BEARER_CHALLENGE, VIEWER, has_role, require_action, token_from
from queues.forms import (
    AccessFilterForm,
    ActionForm,
    BatchFilterForm,
    FailedFilterForm,
    JobFilterForm,
    SubmitForm,
)
from queues.models import Note
from queues.routes import (
    ACCESS_ACTION,
    BATCH_ACTION,
    BID,
    HELD_NODE,
    HELD_PROFILE,
    HELD_SERVICE,
    HOLD_ACTION,
    JID,
    JOB_ACTION,
    QID,
    QUEUE_HOLD,
)
from queues.services import Outcome
from queues.states import JOB, JobState
from queues.zk import batches as zbatches
from queues.zk import paths as zpaths
from queues.zk.client import connected_client
from queues.zk.errors import InvalidTransition, NotFound
from queues.zk.maintenance import node_number, service_name, window_info
from queues.zk.records import AccessRequest, Batch, Broken, Job

from .views.common import (
    RETRY_SECONDS,
    batch_or_archived,
    index_loading,
    job_or_archived,
    perform_posted,
    refusal_for,
    run_bulk,
)


def _error(message: str, status: int) -> JsonResponse:
    response = JsonResponse({"error": message, "status": status}, status=status)
    if status == 503:
        response["Retry-After"] = str(RETRY_SECONDS)
    return response


def api_view(
    *methods: str, index: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., HttpResponse]]:
    """Token auth, the viewer role for anything at all, JSON errors with the pages' statuses.

    ``index``: a GET answer comes from the read index, and says in ``loading`` what it is
    still loading after a start ("" once filled), as every page does (``index_loading``);
    an answer with a ``loading`` of its own (a search not complete yet) keeps it."""

    def decorator(view: Callable[..., Any]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                return _error(f"method {request.method} not allowed", 405)
            token = token_from(request)
            if token is None:
                response = _error("a valid API token is required", 401)
                response["WWW-Authenticate"] = BEARER_CHALLENGE
                return response
            request.user = token.user
            if not has_role(token.user, VIEWER):
                return _error("this token's user has no console role", 403)
            try:
                result = view(request, *args, **kwargs)
            except Exception as exc:
                refusal = refusal_for(exc)
                if refusal is None:
                    raise
                if not refusal.unavailable:
                    return _error(refusal.message, refusal.status)
                return _error(f"ZooKeeper is unavailable: {refusal.message}", 503)
            if isinstance(result, HttpResponse):
                return result
            if index and request.method == "GET" and not result.get("loading"):
                result["loading"] = index_loading()
            return JsonResponse(result)

        return wrapped

    return decorator


def _body(request: HttpRequest) -> dict[str, Any]:
    """A JSON object body, or form fields; anything else is a 400."""
    if request.content_type == "application/json":
        try:
            data = json.loads(request.body or b"{}")
        except ValueError as exc:
            raise ValueError(f"the body is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return data
    return request.POST.dict()


def form_input(
    data: Mapping[str, Any], form_class: type[forms.Form], *, also: Iterable[str] = (), what: str
) -> dict[str, str]:
    """A JSON object's fields for ``form_class``, as a browser would post them: a closed set of
    keys (the form's fields and ``also``), each text, a number, true/false or null (null: not
    given). An unknown key is a 400 naming it, never a field quietly left out (a filter key
    misspelt would otherwise widen the filter, a hold's end misspelt would hold with no end);
    a list or an object where a field goes is a 400, never a 500 from the field's parser."""
    known = set(form_class.base_fields) | set(also)
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        names = ", ".join(repr(k[:40]) for k in unknown[:5])
        raise ValueError(
            f"{what}: unknown key{'s' if len(unknown) > 1 else ''} {names}; "
            f"the keys are {', '.join(sorted(known))}"
        )
    fields: dict[str, str] = {}
    for key, value in data.items():
        if value is None or key not in form_class.base_fields:
            continue
        if isinstance(value, dict | list):
            kind = "an object" if isinstance(value, dict) else "a list"
            raise ValueError(f"{what}: {key} must be text, a number or true/false, not {kind}")
        fields[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return fields


def _version(data: dict[str, Any]) -> int | None:
    value = data.get("version")
    if value in (None, ""):
        return None
    if isinstance(value, bool) or not str(value).isdigit():
        raise ValueError("version must be a non-negative integer")
    return int(value)


def _stamp(value: Any) -> str | None:
    """Every time the API answers: one ISO-8601 form, UTC to the second (``queues.clock``)."""
    return clock.exact(value) or None if value is not None else None


def retry_json(raw: dict[str, Any]) -> dict[str, Any] | None:
    """A job's wait for its next try after an outage of a service outside (queues.retries):
    the service, the tries failed so far, the next try (ISO 8601, UTC) and the last reason;
    None when it waits for none."""
    record = retries.current(raw)
    next_at = retries.next_try(raw)
    if record is None or next_at is None:
        return None
    reasons = [r for r in record.get("reasons", []) if isinstance(r, str)]
    return {
        "service": str(record.get("service", "")),
        "failed_tries": record.get("attempt"),
        "next_try": clock.exact(datetime.fromtimestamp(next_at, UTC)),
        "last_reason": reasons[-1].partition(" ")[2] if reasons else "",
    }


def job_json(job: Job | Broken, *, full: bool = False) -> dict[str, Any]:
    if isinstance(job, Broken):
        return {"id": job.id, "broken": True, "path": job.path, "reason": job.reason}
    data: dict[str, Any] = {
        "id": job.jid,
        "batch": job.bid,
        "state": job.state,
        "version": job.status.version,
        "priority": job.priority,
        "profile": job.profile,
        "submitter": job.submitter,
        "primary_id": job.primary_id,
        "local_ids": job.local_ids,
        "message": job.status.message,
        "last_successful_status": job.status.last_successful_status,
        "retry_count": job.status.retry_count,
        "seconds_in_state": round(job.status.age_seconds),
        "space_needed": job.space_needed,
        "locked": job.lock is not None,
        "lock_age_seconds": round(job.lock.age_seconds) if job.lock else None,
        "retry": retry_json(job.status.raw),
    }
    if getattr(job, "archived", False):  # retention moved it into the database: read-only
        data["archived"] = True
    if full:
        data.update(
            {
                "status": job.status.raw,
                "configuration": job.configuration,
                "identifiers": job.identifiers,
                "metadata": job.metadata,
                "inventory": job.inventory,
                "store": job.store,
                "problems": job.problems,
                "created": _stamp(job.created),
            }
        )
    return data


def batch_json(
    batch: Batch | Broken,
    folders: dict[str, int] | None = None,
    states: dict[str, int] | None = None,
) -> dict[str, Any]:
    if isinstance(batch, Broken):
        return {"id": batch.id, "broken": True, "path": batch.path, "reason": batch.reason}
    data = {
        "id": batch.bid,
        "uuid": batch.uuid,
        "state": batch.state,
        "version": batch.status.version,
        "profile": batch.profile,
        "submitter": batch.submitter,
        "title": batch.title,
        "type": batch.type,
        "message": batch.status.message,
        "created": _stamp(batch.created),
        "seconds_in_state": round(batch.status.age_seconds),
        "locked": batch.lock is not None,
    }
    if getattr(batch, "archived", False):
        data["archived"] = True
    if folders is not None:
        data["jobs"] = folders
    if states is not None:
        data["job_states"] = states
    return data


def access_json(item: AccessRequest | Broken) -> dict[str, Any]:
    if isinstance(item, Broken):
        return {"id": item.id, "broken": True, "path": item.path, "reason": item.reason}
    return {
        "id": item.qid,
        "queue": item.queue,
        "state": item.state,
        "version": item.status.version,
        "message": item.status.message,
        "token": item.token,
        "created": _stamp(item.created),
        "seconds_in_state": round(item.status.age_seconds),
    }


def _outcomes(outcomes: list[Outcome]) -> dict[str, Any]:
    return {
        "outcomes": [
            {"kind": o.kind, "id": o.id, "before": o.before, "after": o.after, "detail": o.detail}
            for o in outcomes
        ]
    }


def _counts(summary: dict[str, selectors.StateCount]) -> dict[str, Any]:
    return {s: {"count": c.count, "oldest_seconds": c.oldest_seconds} for s, c in summary.items()}


@api_view("GET", index=True)
def overview(request: HttpRequest) -> dict[str, Any]:
    ov = selectors.overview()
    return {
        "jobs": _counts(ov.jobs),
        "batches": _counts(ov.batches),
        "access": _counts(ov.access),
        "holds": {
            "queues": {q: _stamp(t) for q, t in ov.holds.queues.items()},
            "collections": {c: _stamp(t) for c, t in ov.holds.collections.items()},
        },
        "held_jobs_by_collection": ov.held_by_collection,
        "bytes_in_process": ov.bytes_in_process,
        "backlog": backlog.as_json(backlog.backlog()),
    }


def _page(page: selectors.Page, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "items": items,
        "page": page.number,
        "per_page": page.per_page,
        "total": page.total,
        "has_next": page.has_next,
        "scan_limited": page.scan_limited,
    }


def _only(data: Mapping[str, Any], *keys: str, what: str = "query") -> None:
    """A 400 naming any key of ``data`` that is not one of ``keys`` (a closed set)."""
    unknown = sorted(str(k) for k in data if k not in keys)
    if unknown:
        named = ", ".join(repr(k[:40]) for k in unknown[:5])
        known = ", ".join(keys) if keys else "none"
        raise ValueError(f"{what}: unknown key {named}; the keys are {known}")


def _text(data: Mapping[str, Any], key: str) -> str:
    """A body's text field ("" when not given); a number, a list or an object is a 400."""
    value = data.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key} must be text")
    return value


def _query(request: HttpRequest, form_class: type[forms.Form], *, also: Iterable[str] = ()) -> Any:
    """A list's filter from the query string: a closed set of keys, as a bulk filter's."""
    form_input(request.GET, form_class, also=also, what="filter")
    return form_class(request.GET)


@api_view("GET", index=True)
def jobs(request: HttpRequest) -> dict[str, Any]:
    form = _query(request, JobFilterForm)
    if not form.is_valid():
        raise ValueError(form.errors.as_text())
    page = selectors.jobs_page(flt=form.to_filter(), page=form.cleaned_data["page"] or 1)
    # "loading": a search answered before the read index has every job's local ID and ARK
    # (else, as every answer from the index, what it is still loading after a start).
    return {**_page(page, [job_json(j) for j in page.items]), "loading": page.loading}


@api_view("GET")
def job(request: HttpRequest, jid: str) -> dict[str, Any]:
    detail, archived = job_or_archived(jid)
    if detail is None:
        return archive.job_json(archived)
    if detail.job is None:
        broken = detail.broken.path if detail.broken is not None else None
        return {"id": jid, "broken": True, "path": broken, "nodes": detail.nodes}
    wait = waits.job_wait(detail.job)
    return {
        **job_json(detail.job, full=True),
        "path": detail.path,
        "waiting_for": wait.as_json() if wait else None,
    }


def _act(
    request: HttpRequest,
    *,
    kind: str,
    action: str,
    item_id: str,
    params: Callable[[ActionForm], dict[str, Any]] | None = None,
    also: Iterable[str] = (),
) -> dict[str, Any]:
    """One action from a JSON body {"version": ..., "reason": ..., ...}: the same fields, checks
    and ``actions.perform`` as the console's action views (role, state machine, version, audit);
    a key that is no field of an action (nor in ``also``) is refused before anything is done."""
    _form, outcomes = perform_posted(
        request.user,
        form_input(_body(request), ActionForm, also=also, what=f"{action} of a {kind}"),
        kind=kind,
        action=action,
        item_id=item_id,
        params=params,
        via="api",
    )
    return _outcomes(outcomes)


def _resume_step(form: ActionForm) -> dict[str, Any]:
    """A resume's chosen step ("to"), checked against the job by the service."""
    return {"to": form.cleaned_data["to"]} if form.cleaned_data["to"] else {}


@api_view("POST")
def job_action(request: HttpRequest, jid: str, action: str) -> dict[str, Any]:
    return _act(request, kind="job", action=action, item_id=jid, params=_resume_step)


# The keys of POST /api/jobs/bulk, and of its "filter": the job list's filter but its page and
# order, which choose rows to show, not jobs to act on.
BULK_KEYS = ("action", "jobs", "filter", "all", "reason", "to")
BULK_FILTER_UNUSED = ("page", "sort")


def _bulk_items(data: dict[str, Any]) -> tuple[list[tuple[str, int | None]], bool]:
    """The jobs a bulk request names, checked whole before any is acted on: a list of jobs, or
    a filter (a closed set of keys; one that narrows nothing is refused unless the request says
    ``"all": true``, the one way to ask for every job); and whether the filter's scan stopped."""
    unknown = sorted(str(k) for k in data if k not in BULK_KEYS)
    if unknown:
        raise ValueError(
            f"unknown key {', '.join(repr(k[:40]) for k in unknown[:5])}: "
            f"a bulk request has {', '.join(BULK_KEYS)}"
        )
    every = data.get("all", False)
    if not isinstance(every, bool):
        raise ValueError('"all" must be true or false')
    given = [k for k in ("jobs", "filter") if k in data]
    if len(given) > 1:
        raise ValueError('give "jobs" or "filter", not both')
    if "jobs" in data:
        if every:
            raise ValueError('"all": true means every job: give it without "jobs"')
        if not isinstance(data["jobs"], list):
            raise ValueError('"jobs" must be a list')
        items: list[tuple[str, int | None]] = []
        for entry in data["jobs"]:
            entry = entry if isinstance(entry, dict) else {"id": entry}
            if isinstance(entry.get("id"), dict | list) or set(entry) - {"id", "version"}:
                raise ValueError('a job in "jobs" is an ID or {"id": ..., "version": ...}')
            items.append((zpaths.jid(str(entry.get("id", ""))), _version(entry)))
        return items, False
    flt = data.get("filter", {})
    if not isinstance(flt, dict):
        raise ValueError('"filter" must be an object')
    if not given and not every:
        raise ValueError('give "jobs" (a list) or "filter" (an object)')
    shown = [k for k in BULK_FILTER_UNUSED if k in flt]
    if shown:
        raise ValueError(f"filter: {' and '.join(shown)} choose rows to show, not jobs to act on")
    form = JobFilterForm(form_input(flt, JobFilterForm, what="filter"))
    if not form.is_valid():
        raise ValueError(form.errors.as_text())
    narrows = form.narrows()
    if narrows and every:
        raise ValueError('"all": true means every job: give it without a filter that narrows')
    if not narrows and not every:
        raise ValueError(
            'the filter narrows nothing: say "all": true to act on every job, or narrow it'
        )
    jids, limited = selectors.jobs_matching(flt=form.to_filter())
    return [(j, None) for j in jids], limited


@api_view("POST")
def jobs_bulk(request: HttpRequest) -> dict[str, Any] | HttpResponse:
    """{"action": ..., "jobs": [{"id":..., "version":...}, ...] | "filter": {...}, "reason": ...}

    ``filter`` takes the job list's filter keys (``state``, ``profile``, ``bid``, ``submitter``,
    ``min_age_hours``, ``priority``, ``q``, ``stuck``) and no others; every job, whatever its
    state and collection, is ``"all": true`` and nothing else. Over MRT_BULK_INLINE_MAX jobs it
    answers 202 at once with the background run (its URL in Location), as the console does;
    otherwise with what was done once it is done."""
    data = _body(request)
    to = data.get("to") or ""
    if not isinstance(to, str) or (to and to not in JOB.action_targets("resume", JobState.FAILED)):
        raise ValueError(f'"to" must name a job step a resume may go to, not {str(to)[:40]!r}')
    for key in ("action", "reason"):
        if not isinstance(data.get(key, ""), str):
            raise ValueError(f'"{key}" must be text')
    action, reason = data.get("action", ""), data.get("reason", "")
    actions.check_bulk(user=request.user, kind="job", action=action, reason=reason)
    items, limited = _bulk_items(data)
    result = run_bulk(
        user=request.user,
        kind="job",
        action=action,
        items=items,
        reason=reason,
        limited=limited,
        via="api",
        params={"to": to} if to else None,
    )
    if isinstance(result, bulkrun.BulkRun):
        response = JsonResponse(bulk_run_json(result), status=202)
        response["Location"] = reverse("api-bulk-run", args=[result.pk])
        return response
    return {
        **_outcomes(result.done),
        "skipped": [{"id": i, "reason": why} for i, why in result.skipped],
        "summary": result.summary(),
    }


@api_view("GET", index=True)
def failed(request: HttpRequest) -> dict[str, Any]:
    """Failed jobs, oldest first, ``selectors.FAILED_ROWS_PER_PAGE`` (50) per page (``page``),
    filtered by ``bid``, ``profile``, ``step``; with the counts per batch, collection and
    failing step of everything the filter matches."""
    form = _query(request, FailedFilterForm, also=("page",))
    if not form.is_valid():
        raise ValueError(form.errors.as_text())
    number = request.GET.get("page") or "1"
    if not number.isdigit() or int(number) < 1:
        raise ValueError("page must be a positive number")
    page, steps = selectors.failed_page(**form.cleaned_data, page=int(number))
    return {
        **_page(
            page,
            [
                {**job_json(j), "failed_step": steps.get(j.jid, "")}
                if isinstance(j, Job)
                else job_json(j)
                for j in page.items
            ],
        ),
        "groups": selectors.failed_group_counts(**form.cleaned_data),
        "loading": page.loading,
    }


@api_view("GET", index=True)
def failed_causes(request: HttpRequest) -> dict[str, Any]:
    """Failed jobs grouped by cause (failing step and normalised message), most jobs first,
    ``failure_causes.GROUPS_PER_PAGE`` groups per page; the same filters as ``failed``."""
    form = _query(request, FailedFilterForm, also=("page",))
    if not form.is_valid():
        raise ValueError(form.errors.as_text())
    number = request.GET.get("page") or "1"
    if not number.isdigit() or int(number) < 1:
        raise ValueError("page must be a positive number")
    causes = failure_causes.failure_causes(**form.cleaned_data)
    page = failure_causes.page_of(causes, int(number))
    return {
        **_page(page, [failure_causes.group_json(g) for g in page.items]),
        "jobs": causes.total,
        "loading": page.loading,
    }


@api_view("GET", "POST", index=True)
def batches(request: HttpRequest) -> dict[str, Any]:
    if request.method == "POST":
        form = SubmitForm(form_input(_body(request), SubmitForm, what="submission"))
        if not form.is_valid():
            raise ValueError(form.errors.as_text())
        return _outcomes(
            actions.perform(
                user=request.user,
                kind="batch",
                action="submit",
                item_id="",
                params=form.cleaned_data,
                via="api",
            )
        )
    filters = _query(request, BatchFilterForm)
    if not filters.is_valid():
        raise ValueError(filters.errors.as_text())
    page = selectors.batches_page(flt=filters.to_filter(), page=filters.cleaned_data["page"] or 1)
    return _page(page, [batch_json(r.item, r.folders, r.states) for r in page.items])


# A batch's job IDs per answer of /api/batches/BID: by default, and at most.
BATCH_JOBS_PER_PAGE = 1000
BATCH_JOBS_MAX_PER_PAGE = 10_000


def _positive(request: HttpRequest, name: str, default: int, most: int) -> int:
    value = request.GET.get(name) or str(default)
    if not value.isdigit() or not 1 <= int(value) <= most:
        raise ValueError(f"{name} must be a number from 1 to {most}")
    return int(value)


@api_view("GET", index=True)
def batch(request: HttpRequest, bid: str) -> dict[str, Any]:
    """A batch, the counts of its jobs (per state: ``job_states``; per index folder:
    ``folders``) and one page of its job IDs by state (``jobs``), ``limit`` of them by job ID:
    after the job ID ``after`` (the previous answer's ``next``, null on the last page) or on page
    ``page``; ``state`` keeps one state's jobs. Counts and IDs come from the read index: the
    answer costs the same requests for a batch of 10 jobs as for one of 100,000."""
    _only(request.GET, "limit", "after", "page", "state")
    limit = _positive(request, "limit", BATCH_JOBS_PER_PAGE, BATCH_JOBS_MAX_PER_PAGE)
    after = request.GET.get("after") or ""
    if after and not zpaths.JID_RE.fullmatch(after):
        raise ValueError("after must be a job ID (jidNNNNNNNNNN)")
    if after and request.GET.get("page"):
        raise ValueError("give either after or page, not both")
    number = _positive(request, "page", 1, 10**9)
    state = request.GET.get("state") or ""
    if state and not (JOB.is_state(state) or state == zbatches.UNLISTED):
        raise ValueError(f"{state!r} is not a job state")
    detail, archived = batch_or_archived(bid, per_state=0)
    if detail is None:
        return archive.batch_json(archived)
    found = zbatches.batch_jobs(
        connected_client(),
        detail.batch.bid,
        state=state,
        after=after,
        skip=0 if after else (number - 1) * limit,
        limit=limit,
    )
    return {
        **batch_json(detail.batch),
        "job_states": found.states,
        "folders": found.folders,
        "total_jobs": found.total,
        "jobs": found.by_state(),
        # The ``state`` filter echoed under its own name: ``state`` is the batch's own.
        "job_state": state,
        "limit": limit,
        "after": after,
        "page": None if after else number,
        "next": found.next,
        "has_next": found.next is not None,
        "status_report": detail.report,
    }


@api_view("POST")
def batch_action(request: HttpRequest, bid: str, action: str) -> dict[str, Any]:
    return _act(request, kind="batch", action=action, item_id=bid)


@api_view("GET")
def access(request: HttpRequest) -> dict[str, Any]:
    form = _query(request, AccessFilterForm)
    if not form.is_valid():
        raise ValueError(form.errors.as_text())
    items = selectors.access_requests(
        queue=form.cleaned_data["queue"], state=form.cleaned_data["state"]
    )
    return {"items": [access_json(i) for i in items]}


@api_view("POST")
def access_action(request: HttpRequest, queue: str, qid: str, action: str) -> dict[str, Any]:
    return _act(
        request,
        kind="access",
        action=action,
        item_id=qid,
        params=lambda form: {"queue": queue, "to": form.cleaned_data["to"]},
    )


@api_view("GET", index=True)
def holds(request: HttpRequest) -> dict[str, Any]:
    view = selectors.holds_view()
    return {
        "queues": {q: _stamp(t) for q, t in view.holds.queues.items()},
        "collections": {c: _stamp(t) for c, t in view.holds.collections.items()},
        "held_jobs_by_collection": view.held_jobs,
        "nodes": {
            str(n): {"since": _stamp(h.at), "by": h.by, "reason": h.reason}
            for n, h in view.nodes.items()
        },
        "services": {
            s: {"since": _stamp(h.at), "by": h.by, "reason": h.reason}
            for s, h in view.services.items()
        },
        "windows": [window_info(w) for w in view.windows.values()],
        # Every hold with who placed it, why and until when, in one form for every kind.
        "details": [h.as_json() for h in view.details.all()],
    }


@api_view("POST")
def hold_action(request: HttpRequest, kind: str, name: str, action: str) -> dict[str, Any]:
    return _act(
        request,
        kind=kind,
        action=action,
        item_id=name,
        params=lambda form: {
            "release_jobs": form.cleaned_data["release_jobs"],
            "until": form.cleaned_data["until"],
            "by": request.user.get_username(),
        },
    )


@api_view("GET")
def consumers(request: HttpRequest) -> dict[str, Any]:
    """The registered consumer processes, their threads and what each holds since when (the
    /consumers/ page's data); a thread past its step's usual time has ``flagged``; each
    process's ``orphan_locks`` are locks of its session that no thread of it claims."""
    return selectors.consumers_overview()


REPORTS_PER_PAGE = 50


@api_view("GET", index=True)
def reports(request: HttpRequest) -> dict[str, Any]:
    """Batches with a status report, newest first, ``REPORTS_PER_PAGE`` (50) per page."""
    _only(request.GET, "page")
    number = request.GET.get("page") or "1"
    if not number.isdigit() or int(number) < 1:
        raise ValueError("page must be a positive number")
    page = selectors.status_reports(page=int(number), per_page=REPORTS_PER_PAGE)
    return {
        **_page(
            page,
            [
                {
                    "batch": row.batch.bid,
                    "reports": [
                        {
                            "last_modified": clock.exact(r.last_modified) or r.last_modified,
                            "failed_jobs": r.failed_jobs,
                            "successful_jobs": r.successful_jobs,
                            "failed_count": r.failed_count,
                            "successful_count": r.successful_count,
                            # False: a large report's lists stay in ZooKeeper's part nodes;
                            # /api/batches/BID has the latest two whole.
                            "whole": r.whole,
                            "changes": r.changes,
                        }
                        for r in row.reports
                    ],
                }
                for row in page.items
            ],
        ),
        "loading": page.loading,
    }


@api_view("GET", "POST")
def consistency(request: HttpRequest) -> dict[str, Any]:
    """The latest check run and a page of its findings; POST {"start": true} starts a run (a
    daemon walks it), any other POST repairs from the latest finished run's findings."""
    from queues import consistency as checks

    if request.method == "POST":
        body = _body(request)
        # JSON true/false, or a form's "true"/"1" and "false"/"0": a word it does not know is
        # neither a start nor a repair.
        start = {"true": True, "1": True, "false": False, "0": False}.get(
            str(body.get("start", False)).lower()
        )
        if start is None:
            raise ValueError('"start" must be true or false')
        if start:
            _only(body, "start", what="start")
            require_action(request.user, "consistency", "repair")
            run, _created = checks.start(user=request.user, via="api")
            return checks.run_dict(run)
        return _act(request, kind="consistency", action="repair", item_id="tree", also=("start",))
    _only(request.GET, "page", "kind")
    page = request.GET.get("page", "1")
    return selectors.consistency_report(
        kind=request.GET.get("kind", "")[:40], page=int(page) if page.isdigit() else 1
    )


@api_view("GET")
def audit(request: HttpRequest) -> dict[str, Any]:
    _only(request.GET, "item_id")
    entries = AuditEntry.objects.all()
    item = request.GET.get("item_id", "").strip()
    if item:
        entries = entries.filter(item_id=item[:120])
    return {
        "items": [
            {
                "at": clock.exact(e.at),
                "user": e.username,
                "action": e.action,
                "kind": e.kind,
                "item_id": e.item_id,
                "before": e.before,
                "after": e.after,
                "reason": e.reason,
                "detail": e.detail,
                "ok": e.ok,
                "via": e.via,
            }
            for e in entries[:500]
        ]
    }


def bulk_run_json(run: bulkrun.BulkRun) -> dict[str, Any]:
    return {
        "id": run.pk,
        "url": reverse("api-bulk-run", args=[run.pk]),
        "kind": run.kind,
        "action": run.action,
        "state": run.shown_state,
        "total": run.total,
        "position": run.position,
        "done": run.done,
        "skipped_count": run.skips,
        "skipped": [{"id": i, "reason": why} for i, why in run.skipped],
        "summary": run.summary(),
        "limited": run.limited,
        "error": run.error,
        "started": clock.exact(run.started),
        "finished": _stamp(run.finished),
    }


@api_view("GET")
def bulk_run(request: HttpRequest, pk: int) -> dict[str, Any]:
    return bulk_run_json(_bulk_run(int(pk)))


@api_view("POST")
def bulk_run_control(request: HttpRequest, pk: int, verb: str) -> dict[str, Any]:
    """POST .../stop or .../continue: the same as the run page's buttons, same permission."""
    run = _bulk_run(int(pk))
    if not bulkrun.control(run, verb, user=request.user):
        raise InvalidTransition(f"bulk run {pk} is {run.shown_state}: nothing to {verb}")
    return bulk_run_json(_bulk_run(run.pk))


@api_view("GET", "POST")
def notes_list(request: HttpRequest) -> dict[str, Any]:
    """GET ?kind=job|batch|collection&item=ID: an item's notes, oldest first. POST
    {"kind": ..., "item": ..., "text": ...}: add one (the operator role)."""
    if request.method == "POST":
        data = _body(request)
        _only(data, "kind", "item", "text", what="note")
        note = notes.note_add(
            user=request.user,
            kind=_text(data, "kind"),
            item_id=_text(data, "item"),
            text=_text(data, "text"),
            via="api",
        )
        return notes.note_json(note)
    _only(request.GET, "kind", "item")
    kind, item = request.GET.get("kind", ""), request.GET.get("item", "")
    if kind not in Note.KINDS or not item:
        raise ValueError('give "kind" (job, batch or collection) and "item"')
    return {"notes": [notes.note_json(n) for n in notes.notes_for(kind, item)]}


@api_view("POST")
def note_change(request: HttpRequest, pk: str, verb: str) -> dict[str, Any]:
    """POST .../edit {"text": ...} or .../delete: by the note's author or an admin."""
    if verb == "delete":
        deleted = notes.note_delete(user=request.user, pk=int(pk), via="api")
        return {"deleted": notes.note_json(deleted)}
    data = _body(request)
    _only(data, "text", what="note")
    note = notes.note_edit(user=request.user, pk=int(pk), text=_text(data, "text"), via="api")
    return notes.note_json(note)


def _bulk_run(pk: int) -> bulkrun.BulkRun:
    try:
        return bulkrun.BulkRun.objects.defer("items").get(pk=pk)
    except bulkrun.BulkRun.DoesNotExist:
        raise NotFound(f"no bulk run {pk}") from None


# Where an API path names an item. A path that no route above takes is answered here, in JSON
# as every answer under /api/: 400 when it has an item's place and the ID there is malformed
# (the routes take only well-formed IDs), else 404.
_ID_PLACES: tuple[tuple[re.Pattern[str], Callable[..., object]], ...] = (
    (re.compile(r"^jobs/(?P<a>[^/]*)(?:/|$)"), zpaths.jid),
    (re.compile(r"^batches/(?P<a>[^/]*)(?:/|$)"), zpaths.bid),
    (re.compile(r"^access/(?P<a>[^/]*)(?:/|$)"), zpaths.access_queue),
    (re.compile(r"^access/[^/]*/(?P<a>[^/]*)(?:/|$)"), zpaths.qid),
    (re.compile(r"^holds/queue/(?P<a>[^/]*)(?:/|$)"), zpaths.queue_hold),
    (re.compile(r"^holds/collection/(?P<a>[^/]*)(?:/|$)"), zpaths.profile),
    (re.compile(r"^holds/node/(?P<a>[^/]*)(?:/|$)"), node_number),
    (re.compile(r"^holds/service/(?P<a>[^/]*)(?:/|$)"), service_name),
    (re.compile(r"^collections/(?P<a>[^/]*)(?:/|$)"), zpaths.profile),
)


@api_view("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
def unknown_path(request: HttpRequest, rest: str) -> HttpResponse:
    """Any other path under /api/, after the token check: a JSON 400 for a malformed ID in an
    item's place (InvalidID), else a JSON 404; never the pages' HTML."""
    for place, validate in _ID_PLACES:
        found = place.match(rest)
        if found is not None:
            validate(found["a"])
    return _error(f"no API endpoint at /api/{rest[:200]}", 404)


urlpatterns = [
    re_path(r"^overview$", overview, name="api-overview"),
    re_path(r"^jobs$", jobs, name="api-jobs"),
    re_path(r"^jobs/bulk$", jobs_bulk, name="api-jobs-bulk"),
    re_path(rf"^jobs/{JID}$", job, name="api-job"),
    re_path(
        rf"^jobs/{JID}/{JOB_ACTION}$",
        job_action,
        name="api-job-action",
    ),
    re_path(r"^failed$", failed, name="api-failed"),
    re_path(r"^failed/causes$", failed_causes, name="api-failed-causes"),
    re_path(r"^batches$", batches, name="api-batches"),
    re_path(rf"^batches/{BID}$", batch, name="api-batch"),
    re_path(
        rf"^batches/{BID}/{BATCH_ACTION}$",
        batch_action,
        name="api-batch-action",
    ),
    re_path(r"^access$", access, name="api-access"),
    re_path(
        rf"^access/{QID}/{ACCESS_ACTION}$",
        access_action,
        name="api-access-action",
    ),
    re_path(r"^holds$", holds, name="api-holds"),
    re_path(
        rf"^holds/(?P<kind>queue)/{QUEUE_HOLD}/{HOLD_ACTION}$",
        hold_action,
        name="api-queue-hold",
    ),
    re_path(
        rf"^holds/(?P<kind>collection)/{HELD_PROFILE}/{HOLD_ACTION}$",
        hold_action,
        name="api-collection-hold",
    ),
    re_path(
        rf"^holds/(?P<kind>node)/{HELD_NODE}/{HOLD_ACTION}$",
        hold_action,
        name="api-node-hold",
    ),
    re_path(
        rf"^holds/(?P<kind>service)/{HELD_SERVICE}/{HOLD_ACTION}$",
        hold_action,
        name="api-service-hold",
    ),
    re_path(r"^reports$", reports, name="api-reports"),
    re_path(r"^consistency$", consistency, name="api-consistency"),
    re_path(r"^audit$", audit, name="api-audit"),
    re_path(r"^consumers$", consumers, name="api-consumers"),
    re_path(r"^bulk/(?P<pk>[0-9]{1,18})$", bulk_run, name="api-bulk-run"),
    re_path(r"^notes$", notes_list, name="api-notes"),
    re_path(r"^notes/(?P<pk>[0-9]{1,18})/(?P<verb>edit|delete)$", note_change, name="api-note"),
    re_path(r"^bulk/(?P<pk>[0-9]{1,18})/(?P<verb>stop|continue)$", bulk_run_control),
    # Last: what no route above takes (queues/urls.py includes these after every other api/).
    re_path(r"^(?P<rest>.*)$", unknown_path, name="unknown-api-path"),
]
