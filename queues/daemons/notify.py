"""Job Notify: POST the profile's callback (when it has one), then Completed; the working
folder is deleted once the job is Completed, and a batch whose last job this was moves on to
Reporting.

The callback may be called twice for one job (steps are at-least-once); its JSON carries the
job ID for the receiver to recognise a repeat.
"""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings

from queues.daemons.base import JobDaemon, Next, Step, StepFailed
from queues.daemons.jobwork import remove_workdir
from queues.steps.notify import CallbackError, post_callback
from queues.steps.profiles import ProfileError, ProfileNotFound, load_profile
from queues.zk.records import Job


class Notify(JobDaemon):
    name: ClassVar[str] = "notify"
    step: ClassVar[str] = "notify"
    state: ClassVar[str] = "Notify"

    def work(self, item: Job) -> Step:
        try:
            profile = load_profile(item.profile)
        except ProfileNotFound:
            profile = None
        except ProfileError as exc:
            raise StepFailed(str(exc)) from exc
        if profile is not None and profile.callback_url:
            inventory = item.inventory or {}
            payload = {
                "job_id": item.jid,
                "batch_id": item.bid,
                "batch_uuid": item.configuration.get("batch_uuid", ""),
                "status": "Completed",
                "profile": item.profile,
                "submitter": item.submitter,
                "ark": item.primary_id,
                "local_id": item.local_ids,
                "version": inventory.get("version"),
                "manifest_url": inventory.get("manifest_url"),
            }
            try:
                post_callback(profile.callback_url, payload, timeout=settings.MRT_HTTP_TIMEOUT)
            except CallbackError as exc:
                raise StepFailed(str(exc)) from exc
        return Next("Completed")

    def after(self, item: Job, step: Next) -> None:
        if step.target == "Completed":
            remove_workdir(item)
        super().after(item, step)
