"""The header's search box (issue 15's cockpit; issue 25 made it search every field): one box
that finds jobs and batches, live and archived. The rest of the cockpit lives with the
resource it shows: a job's story in ``jobs.py``, a batch's summary mails in ``batches.py``, a
report's export in ``reports.py``, the hold previews in ``holds.py``."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from queues.console import search as search_module
from queues.operator.auth import VIEWER

from .common import HtmxHttpRequest, console_view


@require_GET
@console_view(VIEWER)
def search(request: HtmxHttpRequest) -> HttpResponse:
    """The header's search box and its results page: jobs and batches, live and archived, by
    ID prefix, ARK, local ID, submitter, title, file name or error text, in any case, paged by
    kind (``queues/console/search.py`` says what each field searches). A single exact match opens
    the item; input the search refuses is a 400 with the form."""
    context: dict[str, Any] = {
        "fields": search_module.FIELDS,
        "date_of": search_module.DATE_OF,
        "count_cap": search_module.COUNT_CAP,
        "date_checked": search_module.DATE_CHECKED,
    }
    try:
        query = search_module.parse(request.GET)
    except search_module.BadSearch as exc:
        context.update(error=str(exc), query=search_module.Query())
        return render(request, "queues/search.html", context, status=400)
    context["query"] = query
    if len(query.text) < search_module.MIN_TEXT:
        if query.text:
            context["error"] = f"type at least {search_module.MIN_TEXT} characters"
        return render(request, "queues/search.html", context)
    results = search_module.run(query)
    if results.opens:
        return redirect(results.opens)
    kept = {k: str(v) for k, v in request.GET.items() if not k.startswith("page_")}
    context.update(results=results, base_query=urlencode(kept))
    return render(request, "queues/search.html", context)
