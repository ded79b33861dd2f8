"""Prometheus /metrics: items per state, oldest age per state, bytes in process, holds.

Scraped with an API token (``Authorization: Bearer <key>``) or by a logged-in viewer. The
numbers come from the same selectors as the overview page, so the two always agree.

prometheus-client writes the exposition format: :class:`QueueCollector` reads the queue once per
scrape and yields gauge families, on a registry of its own (the library's default registry
would add this process's Python and GC figures, which say nothing about the queue).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from django.db import DatabaseError
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from queues.console import selectors
from queues.operator.auth import BEARER_CHALLENGE, VIEWER, has_role, token_from
from queues.zk.client import connected_client
from queues.zk.errors import is_connection_error

# What generate_latest writes: the classic text format.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
ZOOKEEPER_UP = "mrt_zookeeper_up"
ZOOKEEPER_UP_HELP = "1 when ZooKeeper answered"


def _gauge(
    name: str, help_text: str, samples: Mapping[str, float], label: str = ""
) -> GaugeMetricFamily:
    """One gauge family: with ``label``, one sample per key of ``samples``; without, the
    single value under the key ``""``."""
    if not label:
        return GaugeMetricFamily(name, help_text, value=samples[""])
    family = GaugeMetricFamily(name, help_text, labels=[label])
    for key, value in samples.items():
        family.add_metric([key], value)
    return family


class QueueCollector(Collector):
    """The queue's figures, read afresh at every scrape. A ZooKeeper that does not answer
    raises out of :meth:`collect` (the view then answers 503 with ``mrt_zookeeper_up 0``)."""

    def collect(self) -> Iterator[Metric]:
        ov = selectors.overview()
        for noun, summary in (("jobs", ov.jobs), ("batches", ov.batches), ("access", ov.access)):
            yield _gauge(
                f"mrt_{noun}",
                f"{noun} per state",
                {s: c.count for s, c in summary.items()},
                "state",
            )
            yield _gauge(
                f"mrt_{noun}_oldest_seconds",
                f"age of the oldest {noun} item per state, in seconds",
                {
                    s: round(c.oldest_seconds)
                    for s, c in summary.items()
                    if c.oldest_seconds is not None
                },
                "state",
            )
        yield _gauge(
            "mrt_bytes_in_process",
            "space_needed summed over jobs in the working states, in bytes",
            {"": ov.bytes_in_process},
        )
        yield _gauge(
            "mrt_gb_in_process",
            "space_needed summed over jobs in the working states, in GiB",
            {"": round(ov.gb_in_process, 3)},
        )
        yield _gauge(
            "mrt_queue_held",
            "1 when the queue is held",
            {q: 1 if held else 0 for q, held in ov.holds.queues.items()},
            "queue",
        )
        yield _gauge(
            "mrt_collection_held_jobs",
            "Held jobs per collection",
            dict(ov.held_by_collection),
            "collection",
        )
        yield _gauge(
            "mrt_collections_held", "number of collection holds", {"": len(ov.holds.collections)}
        )
        yield _gauge(
            "mrt_index_loading",
            "1 while the web process's read index is still filling after a start (counts that "
            "need it are of what is read so far, or left out)",
            {"": 1 if ov.loading else 0},
        )
        yield from self.cockpit()
        yield from self.backlog()
        yield from self.retries()
        yield _gauge(ZOOKEEPER_UP, ZOOKEEPER_UP_HELP, {"": 1})

    def retries(self) -> Iterator[Metric]:
        """Steps given back to be tried again after an outage of a service outside
        (``queues.core.retries``), per step, over the last hour of the step history."""
        from queues.models import StepRecord

        since = int(time.time() // 3600) - 1
        try:
            rows = list(
                StepRecord.objects.filter(hour__gte=since, outcome="retry")
                .values_list("step")
                .annotate(n=Count("id"))
            )
        except DatabaseError:
            return  # the step history is away: no figure rather than a wrong one
        yield _gauge(
            "mrt_step_retries_last_hour",
            "steps given back to be tried again after a service outside could not answer, "
            "in this hour and the last, per step",
            {step: n for step, n in rows},
            "step",
        )

    def backlog(self) -> Iterator[Metric]:
        """The overview's backlog ahead (queues/console/backlog.py)."""
        from queues.console import backlog

        b = backlog.backlog()
        yield _gauge(
            "mrt_backlog_jobs",
            "jobs waiting per state",
            {s.state: s.jobs for s in b.steps},
            "state",
        )
        yield _gauge(
            "mrt_backlog_bytes",
            "estimated bytes of the jobs waiting per state (states whose jobs are estimated)",
            {s.state: s.bytes for s in b.steps if s.bytes is not None},
            "state",
        )
        yield _gauge(
            "mrt_jobs_finished_per_hour",
            "jobs through their last step per hour, at its pace while at work over the last "
            f"{backlog.WINDOW_MINUTES} minutes",
            {"": round(b.rate_per_hour, 3)},
        )
        if b.drain_seconds is not None:
            yield _gauge(
                "mrt_backlog_drain_seconds",
                "seconds until the jobs waiting now that no hold or cap keeps are through, at "
                "each step's recent pace",
                {"": round(b.drain_seconds)},
            )
        kept: dict[str, int] = {}
        for wait in b.forecast.blocked if b.forecast else []:
            kept[wait.kind] = kept.get(wait.kind, 0) + wait.jobs
        yield _gauge(
            "mrt_backlog_kept_jobs",
            "jobs waiting that a hold or a full cap keeps, by what keeps them (queue, collection, "
            "node, breaker, cap)",
            {k: kept.get(k, 0) for k in ("queue", "collection", "node", "breaker", "cap")},
            "kind",
        )
        if b.disk is not None:
            yield _gauge(
                "mrt_work_disk_free_bytes", "free bytes on the working disk", {"": b.disk.free}
            )
            yield _gauge(
                "mrt_work_disk_room_bytes",
                "bytes provisioning may still hand out before its high-water mark",
                {"": b.disk.room},
            )
            yield _gauge(
                "mrt_work_disk_waiting_bytes",
                "bytes the jobs waiting for Provisioning will ask for",
                {"": b.disk.to_provision},
            )

    def cockpit(self) -> Iterator[Metric]:
        """Stuck jobs per state and the registered consumer processes (queues/operator/stuck.py,
        queues/zk/consumers.py)."""
        from queues.operator import stuck

        try:
            counts = stuck.stuck_counts(connected_client(), wait=False)
        except stuck.StillCounting:
            counts = None  # the first count after a start is still being made: no figure yet
        if counts is not None:
            yield _gauge(
                "mrt_jobs_stuck",
                "jobs far longer in their state (or under one lock) than its usual time, per state",
                dict(counts),
                "state",
            )
        procs = stuck.consumer_processes()["consumers"]
        modes = {"claiming": 0, "draining": 0, "drained": 0}
        for p in procs:
            mode = (
                "drained" if p.get("drained") else "draining" if p.get("draining") else "claiming"
            )
            modes[mode] += 1
        yield _gauge(
            "mrt_consumers", "registered consumer processes, by whether they claim", modes, "mode"
        )
        yield _gauge(
            "mrt_consumer_threads_busy",
            "consumer threads holding an item",
            {"": sum(p["busy"] for p in procs)},
        )
        yield _gauge(
            "mrt_consumer_threads_flagged",
            "consumer threads holding one item far longer than its step usually takes",
            {"": sum(p["flagged"] for p in procs)},
        )


class ZooKeeperDown(Collector):
    """What a scrape says while ZooKeeper does not answer."""

    def collect(self) -> Iterator[Metric]:
        yield _gauge(ZOOKEEPER_UP, ZOOKEEPER_UP_HELP, {"": 0})


def _registry(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


QUEUE = _registry(QueueCollector())
DOWN = _registry(ZooKeeperDown())


def render_metrics() -> str:
    return generate_latest(QUEUE).decode("utf-8")


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = token_from(request)
    user = token.user if token is not None else request.user
    if not has_role(user, VIEWER):
        response = HttpResponse("a viewer's API token is required\n", status=401)
        response["WWW-Authenticate"] = BEARER_CHALLENGE
        return response
    try:
        body = render_metrics()
    except Exception as exc:
        if not is_connection_error(exc):
            raise
        return HttpResponse(generate_latest(DOWN), content_type=CONTENT_TYPE, status=503)
    return HttpResponse(body, content_type=CONTENT_TYPE)
