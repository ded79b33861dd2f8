"""The front page (state diagrams with live counts, open bulk runs) and the ZooKeeper banner
every page polls."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from queues.console import diagrams, selectors
from queues.core.states import ACCESS, BATCH, JOB, Machine
from queues.models import BulkRun
from queues.operator.auth import VIEWER
from queues.zk.errors import is_connection_error

from .common import HtmxHttpRequest, console_view, job_state_link, link, shown_bulk_runs


@require_GET
@console_view(VIEWER)
def overview(request: HtmxHttpRequest) -> HttpResponse:
    ov = selectors.overview()

    def diagram(
        machine: Machine,
        counts: dict[str, selectors.StateCount],
        href: Callable[[str], str | None],
        title: str,
        noun: str,
        notes: dict[str, list[str]] | None = None,
    ) -> str:
        return diagrams.render(
            machine,
            counts={s: c.count for s, c in counts.items()},
            oldest={s: c.oldest_seconds for s, c in counts.items()},
            href=href,
            title=title,
            noun=noun,
            notes=notes,
        )

    # Under a job state's box: how many of its jobs each hold or cap keeps, and which.
    notes: dict[str, list[str]] = {}
    for wait in ov.kept:
        notes.setdefault(wait.state, []).append(f"{wait.jobs} {wait.words}")

    context = {
        "ov": ov,
        "job_svg": diagram(JOB, ov.jobs, job_state_link, "Jobs by state", "job", notes),
        "batch_svg": diagram(
            BATCH, ov.batches, lambda s: link("batches", state=s), "Batches by state", "batch"
        ),
        "access_svg": diagram(
            ACCESS,
            ov.access,
            lambda s: link("access", state=s),
            "Access requests by state",
            "request",
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
    """The banner fragment base.html polls: empty while ZooKeeper answers (one small read:
    not the state folders' listings, which the fill reads first after a start)."""
    try:
        selectors.zookeeper_answers()
    except Exception as exc:
        if is_connection_error(exc):
            return render(request, "base.html#zk-banner", {"zk_down": True, "error": str(exc)})
        raise
    return render(request, "base.html#zk-banner", {"zk_down": False})
