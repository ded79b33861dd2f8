"""The tests' PostgreSQL: the project's one launcher, ``queues.chaos.infra.Postgres`` (which
``manage.py chaosrun`` starts too), as pytest fixtures, and Django's default database pointed at
one of its databases for a test.

Fixtures (import them into a test module or a conftest):

- ``pg_cluster`` (session): the running cluster (a ``Postgres``);
- ``pg_url`` (session): ``postgres://...`` of a database of its own, migrated;
- ``pg_db`` (function, needs pytest-django's ``db``): the default database connection points
  at ``pg_url`` for the test (the ORM, the test client, the management commands all use it),
  and every table is emptied afterwards.

A module that stops and starts its own cluster calls ``Postgres.started()`` (``InfraError``
when PostgreSQL is not installed), ``stop()`` and ``start()`` again, and ``remove()`` at the end.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import pytest

from queues.chaos.infra import InfraError, Postgres


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Postgres]:
    try:
        cluster = Postgres.started()
    except InfraError as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()
        cluster.remove()


def database_settings(url: str) -> dict:
    """The complete settings dict Django would make of ``DATABASE_URL=url``."""
    import dj_database_url
    from django.db import connections

    configured = connections.configure_settings({"default": dj_database_url.parse(url)})
    return configured["default"]


@contextlib.contextmanager
def default_database(url: str) -> Iterator[None]:
    """Point Django's default database at ``url`` (this thread and any thread started meanwhile)."""
    from django.db import connections
    from django.db.utils import load_backend

    settings_dict = database_settings(url)
    old_connection = connections["default"]
    old_settings = connections.settings["default"]
    backend = load_backend(settings_dict["ENGINE"])
    connections.settings["default"] = settings_dict
    connections["default"] = backend.DatabaseWrapper(settings_dict, "default")
    try:
        yield
    finally:
        connections["default"].close()
        connections.settings["default"] = old_settings
        connections["default"] = old_connection


@pytest.fixture(scope="session")
def pg_url(pg_cluster: Postgres, django_db_blocker) -> str:
    """A migrated database of its own in the session's cluster."""
    from django.core.management import call_command

    url = pg_cluster.create_database(f"mrt_test_{int(time.time())}")
    with django_db_blocker.unblock(), default_database(url):
        call_command("migrate", verbosity=0, interactive=False)
    return url


@pytest.fixture
def pg_db(db, pg_url: str, django_db_blocker) -> Iterator[str]:
    """The test's ORM work goes to PostgreSQL; every table is emptied afterwards."""
    from django.core.management import call_command

    with django_db_blocker.unblock(), default_database(pg_url):
        try:
            yield pg_url
        finally:
            call_command("flush", verbosity=0, interactive=False)
