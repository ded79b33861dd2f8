"""Prometheus /metrics: the same names, labels and auth as ever, written by prometheus-client.

The answer is read back with prometheus-client's own parser, so the tests check what a
Prometheus server reads (values, not how a number happens to be spelt)."""

from __future__ import annotations

import pytest
from django.urls import reverse
from kazoo.exceptions import ConnectionLoss
from prometheus_client.parser import text_string_to_metric_families

from queues.console import selectors
from queues.operator.audit import ApiToken
from tests.jobnodes import set_job_nodes

pytestmark = pytest.mark.django_db

FAMILIES = {
    "mrt_jobs": "state",
    "mrt_jobs_oldest_seconds": "state",
    "mrt_batches": "state",
    "mrt_batches_oldest_seconds": "state",
    "mrt_access": "state",
    "mrt_access_oldest_seconds": "state",
    "mrt_bytes_in_process": None,
    "mrt_gb_in_process": None,
    "mrt_queue_held": "queue",
    "mrt_collection_held_jobs": "collection",
    "mrt_collections_held": None,
    "mrt_index_loading": None,
    "mrt_jobs_stuck": "state",
    "mrt_consumers": "mode",
    "mrt_consumer_threads_busy": None,
    "mrt_consumer_threads_flagged": None,
    "mrt_backlog_jobs": "state",
    "mrt_backlog_bytes": "state",
    "mrt_backlog_kept_jobs": "kind",
    "mrt_jobs_finished_per_hour": None,
    "mrt_work_disk_free_bytes": None,
    "mrt_work_disk_room_bytes": None,
    "mrt_work_disk_waiting_bytes": None,
    "mrt_zookeeper_up": None,
    "mrt_step_retries_last_hour": "step",
}


def scrape(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``{family: {labels: value}}``, every family a gauge."""
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge", family.name
        found[family.name] = {tuple(sorted(s.labels.items())): s.value for s in family.samples}
    return found


@pytest.fixture
def viewer_token(make_user) -> dict[str, str]:
    _token, key = ApiToken.issue(user=make_user("viewer", "api-viewer"), name="prometheus")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def test_metrics_expose_counts_ages_and_bytes_in_process(client, viewer_token, zk, make_job):
    job = make_job("Downloading")
    set_job_nodes(zk, job, space_needed=3 * 1024**3)
    make_job("Failed")
    assert client.get("/metrics").status_code == 401
    response = client.get("/metrics", **viewer_token)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.content.decode()
    assert "# TYPE mrt_jobs gauge" in text
    metrics = scrape(text)
    assert set(metrics) == set(FAMILIES)
    for name, label in FAMILIES.items():
        for labels in metrics[name]:
            assert [k for k, _ in labels] == ([label] if label else []), name
    assert metrics["mrt_jobs"][(("state", "Failed"),)] == 1
    assert metrics["mrt_jobs"][(("state", "Downloading"),)] == 1
    assert metrics["mrt_jobs"][(("state", "Pending"),)] == 0
    assert metrics["mrt_jobs_oldest_seconds"][(("state", "Failed"),)] >= 0
    assert metrics["mrt_bytes_in_process"][()] == 3 * 1024**3
    assert metrics["mrt_gb_in_process"][()] == 3
    assert metrics["mrt_queue_held"][(("queue", "ingest"),)] == 0
    assert metrics["mrt_collections_held"][()] == 0
    assert metrics["mrt_zookeeper_up"][()] == 1
    assert metrics["mrt_index_loading"][()] == 0  # the read index has filled
    # Nothing of the library's default registry (process, GC, platform figures).
    assert not [name for name in metrics if not name.startswith("mrt_")]


def test_metrics_count_the_retries_of_the_last_hour_per_step(client, viewer_token, zk):
    from datetime import UTC, datetime, timedelta

    from queues.models import StepRecord

    now = datetime.now(UTC)

    def record(step: str, outcome: str, when: datetime) -> StepRecord:
        return StepRecord(
            kind="job",
            item_id="jid0000000001",
            step=step,
            state="Storing",
            outcome=outcome,
            started=when,
            duration=0.1,
            hour=int(when.timestamp() // 3600),
            host="h",
        )

    StepRecord.objects.bulk_create(
        [
            record("storing", "retry", now),
            record("storing", "retry", now),
            record("notify", "retry", now),
            record("storing", "waiting", now),  # a database outage's wait is not a retry
            record("storing", "retry", now - timedelta(hours=3)),  # too old
        ]
    )
    metrics = scrape(client.get("/metrics", **viewer_token).content.decode())
    assert metrics["mrt_step_retries_last_hour"] == {
        (("step", "storing"),): 2,
        (("step", "notify"),): 1,
    }


def test_metrics_for_a_logged_in_viewer(viewer, zk):
    assert viewer.get(reverse("metrics")).status_code == 200


def test_metrics_need_the_viewer_role(client, make_user, zk):
    _token, key = ApiToken.issue(user=make_user(None, "no-role"), name="x")
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="mrt-console"'
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401


def test_metrics_say_zookeeper_is_down_with_503(client, viewer_token, zk, monkeypatch):
    def unreachable():
        raise ConnectionLoss()

    monkeypatch.setattr(selectors, "overview", unreachable)
    response = client.get("/metrics", **viewer_token)
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert scrape(response.content.decode()) == {"mrt_zookeeper_up": {(): 0}}
