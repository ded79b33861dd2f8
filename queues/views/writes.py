"""Actions: every one a POST with CSRF, role-checked and audited by ``queues.actions``.

A destructive action's GET shows the confirmation with a preview; its POST needs a reason.
An htmx POST gets back the updated row or panel plus the messages; a plain POST is redirected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import HttpResponse, HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from queues import actions, bulkrun, selectors
from queues.audit import ApiToken
from queues.auth import ADMIN, VIEWER, has_role, require_action
from queues.forms import (
    ActionForm,
    BulkForm,
    CollectionHoldForm,
    FailedFilterForm,
    JobFilterForm,
    SubmitForm,
    TokenForm,
)
from queues.states import REMOVE
from queues.zk import index as zindex
from queues.zk import paths as zpaths
from queues.zk.errors import DomainError, NotFound

from . import cockpit
from .common import (
    HtmxHttpRequest,
    console_view,
    error_response,
    fragment,
    redirect_after_post,
    safe_next,
)
from .pages import job_context

# Actions after which the item is no longer there to show.
GONE = ("delete", REMOVE)


def _form(request: HtmxHttpRequest) -> ActionForm:
    form = ActionForm(request.POST)
    if not form.is_valid():
        raise ValueError(f"bad action input: {form.errors.as_text()}")
    return form


def _report(request: HtmxHttpRequest, outcomes: list[Any]) -> None:
    for outcome in outcomes:
        messages.success(request, f"Done: {outcome}")


def _act(
    request: HtmxHttpRequest,
    *,
    kind: str,
    action: str,
    item_id: str,
    params: Callable[[ActionForm], dict[str, Any]] | None = None,
) -> ActionForm:
    """One item action from a posted ActionForm (version, reason), reported as a message."""
    form = _form(request)
    outcomes = actions.perform(
        user=request.user,
        kind=kind,
        action=action,
        item_id=item_id,
        expect_version=form.cleaned_data["version"],
        reason=form.cleaned_data["reason"],
        params=params(form) if params else None,
    )
    _report(request, outcomes)
    return form


def _confirm(
    request: HtmxHttpRequest, *, kind: str, action: str, item_id: str, preview: dict[str, Any]
) -> HttpResponse:
    require_action(request.user, kind, action)
    return render(
        request,
        "queues/confirm.html",
        {
            "kind": kind,
            "action": action,
            "item_id": item_id,
            "next": safe_next(request, request.GET.get("next"), ""),
            **preview,
        },
    )


@console_view(VIEWER)
def job_action(request: HtmxHttpRequest, jid: str, action: str) -> HttpResponse:
    if request.method == "GET":
        if not actions.is_destructive("job", action):
            return HttpResponseNotAllowed(["POST"])
        return _confirm(
            request,
            kind="job",
            action=action,
            item_id=jid,
            preview={"detail": selectors.job_detail(jid=jid)},
        )
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    form = _act(request, kind="job", action=action, item_id=jid)
    render_as = form.cleaned_data["render"]
    if request.htmx and render_as == "row":
        if action in GONE:
            return fragment(request, "queues/jobs.html#job-gone", {"jid": jid})
        return fragment(
            request,
            "queues/jobs.html#job-row",
            {"job": selectors.job_one(jid=jid), "next": form.cleaned_data["next"]},
        )
    if request.htmx and render_as == "panel" and action not in GONE:
        return fragment(request, "queues/job.html#job-body", job_context(request, jid))
    default = reverse("jobs") if action in GONE else reverse("job", args=[jid])
    return redirect_after_post(safe_next(request, form.cleaned_data["next"], default))


@console_view(VIEWER)
def batch_action(request: HtmxHttpRequest, bid: str, action: str) -> HttpResponse:
    if request.method == "GET":
        if not actions.is_destructive("batch", action):
            return HttpResponseNotAllowed(["POST"])
        batch, folders = selectors.batch_preview(bid=bid)
        jids = sorted({j for v in folders.values() for j in v})
        return _confirm(
            request,
            kind="batch",
            action=action,
            item_id=bid,
            preview={"batch": batch, "folders": folders, "jids": jids[:200], "njobs": len(jids)},
        )
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    form = _act(request, kind="batch", action=action, item_id=bid)
    if request.htmx and form.cleaned_data["render"] == "row":
        if action in GONE:
            return fragment(request, "queues/batches.html#batch-gone", {"bid": bid})
        return fragment(
            request,
            "queues/batches.html#batch-row",
            {"row": selectors.batch_one(bid=bid), "next": form.cleaned_data["next"]},
        )
    default = reverse("batches") if action in GONE else reverse("batch", args=[bid])
    return redirect_after_post(safe_next(request, form.cleaned_data["next"], default))


@console_view(VIEWER)
def access_action(request: HtmxHttpRequest, queue: str, qid: str, action: str) -> HttpResponse:
    if request.method == "GET":
        if not actions.is_destructive("access", action):
            return HttpResponseNotAllowed(["POST"])
        item = selectors.access_one(queue=queue, qid=qid)
        return _confirm(
            request,
            kind="access",
            action=action,
            item_id=qid,
            preview={"item": item, "queue": queue},
        )
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    form = _act(
        request,
        kind="access",
        action=action,
        item_id=qid,
        params=lambda f: {"queue": queue, "to": f.cleaned_data["to"]},
    )
    if request.htmx and form.cleaned_data["render"] == "row":
        try:
            item = selectors.access_one(queue=queue, qid=qid)
        except NotFound:
            return fragment(request, "queues/access.html#access-gone", {"qid": qid})
        return fragment(
            request,
            "queues/access.html#access-row",
            {"item": item, "next": form.cleaned_data["next"]},
        )
    return redirect_after_post(safe_next(request, form.cleaned_data["next"], reverse("access")))


def _holds_response(
    request: HtmxHttpRequest, form: ActionForm | None = None, *, just_held: str = ""
) -> HttpResponse:
    if request.htmx:
        return fragment(
            request, "queues/holds.html#holds-panel", cockpit.holds_context(just_held=just_held)
        )
    target = form.cleaned_data["next"] if form is not None else ""
    default = reverse("holds")
    if just_held:
        default += f"?held={just_held}"
    return redirect_after_post(safe_next(request, target, default))


@console_view(VIEWER)
def queue_hold_action(request: HtmxHttpRequest, name: str, action: str) -> HttpResponse:
    """Holding a whole queue is confirmed on a page that says what it stops, with a reason
    (kept in the audit log and shown on the holds page); releasing is one click."""
    if request.method == "GET":
        if action != "hold":
            return HttpResponseNotAllowed(["POST"])
        require_action(request.user, "queue", action)
        return render(
            request,
            "queues/queue_hold_confirm.html",
            {"name": name, **(cockpit.queue_hold_preview() if name == "ingest" else {})},
        )
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    # The reason a hold needs is checked by actions.perform, for the API as well.
    form = _act(request, kind="queue", action=action, item_id=name)
    return _holds_response(request, form)


@require_POST
@console_view(VIEWER)
def collection_hold_action(request: HtmxHttpRequest, profile: str, action: str) -> HttpResponse:
    form = _act(
        request,
        kind="collection",
        action=action,
        item_id=profile,
        params=lambda f: {"release_jobs": f.cleaned_data["release_jobs"]},
    )
    return _holds_response(request, form)


@require_POST
@console_view(VIEWER)
def collection_hold_new(request: HtmxHttpRequest) -> HttpResponse:
    """The "hold a collection" form, where the profile is typed rather than in the URL."""
    form = CollectionHoldForm(request.POST)
    if not form.is_valid():
        return error_response(request, f"cannot hold: {form.errors.as_text()}", 400)
    _report(
        request,
        actions.perform(
            user=request.user,
            kind="collection",
            action="hold",
            item_id=form.cleaned_data["profile"],
            reason=form.cleaned_data["reason"],
        ),
    )
    return _holds_response(request, just_held=form.cleaned_data["profile"])


PREVIEW_ROWS = 10


def _preview_rows(kind: str, items: list[tuple[str, int | None]]) -> list[Any]:
    """The first items as they are now, for the confirmation's table."""
    rows: list[Any] = []
    for item_id, _version in items:
        try:
            rows.append(
                selectors.job_one(jid=item_id)
                if kind == "job"
                else selectors.batch_one(bid=item_id)
            )
        except DomainError as exc:
            rows.append({"id": item_id, "problem": str(exc)})
    return rows


def _preview_states(kind: str, items: list[tuple[str, int | None]]) -> dict[str, int]:
    """How many of the items are in each state now (jobs, from the read index)."""
    if kind != "job":
        return {}
    where = zindex.for_client(selectors.zk_client()).job_states_of(i for i, _v in items)
    counts: dict[str, int] = {}
    for item_id, _v in items:
        state = where.get(item_id, "not listed")
        counts[state] = counts.get(state, 0) + 1
    return counts


def _bulk(
    request: HtmxHttpRequest, *, kind: str, matching: Any, id_validator: Any, back: str
) -> HttpResponse:
    """Shared by the job and batch bulk forms: preview destructive ones, then run and report."""
    form = BulkForm(request.POST, id_validator=id_validator)
    if not form.is_valid():
        return error_response(request, f"bad bulk request: {form.errors.as_text()}", 400)
    action = form.cleaned_data["action"]
    require_action(request.user, kind, action)
    limited = False
    if form.cleaned_data["scope"] == "filter":
        items, limited = matching()
    else:
        items = form.cleaned_data["item"]
    if not items:
        return error_response(request, "nothing selected", 400)
    destructive = actions.is_destructive(kind, action)
    # A destructive action, and any action over a whole filter (whose extent the operator has
    # not seen item by item), is previewed and confirmed first.
    if (destructive or form.cleaned_data["scope"] == "filter") and not form.cleaned_data[
        "confirmed"
    ]:
        return render(
            request,
            "queues/bulk_confirm.html",
            {
                "kind": kind,
                "action": action,
                "items": items,
                "preview": items[:200],
                "rows": _preview_rows(kind, items[:PREVIEW_ROWS]),
                "states": _preview_states(kind, items),
                "destructive": destructive,
                "scope": form.cleaned_data["scope"],
                "limited": limited,
                "post": request.POST,
                "back": back,
            },
        )
    if len(items) > settings.MRT_BULK_INLINE_MAX:
        run = bulkrun.start(
            user=request.user,
            kind=kind,
            action=action,
            items=items,
            reason=form.cleaned_data["reason"],
            limited=limited,
            back=back,
        )
        messages.info(request, f"{action} of {len(items)} {kind}s started in the background")
        return redirect_after_post(reverse("bulk-run", args=[run.pk]))
    result = actions.perform_bulk(
        user=request.user,
        kind=kind,
        action=action,
        items=items,
        reason=form.cleaned_data["reason"],
    )
    messages.info(request, f"{action}: {result.summary()}")
    return render(
        request,
        "queues/bulk_result.html",
        {"kind": kind, "action": action, "result": result, "limited": limited, "back": back},
    )


@require_POST
@console_view(VIEWER)
def jobs_bulk(request: HtmxHttpRequest) -> HttpResponse:
    filter_form = JobFilterForm(request.POST)
    if not filter_form.is_valid():
        return error_response(request, f"bad filter: {filter_form.errors.as_text()}", 400)

    def matching() -> tuple[list[tuple[str, int | None]], bool]:
        jids, limited = selectors.jobs_matching(flt=filter_form.to_filter())
        return [(j, None) for j in jids], limited

    return _bulk(
        request,
        kind="job",
        matching=matching,
        id_validator=zpaths.jid,
        back=safe_next(request, request.POST.get("next"), reverse("jobs")),
    )


@require_POST
@console_view(VIEWER)
def failed_bulk(request: HtmxHttpRequest) -> HttpResponse:
    """Resume (or delete) failed jobs: the ticked ones or every one the failed filter matches."""
    filter_form = FailedFilterForm(request.POST)
    if not filter_form.is_valid():
        return error_response(request, f"bad filter: {filter_form.errors.as_text()}", 400)

    def matching() -> tuple[list[tuple[str, int | None]], bool]:
        # Every match, from the read index (no job is loaded); each action checks its state.
        return [(j, None) for j in selectors.failed_matching(**filter_form.cleaned_data)], False

    return _bulk(
        request,
        kind="job",
        matching=matching,
        id_validator=zpaths.jid,
        back=safe_next(request, request.POST.get("next"), reverse("failed")),
    )


@require_POST
@console_view(VIEWER)
def batches_bulk(request: HtmxHttpRequest) -> HttpResponse:
    def matching() -> tuple[list[tuple[str, int | None]], bool]:
        raise ValueError("batch bulk actions work on a selection")

    return _bulk(
        request,
        kind="batch",
        matching=matching,
        id_validator=zpaths.bid,
        back=safe_next(request, request.POST.get("next"), reverse("batches")),
    )


@require_POST
@console_view(VIEWER)
def consistency_repair(request: HtmxHttpRequest) -> HttpResponse:
    form = _form(request)
    outcomes = actions.perform(
        user=request.user,
        kind="consistency",
        action="repair",
        item_id="tree",
        reason=form.cleaned_data["reason"],
    )
    _report(request, outcomes)
    return render(
        request,
        "queues/consistency.html",
        {
            "report": selectors.consistency_report(),
            "repaired": outcomes[0].detail.split("; ") if outcomes[0].detail else [],
        },
    )


@require_http_methods(["GET", "POST"])
@console_view(VIEWER)
def submit(request: HtmxHttpRequest) -> HttpResponse:
    """The submission form (GET) and the submission (POST)."""
    if request.method == "GET":
        return render(
            request,
            "queues/submit.html",
            {"form": SubmitForm(), "profiles": selectors.known_profiles()},
        )
    form = SubmitForm(request.POST)
    if not form.is_valid():
        return render(
            request,
            "queues/submit.html",
            {"form": form, "profiles": selectors.known_profiles()},
            status=400,
        )
    outcomes = actions.perform(
        user=request.user,
        kind="batch",
        action="submit",
        item_id="",
        params=form.cleaned_data,
    )
    _report(request, outcomes)
    return redirect_after_post(reverse("batch", args=[outcomes[0].id]))


@require_POST
@console_view(VIEWER)
def token_create(request: HtmxHttpRequest) -> HttpResponse:
    form = TokenForm(request.POST)
    if not form.is_valid():
        return error_response(request, "a token needs a name", 400)
    token, key = ApiToken.issue(user=request.user, name=form.cleaned_data["name"])
    return render(request, "queues/token_created.html", {"token": token, "key": key})


@require_POST
@console_view(VIEWER)
def token_revoke(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    mine = ApiToken.objects.filter(user__username=request.user.get_username())
    tokens = ApiToken.objects.all() if has_role(request.user, ADMIN) else mine
    token = get_object_or_404(tokens, pk=pk)
    token.delete()
    messages.success(request, f"Token {token.name} revoked")
    return redirect_after_post(reverse("tokens"))


@require_POST
@console_view(VIEWER)
def bulk_run_control(request: HtmxHttpRequest, pk: int, verb: str) -> HttpResponse:
    run = get_object_or_404(bulkrun.BulkRun.objects.defer("items"), pk=pk)
    if bulkrun.control(run, verb, user=request.user):
        done = "stopping after the item in hand" if verb == "stop" else "continues"
        messages.info(request, f"{run.action} of {run.total} {run.kind}s: {done}")
    else:
        messages.info(request, f"nothing to {verb}: the run is {run.shown_state}")
    return redirect_after_post(reverse("bulk-run", args=[run.pk]))
