"""The overview's incident parts: the held storage nodes with their maintenance windows
(``queues/zk/maintenance.py``) and the backlog ahead (``queues/backlog.py``)."""

from __future__ import annotations

import logging
from typing import Any

from django import template
from django.conf import settings

from queues import backlog, history, waits
from queues.zk import consumers as zconsumers
from queues.zk.client import connected_client
from queues.zk.maintenance import node_holds, windows

register = template.Library()
log = logging.getLogger(__name__)


@register.inclusion_tag("queues/_backlog.html")
def backlog_section() -> dict[str, Any]:
    try:
        b = backlog.backlog()
    except Exception as exc:  # the overview must still show when this cannot be answered
        log.warning("backlog not computed: %s", exc)
        return {"error": str(exc) or type(exc).__name__}
    chart = history.bars_svg(
        "finished-per-hour",
        "Jobs finished per hour over the last day",
        b.hour_labels,
        b.finished_per_hour,
        [0] * len(b.finished_per_hour),
    )
    return {"b": b, "chart": chart, "window": backlog.WINDOW_MINUTES}


@register.inclusion_tag("queues/_node_holds_card.html")
def node_holds_card() -> dict[str, Any]:
    """The storage nodes held now, each with the end of its maintenance window if it has one."""
    try:
        zk = connected_client()
        held = node_holds(zk)
        ends = {int(w.name): w for w in windows(zk) if w.kind == "node"}
    except Exception as exc:  # the overview must still show when this cannot be answered
        log.warning("node holds not read: %s", exc)
        return {"error": str(exc) or type(exc).__name__}
    return {"nodes": [(n, h, ends.get(n)) for n, h in held.items()]}


@register.inclusion_tag("queues/_job_wait.html")
def job_wait(job: Any) -> dict[str, Any]:
    """What keeps this job waiting, if a hold or a cap does: which, why, who, until when."""
    if job is None:
        return {}
    try:
        return {"wait": waits.job_wait(job)}
    except Exception as exc:  # the job page must still show
        log.warning("holds not read for %s: %s", job.jid, exc)
        return {"error": str(exc) or type(exc).__name__}


@register.inclusion_tag("queues/_slot_wait.html")
def download_slot_wait(jid: str, state: str) -> dict[str, Any]:
    """Why a Downloading job is not being downloaded: a consumer process passes it over because
    its depositor's server already has MRT_DOWNLOADS_PER_HOST downloads under way there."""
    if state != "Downloading":
        return {}
    try:
        processes = zconsumers.consumers_list(connected_client())
    except Exception as exc:  # the job page must still show
        log.warning("registrations not read for %s: %s", jid, exc)
        return {}
    waits = [(p.get("name", "?"), (p.get("slot_waits") or {}).get(jid)) for p in processes]
    found = [(name, server) for name, server in waits if server]
    return {"waits": found, "cap": settings.MRT_DOWNLOADS_PER_HOST}
