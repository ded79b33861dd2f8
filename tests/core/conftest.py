"""Factories for queue items in the test's own chroot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from kazoo.client import KazooClient

from queues.core.roles import ADMIN
from queues.operator.auth import ensure_groups
from queues.zk import batches, jobs
from queues.zk.records import Batch, Job

PROFILE = "ucb_lib_test"

# The console user ``manage.py queue`` moves things as (``--user``): an admin, made by ``ops``.
OPS = "ops"


@pytest.fixture
def make_user(db: Any) -> Callable[..., Any]:
    """A console user with a role (admin unless told), as setupconsole's groups give it."""
    groups = ensure_groups()

    def make(name: str, role: str | None = ADMIN, *, active: bool = True) -> Any:
        user = get_user_model().objects.create_user(username=name, is_active=active)
        if role:
            user.groups.add(groups[role])
        return user

    return make


@pytest.fixture
def ops(make_user: Callable[..., Any]) -> Any:
    return make_user(OPS)


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
                **submission,
            },
        )

    return make


@pytest.fixture
def batch(make_batch: Callable[..., Batch]) -> Batch:
    return make_batch()


@pytest.fixture
def make_job(zk: KazooClient, batch: Batch) -> Callable[..., Job]:
    def make(bid: str | None = None, profile: str = PROFILE, **kwargs: Any) -> Job:
        configuration = kwargs.pop(
            "configuration",
            {
                "profile": profile,
                "submitter": "dpr/Ada Lovelace",
                "payload_url": "https://example.org/object.zip",
                "type": "container",
            },
        )
        return jobs.job_create(zk, bid=bid or batch.bid, configuration=configuration, **kwargs)

    return make


@pytest.fixture
def job(make_job: Callable[..., Job]) -> Job:
    return make_job()
