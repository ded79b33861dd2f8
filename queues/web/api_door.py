"""The JSON API's door (``api`` holds its endpoints): ``api_view``, which every endpoint goes
through (the token, the role, a refusal or a malformed request answered as JSON with the status
the pages give it), the parsing of a request's body and query, and the JSON written of a job,
a batch, an access request, an outcome and a page.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from queues.console import job_reads, selectors
from queues.core import clock, retries
from queues.core.words import DuplicateKey, TooDeep, json_within
from queues.operator.auth import BEARER_CHALLENGE, VIEWER, has_role, token_from
from queues.services.moves import Outcome
from queues.views.common import (
    RETRY_SECONDS,
    index_loading,
    loading_answer,
    refusal_for,
    within_loading_wait,
)
from queues.zk.errors import StillReading
from queues.zk.records import AccessRequest, Batch, Broken, Job


def error_json(message: str, status: int) -> JsonResponse:
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
                return error_json(f"method {request.method} not allowed", 405)
            token = token_from(request)
            if token is None:
                response = error_json("a valid API token is required", 401)
                response["WWW-Authenticate"] = BEARER_CHALLENGE
                return response
            request.user = token.user
            if not has_role(token.user, VIEWER):
                return error_json("this token's user has no console role", 403)
            if request.method == "POST" and request.GET:
                # No action reads its query string: taken and left unread, "?until=..." held
                # a queue with no end, as a misspelt key in the body would have.
                named = ", ".join(repr(k[:40]) for k in sorted(request.GET)[:5])
                return error_json(
                    f"a POST takes its fields in the body, not in the query string: {named}", 400
                )
            try:
                with within_loading_wait(request):
                    result = view(request, *args, **kwargs)
            except UnsupportedBody as exc:
                return error_json(str(exc), 415)
            except BodyTooBig as exc:
                return error_json(str(exc), 413)
            except StillReading as exc:
                return loading_answer(
                    request,
                    JsonResponse(
                        {"error": str(exc), "status": 503, "loading": exc.stage}, status=503
                    ),
                )
            except Exception as exc:
                refusal = refusal_for(exc)
                if refusal is None:
                    raise
                if not refusal.unavailable:
                    return error_json(refusal.message, refusal.status)
                return error_json(f"ZooKeeper is unavailable: {refusal.message}", 503)
            if isinstance(result, HttpResponse):
                return result
            if index and request.method == "GET" and not result.get("loading"):
                result["loading"] = index_loading()
            return JsonResponse(result)

        return wrapped

    return decorator


# What an API body may be beside JSON: a form's fields, as a browser or ``curl -d`` posts them.
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


class UnsupportedBody(ValueError):
    """A body in a media type the API does not read: 415, never read as no fields at all."""


class BodyTooBig(ValueError):
    """A body over Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``: 413, in JSON (Django's own answer
    was the pages' HTML 400)."""


NO_FILES = "the API takes no files: send JSON or form fields"


def request_body(request: HttpRequest) -> dict[str, Any]:
    """A JSON object body, or form fields (no files); no body at all is no fields. A body of
    another media type is a 415 (``text/plain`` read as an empty form did the action with no
    fields), one over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` a 413, anything else malformed a 400: an
    object that gives a key twice too (the last was taken)."""
    try:
        # Read whole first, whatever the type: Django checks the size here before reading, and
        # a form's fields are then parsed from what was read: no part over it is parsed.
        body = request.body
    except RequestDataTooBig:
        raise BodyTooBig(
            f"the body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes: no request "
            "here needs that"
        ) from None
    if request.content_type not in ("application/json", *FORM_TYPES) and body:
        raise UnsupportedBody(
            f"a body of type {(request.content_type or '')[:80]!r} is not read here: send JSON "
            "(Content-Type: application/json) or form fields"
        )
    if request.content_type == "application/json":
        try:
            data = json_within(body or b"{}")
        except TooDeep as exc:
            raise ValueError(f"the body is {exc}: no request needs that") from exc
        except DuplicateKey as exc:
            raise ValueError(f"the body has {exc}: give each key once") from exc
        except ValueError as exc:
            raise ValueError(f"the body is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return data
    try:
        if request.FILES:
            raise ValueError(NO_FILES)
        fields = request.POST
    except TooManyFilesSent:
        raise ValueError(NO_FILES) from None
    except TooManyFieldsSent:
        raise ValueError(
            f"the body has more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS:,} fields: no "
            "request here needs that"
        ) from None
    # A form's field given twice is a key given twice, as in JSON (``.dict()`` kept the last).
    twice = sorted(k for k, values in fields.lists() if len(values) > 1)
    if twice:
        raise ValueError(f"the body has field {twice[0][:40]!r} twice: give each field once")
    return fields.dict()


def form_input(
    data: Mapping[str, Any],
    form_class: type[forms.Form],
    *,
    also: Iterable[str] = (),
    unread: Iterable[str] = (),
    what: str,
) -> dict[str, str]:
    """A JSON object's fields for ``form_class``, as a browser would post them: a closed set of
    keys (the form's fields but ``unread``, which the endpoint does not read, and ``also``),
    each text, a number, true/false or null (null: not given). An unknown key is a 400 naming
    it, never a field quietly left out (a filter key misspelt would otherwise widen the filter,
    a hold's end misspelt would hold with no end, a version no check); a list or an object
    where a field goes is a 400, never a 500 from the field's parser, and so is true/false
    where no yes/no field goes."""
    known = (set(form_class.base_fields) - set(unread)) | set(also)
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
        if isinstance(value, bool) and not isinstance(
            form_class.base_fields[key], forms.BooleanField
        ):
            # true/false where text goes was the text "true" (a reason of "true", a profile
            # named "false"); where a number, a date or a choice goes it was refused already.
            raise ValueError(f"{what}: {key} is no yes/no field: true/false is no value of it")
        fields[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return fields


def stamp_text(value: Any) -> str | None:
    """Every time the API answers: one ISO-8601 form, UTC to the second (``queues.core.clock``)."""
    return clock.exact(value) or None if value is not None else None


def retry_json(raw: dict[str, Any]) -> dict[str, Any] | None:
    """A job's wait for its next try after an outage of a service outside (queues.core.retries):
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
    now = job_reads.shown_now()  # the clock of the node times (queues/zk/servertime.py)
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
        "seconds_in_state": round(job.status.age_at(now)),
        "space_needed": job.space_needed,
        "locked": job.lock is not None,
        "lock_age_seconds": round(job.lock.age_at(now)) if job.lock else None,
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
                "created": stamp_text(job.created),
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
        "created": stamp_text(batch.created),
        "seconds_in_state": round(batch.status.age_at(job_reads.shown_now())),
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
        "created": stamp_text(item.created),
        "seconds_in_state": round(item.status.age_at(job_reads.shown_now())),
    }


def outcomes_json(outcomes: list[Outcome]) -> dict[str, Any]:
    return {
        "outcomes": [
            {"kind": o.kind, "id": o.id, "before": o.before, "after": o.after, "detail": o.detail}
            for o in outcomes
        ]
    }


def counts_json(summary: dict[str, selectors.StateCount]) -> dict[str, Any]:
    return {s: {"count": c.count, "oldest_seconds": c.oldest_seconds} for s, c in summary.items()}


def page_json(page: job_reads.Page, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "items": items,
        "page": page.number,
        "per_page": page.per_page,
        "total": page.total,
        "has_next": page.has_next,
        "scan_limited": page.scan_limited,
    }


def only_keys(data: Mapping[str, Any], *keys: str, what: str = "query") -> None:
    """A 400 naming any key of ``data`` that is not one of ``keys`` (a closed set)."""
    unknown = sorted(str(k) for k in data if k not in keys)
    if unknown:
        named = ", ".join(repr(k[:40]) for k in unknown[:5])
        known = ", ".join(keys) if keys else "none"
        raise ValueError(f"{what}: unknown key {named}; the keys are {known}")


def text_param(data: Mapping[str, Any], key: str) -> str:
    """A body's text field ("" when not given); a number, a list or an object is a 400."""
    value = data.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key} must be text")
    return value


def query_form(
    request: HttpRequest, form_class: type[forms.Form], *, also: Iterable[str] = ()
) -> Any:
    """A list's filter from the query string: a closed set of keys, as a bulk filter's, each
    read as ``form_input`` reads it (``?stuck=no`` is no)."""
    return form_class(form_input(request.GET, form_class, also=also, what="filter"))
