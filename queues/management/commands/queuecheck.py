from __future__ import annotations

import os
import socket
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError

from queues.models import ConsistencyFinding
from queues.operator import consistency
from queues.zk.client import client

from ._base import QueueCommand, require_database


class Command(QueueCommand):
    help = (
        "Check the queue tree for orphans and inconsistencies, walking it in this process in "
        "bounded memory (recorded as a check run the console shows; one run at a time across "
        "hosts); --repair fixes the safe ones."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--repair", action="store_true", help="fix what is safe to fix")
        parser.add_argument(
            "--break-stale-locks",
            action="store_true",
            help="with --repair: also delete locks older than ZK_LOCK_STALE_SECONDS "
            "(never one a live session that is not a console process holds)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["break_stale_locks"] and not opts["repair"]:
            raise CommandError(
                "--break-stale-locks goes with --repair: without it nothing is repaired"
            )
        require_database()
        zk = self.run_safely(client)
        owner = f"{socket.gethostname()}:{os.getpid()}:queuecheck"
        run, created = consistency.start(user=None, via="cli", owner=owner)
        if not created:
            # One that no daemon has taken yet is walked here instead.
            run = consistency.claim(owner) or run
            if run.owner != owner:
                raise CommandError(
                    f"consistency check {run.pk} is already running (on {run.owner}, "
                    f"{run.phase or 'starting'}); see /consistency/"
                )
        tty = self.stderr.isatty()
        try:
            run = consistency.walk(
                run,
                zk,
                owner=owner,
                say=self.stderr.status,
                stale_lock_seconds=settings.ZK_LOCK_STALE_SECONDS,
            )
        except consistency.Interrupted as exc:
            raise CommandError(f"{exc}; run it again") from exc
        if tty:
            self.stderr.write("")
        self.stdout.write(
            f"checked {run.jobs} jobs, {run.batches} batches, "
            f"{run.index_entries} index entries: {run.findings} findings"
        )
        for row in ConsistencyFinding.objects.filter(run=run).order_by("id").iterator(2000):
            mark = (
                "Merritt's: not repaired"
                if row.owner == "merritt"
                else "repairable"
                if row.repairable
                else "report only"
            )
            self.stdout.write(f"{row.kind:30} {row.path}  {row.detail}  [{mark}]")
            if row.advice:
                self.stdout.write(f"{'':30} what to do: {row.advice}")
        if opts["repair"]:
            for line in consistency.repair(run, zk, break_stale_locks=opts["break_stale_locks"]):
                self.stdout.write(f"repaired: {line}")
