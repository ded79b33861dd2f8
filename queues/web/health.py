"""Health of what the console stands on, ZooKeeper and its database: ``/healthz`` for load
balancers and the container, and the database outage banner of every page.

The answer comes within ``BUDGET`` seconds whatever either does. Connecting (up to ZK_TIMEOUT,
or the database's connect timeout) and a request on a connection that is not yet known to be
dead (kazoo waits for it indefinitely) happen in background probes, one per service; the
request waits for them at most the budget and otherwise says 503. A probe still under way is
joined by the next health check rather than started again, so a slow server never piles up
threads.

The database probe asks for what the console's writers need: PostgreSQL must answer a query,
SQLite must also grant its write lock within the budget (a file another process holds
exclusively answers reads, yet every write waits and then fails).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from queues.core import transient
from queues.zk.client import client

BUDGET = 1.5  # seconds; load balancers expect an answer well within 2 s
# The banner trusts a database probe this recent; an older one is started again.
BANNER_FRESH = 5.0


class Probe:
    """One service's background check: at most one under way; its last answer is kept."""

    def __init__(self, name: str, check: Callable[[], str]) -> None:
        self.name = name
        self.check = check
        self._lock = threading.Lock()
        self._future: Future[str] | None = None
        self.started = float("-inf")

    def _run(self, future: Future[str]) -> None:
        try:
            state = self.check()
        # Whatever stops us reaching the service (no server, lost session, timeout, a lock
        # held) means unhealthy.
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(state)

    def current(self) -> Future[str]:
        """The probe under way, or a new one when the last has answered."""
        with self._lock:
            if self._future is None or self._future.done():
                self._future = Future()
                self.started = time.monotonic()
                threading.Thread(
                    target=self._run, args=(self._future,), name=f"healthz-{self.name}", daemon=True
                ).start()
            return self._future

    def recent(self, fresh: float) -> Future[str]:
        """The last probe when it started less than ``fresh`` seconds ago, else a new one."""
        with self._lock:
            future = self._future
            if future is not None and time.monotonic() - self.started < fresh:
                return future
        return self.current()


def _check_zookeeper() -> str:
    zk = client()
    if not zk.connected:
        raise ConnectionError(f"ZooKeeper connection is {zk.state}")
    zk.exists_async("/").get(timeout=BUDGET)
    return str(zk.state)


def _in_memory(name: object) -> bool:
    """An in-memory SQLite database (the tests') is the process's own: no other process can
    hold its lock, and its shared cache refuses rather than waits."""
    return str(name) == ":memory:" or "mode=memory" in str(name)


def _check_database() -> str:
    # A thread of its own, so a connection of its own: closed again whatever happens.
    try:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite" and not _in_memory(connection.settings_dict["NAME"]):
                # Half the budget: a lock held longer is reported as such, not as no answer.
                cursor.execute(f"PRAGMA busy_timeout = {int(BUDGET * 500)}")
                cursor.execute("BEGIN IMMEDIATE")
                cursor.execute("ROLLBACK")
            else:
                cursor.execute("SELECT 1")
        return "ok"
    finally:
        connection.close()


zookeeper_probe = Probe("zookeeper", _check_zookeeper)
database_probe = Probe("database", _check_database)


def _detail(exc: BaseException) -> str:
    return " ".join((str(exc) or type(exc).__name__).split())


@dataclass(frozen=True)
class Status:
    ok: bool
    state: str  # the service's own word when ok; else unreachable | locked
    error: str = ""


def _database_status(exc: BaseException) -> Status:
    text = _detail(exc)
    return Status(False, "locked" if "locked" in text.lower() else "unreachable", text)


def _wait(future: Future[str], what: str, budget: float) -> Status:
    try:
        return Status(True, future.result(timeout=budget))
    except FutureTimeout:
        return Status(False, "unreachable", f"no answer from {what} within {BUDGET:g} s")
    except Exception as exc:
        if what == "the database":
            return _database_status(exc)
        return Status(False, "unreachable", _detail(exc))


def database_outage(*, fresh: float = BANNER_FRESH) -> Status | None:
    """The database outage the last probe found (a probe is started when the last is older
    than ``fresh`` seconds), without waiting: None while it answers, or while no probe has
    answered yet, or when the probe met something other than an outage (a fault of ours)."""
    future = database_probe.recent(fresh)
    if not future.done():
        waited = time.monotonic() - database_probe.started
        if waited <= BUDGET:
            return None
        return Status(False, "unreachable", f"no answer from the database for {waited:.0f} s")
    exc = future.exception()
    if exc is None or not transient.is_database_outage(exc):
        return None
    return _database_status(exc)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    zookeeper = zookeeper_probe.current()
    database = database_probe.current()
    started = time.monotonic()
    zk = _wait(zookeeper, "ZooKeeper", BUDGET)
    db = _wait(database, "the database", max(0.0, BUDGET - (time.monotonic() - started)))
    body: dict[str, Any] = {
        "zookeeper": "connected" if zk.ok else zk.state,
        "database": "ok" if db.ok else db.state,
    }
    if zk.ok:
        body["state"] = zk.state
    errors = []
    if not zk.ok:
        errors.append(f"ZooKeeper: {zk.error}")
    if not db.ok:
        errors.append(f"database: {db.error}")
    if errors:
        body["error"] = "; ".join(errors)
        return JsonResponse(body, status=503)
    return JsonResponse(body)


# From the project root (not this file's folder), so the module may live in any package.
FAVICON = Path(settings.BASE_DIR) / "static" / "favicon.svg"


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, which browsers ask for whatever the page links: the console's icon
    (``static/favicon.svg``), so that no request of it is a 404 in the log."""
    response = HttpResponse(FAVICON.read_bytes(), content_type="image/svg+xml")
    response["Cache-Control"] = "public, max-age=86400"
    return response
