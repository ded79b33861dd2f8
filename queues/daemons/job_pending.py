"""Job Pending: a collection hold parks the job as Held; a payload that cannot be right fails it
for good; a collection at its cap of jobs in flight keeps the job waiting in Pending; anything
else goes on to Estimating.

Checked here, cheaply and before any download: the job's configuration, and for an object
manifest its syntax and the depositor's digest of it. The digests of the payload files themselves
are checked while Downloading, where their bytes pass anyway; a mismatch there can be resumed
once the depositor has fixed the file at its URL.

Caps (``queues/zk/caps.py``): the job is counted in flight for its collection just before its
move to Estimating, exactly across every consumer on every host; a job whose collection is at
its cap is given back untouched and then passed over, unclaimed, until the collection has room,
so the jobs of other collections behind it go on. The batched loop runs the step in threads of
its own (the manifest's host may be slow); the gate's bookkeeping is shared with the loop's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from queues.core.states import JobState
from queues.daemons.base import JobDaemon, Next, Stay, Step
from queues.daemons.workfolder import job_spec, object_files
from queues.zk.caps import CapGate
from queues.zk.jobs import JobClaimer
from queues.zk.locks import collection_held
from queues.zk.records import Job


class JobPending(JobDaemon):
    name: ClassVar[str] = "pending"
    step: ClassVar[str] = "pending"
    state: ClassVar[str] = JobState.PENDING
    steps_elsewhere: ClassVar[bool] = True  # an object manifest from the depositor's server

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.caps = CapGate(self.zk)
        self._claimer = JobClaimer(
            self.zk, self.state, strict=self.strict, skip=self.unclaimed_skip()
        )

    def unclaimed_skip(self) -> Callable[[str], bool]:
        return self.waits_unclaimed  # the caps' gate asks of every name

    def waits_unclaimed(self, jid: str) -> bool:
        return self.caps.waits(jid) or super().waits_unclaimed(jid)

    def accept(self, job: Job) -> bool:
        return self.caps.admit(job.profile, job.jid)

    def work(self, item: Job) -> Step:
        if collection_held(self.zk, item.profile):
            return Next(JobState.HELD, f"collection {item.profile} is held")
        spec = job_spec(item)
        object_files(spec)
        if not self.caps.enter(item.profile, item.jid):
            return Stay(f"collection {item.profile} has its cap of jobs in flight")
        return Next(JobState.ESTIMATING)
