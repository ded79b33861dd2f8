"""The console while its database is away or locked: a 503 that says so, never a 500.

Queue state is in ZooKeeper, but sign-in (the session), API tokens, roles, the audit log and the
bulk runs are in the database, and a request meets them before and after the view proper: the
session and the token are read by the login checks that wrap every view, and a page's header
asks for the user's roles. So one middleware answers for every door: whatever a view (or
its decorators, or its template) raises that ``queues.core.transient`` calls a database outage
becomes a 503 with ``Retry-After``, logged as one line, in the door's own form:

- the JSON API: ``{"error": "the database is unavailable: ..."}``;
- an htmx request: nothing swapped but the outage banner (out of band);
- a page: the outage page, which retries by itself.

Each says nothing was changed, unless the request had moved something before it met the outage
(an inline bulk action part-way through: ``audit.changed_here``); then it says that part was
done, its audit entries written or kept until the database answers (``actions.perform``).

Those answers render without the database: as an anonymous visitor (the header's roles would
need it) and with the messages kept in their cookie only (the session's wait for later).

Another middleware meets the database too (the SSO login, a session saved after the view):
Django turns what it raises into its 500 page before this middleware sees anything but the
response. Django announces such an exception (``got_request_exception``) while handling it, so
the request is marked then, and this middleware, outside them, answers the marked 500 as the
503 above.

``banner`` is the context processor behind the banner every page carries: it shows the
database outage the health probe (``queues.web.health``) last found, without waiting for it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.contrib.messages.storage.cookie import CookieStorage
from django.core.signals import got_request_exception
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django_htmx.http import reswap

from queues.core import transient
from queues.operator import audit
from queues.web import health

from .common import RETRY_SECONDS

log = logging.getLogger(__name__)

API_PREFIX = "/api/"
OUTAGE_MARK = "_database_outage"
NOTHING_CHANGED = "nothing was changed"
PART_DONE = (
    "part of what was asked was done before the database went away: "
    "its audit entries are written once the database answers"
)


def _mark_outage(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """Note on ``request`` the database outage Django is turning into a 500 right now."""
    exc = sys.exc_info()[1]
    if request is not None and exc is not None and transient.is_database_outage(exc):
        setattr(request, OUTAGE_MARK, exc)


got_request_exception.connect(_mark_outage, dispatch_uid="queues.views.outage")


def _offline(request: HttpRequest) -> None:
    """Make ``request`` renderable with the database away (see the module's docstring)."""
    request.user = AnonymousUser()
    request._messages = CookieStorage(request)  # type: ignore[attr-defined]


def database_unavailable(
    request: HttpRequest, message: str, *, changed: bool = False
) -> HttpResponse:
    """The 503 of a door while the database is away or locked; ``changed`` when the request
    moved something before it met the outage."""
    response: HttpResponse
    said = PART_DONE if changed else NOTHING_CHANGED
    if request.path_info.startswith(API_PREFIX):  # without a URL prefix (--root-path)
        response = JsonResponse(
            {"error": f"the database is unavailable: {message}; {said}"}, status=503
        )
    else:
        _offline(request)
        context = {
            "db_down": True,
            "db_error": message,
            "retry": RETRY_SECONDS,
            "part_done": PART_DONE if changed else "",
        }
        if getattr(request, "htmx", False):
            body = render_to_string("base.html#zk-banner", {**context, "oob": True}, request)
            response = reswap(HttpResponse(body, status=503), "none")
        else:
            response = render(request, "queues/db_unavailable.html", context, status=503)
    response["Retry-After"] = str(RETRY_SECONDS)
    return response


class DatabaseOutageMiddleware:
    """Turns a database outage met while answering into the door's 503 (module docstring)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # A thread serves one request after another: what the last one changed is not this one's.
        audit.changed_here.set(False)
        audit.write_kept_if_answering()
        response = self.get_response(request)
        outage = getattr(request, OUTAGE_MARK, None)
        if response.status_code == 500 and outage is not None:
            return self._answer(request, outage)
        return response

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if not transient.is_database_outage(exc):
            return None
        return self._answer(request, exc)

    def _answer(self, request: HttpRequest, exc: BaseException) -> HttpResponse:
        # A connection the outage broke is closed now, so the next request opens a new one.
        close_old_connections()
        message = transient.reason(exc).removeprefix("database unavailable: ")
        log.warning("database unavailable for %s %s: %s", request.method, request.path, message)
        response = database_unavailable(request, message, changed=audit.changed_here.get())
        # That line says it all: not Django's ERROR line for every 5xx besides.
        response._has_been_logged = True  # type: ignore[attr-defined]
        return response


def banner(request: HttpRequest) -> dict[str, Any]:
    """``db_down`` and ``db_error`` for the banner: the outage the last database probe found
    (one is started when the last is older than a few seconds), never waited for."""
    outage = health.database_outage()
    if outage is None:
        return {"db_down": False}
    return {"db_down": True, "db_error": outage.error}
