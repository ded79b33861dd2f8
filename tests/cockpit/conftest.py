"""Cockpit tests (issue 15): the consumers registry, drain, step history, aggregation and stuck
detection against the real ZooKeeper of tests/conftest.py and the real database (SQLite, and
PostgreSQL from tests/pg.py where a test asks for ``database``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import OperationalError

from queues.core.states import JOB
from queues.daemons.base import JobDaemon, Next
from queues.operator import history, stuck
from tests.console.conftest import (  # noqa: F401
    PASSWORD,
    _fresh_cache,
    admin,
    make_access,
    make_batch,
    make_job,
    make_user,
    operator,
    viewer,
)
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
def database_for_threads(request: pytest.FixtureRequest) -> str:
    """``database`` for a test whose writer thread uses a connection of its own: on SQLite the
    test may then not hold a transaction open (pytest-django's ``transactional_db``)."""
    if request.param == "postgresql":
        request.getfixturevalue("pg_db")
    else:
        request.getfixturevalue("transactional_db")
    return request.param


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    history.clear_cache()
    stuck.reset()
    yield
    history.clear_cache()
    stuck.reset()


def wait_for(check: Callable[[], Any], *, timeout: float = 30.0, every: float = 0.1) -> Any:
    """``check()`` once it is true. On the suite's SQLite (in memory, a cache shared between
    connections) a read while a writer thread's transaction holds the table fails at once with
    "database table is locked" instead of waiting as a file database does: a look to take again,
    not an answer."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except OperationalError as exc:
            if "locked" not in str(exc):
                raise
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting after {timeout}s")
        time.sleep(every)


class SlowStep(JobDaemon):
    """A job step that takes ``delay`` seconds and moves the job on: the loop, the lock and the
    transitions are the real ones."""

    name = "slow"
    step = "slow"
    state = "Estimating"
    queue_hold = None
    delay = 0.0
    # When set: the step holds its item until the test sets this event (at most a minute).
    until: threading.Event | None = None

    def work(self, item):  # the base class's signature
        if self.until is not None:
            self.until.wait(60)
        else:
            time.sleep(self.delay)
        return Next(JOB.successor(item.state) or "Completed")


class Running:
    """Daemons running in threads until ``stop()``."""

    def __init__(self, daemons: list[Any]) -> None:
        self.stop_event = threading.Event()
        self.threads = [
            threading.Thread(target=d.run, args=(self.stop_event,), daemon=True) for d in daemons
        ]
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=30)


@contextmanager
def held_consumer(zk_hosts: str, **registered: Any) -> Iterator[tuple[SlowStep, Any]]:
    """A process running the slow step on a ZooKeeper session of its own, registered
    (``registered``: the observer's host, pid, ...): ``(daemon, observer)``. A claimed item is
    held until the test sets ``daemon.until`` (set on the way out in any case): a step of a fixed
    time could end before a look that comes late on a busy machine."""
    from queues.daemons.registration import ProcessObserver
    from queues.zk import client as zkmod

    other = zkmod.connect(zk_hosts)
    daemon = SlowStep(zk=other, poll=0.1)
    daemon.until = threading.Event()
    observer = ProcessObserver(other, [daemon], record=False, publish_seconds=0.2, **registered)
    daemon.observer = observer
    observer.start()
    running = Running([daemon])
    try:
        yield daemon, observer
    finally:
        daemon.until.set()
        running.stop()
        observer.stop()
        other.stop()
        other.close()


def record(**kw: Any) -> Any:
    """A StepRecord with sensible defaults (not saved)."""
    from queues.models import StepRecord

    started = kw.pop("started", datetime.now(UTC) - timedelta(minutes=5))
    values = {
        "kind": "job",
        "item_id": "jid0000000001",
        "step": "estimating",
        "state": "Estimating",
        "outcome": "ok",
        "duration": 1.0,
        "waited": None,
        "host": "h1",
        "consumer": "h1-1",
        **kw,
    }
    return StepRecord(started=started, hour=int(started.timestamp() // 3600), **values)
