"""Job Pending: a collection hold parks the job as Held; a payload that cannot be right fails it
for good; anything else goes on to Estimating.

Checked here, cheaply and before any download: the job's configuration, and for an object
manifest its syntax and the depositor's digest of it. The digests of the payload files themselves
are checked while Downloading, where their bytes pass anyway; a mismatch there can be resumed
once the depositor has fixed the file at its URL.
"""

from __future__ import annotations

from typing import ClassVar

from queues.daemons.base import JobDaemon, Next, Step
from queues.daemons.workfolder import job_spec, object_files
from queues.states import JobState
from queues.zk.locks import collection_held
from queues.zk.records import Job


class JobPending(JobDaemon):
    name: ClassVar[str] = "pending"
    step: ClassVar[str] = "pending"
    state: ClassVar[str] = JobState.PENDING

    def work(self, item: Job) -> Step:
        if collection_held(self.zk, item.profile):
            return Next(JobState.HELD, f"collection {item.profile} is held")
        spec = job_spec(item)
        object_files(spec)
        return Next(JobState.ESTIMATING)
