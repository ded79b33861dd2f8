"""What every console door shares: the role gate, the one mapping of errors to HTTP answers,
htmx fragments and messages, the reads of an item that may have been archived, the steps
of an operator action (parse the posted fields, perform, report; one or many items), and what
the read index is still loading after a start (every page's notice, the API's ``loading``).

The view modules beside this one are one per resource (overview, jobs, batches, failed,
reports, access, holds, bulk, consistency, audit, tokens, workers, cockpit, poster), each with
its GET and POST views; each imports this module and no other of ``queues.views``. The JSON
API (``queues/web/api.py``) takes the same pieces from here, so a read, an action and a refusal are
the same whatever door they come through.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django_htmx.http import reswap
from django_htmx.middleware import HtmxDetails

from queues.console import batch_reads, job_reads
from queues.core import clock
from queues.core.states import JOB, REMOVE, JobState
from queues.models import AuditEntry, BulkRun
from queues.operator import actions, archive, bulkrun
from queues.operator.actions import ReasonRequired
from queues.operator.auth import require_action, role_required
from queues.services.moves import Outcome
from queues.templatetags.console import actions_for
from queues.web.forms import ActionForm, errors_text
from queues.zk import client as zkmod
from queues.zk import index as zindex
from queues.zk import paths as zpaths
from queues.zk.errors import (
    Conflict,
    DomainError,
    InvalidID,
    InvalidTransition,
    ItemLocked,
    MalformedNode,
    NotFound,
    QueueHeld,
    StillLoading,
    StillReading,
    is_connection_error,
)


class HtmxHttpRequest(HttpRequest):
    """A request as django-htmx's middleware leaves it (``request.htmx``), for the type checker."""

    htmx: HtmxDetails


log = logging.getLogger(__name__)

RETRY_SECONDS = 10
# A page that is still loading after a start tries again this soon (``still_reading``).
LOADING_RETRY_SECONDS = 2

# Errors -> HTTP answers -----------------------------------------------------------------------

# Domain error -> HTTP status: bad input 400, unknown 404, refused by the state of things 409.
_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (InvalidID, 400),
    (ReasonRequired, 400),
    (ValueError, 400),
    (NotFound, 404),
    (InvalidTransition, 409),
    (Conflict, 409),
    (ItemLocked, 409),
    (QueueHeld, 409),
    (MalformedNode, 409),
    (StillLoading, 503),
    (DomainError, 409),
)


def status_for(exc: BaseException) -> int:
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


@dataclass(frozen=True)
class Refusal:
    """What a door answers for an exception a view let through: the status and the message;
    ``unavailable`` when ZooKeeper could not be reached (503, retry after RETRY_SECONDS)."""

    status: int
    message: str
    unavailable: bool = False


def refusal_for(exc: BaseException) -> Refusal | None:
    """The one mapping of errors to answers, for the console's pages and the JSON API alike:
    no permission 403, ZooKeeper unreachable 503, domain errors by ``status_for``; None for a
    real fault (500), which the caller re-raises. A database outage is None here too: the
    session and token checks that meet it first run outside the views' wrappers, so the outage
    middleware (``queues.views.outage``) answers it, 503 with the banner, for every door."""
    if isinstance(exc, PermissionDenied):
        return Refusal(403, str(exc) or "you may not do that")
    if is_connection_error(exc):
        return Refusal(503, str(exc) or type(exc).__name__, unavailable=True)
    status = status_for(exc)
    return None if status == 500 else Refusal(status, str(exc))


def unavailable(request: HttpRequest, message: str) -> HttpResponse:
    """ZooKeeper is unreachable: say so plainly, and retry by itself."""
    log.warning("ZooKeeper unavailable: %s", message)
    response = render(
        request,
        "queues/unavailable.html",
        {"error": message, "retry": RETRY_SECONDS},
        status=503,
    )
    response["Retry-After"] = str(RETRY_SECONDS)
    if getattr(request, "htmx", False):
        reswap(response, "none")
    return response


def messages_oob(request: HttpRequest) -> str:
    """The messages area as an out-of-band swap, appended to every htmx response."""
    return render_to_string("base.html#messages", {"oob": True}, request=request)


def fragment(
    request: HttpRequest, template: str, context: dict[str, Any], *, status: int = 200
) -> HttpResponse:
    body = render_to_string(template, context, request=request) + messages_oob(request)
    return HttpResponse(body, status=status)


def error_response(request: HttpRequest, message: str, status: int) -> HttpResponse:
    """A refusal: for htmx only the message (the target stays), else a full error page; a 503
    says when to try again."""
    if getattr(request, "htmx", False):
        messages.error(request, message)
        response = reswap(HttpResponse(messages_oob(request), status=status), "none")
    else:
        response = render(
            request, "queues/error.html", {"message": message, "status": status}, status=status
        )
    if status == 503:
        response["Retry-After"] = str(RETRY_SECONDS)
    return response


def within_loading_wait(request: HttpRequest) -> AbstractContextManager[None]:
    """A read (GET) waits at most ``MRT_LOADING_WAIT`` seconds for what the read index's
    background fill is reading after a start, then says so (``StillReading``); an action
    waits for what it must see (a refusal it cannot give halfway)."""
    if request.method in ("GET", "HEAD"):
        return zindex.answer_within(settings.MRT_LOADING_WAIT)
    return nullcontext()


def still_reading(request: HttpRequest, exc: StillReading) -> HttpResponse:
    """A page asked before the fill has read what it needs: 503, what is loading, and a page
    that asks again by itself every LOADING_RETRY_SECONDS (an htmx refresh keeps its target)."""
    if getattr(request, "htmx", False):
        response = reswap(HttpResponse(status=503), "none")
    else:
        response = render(
            request,
            "queues/loading.html",
            # (its own notice replaces the base page's, which says the page shows what is read)
            {"stage": exc.stage, "retry": LOADING_RETRY_SECONDS, "index_loading": ""},
            status=503,
        )
    return loading_answer(request, response)


def loading_answer(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """A 503 while the index loads: Retry-After, and one INFO line (not Django's ERROR line
    for every 5xx: a console just started is not failing)."""
    response["Retry-After"] = str(LOADING_RETRY_SECONDS)
    log.info("still loading after a start for %s %s", request.method, request.path)
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def console_view(role: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Login and role first; then domain errors become 4xx pages and an unreachable ZooKeeper
    a 503 that retries, so no view needs its own try/except."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                with within_loading_wait(request):
                    return view(request, *args, **kwargs)
            except StillReading as exc:
                return still_reading(request, exc)
            except Exception as exc:
                refusal = refusal_for(exc)
                if refusal is None:
                    raise
                if refusal.unavailable:
                    return unavailable(request, refusal.message)
                return error_response(request, refusal.message, refusal.status)

        return role_required(role)(wrapped)

    return decorator


# Links and redirects --------------------------------------------------------------------------


def safe_next(request: HttpRequest, value: str | None, default: str) -> str:
    if value and url_has_allowed_host_and_scheme(
        value, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return value
    return default


def redirect_after_post(target: str) -> HttpResponse:
    """Post/redirect/get with 303 so a reload never repeats the action."""
    return HttpResponseRedirect(target, status=303)


def querystring_without(request: HttpRequest, *names: str) -> str:
    query = request.GET.copy()
    for name in names:
        query.pop(name, None)
    return query.urlencode()


def link(name: str, **query: str) -> str:
    return f"{reverse(name)}?{urlencode(query)}"


def job_state_link(state: str) -> str | None:
    """The job list of a state, for a diagram's node (the filter offers every job state)."""
    return link("jobs", state=state) if JOB.is_state(state) else None


def shown_bulk_runs() -> Any:
    """Bulk runs for a page, newest first: never their items (up to a filter's whole match),
    pages show counts only."""
    return BulkRun.objects.select_related("user", "continued_by").defer("items")


def bad_form(request: HttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    return render(request, template, context, status=400)


def bulk_actions(user: Any, state: str) -> list[str]:
    """The job actions a bulk form offers: those of ``state`` (all states but Deleted when
    empty) that the user's role allows."""
    states = [state] if state else [s for s in JOB.states if s != JobState.DELETED]
    names: list[str] = []
    for s in states:
        for action in actions_for("job", s, user):
            if action["name"] not in names:
                names.append(action["name"])
    return names


# Items that may have been archived -------------------------------------------------------------


def job_or_archived(jid: str) -> tuple[job_reads.JobDetail | None, Any]:
    """A job as ZooKeeper has it, else (None, its row) once retention archived it; NotFound
    when neither knows it (saying who removed it, when the audit log knows). The job page and
    the API's job both read it so."""
    try:
        return job_reads.job_detail(jid=jid), None
    except NotFound as exc:
        row = archive.archived_job(zpaths.jid(jid))
        if row is None:
            raise NotFound(_gone_words("job", jid) or str(exc)) from exc
        return None, row


def batch_or_archived(
    bid: str, *, per_state: int = batch_reads.BATCH_ROWS_PER_STATE
) -> tuple[batch_reads.BatchDetail | None, Any]:
    """A batch as ZooKeeper has it (``per_state`` jobs of each state loaded), else (None, its
    archived row); NotFound when neither (saying who removed it, when the audit log knows)."""
    try:
        return batch_reads.batch_detail(bid=bid, per_state=per_state), None
    except NotFound as exc:
        row = archive.archived_batch(zpaths.bid(bid))
        if row is None:
            raise NotFound(_gone_words("batch", bid) or str(exc)) from exc
        return None, row


def _gone_words(kind: str, item_id: str) -> str:
    """ "batch bid… was deleted by ada on …: reason", from the audit log's last removal of the item;
    "" when the log has none (a bare not-found then)."""
    entry = (
        AuditEntry.objects.filter(kind=kind, item_id=item_id, action__in=GONE, ok=True)
        .order_by("-at", "-id")
        .first()
    )
    if entry is None:
        return ""
    when = clock.clock_text(entry.at, "minutes")
    verb = "deleted" if entry.action == "delete" else "removed from ZooKeeper"
    who = entry.username or "someone"
    why = f": {entry.reason}" if entry.reason else " (no reason given)"
    return f"{kind} {item_id} was {verb} by {who} on {when}{why}"


# Operator actions: parse, perform, report -------------------------------------------------------

# Actions after which the item is no longer there to show.
GONE = ("delete", REMOVE)


# ActionForm's fields that belong to one action. Given to another they would be left out and
# the action done without what was meant (a release "until" a time would release now).
ACTION_FIELDS_ONLY_FOR = {"until": ("hold",), "release_jobs": ("release",), "to": ("resume",)}
# The kinds whose action reads the field: given to that action of another kind it would be left
# out too (a job's hold "until" a time held the job with no end). A service's hold refuses an
# end, and a node's or a service's release ``release_jobs``, with words of their own.
ACTION_FIELD_KINDS = {
    "until": ("queue", "collection", "node", "service"),
    "release_jobs": ("queue", "collection", "node", "service"),
    "to": ("job", "access"),
}


# The kinds whose items have a status version an action checks; another kind's action left a
# posted version out and was done whatever it said.
VERSIONED_KINDS = ("job", "batch", "access")

# What a browser posts with every console form besides the form's own fields: Django's CSRF
# token. (The templates name no submit button, and htmx posts the form's fields only.)
POSTED_WITH_EVERY_FORM = ("csrfmiddlewaretoken",)


def unknown_fields(
    data: Mapping[str, Any],
    *form_classes: type[forms.Form],
    also: Iterable[str] = (),
    unread: Iterable[str] = (),
) -> str:
    """The posted field names that no form of a view takes (its fields but ``unread``, which the
    view does not read) nor ``also`` names, as a refusal's words; "" when there are none."""
    known = {k for f in form_classes for k in f.base_fields} - set(unread)
    known |= {*also, *POSTED_WITH_EVERY_FORM}
    unknown = sorted(str(k) for k in data if k not in known)
    return ", ".join(repr(k[:40]) for k in unknown[:5])


def only_fields(
    request: HttpRequest,
    *form_classes: type[forms.Form],
    also: Iterable[str] = (),
    unread: Iterable[str] = (),
) -> None:
    """A console form's post is a closed set of fields (``unknown_fields``), as the API's bodies
    and the bulk forms are: a field the view does not read is a 400 naming it, checked before
    anything is read or done, never left out while the action is done without it."""
    named = unknown_fields(request.POST, *form_classes, also=also, unread=unread)
    if named:
        raise ValueError(f"unknown field {named}: this form does not take it")


def perform_posted(
    user: Any,
    data: Mapping[str, Any],
    *,
    kind: str,
    action: str,
    item_id: str,
    params: Callable[[ActionForm], dict[str, Any]] | None = None,
    via: str = "web",
) -> tuple[ActionForm, list[Outcome]]:
    """One item action from posted fields, through ``actions.perform`` (role, state machine,
    version, reason, audit): the console's action views and the API's. The fields (version,
    reason, to, release_jobs, ...) are ActionForm's; bad input is a ValueError (400)."""
    form = ActionForm(data)
    if not form.is_valid():
        raise ValueError(f"bad action input: {errors_text(form)}")
    if form.cleaned_data["version"] is not None and kind not in VERSIONED_KINDS:
        raise ValueError(f"a {kind} has no version to check: leave version out")
    for name, only in ACTION_FIELDS_ONLY_FOR.items():
        if form.cleaned_data[name] in (None, "", False):
            continue
        if action not in only:
            raise ValueError(f"{name} goes with {' or '.join(only)}, not with {action}")
        if kind not in ACTION_FIELD_KINDS[name]:
            raise ValueError(
                f"a {kind}'s {action} takes no {name}"
                + (": it has no end time, release it by hand" if name == "until" else "")
            )
    outcomes = actions.perform(
        user=user,
        kind=kind,
        action=action,
        item_id=item_id,
        expect_version=form.cleaned_data["version"],
        reason=form.cleaned_data["reason"],
        params=params(form) if params else None,
        via=via,
    )
    return form, outcomes


def report(request: HttpRequest, outcomes: list[Any]) -> None:
    for outcome in outcomes:
        if outcome.before != outcome.after:
            messages.success(request, f"Done: {outcome}")
        else:  # found as asked (a form posted twice): said as such, not as "Done: held -> held"
            said = outcome.detail or f"already {outcome.after}"
            messages.info(request, f"{outcome.kind} {outcome.id} {said}")


def act(
    request: HttpRequest,
    *,
    kind: str,
    action: str,
    item_id: str,
    params: Callable[[ActionForm], dict[str, Any]] | None = None,
    also: Iterable[str] = (),
    unread: Iterable[str] = (),
) -> ActionForm:
    """One item action from a console form post, reported as a message. The post is
    ActionForm's fields but ``unread`` (those the view does not read: ``render`` and ``next``
    where it answers the same whatever they say) and ``also`` (those it reads itself)."""
    only_fields(request, ActionForm, also=also, unread=unread)
    form, outcomes = perform_posted(
        request.user, request.POST, kind=kind, action=action, item_id=item_id, params=params
    )
    report(request, outcomes)
    return form


def resume_params(kind: str, action: str, to: str) -> dict[str, str]:
    """A job resume's chosen step, as the action's parameters; other actions take none (the
    console's bulk forms and ``POST /api/jobs/bulk`` alike)."""
    if not to:
        return {}
    if (kind, action) != ("job", "resume"):
        raise ValueError(f"a step to start from goes with resume, not with {action}")
    return {"to": to}


def run_bulk(
    *,
    user: Any,
    kind: str,
    action: str,
    items: list[tuple[str, int | None]],
    reason: str,
    limited: bool,
    back: str = "",
    via: str = "web",
    params: dict[str, Any] | None = None,
) -> BulkRun | actions.BulkResult:
    """One action over many items: over ``MRT_BULK_INLINE_MAX`` a background bulk run (the
    console shows its page, the API answers 202), else done now, each refusal a skip.
    ``params``: the action's further parameters for every item (a resume's step "to")."""
    if len(items) > settings.MRT_BULK_INLINE_MAX:
        return bulkrun.start(
            user=user,
            kind=kind,
            action=action,
            items=items,
            reason=reason,
            limited=limited,
            back=back,
            via=via,
            params=params,
        )
    return actions.perform_bulk(
        user=user, kind=kind, action=action, items=items, reason=reason, via=via, params=params
    )


def confirm(
    request: HttpRequest, *, kind: str, action: str, item_id: str, preview: dict[str, Any]
) -> HttpResponse:
    """A destructive action's GET: the confirmation page with a preview of the item."""
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


# What the read index is still loading ---------------------------------------------------------


def index_loading() -> str:
    """What the process's read index is still loading after a start ("" when nothing).

    The web process fills its read index in the background after a start
    (``queues.web.warmup``) and pages answer meanwhile from what is read so far: every page says
    so through ``loading_banner`` (the base template's notice, ``id="index-loading"``; a page
    with a note of its own then says only what it means there), and every API answer from the
    index in ``loading``. Nothing here connects, waits or reads: a process whose client is
    not connected has nothing loading to say (the outage banner says the rest).
    """
    zk = zkmod.existing_client()
    if zk is None or not zk.connected:
        return ""
    return zindex.for_client(zk).loading()


def loading_banner(request: HttpRequest) -> dict[str, Any]:
    """The context processor behind every page's notice of what is still loading."""
    return {"index_loading": index_loading()}
