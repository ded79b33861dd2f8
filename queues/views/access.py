"""Access requests: the list of both queues and the actions on one request."""

from __future__ import annotations

from django.http import HttpResponse, HttpResponseNotAllowed
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from queues.console import selectors
from queues.operator import actions
from queues.operator.auth import VIEWER
from queues.web.forms import AccessFilterForm
from queues.zk.errors import NotFound

from .common import (
    HtmxHttpRequest,
    act,
    bad_form,
    confirm,
    console_view,
    fragment,
    redirect_after_post,
    safe_next,
)


@require_GET
@console_view(VIEWER)
def access(request: HtmxHttpRequest) -> HttpResponse:
    form = AccessFilterForm(request.GET or None)
    if request.GET and not form.is_valid():
        return bad_form(request, "queues/access.html", {"form": form, "items": []})
    data = form.cleaned_data if form.is_bound else {"queue": "", "state": ""}
    items = selectors.access_requests(queue=data["queue"], state=data["state"])
    return render(
        request,
        "queues/access.html",
        {"form": form, "items": items, "next": request.get_full_path()},
    )


@console_view(VIEWER)
def access_action(request: HtmxHttpRequest, queue: str, qid: str, action: str) -> HttpResponse:
    if request.method == "GET":
        if not actions.is_destructive("access", action):
            return HttpResponseNotAllowed(["POST"])
        item = selectors.access_one(queue=queue, qid=qid)
        return confirm(
            request,
            kind="access",
            action=action,
            item_id=qid,
            preview={"item": item, "queue": queue},
        )
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    form = act(
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
