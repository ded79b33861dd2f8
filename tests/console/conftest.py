"""Fixtures for the console: users in each role, logged-in clients, and queue items in any
state, built with the real ZooKeeper service module in the test's own chroot."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from kazoo.client import KazooClient

from queues.core.states import JOB_STEPS
from queues.operator.audit import ApiToken
from queues.operator.auth import ensure_groups
from queues.zk import access, batches, jobs
from queues.zk import paths as zpaths
from queues.zk.maintenance import WINDOWS, node_hold_path
from queues.zk.records import AccessRequest, Batch, Job
from tests.browser import logged_in

# Playwright's sync API runs an event loop in the test thread; Django's ORM must still work.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

PROFILE = "demo_collection"
PASSWORD = "correct-horse-battery-staple"


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    cache.clear()


@pytest.fixture
def make_user(db: Any) -> Callable[[str | None], Any]:
    groups = ensure_groups()

    def make(role: str | None, username: str | None = None) -> Any:
        user = get_user_model().objects.create_user(
            username=username or f"{role or 'nobody'}-user", password=PASSWORD
        )
        if role:
            user.groups.add(groups[role])
        return user

    return make


def _client(user: Any, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


@pytest.fixture
def viewer(make_user: Callable[..., Any]) -> Client:
    return _client(make_user("viewer"))


@pytest.fixture
def operator(make_user: Callable[..., Any]) -> Client:
    return _client(make_user("operator"))


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> Client:
    return _client(make_user("admin"))


@pytest.fixture
def htmx_admin(make_user: Callable[..., Any]) -> Client:
    """An admin whose requests look like htmx's (HX-Request header)."""
    return _client(make_user("admin", "htmx-admin"), HTTP_HX_REQUEST="true")


@pytest.fixture
def operator_page(browser: Any, live_server: Any, make_user: Callable[..., Any]) -> Iterator[Any]:
    """A Chromium page with the operator olga logged in at the live server."""
    make_user("operator", "olga")
    with logged_in(browser, live_server.url, "olga", PASSWORD) as page:
        yield page


@pytest.fixture
def make_batch(zk: KazooClient) -> Callable[..., Batch]:
    def make(profile: str = PROFILE, **submission: Any) -> Batch:
        return batches.batch_create(
            zk,
            submission={
                "profile": profile,
                "submitter": "dpr/Ada Lovelace",
                "payload_url": "https://example.org/payload.zip",
                "type": "container",
                "title": "Letters of Ada",
                **submission,
            },
        )

    return make


@pytest.fixture
def make_job(zk: KazooClient, make_batch: Callable[..., Batch]) -> Callable[..., Job]:
    """A job walked through the real transitions to ``state``.

    ``failed_at`` names the step a Failed job failed in (default Downloading).
    """

    def make(
        state: str = "Pending",
        *,
        batch: Batch | None = None,
        profile: str = PROFILE,
        failed_at: str = "Downloading",
        message: str = "",
        priority: int = 5,
        **configuration: Any,
    ) -> Job:
        batch = batch or make_batch(profile=profile)
        job = jobs.job_create(
            zk,
            bid=batch.bid,
            priority=priority,
            configuration={
                "profile": profile,
                "submitter": "dpr/Ada Lovelace",
                "payload_url": "https://example.org/a.pdf",
                "type": "file",
                **configuration,
            },
            identifiers={"primary_id": "ark:/99999/fk4test", "local_id": ["letters-001"]},
        )
        if state == "Pending":
            return job
        if state == "Held":
            return jobs.job_transition(zk, job, "Held", message=message or "collection held")
        target = failed_at if state == "Failed" else state
        for step in JOB_STEPS[1 : JOB_STEPS.index(target) + 1]:
            job = jobs.job_transition(zk, job, step)
        if state == "Failed":
            job = jobs.job_transition(zk, job, "Failed", message=message or "HTTP 404 on payload")
        return job

    return make


@pytest.fixture
def make_access(zk: KazooClient) -> Callable[..., AccessRequest]:
    def make(state: str = "Pending", queue: str = "small") -> AccessRequest:
        item = access.access_create(zk, queue=queue, token={"object": "ark:/99999/fk4x"})
        if state == "Pending":
            return item
        item = access.access_transition(zk, item, "Processing")
        if state in ("Completed", "Failed"):
            item = access.access_transition(zk, item, state, message="assembly failed")
        return item

    return make


@pytest.fixture
def bulk_runs_daemon(zk: KazooClient) -> Any:
    """The bulk-runs consumer daemon, running in a thread of the test process (as
    ``runconsumer bulk-runs`` runs it), so that the bulk runs the console records get done."""
    import threading

    from queues.daemons.bulk_runs import BulkRuns

    daemon = BulkRuns(zk=zk, poll=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=daemon.run, args=(stop,), daemon=True)
    thread.start()
    yield daemon
    stop.set()
    thread.join(timeout=30)


@pytest.fixture
def token_for(make_user):
    def issue(role: str) -> dict[str, str]:
        _token, key = ApiToken.issue(user=make_user(role, f"api-{role}"), name="test")
        return {"HTTP_AUTHORIZATION": f"Bearer {key}"}

    return issue


def post_json(client, url, data, **headers):
    return client.post(url, json.dumps(data), content_type="application/json", **headers)


def nothing_held(zk: Any) -> bool:
    """No hold of the kinds the tests place, and no window at all."""
    markers = [zpaths.queue_lock("ingest"), zpaths.collection_lock("letters"), node_hold_path(9501)]
    return all(zk.exists(m) is None for m in markers) and (
        zk.exists(WINDOWS) is None or zk.get_children(WINDOWS) == []
    )
