"""Alerts daemon (``runconsumer alerts``, and part of ``all``): every ``MRT_ALERT_EVERY``
seconds, evaluate the alert rules (``queues/daemons/alert_rules.py``), write what changed
(``queues/daemons/alerting.py``), deliver the messages due, and once a day the digest.

Exactly one process evaluates while ZooKeeper is reachable: the one whose session holds the
ephemeral ``/mrt-console/leaders/alerts`` node (``queues/zk/leader.py``); any number may run,
on any hosts, and another takes over within a round of the holder's session ending.

ZooKeeper unreachable is the one thing the leader cannot be trusted to notice alone (it may be
the process that lost it, or gone with it): every alerts process whose connection is down
evaluates the rules that need no ZooKeeper (ZooKeeper and the database unreachable) itself, and
the database's one-open-episode rule makes their alert one alert. Every process delivers: the
messages are claimed in the database, so each goes out once whoever sends it.

Claims nothing and takes no item lock, so a queue hold does not stop it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from queues.core import transient
from queues.daemons.alert_rules import KINDS
from queues.daemons.alerting import Evaluator, deliver_due, digest_if_due
from queues.daemons.base import ItemResult, PeriodicDaemon
from queues.zk.errors import is_connection_error
from queues.zk.leader import leader_resign, leader_take
from queues.zk.servertime import server_moment

log = logging.getLogger("queues.daemons")

ROLE = "alerts"


class Alerts(PeriodicDaemon):
    name: ClassVar[str] = "alerts"
    step: ClassVar[str] = "alerts"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.evaluator = Evaluator()
        self.leading = False
        self.started = timezone.now()

    def _lead(self) -> bool:
        """Whether this process holds the leadership (taking it when nobody does)."""
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": self.started.isoformat(timespec="seconds"),
        }
        return leader_take(self.zk, ROLE, info)

    def round(self, now: datetime | None = None) -> list[str]:
        """One round; the lines say what fired, resolved or was sent.

        Its "now" is the ZooKeeper server's (``queues/zk/servertime.py``) while it answers: the
        rules compare it with node times, and the episodes' times it writes are read by the
        alerts daemon of another host once that one leads. Without ZooKeeper, this host's."""
        reachable = self.gate.connected and self.zk.connected
        if now is None:
            now = timezone.now()
            if reachable:
                try:
                    now = server_moment(self.zk)
                except Exception as exc:
                    if not is_connection_error(exc):
                        raise
                    reachable = False
        if reachable:
            try:
                self.leading = self._lead()
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                reachable = False
        said: list[str] = []
        if not reachable:
            self.leading = False
            without = [k for k, kind in KINDS.items() if not kind.needs_zookeeper]
            said += self.evaluator.evaluate(zk=self.zk, now=now, kinds=without)
        elif self.leading:
            said += self.evaluator.evaluate(zk=self.zk, now=now)
            said += self._database_step(lambda: ["digest written"] if digest_if_due(now) else [])
        sent = self._database_step(lambda: [f"{n} sent"] if (n := deliver_due(now=now)) else [])
        kept = self.evaluator.deliver_kept()
        return said + sent + ([f"{kept} sent from memory"] if kept else [])

    def _database_step(self, step: Callable[[], list[str]]) -> list[str]:
        try:
            return list(step())
        except Exception as exc:
            if not transient.is_database_outage(exc):
                raise
            log.info("%s: %s", self.name, transient.reason(exc))
            close_old_connections()
            return []

    def run_once(self) -> bool:
        started = time.monotonic()
        said = self.round()
        role = "leader" if self.leading else "standby"
        detail = f"{role}: " + ("; ".join(said) if said else "nothing changed")
        self.last = ItemResult("round", self.step, "ok", time.monotonic() - started, detail)
        log.info("%s", self.last.line())
        return False

    def every(self) -> float:
        return float(settings.MRT_ALERT_EVERY)

    def tick(self) -> bool:
        for line in self.round():
            log.info("%s: %s", self.name, line)
        return True

    def stopping(self) -> None:
        if self.leading:
            with contextlib.suppress(Exception):
                leader_resign(self.zk, ROLE)
