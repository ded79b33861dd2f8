"""Bulk runs: work through the bulk actions operators started (``queues/operator/bulkrun.py``).

The web process only records a run; this daemon claims a waiting one (the update that takes it
checks it is still unclaimed, so two daemons never work on one run), does its items one by one
exactly as ``actions.perform`` does them, and writes its progress twice a second. A restart of
the web process therefore loses nothing, and a run whose daemon dies is shown as interrupted
until an operator continues it, which hands it to a daemon again.

Its items are in the database, not in a ZooKeeper state folder: it takes no ZooKeeper lock and
is not stopped by a queue hold (each item's move is refused by the state machine if it must
be).

A database outage (``queues.core.transient``) is waited out: logged once, tried again after a
growing back-off, and a run it interrupted is taken up again by this daemon, which still owns it,
from the progress last saved (an operator who continued it meanwhile owns it instead: then this
daemon leaves it).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from typing import Any, ClassVar

from django.db import close_old_connections

from queues.core import transient
from queues.daemons.base import Daemon, ItemResult, Next, Step
from queues.models import BulkRun
from queues.operator import bulkrun

log = logging.getLogger("queues.daemons")

_numbers = itertools.count(1)


class BulkRuns(Daemon[Any]):
    name: ClassVar[str] = "bulk-runs"
    step: ClassVar[str] = "bulk-run"
    queue_hold: ClassVar[str | None] = None

    @property
    def owner(self) -> str:
        """Who claims runs, as the run's page and the database show it: host, pid, loop."""
        if not hasattr(self, "_owner"):
            self._owner = f"{socket.gethostname()}:{os.getpid()}:{next(_numbers)}"
        return self._owner

    # A run this daemon owns that an outage interrupted: worked on again before any new claim.
    interrupted: int | None = None

    def run_once(self) -> bool:
        self.last = None
        try:
            outcome = self._run_once()
        except Exception as exc:
            if not transient.is_database_outage(exc):
                raise
            backoff = transient.backoff_of(self)
            if backoff.failures == 0:
                log.warning("%s: %s; runs wait until it is back", self.name, transient.reason(exc))
            close_old_connections()
            time.sleep(backoff.next_delay())
            return False
        finally:
            close_old_connections()
        if transient.backoff_of(self).clear():
            log.info("%s: the database is back", self.name)
        return outcome

    def _run_once(self) -> bool:
        if self.interrupted is not None:
            run = BulkRun.objects.filter(pk=self.interrupted).first()
            if run is None or run.owner != self.owner or run.state != BulkRun.RUNNING:
                self.interrupted = None  # continued by an operator, stopped, ended or deleted
                return True
            log.info("bulk run %s: %s, taken up again by %s", run.pk, run, self.owner)
        else:
            run = self.claim()
            if run is None:
                return False
            log.info("bulk run %s: %s, claimed by %s", run.pk, run, self.owner)
        started = time.monotonic()
        self.interrupted = run.pk
        bulkrun.work(run.pk)
        self.interrupted = None
        ended = BulkRun.objects.only("state", "position", "total").get(pk=run.pk)
        outcome = "failed" if ended.state == BulkRun.FAILED else "ok"
        detail = f"{ended.state} at {ended.position} of {ended.total}"
        self.last = ItemResult(
            f"bulk-{run.pk}", self.step, outcome, time.monotonic() - started, detail
        )
        log.info("%s", self.last.line())
        return True

    # The consumer hooks the shared loop calls through run_once above.

    def claim(self) -> BulkRun | None:
        return bulkrun.claim(self.owner)

    def work(self, item: BulkRun) -> Step:
        bulkrun.work(item.pk)
        return Next(item.state)

    def item_id(self, item: BulkRun) -> str:
        return f"bulk-{item.pk}"

    def lock_path(self, item: BulkRun) -> str:
        raise NotImplementedError("a bulk run is claimed in the database, not by a lock")

    def move(self, item: BulkRun, step: Next) -> bool:
        raise NotImplementedError("a bulk run's items move themselves, one action each")

    def unlock(self, item: BulkRun) -> None:
        return None
