"""The consistency check of the ZooKeeper tree: started here by an admin, walked in the
background by the ``consistency`` daemon (``queues/operator/consistency.py``), its progress polled
and its findings paged here; the repair, an admin's destructive action, works from those
findings."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from queues.models import ConsistencyRun
from queues.operator import consistency as checks
from queues.operator.auth import VIEWER, require_action
from queues.web.forms import whole_number

from .common import (
    HtmxHttpRequest,
    console_view,
    only_fields,
    perform_posted,
    redirect_after_post,
    report,
)


def _page(request: HtmxHttpRequest, run: ConsistencyRun | None) -> dict[str, object]:
    kind = request.GET.get("kind", "")
    if run is None or kind not in run.kinds:
        kind = ""
    page = whole_number(request.GET)
    rows, more = checks.findings_page(run, kind=kind, page=page) if run else ([], False)
    return {
        "run": run,
        "rows": rows,
        "kind": kind,
        "page": page,
        "next_page": page + 1 if more else None,
        "previous_page": page - 1 if page > 1 else None,
    }


@require_http_methods(["GET", "POST"])
@console_view(VIEWER)
def consistency(request: HtmxHttpRequest) -> HttpResponse:
    """GET: the latest run; POST (an admin): start a run, or show the one already going."""
    if request.method == "POST":
        # Starting a walk of the whole tree is an admin's, like the repair.
        require_action(request.user, "consistency", "repair")
        only_fields(request)
        run, created = checks.start(user=request.user, via="web")
        if not created:
            messages.info(request, f"A check is already going (run {run.pk}): showing it.")
        return redirect_after_post(reverse("consistency"))
    return render(request, "queues/consistency.html", _page(request, checks.latest()))


@require_POST
@console_view(VIEWER)
def consistency_repair(request: HtmxHttpRequest) -> HttpResponse:
    only_fields(request, also=("reason",))
    _form, outcomes = perform_posted(
        request.user, request.POST, kind="consistency", action="repair", item_id="tree"
    )
    report(request, outcomes)
    context = _page(request, checks.latest())
    context["repaired"] = outcomes[0].detail.split("; ") if outcomes[0].detail else []
    return render(request, "queues/consistency.html", context)
