"""Failed batches whose jobs have all ended well since (each failed job resumed and
completed): they stay Failed until an operator starts Update-reporting, which the seeds leave
to a person. This page lists every such batch and starts Update-reporting on them all at once,
through the batch bulk action (audited, checked per batch, in the background when many)."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from queues.console import batch_reads
from queues.operator.auth import VIEWER
from queues.templatetags.followup import batches_waiting_for_update_reporting
from queues.zk.client import connected_client

from .common import HtmxHttpRequest, console_view

SHOWN = 500  # rows on the page; the button covers the batches listed


@require_GET
@console_view(VIEWER)
def fixed_batches(request: HtmxHttpRequest) -> HttpResponse:
    bids = batches_waiting_for_update_reporting()
    rows = batch_reads.batch_rows(connected_client(), bids[:SHOWN]) if bids else []
    return render(
        request,
        "queues/fixed_batches.html",
        {"rows": rows, "total": len(bids), "next": reverse("fixed-batches")},
    )
