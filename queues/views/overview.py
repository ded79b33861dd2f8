"""The front page (state diagrams with live counts, open bulk runs) and the ZooKeeper banner
every page polls."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from queues import diagrams, selectors
from queues.auth import VIEWER
from queues.models import BulkRun
from queues.states import ACCESS, BATCH, JOB
from queues.zk.errors import is_connection_error

from .common import HtmxHttpRequest, console_view, job_state_link, link, shown_bulk_runs


@require_GET
@console_view(VIEWER)
def overview(request: HtmxHttpRequest) -> HttpResponse:
    ov = selectors.overview()

    def summary(counts: dict[str, selectors.StateCount]) -> tuple[dict, dict]:
        return {s: c.count for s, c in counts.items()}, {
            s: c.oldest_seconds for s, c in counts.items()
        }

    job_counts, job_oldest = summary(ov.jobs)
    batch_counts, batch_oldest = summary(ov.batches)
    access_counts, access_oldest = summary(ov.access)
    context = {
        "ov": ov,
        "job_svg": diagrams.render(
            JOB,
            counts=job_counts,
            oldest=job_oldest,
            href=job_state_link,
            title="Jobs by state",
            noun="job",
        ),
        "batch_svg": diagrams.render(
            BATCH,
            counts=batch_counts,
            oldest=batch_oldest,
            href=lambda s: link("batches", state=s),
            title="Batches by state",
            noun="batch",
        ),
        "access_svg": diagrams.render(
            ACCESS,
            counts=access_counts,
            oldest=access_oldest,
            href=lambda s: link("access", state=s),
            title="Access requests by state",
            noun="request",
        ),
        "unknown_batch_states": [s for s in ov.batches if not BATCH.is_state(s)],
        # Bulk runs not ended: going, or interrupted and waiting for someone to continue them.
        "bulk_open": list(shown_bulk_runs().filter(state=BulkRun.RUNNING)),
    }
    if request.htmx and request.htmx.target == "overview-live":
        return render(request, "queues/overview.html#overview-live", context)
    return render(request, "queues/overview.html", context)


@require_GET
def zk_health(request: HtmxHttpRequest) -> HttpResponse:
    """The banner fragment base.html polls: empty while ZooKeeper answers."""
    try:
        selectors.job_state_counts()
    except Exception as exc:
        if is_connection_error(exc):
            return render(request, "base.html#zk-banner", {"zk_down": True, "error": str(exc)})
        raise
    return render(request, "base.html#zk-banner", {"zk_down": False})
