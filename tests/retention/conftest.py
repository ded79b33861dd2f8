"""Retention tests run against the real ZooKeeper of tests/conftest.py and against both
databases: SQLite (the default) and a throwaway PostgreSQL cluster (tests/pg.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from queues.core.states import JOB_STEPS
from queues.operator.auth import ensure_groups
from queues.zk import batches, jobs
from queues.zk.records import Batch, Job
from tests.pg import pg_cluster, pg_db, pg_url  # noqa: F401

# The PostgreSQL run asks for pg_db at run time, where the markers cannot see it (tests/markers.py).
ON_POSTGRES = pytest.param("postgresql", marks=pytest.mark.postgres)


@pytest.fixture(params=["sqlite", ON_POSTGRES])
def database(request: pytest.FixtureRequest, db: None) -> str:
    """Each test that asks for it runs twice: on SQLite, then with the ORM on PostgreSQL."""
    if request.param == "postgresql":
        request.getfixturevalue("pg_db")
    return request.param


@pytest.fixture(params=["sqlite", ON_POSTGRES])
def database_for_threads(request: pytest.FixtureRequest, transactional_db: None) -> str:
    """``database`` for a test whose daemon writes from a thread of its own: on SQLite the test
    may then not hold a transaction open (pytest-django's ``transactional_db``)."""
    if request.param == "postgresql":
        request.getfixturevalue("pg_db")
    return request.param


PROFILE = "demo_collection"


@pytest.fixture
def finished_batch(zk: Any) -> Callable[..., tuple[Batch, list[Job]]]:
    """A batch walked through the real transitions with its jobs: each job to the state given
    (Completed, Failed, or a working state), the batch to ``batch_state`` with its report."""

    def make(
        job_states: tuple[str, ...] = ("Completed", "Completed", "Failed"),
        *,
        batch_state: str = "auto",
        tag: str = "",
    ) -> tuple[Batch, list[Job]]:
        batch = batches.batch_create(
            zk,
            submission={
                "profile": PROFILE,
                "submitter": "dpr/Ada Lovelace",
                "payload_url": "https://example.org/manifest.checkm",
                "type": "batch-manifest",
                "title": f"Letters of Ada {tag}".strip(),
                "batchID": f"bid-{uuid.uuid4()}",
            },
        )
        batch = batches.batch_transition(zk, batch, "Processing")
        made: list[Job] = []
        for n, state in enumerate(job_states):
            job = jobs.job_create(
                zk,
                bid=batch.bid,
                configuration={
                    "profile": PROFILE,
                    "submitter": "dpr/Ada Lovelace",
                    "payload_url": f"https://example.org/{n}.pdf",
                    "type": "file",
                    "title": f"Letter {n} {tag}".strip(),
                    "localID": f"letters-{tag}{n:03d}",
                },
                identifiers={
                    "primary_id": f"ark:/99999/fk4{tag}{n:03d}",
                    "local_id": [f"letters-{tag}{n:03d}", f"alt-{tag}{n:03d}"],
                },
            )
            target = "Downloading" if state == "Failed" else state
            for step in JOB_STEPS[1 : JOB_STEPS.index(target) + 1]:
                job = jobs.job_transition(zk, job, step)
            if state == "Failed":
                job = jobs.job_transition(zk, job, "Failed", message="HTTP 404 on payload")
            made.append(job)
        if batch_state == "auto":
            batch_state = "Failed" if "Failed" in job_states else "Completed"
        if batch_state in ("Completed", "Failed"):
            batch = batches.batch_transition(zk, batch, "Reporting")
            batches.batch_write_report(
                zk,
                batch,
                failed=[j.jid for j in made if j.state == "Failed"],
                successful=[j.jid for j in made if j.state == "Completed"],
            )
            batch = batches.batch_transition(zk, batch, batch_state, message="report written")
        return batches.batch_load(zk, batch.bid), made

    return make


@pytest.fixture
def viewer_client(database: str) -> Client:
    groups = ensure_groups()
    user = get_user_model().objects.create_user(username="retention-viewer", password="x" * 20)
    user.groups.add(groups["viewer"])
    client = Client()
    client.force_login(user)
    return client
