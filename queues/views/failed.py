"""Failed jobs: grouped by batch, collection or failing step, paged, with each group's rows.
Resuming (or deleting) them in bulk is ``bulk.failed_bulk``."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from queues.console import failed_reads
from queues.operator.auth import VIEWER
from queues.web.forms import FailedFilterForm, whole_number

from .common import HtmxHttpRequest, bad_form, console_view


@require_GET
@console_view(VIEWER)
def failed(request: HtmxHttpRequest) -> HttpResponse:
    form = FailedFilterForm(request.GET or None)
    if request.GET and not form.is_valid():
        return bad_form(request, "queues/failed.html", {"form": form})
    data = form.cleaned_data if form.is_bound else {"bid": "", "profile": "", "step": ""}
    # Paging of the groups, and of the open group's rows (failed_reads.failed_jobs).
    group_page = whole_number(request.GET, "gpage")
    row_page = whole_number(request.GET, "rpage")
    group = request.GET.get("group", "batch")
    group = group if group in failed_reads.FAILED_GROUPINGS else "batch"
    view = failed_reads.failed_jobs(
        bid=data["bid"],
        profile=data["profile"],
        step=data["step"],
        group=group,
        group_page=group_page,
        open_group=request.GET.get("open", "")[:200],
        row_page=row_page,
    )
    filters = {k: v for k, v in data.items() if v}
    return render(
        request,
        "queues/failed.html",
        {
            "form": form,
            "view": view,
            "group": group,
            "filter_query": urlencode(filters),
            "group_query": urlencode({**filters, "group": group}),
            "filter_data": data,
            "next": request.get_full_path(),
        },
    )
