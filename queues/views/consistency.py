"""The consistency check of the ZooKeeper tree (what is wrong, what can be repaired) and the
repair, an admin's destructive action."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from queues import selectors
from queues.auth import VIEWER

from .common import HtmxHttpRequest, console_view, perform_posted, report


@require_GET
@console_view(VIEWER)
def consistency(request: HtmxHttpRequest) -> HttpResponse:
    found = selectors.consistency_report()
    return render(
        request,
        "queues/consistency.html",
        {"report": found, "repairable": sum(1 for f in found.findings if f.repairable)},
    )


@require_POST
@console_view(VIEWER)
def consistency_repair(request: HtmxHttpRequest) -> HttpResponse:
    _form, outcomes = perform_posted(
        request.user, request.POST, kind="consistency", action="repair", item_id="tree"
    )
    report(request, outcomes)
    return render(
        request,
        "queues/consistency.html",
        {
            "report": selectors.consistency_report(),
            "repaired": outcomes[0].detail.split("; ") if outcomes[0].detail else [],
        },
    )
