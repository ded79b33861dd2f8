"""The overview's "backlog ahead" section (``queues/backlog.py``)."""

from __future__ import annotations

import logging
from typing import Any

from django import template

from queues import backlog, history

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
    return {"b": b, "chart": chart, "window": backlog.WINDOW_HOURS}
