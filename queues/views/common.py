"""What every console view shares: the role gate, error pages, htmx fragments and messages."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.middleware import HtmxDetails

from queues.actions import ReasonRequired
from queues.auth import role_required
from queues.zk.errors import (
    Conflict,
    DomainError,
    InvalidID,
    InvalidTransition,
    ItemLocked,
    MalformedNode,
    NotFound,
    QueueHeld,
    is_connection_error,
)


class HtmxHttpRequest(HttpRequest):
    """A request as django-htmx's middleware leaves it (``request.htmx``), for the type checker."""

    htmx: HtmxDetails


log = logging.getLogger(__name__)

RETRY_SECONDS = 10

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
    (DomainError, 409),
)


def status_for(exc: BaseException) -> int:
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def unavailable(request: HttpRequest, exc: BaseException) -> HttpResponse:
    """ZooKeeper is unreachable: say so plainly, and retry by itself."""
    log.warning("ZooKeeper unavailable: %s", exc)
    response = render(
        request,
        "queues/unavailable.html",
        {"error": str(exc) or type(exc).__name__, "retry": RETRY_SECONDS},
        status=503,
    )
    response["Retry-After"] = str(RETRY_SECONDS)
    if getattr(request, "htmx", False):
        response["HX-Reswap"] = "none"
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
    """A refusal: for htmx only the message (the target stays), else a full error page."""
    if getattr(request, "htmx", False):
        messages.error(request, message)
        response = HttpResponse(messages_oob(request), status=status)
        response["HX-Reswap"] = "none"
        return response
    return render(
        request, "queues/error.html", {"message": message, "status": status}, status=status
    )


def console_view(role: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Login and role first; then domain errors become 4xx pages and an unreachable ZooKeeper
    a 503 that retries, so no view needs its own try/except."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                return view(request, *args, **kwargs)
            except PermissionDenied as exc:
                return error_response(request, str(exc) or "you may not do that", 403)
            except Exception as exc:
                if is_connection_error(exc):
                    return unavailable(request, exc)
                status = status_for(exc)
                if status == 500:
                    raise
                return error_response(request, str(exc), status)

        return role_required(role)(wrapped)

    return decorator


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
