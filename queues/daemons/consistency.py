"""Consistency check runs: walk the tree for a check an admin started
(``queues/operator/consistency.py``).

The web process only records a run; this daemon claims it (the update that takes it checks it
is still unclaimed, so two daemons on two hosts never walk one run, and the database holds only
one running run) and walks the tree with ``queues.operator.check`` in bounded memory, in this
process, not the web process. It takes no ZooKeeper lock and is not stopped by a queue hold: it only
reads.

An outage (ZooKeeper or the database away) is waited out with a growing back-off; the run it
interrupted stays this daemon's and is walked again from the start once the outage is over.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from typing import Any, ClassVar

from django.conf import settings
from django.db import close_old_connections

from queues.core import transient
from queues.daemons.base import Daemon, ItemResult, Next, Step
from queues.models import ConsistencyRun
from queues.operator import consistency

log = logging.getLogger("queues.daemons")

_numbers = itertools.count(1)


class ConsistencyCheck(Daemon[Any]):
    name: ClassVar[str] = "consistency"
    step: ClassVar[str] = "consistency-check"
    queue_hold: ClassVar[str | None] = None

    # The run this daemon owns that an outage interrupted: walked again before any new claim.
    interrupted: int | None = None

    @property
    def owner(self) -> str:
        if not hasattr(self, "_owner"):
            self._owner = f"{socket.gethostname()}:{os.getpid()}:{next(_numbers)}"
        return self._owner

    def run_once(self) -> bool:
        self.last = None
        try:
            return self._run_once()
        except consistency.Lost as exc:
            log.warning("%s: %s", self.name, exc)
            self.interrupted = None
            return True
        except Exception as exc:
            interrupted = isinstance(exc, consistency.Interrupted)
            why = str(exc) if interrupted else consistency.outage_reason(exc)
            if why is None:
                raise
            backoff = transient.backoff_of(self)
            if backoff.failures == 0:
                log.warning("%s: %s", self.name, why)
            close_old_connections()
            time.sleep(backoff.next_delay())
            return False
        finally:
            close_old_connections()

    def _run_once(self) -> bool:
        run: ConsistencyRun | None
        if self.interrupted is not None:
            run = ConsistencyRun.objects.filter(pk=self.interrupted).first()
            if run is None or run.owner != self.owner or run.state != ConsistencyRun.RUNNING:
                self.interrupted = None
                return True
        else:
            run = self.claim()
            if run is None:
                return False
            log.info("consistency check %s claimed by %s", run.pk, self.owner)
        started = time.monotonic()
        self.interrupted = run.pk
        ended = consistency.walk(
            run,
            self.zk,
            owner=self.owner,
            stale_lock_seconds=settings.ZK_LOCK_STALE_SECONDS,
        )
        self.interrupted = None
        if transient.backoff_of(self).clear():
            log.info("%s: ZooKeeper and the database are back", self.name)
        self.last = ItemResult(
            f"check-{run.pk}",
            self.step,
            "ok",
            time.monotonic() - started,
            f"{ended.jobs} jobs, {ended.batches} batches: {ended.findings} findings",
        )
        log.info("%s", self.last.line())
        return True

    # The consumer hooks the shared loop calls through run_once above.

    def claim(self) -> ConsistencyRun | None:
        return consistency.claim(self.owner)

    def work(self, item: ConsistencyRun) -> Step:
        consistency.walk(item, self.zk, owner=self.owner)
        return Next(item.state)

    def item_id(self, item: ConsistencyRun) -> str:
        return f"check-{item.pk}"

    def lock_path(self, item: ConsistencyRun) -> str:
        raise NotImplementedError("a check run is claimed in the database, not by a lock")

    def move(self, item: ConsistencyRun, step: Next) -> bool:
        raise NotImplementedError("a check run moves no item")

    def unlock(self, item: ConsistencyRun) -> None:
        return None
