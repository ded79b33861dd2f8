"""Job Notify: POST the profile's callback (when it has one), then Completed; the working
folder is deleted once the job is Completed, and a batch whose last job this was moves on to
Reporting.

The callback is Merritt ingest's: ``POST {CallbackURL}/mc/{jobID}`` with the job's state as
JSON (``job:jobState``, docs/merritt-services.md), through the depositor fetch policy. It may be
called twice for one job (steps are at-least-once); the job ID lets the receiver see a repeat.
Unlike Merritt's ingest, which only logs a failed callback, a callback that cannot be delivered
fails the job (resumable): the operator sees it, and a resume calls it again.
"""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings

from queues.daemons import clients
from queues.daemons.base import JobDaemon, Next, Step, StepFailed
from queues.daemons.workfolder import remove_workdir
from queues.depositors import depositor_policy
from queues.states import JobState
from queues.steps.notify import CallbackError, post_job_callback
from queues.steps.profiles import ProfileError, ProfileNotFound, load_profile
from queues.zk.records import Job


class Notify(JobDaemon):
    name: ClassVar[str] = "notify"
    step: ClassVar[str] = "notify"
    state: ClassVar[str] = JobState.NOTIFY

    def work(self, item: Job) -> Step:
        try:
            profile = load_profile(item.profile)
        except ProfileNotFound:
            profile = None
        except ProfileError as exc:
            raise StepFailed(str(exc)) from exc
        if profile is not None and profile.callback_url:
            try:
                post_job_callback(
                    profile.callback_url,
                    item.jid,
                    clients.callback_state(item),
                    timeout=settings.MRT_HTTP_TIMEOUT,
                    policy=depositor_policy(),
                )
            except CallbackError as exc:
                raise StepFailed(str(exc)) from exc
        return Next(JobState.COMPLETED)

    def after(self, item: Job, step: Next) -> None:
        if step.target == JobState.COMPLETED:
            remove_workdir(item)
        super().after(item, step)
