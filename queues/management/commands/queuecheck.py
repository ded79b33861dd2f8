from __future__ import annotations

from typing import Any

from django.conf import settings

from queues.check import repair, run_check
from queues.zk.client import client

from ._base import QueueCommand


class Command(QueueCommand):
    help = "Check the queue tree for orphans and inconsistencies; --repair fixes the safe ones."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--repair", action="store_true", help="fix what is safe to fix")
        parser.add_argument(
            "--break-stale-locks",
            action="store_true",
            help="with --repair: also delete locks older than ZK_LOCK_STALE_SECONDS",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        zk = self.run_safely(client)
        report = run_check(
            zk,
            stale_lock_seconds=settings.ZK_LOCK_STALE_SECONDS,
            progress=lambda msg: self.stderr.write(msg),
        )
        self.stdout.write(
            f"checked {report.jobs} jobs, {report.batches} batches, "
            f"{report.index_entries} index entries: {len(report.findings)} findings"
        )
        for finding in report.findings:
            mark = "repairable" if finding.repairable else "report only"
            self.stdout.write(f"{finding.kind:30} {finding.path}  {finding.detail}  [{mark}]")
        if opts["repair"]:
            for line in repair(zk, report, break_stale_locks=opts["break_stale_locks"]):
                self.stdout.write(f"repaired: {line}")
