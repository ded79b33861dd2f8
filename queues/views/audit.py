"""The audit log: every operator action and refusal, filtered and paged."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.db.models import Q
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from queues.operator.audit import AuditEntry
from queues.operator.auth import VIEWER
from queues.web.forms import whole_number

from .common import HtmxHttpRequest, console_view, querystring_without


@require_GET
@console_view(VIEWER)
def audit(request: HtmxHttpRequest) -> HttpResponse:
    entries = AuditEntry.objects.all()
    filters = {}
    for field in ("username", "kind", "action", "item_id"):
        value = request.GET.get(field, "").strip()[:120]
        if value:
            entries = entries.filter(**{field: value})
            filters[field] = value
    if request.GET.get("ok") in ("0", "1"):
        entries = entries.filter(ok=request.GET["ok"] == "1")
        filters["ok"] = request.GET["ok"]
    bulk = request.GET.get("bulk", "")
    if bulk:
        # One bulk run's item entries (and its own line); a run's number, or a 400 saying so.
        run = whole_number(request.GET, "bulk", most=10**18)
        entries = entries.filter(
            Q(detail__startswith=f"bulk run #{run}:") | Q(kind="bulk", item_id=str(run))
        )
        filters["bulk"] = bulk
    elif not ({"item_id", "kind"} & set(filters)) and request.GET.get("items") != "all":
        # A background bulk run is one line here, not one per item (486 for one delete): its
        # items are a click away. Looking for an item or a kind shows every entry.
        entries = entries.exclude(detail__startswith="bulk run #")
    page = Paginator(entries, 100).get_page(whole_number(request.GET))
    return render(
        request,
        "queues/audit.html",
        {"page": page, "filters": filters, "query": querystring_without(request, "page")},
    )
