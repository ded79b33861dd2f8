"""The audit log: every operator action and refusal, filtered and paged."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from queues.audit import AuditEntry
from queues.auth import VIEWER

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
    page = Paginator(entries, 100).get_page(request.GET.get("page"))
    return render(
        request,
        "queues/audit.html",
        {"page": page, "filters": filters, "query": querystring_without(request, "page")},
    )
