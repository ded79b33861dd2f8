"""The JSON API under /api/: the console's reads and actions for scripts, one endpoint a
function (their door, the parsing and the JSON they answer are ``api_door``).

Authentication is by token only (``Authorization: Bearer <key>`` or ``Token <key>``, checked by
``auth.token_from``, the one token check), never by session cookie, so the endpoints can be
CSRF-exempt without a browser being able to forge them. The reads are the pages' selectors and
forms, the actions go through the same ``actions.perform`` (roles, state checks, audit log), and
a refusal gets the status the pages give it (``views.common.refusal_for``), as JSON.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.urls import re_path, reverse

from queues.console import (
    backlog,
    batch_reads,
    failed_reads,
    failure_causes,
    job_reads,
    notes,
    selectors,
    waits,
)
from queues.core import clock
from queues.core.states import JOB
from queues.models import Note
from queues.operator import actions, archive, bulkrun
from queues.operator.audit import AuditEntry
from queues.operator.auth import require_action
from queues.views.common import (
    batch_or_archived,
    job_or_archived,
    perform_posted,
    resume_params,
    run_bulk,
)
from queues.web.api_door import (
    access_json,
    api_view,
    batch_json,
    counts_json,
    error_json,
    form_input,
    job_json,
    only_keys,
    outcomes_json,
    page_json,
    query_form,
    request_body,
    stamp_text,
    text_param,
)
from queues.web.forms import (
    AccessFilterForm,
    ActionForm,
    BatchFilterForm,
    BulkForm,
    FailedFilterForm,
    JobFilterForm,
    SubmitForm,
    errors_text,
    whole_number,
)
from queues.web.routes import (
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
from queues.zk import batches as zbatches
from queues.zk import paths as zpaths
from queues.zk.client import connected_client
from queues.zk.errors import InvalidTransition, NotFound
from queues.zk.maintenance import node_number, service_name, window_info
from queues.zk.records import Job


@api_view("GET", index=True)
def overview(request: HttpRequest) -> dict[str, Any]:
    ov = selectors.overview()
    return {
        "jobs": counts_json(ov.jobs),
        "batches": counts_json(ov.batches),
        "access": counts_json(ov.access),
        "holds": {
            "queues": {q: stamp_text(t) for q, t in ov.holds.queues.items()},
            "collections": {c: stamp_text(t) for c, t in ov.holds.collections.items()},
        },
        "held_jobs_by_collection": ov.held_by_collection,
        "bytes_in_process": ov.bytes_in_process,
        "backlog": backlog.as_json(backlog.backlog()),
    }


@api_view("GET", index=True)
def jobs(request: HttpRequest) -> dict[str, Any]:
    form = query_form(request, JobFilterForm)
    if not form.is_valid():
        raise ValueError(errors_text(form))
    page = job_reads.jobs_page(flt=form.to_filter(), page=form.cleaned_data["page"] or 1)
    # "loading": a search answered before the read index has every job's local ID and ARK
    # (else, as every answer from the index, what it is still loading after a start).
    return {**page_json(page, [job_json(j) for j in page.items]), "loading": page.loading}


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


# ActionForm's fields that only a page reads (the row or panel htmx asks back, where to go next).
PAGE_ONLY = ("render", "next")


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
        form_input(
            request_body(request),
            ActionForm,
            also=also,
            unread=PAGE_ONLY,
            what=f"{action} of a {kind}",
        ),
        kind=kind,
        action=action,
        item_id=item_id,
        params=params,
        via="api",
    )
    return outcomes_json(outcomes)


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


def _bulk_form(data: dict[str, Any]) -> BulkForm:
    """A bulk request's action, reason, step and listed jobs, read by the console's bulk form
    (``BulkForm``: an over-long reason, a step that is none, a malformed version are refused
    there, for both doors), after its closed set of keys and its shape are checked here."""
    unknown = sorted(str(k) for k in data if k not in BULK_KEYS)
    if unknown:
        raise ValueError(
            f"unknown key {', '.join(repr(k[:40]) for k in unknown[:5])}: "
            f"a bulk request has {', '.join(BULK_KEYS)}"
        )
    every = data.get("all", False)
    if not isinstance(every, bool):
        raise ValueError('"all" must be true or false')
    if "jobs" in data and "filter" in data:
        raise ValueError('give "jobs" or "filter", not both')
    posted = QueryDict(mutable=True)
    for key in ("action", "reason", "to"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f'"{key}" must be text')
        posted[key] = value or ""
    posted["scope"] = "selection" if "jobs" in data else "filter"
    posted["confirmed"] = "true"  # a script's request is its own confirmation
    if "jobs" in data:
        if every:
            raise ValueError('"all": true means every job: give it without "jobs"')
        if not isinstance(data["jobs"], list):
            raise ValueError('"jobs" must be a list')
        pairs = []
        for entry in data["jobs"]:
            entry = entry if isinstance(entry, dict) else {"id": entry}
            if isinstance(entry.get("id"), dict | list) or set(entry) - {"id", "version"}:
                raise ValueError('a job in "jobs" is an ID or {"id": ..., "version": ...}')
            version = entry.get("version")
            if isinstance(version, bool | dict | list):
                raise ValueError(f"the version of {str(entry.get('id'))[:40]} must be a number")
            # The console's "jid:version", which BulkForm reads (the ID checked whole first).
            jid = zpaths.jid(str(entry.get("id", "")))
            pairs.append(f"{jid}:{'' if version is None else version}")
        posted.setlist("item", pairs)
    form = BulkForm(posted, id_validator=zpaths.jid)
    if not form.is_valid():
        raise ValueError(f"bad bulk request: {errors_text(form)}")
    return form


def _bulk_items(data: dict[str, Any], form: BulkForm) -> tuple[list[tuple[str, int | None]], bool]:
    """The jobs a bulk request names, checked whole before any is acted on: a list of jobs (at
    least one, as on the console), or a filter (a closed set of keys; one that narrows nothing
    is refused unless the request says ``"all": true``, the one way to ask for every job); and
    whether the filter's scan stopped."""
    if "jobs" in data:
        items: list[tuple[str, int | None]] = form.cleaned_data["item"]
        if not items:
            raise ValueError('nothing selected: "jobs" lists no job')
        return items, False
    every = data.get("all", False)
    flt = data.get("filter", {})
    if not isinstance(flt, dict):
        raise ValueError('"filter" must be an object')
    if "filter" not in data and not every:
        raise ValueError('give "jobs" (a list) or "filter" (an object)')
    shown = [k for k in BULK_FILTER_UNUSED if k in flt]
    if shown:
        raise ValueError(f"filter: {' and '.join(shown)} choose rows to show, not jobs to act on")
    filter_form = JobFilterForm(form_input(flt, JobFilterForm, what="filter"))
    if not filter_form.is_valid():
        raise ValueError(errors_text(filter_form))
    narrows = filter_form.narrows()
    if narrows and every:
        raise ValueError('"all": true means every job: give it without a filter that narrows')
    if not narrows and not every:
        raise ValueError(
            'the filter narrows nothing: say "all": true to act on every job, or narrow it'
        )
    jids, limited = job_reads.jobs_matching(flt=filter_form.to_filter())
    if not jids:
        raise actions.NothingMatches("job")
    return [(j, None) for j in jids], limited


@api_view("POST")
def jobs_bulk(request: HttpRequest) -> dict[str, Any] | HttpResponse:
    """{"action": ..., "jobs": [{"id":..., "version":...}, ...] | "filter": {...}, "reason": ...}

    ``filter`` takes the job list's filter keys (``state``, ``profile``, ``bid``, ``submitter``,
    ``min_age_hours``, ``priority``, ``q``, ``stuck``) and no others; every job, whatever its
    state and collection, is ``"all": true`` and nothing else. The action, the reason, the step
    (``to``) and the listed jobs are read as the console's bulk form reads them. Over
    MRT_BULK_INLINE_MAX jobs it answers 202 at once with the background run (its URL in
    Location), as the console does; otherwise with what was done once it is done."""
    data = request_body(request)
    form = _bulk_form(data)
    action, reason = form.cleaned_data["action"], form.cleaned_data["reason"]
    params = resume_params("job", action, form.cleaned_data["to"])
    actions.check_bulk(user=request.user, kind="job", action=action, reason=reason)
    items, limited = _bulk_items(data, form)
    result = run_bulk(
        user=request.user,
        kind="job",
        action=action,
        items=items,
        reason=reason,
        limited=limited,
        via="api",
        params=params or None,
    )
    if isinstance(result, bulkrun.BulkRun):
        response = JsonResponse(bulk_run_json(result), status=202)
        response["Location"] = reverse("api-bulk-run", args=[result.pk])
        return response
    return {
        **outcomes_json(result.done),
        "skipped": [{"id": i, "reason": why} for i, why in result.skipped],
        "summary": result.summary(),
    }


@api_view("GET", index=True)
def failed(request: HttpRequest) -> dict[str, Any]:
    """Failed jobs, oldest first, ``failed_reads.FAILED_ROWS_PER_PAGE`` (50) per page (``page``),
    filtered by ``bid``, ``profile``, ``step``; with the counts per batch, collection and
    failing step of everything the filter matches."""
    form = query_form(request, FailedFilterForm, also=("page",))
    if not form.is_valid():
        raise ValueError(errors_text(form))
    number = whole_number(request.GET)
    page, steps = failed_reads.failed_page(**form.cleaned_data, page=number)
    return {
        **page_json(
            page,
            [
                {**job_json(j), "failed_step": steps.get(j.jid, "")}
                if isinstance(j, Job)
                else job_json(j)
                for j in page.items
            ],
        ),
        "groups": failed_reads.failed_group_counts(**form.cleaned_data),
        "loading": page.loading,
    }


@api_view("GET", index=True)
def failed_causes(request: HttpRequest) -> dict[str, Any]:
    """Failed jobs grouped by cause (failing step and normalised message), most jobs first,
    ``failure_causes.GROUPS_PER_PAGE`` groups per page; the same filters as ``failed``."""
    form = query_form(request, FailedFilterForm, also=("page",))
    if not form.is_valid():
        raise ValueError(errors_text(form))
    number = whole_number(request.GET)
    causes = failure_causes.failure_causes(**form.cleaned_data)
    page = failure_causes.page_of(causes, number)
    return {
        **page_json(page, [failure_causes.group_json(g) for g in page.items]),
        "jobs": causes.total,
        "loading": page.loading,
    }


@api_view("GET", "POST", index=True)
def batches(request: HttpRequest) -> dict[str, Any]:
    if request.method == "POST":
        form = SubmitForm(form_input(request_body(request), SubmitForm, what="submission"))
        if not form.is_valid():
            raise ValueError(errors_text(form))
        return outcomes_json(
            actions.perform(
                user=request.user,
                kind="batch",
                action="submit",
                item_id="",
                params=form.cleaned_data,
                via="api",
            )
        )
    filters = query_form(request, BatchFilterForm)
    if not filters.is_valid():
        raise ValueError(errors_text(filters))
    page = batch_reads.batches_page(flt=filters.to_filter(), page=filters.cleaned_data["page"] or 1)
    return page_json(page, [batch_json(r.item, r.folders, r.states) for r in page.items])


# A batch's job IDs per answer of /api/batches/BID: by default, and at most.
BATCH_JOBS_PER_PAGE = 1000
BATCH_JOBS_MAX_PER_PAGE = 10_000


@api_view("GET", index=True)
def batch(request: HttpRequest, bid: str) -> dict[str, Any]:
    """A batch, the counts of its jobs (per state: ``job_states``; per index folder:
    ``folders``) and one page of its job IDs by state (``jobs``), ``limit`` of them by job ID:
    after the job ID ``after`` (the previous answer's ``next``, null on the last page) or on page
    ``page``; ``state`` keeps one state's jobs. Counts and IDs come from the read index: the
    answer costs the same requests for a batch of 10 jobs as for one of 100,000."""
    only_keys(request.GET, "limit", "after", "page", "state")
    limit = whole_number(
        request.GET, "limit", default=BATCH_JOBS_PER_PAGE, most=BATCH_JOBS_MAX_PER_PAGE
    )
    after = request.GET.get("after") or ""
    if after and not zpaths.JID_RE.fullmatch(after):
        raise ValueError("after must be a job ID (jidNNNNNNNNNN)")
    if after and request.GET.get("page"):
        raise ValueError("give either after or page, not both")
    number = whole_number(request.GET, most=10**9)
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
    form = query_form(request, AccessFilterForm)
    if not form.is_valid():
        raise ValueError(errors_text(form))
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
        "queues": {q: stamp_text(t) for q, t in view.holds.queues.items()},
        "collections": {c: stamp_text(t) for c, t in view.holds.collections.items()},
        "held_jobs_by_collection": view.held_jobs,
        "nodes": {
            str(n): {"since": stamp_text(h.at), "by": h.by, "reason": h.reason}
            for n, h in view.nodes.items()
        },
        "services": {
            s: {"since": stamp_text(h.at), "by": h.by, "reason": h.reason}
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
    only_keys(request.GET, "page")
    number = whole_number(request.GET)
    page = batch_reads.status_reports(page=number, per_page=REPORTS_PER_PAGE)
    return {
        **page_json(
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
    from queues.operator import consistency as checks

    if request.method == "POST":
        body = request_body(request)
        # JSON true/false, or a form's "true"/"1" and "false"/"0": a word it does not know is
        # neither a start nor a repair.
        start = {"true": True, "1": True, "false": False, "0": False}.get(
            str(body.get("start", False)).lower()
        )
        if start is None:
            raise ValueError('"start" must be true or false')
        if start:
            only_keys(body, "start", what="start")
            require_action(request.user, "consistency", "repair")
            run, _created = checks.start(user=request.user, via="api")
            return checks.run_dict(run)
        return _act(request, kind="consistency", action="repair", item_id="tree", also=("start",))
    only_keys(request.GET, "page", "kind")
    return selectors.consistency_report(
        kind=request.GET.get("kind", "")[:40], page=whole_number(request.GET)
    )


@api_view("GET")
def audit(request: HttpRequest) -> dict[str, Any]:
    only_keys(request.GET, "item_id")
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
        "finished": stamp_text(run.finished),
    }


@api_view("GET")
def bulk_run(request: HttpRequest, pk: int) -> dict[str, Any]:
    return bulk_run_json(_bulk_run(int(pk)))


@api_view("POST")
def bulk_run_control(request: HttpRequest, pk: int, verb: str) -> dict[str, Any]:
    """POST .../stop or .../continue: the same as the run page's buttons, same permission;
    no fields (any key in the body is refused, as an unknown key is everywhere)."""
    only_keys(request_body(request), what=f"{verb} of a bulk run")
    run = _bulk_run(int(pk))
    if not bulkrun.control(run, verb, user=request.user):
        raise InvalidTransition(f"bulk run {pk} is {run.shown_state}: nothing to {verb}")
    return bulk_run_json(_bulk_run(run.pk))


@api_view("GET", "POST")
def notes_list(request: HttpRequest) -> dict[str, Any]:
    """GET ?kind=job|batch|collection&item=ID: an item's notes, oldest first. POST
    {"kind": ..., "item": ..., "text": ...}: add one (the operator role)."""
    if request.method == "POST":
        data = request_body(request)
        only_keys(data, "kind", "item", "text", what="note")
        note = notes.note_add(
            user=request.user,
            kind=text_param(data, "kind"),
            item_id=text_param(data, "item"),
            text=text_param(data, "text"),
            via="api",
        )
        return notes.note_json(note)
    only_keys(request.GET, "kind", "item")
    kind, item = request.GET.get("kind", ""), request.GET.get("item", "")
    if kind not in Note.KINDS or not item:
        raise ValueError('give "kind" (job, batch or collection) and "item"')
    return {"notes": [notes.note_json(n) for n in notes.notes_for(kind, item)]}


@api_view("POST")
def note_change(request: HttpRequest, pk: str, verb: str) -> dict[str, Any]:
    """POST .../edit {"text": ...} or .../delete (no fields): by the note's author or an
    admin."""
    if verb == "delete":
        only_keys(request_body(request), what="delete of a note")
        deleted = notes.note_delete(user=request.user, pk=int(pk), via="api")
        return {"deleted": notes.note_json(deleted)}
    data = request_body(request)
    only_keys(data, "text", what="note")
    note = notes.note_edit(user=request.user, pk=int(pk), text=text_param(data, "text"), via="api")
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
    return error_json(f"no API endpoint at /api/{rest[:200]}", 404)


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
