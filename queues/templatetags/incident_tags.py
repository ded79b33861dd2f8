"""The overview's incident parts: the held storage nodes with their maintenance windows
(``queues/zk/maintenance.py``) and the backlog ahead (``queues/console/backlog.py``)."""

from __future__ import annotations

import logging
from typing import Any

from django import template
from django.conf import settings

from queues.console import backlog, waits
from queues.core.retries import service_at
from queues.operator import history
from queues.steps.profiles import ProfileError, ProfileNotFound, load_profile
from queues.zk import consumers as zconsumers
from queues.zk.client import connected_client
from queues.zk.maintenance import node_holds, service_holds, windows

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
        history.hours_exact(b.hour_starts),
    )
    return {"b": b, "chart": chart, "window": backlog.WINDOW_MINUTES}


@register.inclusion_tag("queues/_node_holds_card.html")
def node_holds_card() -> dict[str, Any]:
    """The storage nodes held now, each with the end of its maintenance window if it has one."""
    try:
        zk = connected_client()
        held = node_holds(zk)
        ends = {int(w.name): w for w in windows(zk) if w.kind == "node"}
        services = service_holds(zk)
    except Exception as exc:  # the overview must still show when this cannot be answered
        log.warning("node holds not read: %s", exc)
        return {"error": str(exc) or type(exc).__name__}
    return {
        "nodes": [(n, h, ends.get(n)) for n, h in held.items()],
        "services": list(services.items()),
    }


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


def _services_needed(job: Any) -> list[str]:
    """The services outside the step of ``job``'s state talks to (as each daemon's
    ``services_of`` names them), for saying why it waits."""
    state = job.state
    if state == "Recording":
        return ["inventory"] if settings.MRT_INVENTORY_URL else []
    if state == "Processing":
        return ["ezid"] if settings.MRT_EZID_URL else []
    if state in ("Estimating", "Downloading"):
        url = job.configuration.get("payload_url")
        if isinstance(url, str) and url.lower().startswith(("http://", "https://")):
            return [service_at("depositor", url)]
        return []
    if state == "Notify":
        try:
            url = load_profile(job.profile).callback_url
        except (ProfileNotFound, ProfileError):
            return []
        return [service_at("callback", url)] if url else []
    return []


@register.inclusion_tag("queues/_service_wait.html")
def service_hold_wait(job: Any) -> dict[str, Any]:
    """Why a job waits unclaimed before its step: a service that step needs is held."""
    needed = _services_needed(job)
    if not needed:
        return {}
    try:
        held = service_holds(connected_client())
    except Exception as exc:  # the job page must still show
        log.warning("service holds not read for %s: %s", job.jid, exc)
        return {}
    return {"holds": [held[name] for name in needed if name in held], "state": job.state}
