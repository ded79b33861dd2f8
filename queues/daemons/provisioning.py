"""Job Provisioning: let a job go on to Downloading only when its files fit on working storage.

A job fits when the working storage, with the job's ``space_needed`` and what the jobs already
Downloading still expect to write, stays at or below the high-water mark
(MRT_PROVISION_HIGH_WATER, a fraction of the disk; 0.70 by default) and within what the disk
really has free (``shutil.disk_usage``: other writers, a quota or reserved blocks may leave less
than the mark says). An unestimated job (0 bytes) goes on only while the disk is under the mark.

The step runs in the batched loop (``runner.BATCHED_STEPS``): many jobs a claim, one move for
all of them. What it may let through is decided by one budget, the bytes that may still be
promised to downloads:

- An evaluation reads every job listed in Provisioning (the index, without locking) in run
  order against a fresh budget (the disk's room less what the jobs Downloading expect): each
  job that fits has its bytes set aside, each that does not waits. So N waiting jobs cost one
  read of each per evaluation, not per claim.
- A job that arrives after an evaluation is decided under its lock (``accept``), from the read
  the claim made anyway, against what is left of the budget.
- The jobs that wait are passed over by the listing (``screen``) until the next evaluation.
  That comes no sooner than IDLE_EVALUATION_GAP seconds after the last, and only once the
  budget has room for the least need among them: with the disk full, every arrival wakes the
  loop, and re-reading all N waiting jobs per arrival would cost N squared reads while a big
  batch piles up, and re-reading them while none of them could go on is polling.
- The disk is asked again under each job's lock: when something else has filled it since the
  evaluation, the jobs set aside wait for the next one.
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
from queues.zk.jobs import index_entries, jobs_load
from queues.zk.records import Job

from .waiting import chained
from .workfolder import work_root

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
        # What the last evaluation decided, until the next (see the module's docstring): the
        # jobs that fitted, their bytes set aside and not taken yet; the jobs that wait.
        self.fitting: dict[str, int] = {}
        self.unfit: set[str] = set()
        self.budget_left: int | None = None  # None: no evaluation yet
        self.evaluated_at = float("-inf")
        self._least_need: int | None = None  # the least need of the jobs that wait
        self._needs: dict[str, int] = {}  # the jobs Downloading: what each expects to write
        self._capacity = 0  # the disk's capacity for one job at the last evaluation
        self._last_usage: Any = None  # the disk's last answer (``_usage``)

    def _usage(self) -> Any:
        root = work_root()
        try:
            usage = self.disk_usage(root)
        except FileNotFoundError:  # not made yet (once: asked for every job claimed)
            root.mkdir(parents=True, exist_ok=True)
            usage = self.disk_usage(root)
        self._last_usage = usage
        return usage

    def room(self) -> int:
        """Bytes the working disk itself can take now: below the high-water mark, and no more
        than it has free."""
        return provision_room(self._usage(), settings.MRT_PROVISION_HIGH_WATER)

    def capacity(self, usage: Any = None) -> int:
        """The most the working disk could ever give one job: its high-water mark, empty (of
        ``usage``, the disk's answer, when given; else asked now)."""
        return int((usage or self._usage()).total * settings.MRT_PROVISION_HIGH_WATER)

    def _promised(self) -> int:
        """What the jobs Downloading still expect to write. Their needs are read once each
        while they stay there: only the jobs new to the listing are read."""
        downloading = [jid for _p, jid in index_entries(self.zk, JobState.DOWNLOADING)]
        needs = self._needs
        unknown = [jid for jid in downloading if jid not in needs]
        for job in jobs_load(self.zk, unknown):
            if isinstance(job, Job):
                needs[job.jid] = job.space_needed
        self._needs = {jid: needs[jid] for jid in downloading if jid in needs}
        return sum(self._needs.values())

    def budget(self) -> int:
        """Bytes that may still be promised to new downloads: the disk's room less what the
        jobs already Downloading expect to write."""
        return self.room() - self._promised()

    @staticmethod
    def fits_in(space: int, budget: int) -> bool:
        """Whether a job of ``space`` bytes fits ``budget`` (one of 0 bytes while any is left)."""
        return budget > 0 if space == 0 else space <= budget

    def fits(self, job: Job, budget: int) -> bool:
        return self.fits_in(job.space_needed, budget)

    def fits_now(self, space: int) -> bool:
        """Whether the disk as it is now still takes a job of ``space`` bytes (the evaluation's
        budget counted the jobs handed out since; this catches other writers)."""
        return self.fits_in(space, self.room())

    def evaluate(self, jids: list[str]) -> None:
        """Every job of ``jids`` (in run order) against one fresh budget."""
        budget = self.budget()
        self._capacity = self.capacity()
        self.fitting = {}
        self.unfit = set()
        self._least_need = None
        candidates = [j for j in jobs_load(self.zk, jids) if isinstance(j, Job)]
        for job in candidates:
            if job.lock is not None:
                continue  # another's now: decided under the lock if it comes back
            if job.space_needed > self._capacity:
                self.fitting[job.jid] = job.space_needed  # its step fails it (``work``)
            elif self.fits(job, budget):
                budget -= job.space_needed
                self.fitting[job.jid] = job.space_needed
            else:
                self._wait(job, budget)
        self.waiting &= {j.jid for j in candidates}
        self.budget_left = budget
        self.evaluated_at = time.monotonic()

    def _wait(self, job: Job, budget: int) -> None:
        self._unfit(job.jid, job.space_needed)
        if job.jid not in self.waiting:
            self.waiting.add(job.jid)
            log.info(
                "%s provisioning waiting: needs %d bytes, %d available below the mark",
                job.jid,
                job.space_needed,
                max(budget, 0),
            )

    def _unfit(self, jid: str, space: int) -> None:
        self.unfit.add(jid)
        if self._least_need is None or space < self._least_need:
            self._least_need = space

    def _evaluation_due(self) -> bool:
        """Whether the jobs that wait are to be evaluated again: the gap has passed and the
        budget now has room for the least of their needs (asking costs the disk's room, one
        listing of Downloading and a read of the jobs new there, not a read of every job that
        waits: while nothing could go on, nothing is read again)."""
        if time.monotonic() - self.evaluated_at < IDLE_EVALUATION_GAP:
            return False
        return self._least_need is None or self.fits_in(self._least_need, self.budget())

    def screen(self, names: list[str]) -> list[str]:
        """The listing less the jobs waiting for room (the listing's ``screen``); evaluates the
        listed jobs first when none was made yet or one is due. While no job waits, the
        listing passes as it is (it is called with the whole folder at every listing)."""
        if self.budget_left is None or (self.unfit and self._evaluation_due()):
            in_order = (zpaths.entry_jid(name) for name in sorted(names))  # run order
            self.evaluate([jid for jid in in_order if jid is not None])
        if not self.unfit:
            return names
        unfit = self.unfit
        return [name for name in names if name[3:] not in unfit]

    def listing_screen(self) -> Callable[[list[str]], list[str]] | None:
        return self.screen

    def unclaimed_screen(self) -> Callable[[list[str]], list[str]] | None:
        return chained(self.screen, super().unclaimed_screen())

    def accept(self, job: Job) -> bool:
        """Whether ``job`` (under its lock) may go on now: set aside for at the evaluation, or
        arrived since and fitting what is left of the budget; and the disk still takes it."""
        if self.budget_left is None:
            self.evaluate([])  # the budget alone: this job is decided below
        assert self.budget_left is not None
        jid, space = job.jid, job.space_needed
        if space > self._capacity:
            return True  # a job that can never fit goes on at once: its step fails it
        if jid in self.unfit:
            return False
        reserved = self.fitting.pop(jid, None)
        if reserved != space:  # not evaluated yet, or its need changed since: decided now
            self.budget_left += reserved or 0
            if not self.fits(job, self.budget_left):
                self._wait(job, self.budget_left)
                return False
            self.budget_left -= space
        if not self.fits_now(space):
            # Something else filled the disk since the evaluation: nothing set aside goes on
            # before the next one, which the changed room makes due.
            log.info(
                "provisioning: the working disk filled up since the last evaluation; "
                "%d jobs wait again",
                len(self.fitting) + 1,
            )
            for waits, need in [*self.fitting.items(), (jid, space)]:
                self._unfit(waits, need)
            self.fitting = {}
            self.budget_left = min(self.budget_left, self.room())
            self.evaluated_at = time.monotonic()
            return False
        self.waiting.discard(jid)
        return True

    def work(self, item: Job) -> Step:
        # The disk's size as ``accept`` found it for this job a moment ago, under the same
        # lock: a disk is not asked twice a job (thousands a second) for a size that changes
        # only when it is grown.
        capacity = self.capacity(self._last_usage)
        if item.space_needed > capacity:
            # Waiting would be for ever, and silent: the operator needs to hear of it.
            raise StepFailed(
                f"needs {item.space_needed} bytes of working disk, more than it can ever give "
                f"one job ({capacity} bytes, MRT_PROVISION_HIGH_WATER of the disk); resume it "
                "once the working disk is larger"
            )
        return Next(JobState.DOWNLOADING)
