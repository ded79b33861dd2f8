"""Retention: every ``MRT_RETENTION_SWEEP_SECONDS`` archive the batches (with their jobs) that
finished at least ``MRT_RETENTION_DAYS`` ago into the database and remove them from ZooKeeper
(``queues/operator/archive.py``), with one log line per batch archived or left alone; then
remove the working folders no job will use again (``workfolder.leftover_folders``) and the
console's records of storage adds and callbacks whose job is gone (removed by a tool that does
not know them: ``queues.zk.side_effects.gone_records_remove``).

Not a consumer of one state: it claims nothing and takes no lock (the removers refuse a locked
item and check every status version against what was archived), so it is not stopped by a
queue hold either. Several copies may run; the archive rows are keyed by ID.
"""

from __future__ import annotations

import logging
import time
from typing import ClassVar

from django.conf import settings

from queues.daemons.base import ItemResult, PeriodicDaemon
from queues.daemons.workfolder import remove_leftover_folders
from queues.operator import archive
from queues.zk.side_effects import gone_records_remove
from queues.zk.store_intents import SIDE_EFFECT_FOLDERS

log = logging.getLogger("queues.daemons")


class Retention(PeriodicDaemon):
    name: ClassVar[str] = "retention"
    step: ClassVar[str] = "retention"
    round_name: ClassVar[str] = "sweep"

    def sweep(self) -> ItemResult:
        """One sweep: a line per batch, then a summary line; the summary is returned.

        A stop (SIGTERM) ends the sweep after the batch in hand, as consumers finish the item in
        hand; the next start sweeps again from the oldest batch.
        """
        started = time.monotonic()
        archived = left = jobs = stopped = 0
        for outcome in archive.sweep(zk=self.zk):
            if outcome.done:
                archived += 1
                jobs += outcome.jobs
                log.info("%s retention archived %s", outcome.bid, _detail(outcome))
            elif outcome.partway:
                stopped += 1
                log.warning("%s retention %s", outcome.bid, _detail(outcome))
            else:
                left += 1
                log.info("%s retention left alone %s", outcome.bid, _detail(outcome))
            if self._stop is not None and self._stop.is_set():
                break
        days = archive.retention_age().total_seconds() / 86400
        folders = remove_leftover_folders(self.zk)
        records = gone_records_remove(self.zk, SIDE_EFFECT_FOLDERS)
        detail = (
            f"{archived} batches ({jobs} jobs) archived and removed from ZooKeeper, "
            f"{left} left alone; finished at least {days:g} days ago; "
            + (
                f"{stopped} batches stopped part-way (marked Deleted, their rows kept; the next "
                "sweep finishes them); "
                if stopped
                else ""
            )
            + f"{folders} working folders of ended or removed jobs removed; "
            f"{records} records of storage adds or callbacks of removed jobs removed"
        )
        return ItemResult("sweep", self.step, "ok", time.monotonic() - started, detail)

    def run_once(self) -> bool:
        self.last = None
        if not self.gate.connected:
            return False
        self.last = self.sweep()
        log.info("%s", self.last.line())
        return False

    def every(self) -> float:
        return float(settings.MRT_RETENTION_SWEEP_SECONDS)

    def tick(self) -> bool:
        self.run_once()
        return self.last is not None


def _detail(outcome: archive.ArchiveOutcome) -> str:
    if outcome.done:
        text = f"{outcome.state} batch, {outcome.jobs} jobs"
        if outcome.detail:
            text += f" ({outcome.detail})"
    elif outcome.partway:
        text = f"{archive.PARTWAY}: {outcome.state} batch, {outcome.jobs} jobs removed: "
        text += outcome.detail
    else:
        text = f"{outcome.state} batch: {outcome.detail}"
    return f"{text} {outcome.seconds:.2f}s"
