"""The consumers page (who is working, on what, since when; drain), the history page (how fast,
over time) and the stuck-job list (issue 15, items 1-5).

The consumers come from their registration nodes (``queues/zk/consumers.py``), the history from
the step records in the database (``queues/operator/history.py``), stuck jobs from
``queues/operator/stuck.py``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpResponse, HttpResponseNotAllowed
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from queues.console import selectors
from queues.operator import history, stuck
from queues.operator.auth import OPERATOR, VIEWER, may, require_action
from queues.web.forms import whole_number
from queues.zk import consumers as zconsumers
from queues.zk.client import connected_client
from queues.zk.errors import NotFound

from .common import (
    HtmxHttpRequest,
    console_view,
    only_fields,
    perform_posted,
    redirect_after_post,
)


def consumers_context(user: Any) -> dict[str, Any]:
    return {
        **selectors.consumers_overview(),
        "can_drain": may(user, "consumer", "drain"),
        "can_repair": may(user, "consistency", "repair"),
    }


@require_GET
@console_view(VIEWER)
def consumers(request: HtmxHttpRequest) -> HttpResponse:
    context = consumers_context(request.user)
    if request.htmx and request.htmx.target == "consumers-live":
        return render(request, "queues/consumers.html#consumers-live", context)
    return render(request, "queues/consumers.html", context)


def drain_preview(name: str) -> dict[str, Any]:
    """What draining process ``name`` stops: its steps, and those of them no other claiming
    process serves (their items wait until another consumer starts or this one claims again)."""
    processes = selectors.consumers_overview()["consumers"]
    target = next((p for p in processes if p.get("name") == name), None)
    if target is None:
        raise NotFound(f"no consumer process {name} is registered")
    served = sorted({str(s) for s in target.get("steps") or []})
    # A drain stops the steps that claim items; the periodic ones (alerts, maintenance,
    # retention...) go on. A process registered before "claiming" was published: all of them.
    claiming = target.get("claiming")
    stopped = served if not isinstance(claiming, list) else sorted(set(map(str, claiming)))
    going_on = [s for s in served if s not in stopped]
    others = {
        str(step)
        for p in processes
        if p.get("name") != name and not p.get("draining")
        for step in p.get("claiming", p.get("steps")) or []
    }
    return {
        "process": target,
        "steps": stopped,
        "going_on": going_on,
        "alone": [s for s in stopped if s not in others],
    }


@console_view(OPERATOR)
def consumer_drain(request: HtmxHttpRequest, name: str, verb: str) -> HttpResponse:
    """Ask a process to stop claiming (``drain``, confirmed on a page that says what stops, with
    a reason, like a queue hold) or to claim again (``undrain``, one click); audited."""
    zconsumers.name(name)
    if request.method == "GET":
        if verb != "drain":
            return HttpResponseNotAllowed(["POST"])
        require_action(request.user, "consumer", verb)
        return render(request, "queues/consumer_drain_confirm.html", drain_preview(name))
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    only_fields(request, also=("reason",))
    # A refusal (role, no reason, a process that is gone) is audited by perform and answered by
    # console_view: 403, 400, 404. The reason is checked as every action's (ActionForm: at most
    # 2,000 characters, no NUL), refused whole rather than cut.
    _form, outcomes = perform_posted(
        request.user,
        request.POST,
        kind="consumer",
        action=verb,
        item_id=name,
        params=lambda _f: {"by": request.user.get_username()},
    )
    if verb == "drain":
        text = f"{name} asked to drain: it finishes the items in hand and claims nothing more"
    else:
        text = f"{name} claims again"
    messages.success(request, f"{text} ({outcomes[0].before} → {outcomes[0].after})")
    return redirect_after_post(reverse("consumers"))


@require_GET
@console_view(VIEWER)
def history_page(request: HtmxHttpRequest) -> HttpResponse:
    range_name = request.GET.get("range", "24h")
    if range_name not in history.RANGES:
        range_name = "24h"
    bucket = request.GET.get("bucket") or history.RANGES[range_name][2]
    if (range_name, bucket) not in history.ALLOWED:
        bucket = history.RANGES[range_name][2]
    context = {
        **history.page_context(range_name, bucket),
        "range": range_name,
        "bucket": bucket,
        "range_label": history.RANGES[range_name][0],
        "ranges": [(k, v[0]) for k, v in history.RANGES.items()],
        "allowed": sorted(b for r, b in history.ALLOWED if r == range_name),
    }
    if request.htmx and request.htmx.target == "history-live":
        return render(request, "queues/history.html#history-live", context)
    return render(request, "queues/history.html", context)


@require_GET
@console_view(VIEWER)
def stuck_jobs(request: HtmxHttpRequest) -> HttpResponse:
    """Stuck jobs with why, a page at a time (the longest stuck first), and the consumer
    holding each now (if one registered does)."""
    number = whole_number(request.GET)
    zk = connected_client()
    page = stuck.stuck_page(zk, number, per_page=stuck.PAGE_SIZE)
    holders = {}
    for data in zconsumers.consumers_list(zk):
        for t in data.get("threads") or []:
            if isinstance(t, dict) and t.get("item"):
                holders[t["item"]] = (data.get("name"), t.get("thread"))
    return render(
        request,
        "queues/stuck.html",
        {"page": page, "holders": holders, "limits": stuck.thresholds()},
    )
