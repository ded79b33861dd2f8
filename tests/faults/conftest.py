"""Users in each role and queue items carrying hostile text, for the bad-input tests."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The daemons' loopback file server, and each test its own work and storage folders, for the
# hostile-depositor tests.
from daemons.conftest import daemon_dirs, files, own_zk  # noqa: F401
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from kazoo.client import KazooClient

from queues.chaos.servers import files_server
from queues.operator.auth import ensure_groups
from queues.steps.checkm import ADD_MANIFEST, write_checkm
from queues.zk import batches, jobs
from queues.zk.records import Job

# Playwright's sync API runs an event loop in the test thread; Django's ORM must still work.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

PASSWORD = "correct-horse-battery-staple"


def _sso_middleware() -> list[str]:
    middleware = list(settings.MIDDLEWARE)
    auth = "django.contrib.auth.middleware.AuthenticationMiddleware"
    middleware.insert(middleware.index(auth) + 1, "queues.operator.auth.TrustedHeaderMiddleware")
    return middleware


# What settings.py configures when MRT_SSO_HEADER=X-Remote-User (for override_settings).
SSO_SETTINGS = {
    "MRT_SSO_HEADER": "X-Remote-User",
    "MIDDLEWARE": _sso_middleware(),
    "AUTHENTICATION_BACKENDS": [
        "queues.operator.auth.LoginAttemptsBackend",
        "queues.operator.auth.TrustedHeaderBackend",
        "django.contrib.auth.backends.ModelBackend",
    ],
}
# What a depositor (or another client writing ZooKeeper) might put where the console shows text.
HOSTILE = {
    "submitter": "<script>alert('submitter')</script>",
    "title": "<img src=x onerror=alert('title')>",
    "filename": "\"><svg onload=alert('filename')>.txt",
    "profile": "hostile_collection",
}


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    cache.clear()


@pytest.fixture
def make_user(db: Any) -> Callable[..., Any]:
    groups = ensure_groups()

    def make(role: str | None, username: str | None = None) -> Any:
        user = get_user_model().objects.create_user(
            username=username or f"{role or 'nobody'}-faults", password=PASSWORD
        )
        if role:
            user.groups.add(groups[role])
        return user

    return make


def logged_in(user: Any, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


@pytest.fixture
def viewer(make_user: Callable[..., Any]) -> Client:
    return logged_in(make_user("viewer"))


@pytest.fixture
def operator(make_user: Callable[..., Any]) -> Client:
    return logged_in(make_user("operator"))


@pytest.fixture
def admin(make_user: Callable[..., Any]) -> Client:
    return logged_in(make_user("admin"))


@pytest.fixture
def hostile_job(zk: KazooClient) -> Job:
    """A Failed job whose submitter, title and file name are markup and script."""
    batch = batches.batch_create(
        zk,
        submission={
            "profile": HOSTILE["profile"],
            "submitter": HOSTILE["submitter"],
            "title": HOSTILE["title"],
            "type": "file",
            "payload_url": "https://example.org/x",
        },
    )
    job = jobs.job_create(
        zk,
        bid=batch.bid,
        configuration={
            "profile": HOSTILE["profile"],
            "submitter": HOSTILE["submitter"],
            "title": HOSTILE["title"],
            "filename": HOSTILE["filename"],
            "payload_url": "https://example.org/x",
            "type": "file",
        },
        metadata={"erc_what": HOSTILE["title"], "erc_who": HOSTILE["submitter"]},
    )
    job = jobs.job_transition(zk, job, "Estimating")
    return jobs.job_transition(zk, job, "Failed", message=HOSTILE["title"])


def snapshot(zk: KazooClient) -> dict[str, bytes]:
    """Every node of the test's chroot with its data: proof that nothing was written."""
    found: dict[str, bytes] = {}

    def walk(path: str) -> None:
        data, _stat = zk.get(path)
        found[path] = data
        for kid in zk.get_children(path):
            walk(f"{path.rstrip('/')}/{kid}")

    walk("/")
    return found


@pytest.fixture
def add_manifest(tmp_path: Path) -> Iterator[str]:
    """An add manifest (checkm text) of one file, served on loopback as it lists it: storage
    fetches every file an add lists and checks its size and digest, as the stand-in does."""
    (tmp_path / "a.txt").write_bytes(b"abc")
    served = files_server(str(tmp_path))
    row = {
        "url": f"{served.url}/a.txt",
        "hash_alg": "sha256",
        "hash_value": hashlib.sha256(b"abc").hexdigest(),
        "size": 3,
        "filename": "producer/a.txt",
    }
    try:
        yield write_checkm([row], kind=ADD_MANIFEST)
    finally:
        served.stop()
