"""Failed jobs grouped by cause (``queues.failure_causes``): a page of groups with their
signature, count, batches, collections, first and last failure and a sample message, and the
group's actions. Resume and delete go through the failed list's bulk code (previewed and
confirmed there, with the group's jobs as the filter's match); holding a collection is the
holds page's own action."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from queues import failure_causes
from queues.auth import VIEWER
from queues.forms import FailedFilterForm

from .bulk import _job_bulk
from .common import HtmxHttpRequest, bad_form, console_view, error_response

COLLECTIONS_SHOWN = 10  # collections with a hold button per group; the rest are counted
BATCHES_SHOWN = 5


@require_GET
@console_view(VIEWER)
def failed_causes(request: HtmxHttpRequest) -> HttpResponse:
    form = FailedFilterForm(request.GET or None)
    if request.GET and not form.is_valid():
        return bad_form(request, "queues/failed_causes.html", {"form": form})
    data = form.cleaned_data if form.is_bound else {"bid": "", "profile": "", "step": ""}
    number = request.GET.get("gpage") or "1"
    if not number.isdigit():
        return error_response(request, "gpage must be a number", 400)
    causes = failure_causes.failure_causes(**data)
    filters = {k: v for k, v in data.items() if v}
    return render(
        request,
        "queues/failed_causes.html",
        {
            "form": form,
            "causes": causes,
            "page": failure_causes.page_of(causes, int(number)),
            "filter_data": data,
            "filter_query": urlencode(filters),
            "collections_shown": COLLECTIONS_SHOWN,
            "batches_shown": BATCHES_SHOWN,
            "next": request.get_full_path(),
        },
    )


@require_POST
@console_view(VIEWER)
def failed_causes_bulk(request: HtmxHttpRequest) -> HttpResponse:
    """Resume (or delete) one cause's Failed jobs: posted with scope "filter" and the group's
    key, so the bulk code previews the group's jobs as they are now, then acts on them."""
    key = request.POST.get("cause", "")
    if not failure_causes.KEY_RE.fullmatch(key):
        return error_response(request, "cause must be a group's key", 400)

    def matching(form: FailedFilterForm) -> tuple[list[str], bool]:
        # None left (all resumed meanwhile): the bulk code answers "nothing selected".
        return failure_causes.failure_causes(**form.cleaned_data).jids(key), False

    return _job_bulk(request, FailedFilterForm(request.POST), matching, "failed-causes")
