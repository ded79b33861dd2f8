"""Prometheus /metrics: items per state, oldest age per state, bytes in process, holds.

Scraped with an API token (``Authorization: Bearer <key>``) or by a logged-in viewer. The
numbers come from the same selectors as the overview page, so the two always agree.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from queues import selectors
from queues.api import token_from
from queues.auth import VIEWER, has_role
from queues.zk.errors import is_connection_error

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    """A label value per the exposition format: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(
    lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]
) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        number = str(int(value)) if float(value).is_integer() else repr(float(value))
        lines.append(f"{name}{{{labels}}} {number}" if labels else f"{name} {number}")


def render_metrics() -> str:
    ov = selectors.overview()
    lines: list[str] = []
    for noun, summary in (("jobs", ov.jobs), ("batches", ov.batches), ("access", ov.access)):
        _family(
            lines,
            f"mrt_{noun}",
            "gauge",
            f"{noun} per state",
            [(f'state="{_label(s)}"', c.count) for s, c in summary.items()],
        )
        _family(
            lines,
            f"mrt_{noun}_oldest_seconds",
            "gauge",
            f"age of the oldest {noun} item per state, in seconds",
            [
                (f'state="{_label(s)}"', round(c.oldest_seconds))
                for s, c in summary.items()
                if c.oldest_seconds is not None
            ],
        )
    _family(
        lines,
        "mrt_bytes_in_process",
        "gauge",
        "space_needed summed over jobs in the working states, in bytes",
        [("", ov.bytes_in_process)],
    )
    _family(
        lines,
        "mrt_gb_in_process",
        "gauge",
        "space_needed summed over jobs in the working states, in GiB",
        [("", round(ov.gb_in_process, 3))],
    )
    _family(
        lines,
        "mrt_queue_held",
        "gauge",
        "1 when the queue is held",
        [(f'queue="{_label(q)}"', 1 if t else 0) for q, t in ov.holds.queues.items()],
    )
    _family(
        lines,
        "mrt_collection_held_jobs",
        "gauge",
        "Held jobs per collection",
        [(f'collection="{_label(c)}"', n) for c, n in ov.held_by_collection.items()],
    )
    _family(
        lines,
        "mrt_collections_held",
        "gauge",
        "number of collection holds",
        [("", len(ov.holds.collections))],
    )
    _cockpit_families(lines)
    _family(lines, "mrt_zookeeper_up", "gauge", "1 when ZooKeeper answered", [("", 1)])
    return "\n".join(lines) + "\n"


def _cockpit_families(lines: list[str]) -> None:
    """Stuck jobs per state and the registered consumer processes (queues/stuck.py,
    queues/zk/consumers.py)."""
    from queues import stuck

    zk = selectors.zk_client()
    _family(
        lines,
        "mrt_jobs_stuck",
        "gauge",
        "jobs far longer in their state (or under one lock) than its usual time, per state",
        [(f'state="{_label(s)}"', n) for s, n in stuck.stuck_counts(zk).items()],
    )
    procs = stuck.consumer_processes()["consumers"]
    modes = {"claiming": 0, "draining": 0, "drained": 0}
    for p in procs:
        mode = "drained" if p.get("drained") else "draining" if p.get("draining") else "claiming"
        modes[mode] += 1
    _family(
        lines,
        "mrt_consumers",
        "gauge",
        "registered consumer processes, by whether they claim",
        [(f'mode="{m}"', n) for m, n in modes.items()],
    )
    _family(
        lines,
        "mrt_consumer_threads_busy",
        "gauge",
        "consumer threads holding an item",
        [("", sum(p["busy"] for p in procs))],
    )
    _family(
        lines,
        "mrt_consumer_threads_flagged",
        "gauge",
        "consumer threads holding one item far longer than its step usually takes",
        [("", sum(p["flagged"] for p in procs))],
    )


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = token_from(request)
    user = token.user if token is not None else request.user
    if not has_role(user, VIEWER):
        response = HttpResponse("a viewer's API token is required\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="mrt-console"'
        return response
    try:
        body = render_metrics()
    except Exception as exc:
        if not is_connection_error(exc):
            raise
        body = (
            "# HELP mrt_zookeeper_up 1 when ZooKeeper answered\n"
            "# TYPE mrt_zookeeper_up gauge\nmrt_zookeeper_up 0\n"
        )
        return HttpResponse(body, content_type=CONTENT_TYPE, status=503)
    return HttpResponse(body, content_type=CONTENT_TYPE)
