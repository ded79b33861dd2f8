"""Retention tests run against the real ZooKeeper of tests/conftest.py and against both
databases: SQLite (the default) and a throwaway PostgreSQL cluster (tests/pg.py)."""

from __future__ import annotations

import pytest

from tests.pg import pg_cluster, pg_db, pg_url  # noqa: F401


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, db: None) -> str:
    """Each test that asks for it runs twice: on SQLite, then with the ORM on PostgreSQL."""
    if request.param == "postgresql":
        request.getfixturevalue("pg_db")
    return request.param
