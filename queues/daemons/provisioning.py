"""Job Provisioning: let a job go on to Downloading only when its files fit on working storage.

A job fits when the working storage, with the job's ``space_needed`` and what the jobs already
Downloading still expect to write, stays at or below the high-water mark
(MRT_PROVISION_HIGH_WATER, a fraction of the disk; 0.70 by default) and within what the disk
really has free (``shutil.disk_usage``: other writers, a quota or reserved blocks may leave less
than the mark says). Every cycle evaluates ALL jobs in Provisioning in priority order (the
index, read without locking) against one budget and keeps, in order, every job that fits; the
following claims hand those out one by one (each re-checked under its lock), and only when they
are used up is everything evaluated again. So N waiting jobs cost one read of each per cycle,
not per claim. The disk is asked again before each hand-out: when something else has filled it
since the evaluation, the jobs still kept go back to waiting. Jobs that do not fit stay and are
evaluated again next cycle, after ``poll`` seconds. An unestimated job (0 bytes) goes on only
while the disk is under the mark.

An evaluation that lets nothing through is not repeated for IDLE_EVALUATION_GAP seconds: with
the disk full, every job arriving in Provisioning wakes the consumer, and re-reading all N
waiting jobs per arrival would cost N squared reads while a big batch piles up.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from django.conf import settings

from queues.core.states import JobState
from queues.daemons.base import JobDaemon, Next, Step, StepFailed
from queues.steps.workdisk import provision_room
from queues.zk import paths as zpaths
from queues.zk.errors import MalformedNode, NotFound
from queues.zk.jobs import index_entries, job_load, jobs_load
from queues.zk.locks import lock_create, lock_release
from queues.zk.records import Job

log = logging.getLogger("queues.daemons")

DiskUsage = Callable[[Path], Any]
IDLE_EVALUATION_GAP = 2.0


class Provisioning(JobDaemon):
    name: ClassVar[str] = "provisioning"
    step: ClassVar[str] = "provisioning"
    state: ClassVar[str] = JobState.PROVISIONING

    def __init__(self, *args: Any, disk_usage: DiskUsage = shutil.disk_usage, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.disk_usage = disk_usage
        self.waiting: set[str] = set()  # jobs already logged as waiting, to log each once
        # Jobs that fitted at the last evaluation, in priority order, still to be handed out,
        # with the bytes each needs.
        self.fitting: list[tuple[str, int]] = []
        self.fruitless_at = float("-inf")  # when an evaluation last let nothing through
        self._capacity = 0  # the disk's capacity for one job at the last evaluation

    def _usage(self) -> Any:
        root = Path(settings.MRT_WORK_DIR)
        root.mkdir(parents=True, exist_ok=True)
        return self.disk_usage(root)

    def room(self) -> int:
        """Bytes the working disk itself can take now: below the high-water mark, and no more
        than it has free."""
        return provision_room(self._usage(), settings.MRT_PROVISION_HIGH_WATER)

    def capacity(self) -> int:
        """The most the working disk could ever give one job: its high-water mark, empty."""
        return int(self._usage().total * settings.MRT_PROVISION_HIGH_WATER)

    def budget(self) -> int:
        """Bytes that may still be promised to new downloads: the disk's room less what the
        jobs already Downloading expect to write."""
        room = self.room()
        downloading = [jid for _p, jid in index_entries(self.zk, JobState.DOWNLOADING)]
        promised = sum(
            j.space_needed for j in jobs_load(self.zk, downloading) if isinstance(j, Job)
        )
        return room - promised

    def fits(self, job: Job, budget: int) -> bool:
        if job.space_needed == 0:
            return budget > 0
        return job.space_needed <= budget

    def claim(self) -> Job | None:
        if not self.fitting:
            if time.monotonic() - self.fruitless_at < IDLE_EVALUATION_GAP:
                return None
            self.fitting = self.evaluate()
            if not self.fitting:
                self.fruitless_at = time.monotonic()
        while self.fitting:
            jid, space = self.fitting[0]
            # A job that can never fit is handed out at once: its step fails it (``work``).
            if space <= self._capacity and not self.fits_now(space):
                log.info(
                    "provisioning: the working disk filled up since the last evaluation; "
                    "%d jobs wait again",
                    len(self.fitting),
                )
                self.fitting = []
                self.fruitless_at = time.monotonic()
                return None
            self.fitting.pop(0)
            claimed = self._lock(jid)
            if claimed is not None:
                self.waiting.discard(jid)
                return claimed
        return None

    def fits_now(self, space: int) -> bool:
        """Whether the disk as it is now still takes a job of ``space`` bytes (the evaluation's
        budget counted the jobs handed out since; this catches other writers)."""
        room = self.room()
        return room > 0 if space == 0 else space <= room

    def evaluate(self) -> list[tuple[str, int]]:
        """Every job in Provisioning that fits, in priority order, against one budget."""
        budget = self.budget()
        self._capacity = self.capacity()
        entries = [jid for _p, jid in index_entries(self.zk, self.state)]
        candidates = [j for j in jobs_load(self.zk, entries) if isinstance(j, Job)]
        fitting = []
        for job in candidates:
            if job.lock is not None:
                continue
            if job.space_needed > self._capacity:
                fitting.append((job.jid, job.space_needed))
                continue
            if not self.fits(job, budget):
                if job.jid not in self.waiting:
                    self.waiting.add(job.jid)
                    log.info(
                        "%s provisioning waiting: needs %d bytes, %d available below the mark",
                        job.jid,
                        job.space_needed,
                        max(budget, 0),
                    )
                continue
            budget -= job.space_needed
            fitting.append((job.jid, job.space_needed))
        self.waiting &= {j.jid for j in candidates}
        return fitting

    def _lock(self, jid: str) -> Job | None:
        lock = zpaths.job_node(jid, "lock")
        if not lock_create(self.zk, lock):
            return None
        try:
            job = job_load(self.zk, jid)
        except (NotFound, MalformedNode):
            lock_release(self.zk, lock)
            return None
        if job.state != self.state:
            lock_release(self.zk, lock)
            return None
        return job

    def work(self, item: Job) -> Step:
        capacity = self.capacity()
        if item.space_needed > capacity:
            # Waiting would be for ever, and silent: the operator needs to hear of it.
            raise StepFailed(
                f"needs {item.space_needed} bytes of working disk, more than it can ever give "
                f"one job ({capacity} bytes, MRT_PROVISION_HIGH_WATER of the disk); resume it "
                "once the working disk is larger"
            )
        return Next(JobState.DOWNLOADING)
