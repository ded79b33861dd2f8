"""Job Estimating: HEAD every file at once and record the sum of their sizes in ``space_needed``.

It never fails: a size that cannot be told (no Content-Length, an unreachable server, a manifest
that will not load) counts as 0, and Provisioning treats an unestimated job cautiously. A job
larger than MRT_LARGE_JOB_BYTES is moved behind the ordinary ones (priority at least 10).
"""

from __future__ import annotations

import logging
from typing import ClassVar

from django.conf import settings

from queues.daemons import clients
from queues.daemons.base import JobDaemon, Next, Step
from queues.daemons.jobwork import job_spec, object_files, priority_for_size
from queues.steps.fetch import head_all
from queues.zk.jobs import job_set_space_needed
from queues.zk.records import Job

log = logging.getLogger("queues.daemons")


class Estimating(JobDaemon):
    name: ClassVar[str] = "estimating"
    step: ClassVar[str] = "estimating"
    state: ClassVar[str] = "Estimating"

    def estimate(self, job: Job) -> int:
        try:
            files = object_files(job_spec(job))
        except Exception as exc:
            log.info("%s estimating: size unknown (%s)", job.jid, exc)
            return 0
        sizes = head_all(
            [f.url for f in files],
            threads=settings.MRT_DOWNLOAD_THREADS,
            timeout=settings.MRT_HTTP_TIMEOUT,
            file_roots=clients.payload_roots(),
        )
        # A size the depositor declared stands in for one the server would not tell.
        return sum(sizes.get(f.url) or f.size or 0 for f in files)

    def work(self, item: Job) -> Step:
        space = self.estimate(item)
        job_set_space_needed(self.zk, item, space)
        return Next("Provisioning", priority=priority_for_size(item.priority, space))
