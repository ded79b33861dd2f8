"""Job Estimating: HEAD every file at once and record the sum of their sizes in ``space_needed``.

It never fails: a file whose size cannot be told (no Content-Length, an unreachable server) counts
as MRT_UNKNOWN_SIZE_BYTES (a depositor's declared size stands in when given), and so does an object
whose manifest will not load: never 0, which Provisioning would let through whatever the disk
holds. A job larger than MRT_LARGE_JOB_BYTES is moved behind the ordinary ones (priority at
least 10).
"""

from __future__ import annotations

import logging
from typing import ClassVar

from django.conf import settings

from queues.core.states import JobState
from queues.daemons.base import JobDaemon, Next, Step
from queues.daemons.workfolder import job_spec, object_files, priority_for_size
from queues.services.depositors import depositor_policy, payload_roots
from queues.steps.fetch import head_all
from queues.zk.jobs import job_set_space_needed
from queues.zk.records import Job

log = logging.getLogger("queues.daemons")


def _known(told: int | None, declared: int | None, unknown: int) -> int:
    """The server's size, else the depositor's, else the stand-in for an unknown size."""
    for size in (told, declared):
        if size is not None:
            return size
    return unknown


class Estimating(JobDaemon):
    name: ClassVar[str] = "estimating"
    step: ClassVar[str] = "estimating"
    state: ClassVar[str] = JobState.ESTIMATING
    steps_elsewhere: ClassVar[bool] = True  # HEADs to depositors' servers

    def services_of(self, item: Job) -> tuple[str, ...]:
        return self.payload_service(item)

    def estimate(self, job: Job) -> int:
        unknown = settings.MRT_UNKNOWN_SIZE_BYTES
        try:
            files = object_files(job_spec(job))
        except Exception as exc:
            log.info("%s estimating: size unknown (%s)", job.jid, exc)
            return unknown
        sizes = head_all(
            [f.url for f in files],
            threads=settings.MRT_DOWNLOAD_THREADS,
            timeout=settings.MRT_HTTP_TIMEOUT,
            file_roots=payload_roots(),
            policy=depositor_policy(),
        )
        return sum(_known(sizes.get(f.url), f.size, unknown) for f in files)

    def work(self, item: Job) -> Step:
        space = self.estimate(item)
        job_set_space_needed(self.zk, item, space)
        return Next(JobState.PROVISIONING, priority=priority_for_size(item.priority, space))
