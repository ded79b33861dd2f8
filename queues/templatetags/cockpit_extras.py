"""Template tags for the cockpit's additions to other pages: the overview's stuck-jobs card and
the job page's step records (``queues/views/workers.py`` has the pages of their own)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django import template

from queues.operator import history, stuck
from queues.zk.client import connected_client

register = template.Library()
log = logging.getLogger(__name__)


@register.filter
def duration(seconds: float | None) -> str:
    return history.fmt_seconds(seconds)


@register.inclusion_tag("queues/_stuck_card.html")
def stuck_card() -> dict[str, Any]:
    """How many jobs are stuck now, per state, with links to them."""
    try:
        counts = stuck.stuck_counts(connected_client(), wait=False)
    except stuck.StillCounting as exc:
        return {"error": str(exc)}
    except Exception as exc:  # the overview must still show when this cannot be answered
        log.warning("stuck jobs not counted: %s", exc)
        return {"error": str(exc) or type(exc).__name__}
    return {
        "total": sum(counts.values()),
        "by_state": [(s, n) for s, n in counts.items() if n],
    }


@register.inclusion_tag("queues/_job_steps.html")
def job_steps(jid: str) -> dict[str, Any]:
    """The consumers' step records of one job (start, end, duration, host, outcome), oldest
    first, and the consumer holding it now if a registered one does."""
    try:
        rows = history.item_steps(jid)
    except Exception as exc:
        log.warning("step records of %s not read: %s", jid, exc)
        rows = []
    steps = [
        {"row": r, "ended": r.started + timedelta(seconds=r.duration), "retry": False} for r in rows
    ]
    seen: set[str] = set()
    for s in steps:
        key = s["row"].step
        s["retry"] = key in seen
        seen.add(key)
    holder = None
    try:
        from queues.zk import consumers as zconsumers

        for data in zconsumers.consumers_list(connected_client()):
            for t in data.get("threads") or []:
                if isinstance(t, dict) and t.get("item") == jid:
                    holder = {"name": data.get("name"), **t}
    except Exception as exc:
        log.debug("consumers not read: %s", exc)
    return {"steps": steps, "holder": holder, "jid": jid}
