"""Job Notify: POST the profile's callback (when it has one), then Completed; the working
folder is deleted once the job is Completed, and a batch whose last job this was moves on to
Reporting.

The callback is Merritt ingest's: ``POST {CallbackURL}/mc/{jobID}`` with the job's state
(``job:jobState``, docs/merritt-services.md) in the job's ``notificationFormat``, else the
profile's ``NotificationFormat``, else JSON, through the depositor fetch policy. A receiver that
refuses the callback (4xx but 408 and 429) is logged and the job completes, the refusal in its
status message, as Merritt's ingest logs a 4xx and completes (docs/merritt-services.md,
"Callbacks"). A receiver away (5xx, 408, 429, unreachable) is waited for on ``MRT_RETRY_CALLBACK``;
unlike Merritt's ingest, which only logs that too, a spent retry policy or an address the fetch
policy refuses fails the job (resumable): the operator sees it, and a resume calls it again.

A callback is a side effect that no ZooKeeper lock fences once its holder's session is gone (a
batched loop posts a whole batch's callbacks before their one move). So the step records it
first, under the job's lock (``queues.zk.side_effects``), and marks the record delivered once
the receiver answered: a claimer that finds a delivered record moves the job on without posting
again. Only a callback whose answer was lost with the session (or whose mark could not be
written) is posted twice; the job ID lets the receiver see the repeat.
"""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar

from django.conf import settings

from queues.core.retries import is_unavailable_status, service_at
from queues.core.states import JobState
from queues.daemons import clients
from queues.daemons.base import JobDaemon, Next, Stay, Step, StepFailed
from queues.daemons.workfolder import remove_workdir
from queues.services.depositors import depositor_policy
from queues.steps.notify import (
    CallbackError,
    delivery_key,
    notification_format,
    post_job_callback,
)
from queues.steps.profiles import Profile, ProfileError, ProfileNotFound, load_profile
from queues.zk.errors import Conflict, StaleVersion
from queues.zk.records import Job
from queues.zk.side_effects import (
    callback_record_delivered,
    callback_record_path,
    callback_record_read,
    callback_record_start,
)

log = logging.getLogger("queues.daemons")

SERVICES_FOR = 1.0  # seconds a profile's callback service is kept (``Notify.services_of``)
SERVICES_KEPT = 1024  # profiles kept at most


def refused_for_good(status: int) -> bool:
    """A receiver's answer that refuses the callback (4xx), not one that says "not now" (408,
    429: waited for like a 5xx)."""
    return 400 <= status < 500 and not is_unavailable_status(status)


class Notify(JobDaemon):
    name: ClassVar[str] = "notify"
    step: ClassVar[str] = "notify"
    state: ClassVar[str] = JobState.NOTIFY
    steps_elsewhere: ClassVar[bool] = True  # the depositor's callback

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # profile name -> (when looked up, its services): ``services_of``'s, read by the loop's
        # thread and the step threads (each a whole entry, replaced, never changed).
        self._services: dict[str, tuple[float, tuple[str, ...]]] = {}

    def server_of(self, item: Job) -> str:
        return f"callback of {item.profile}"  # the collection's receiver

    slow_key = server_of  # one URL a receiver: its slowness is its server's

    def services_of(self, item: Job) -> tuple[str, ...]:
        """The collection's callback receiver, as its breaker names it. Asked twice a job (is
        it held? it answered): the answer is kept for SERVICES_FOR s by profile name, since
        looking a profile up stats up to three files. The step itself reads the profile anew."""
        name = item.profile
        now = time.monotonic()
        kept = self._services.get(name)
        if kept is not None and now - kept[0] < SERVICES_FOR:
            return kept[1]
        try:
            url = load_profile(name).callback_url
            services = (service_at("callback", url),) if url else ()
        except (ProfileNotFound, ProfileError):
            services = ()
        if len(self._services) >= SERVICES_KEPT:
            self._services.clear()
        self._services[name] = (now, services)
        return services

    def work(self, item: Job) -> Step:
        try:
            profile = load_profile(item.profile)
        except ProfileNotFound:
            profile = None
        except ProfileError as exc:
            raise StepFailed(str(exc)) from exc
        if profile is not None and profile.callback_url:
            return self.call_back_once(item, profile.callback_url, profile)
        return Next(JobState.COMPLETED)

    def call_back_once(self, item: Job, url: str, profile: Profile | None = None) -> Step:
        """Post the job's callback unless an earlier claim of the job delivered it."""
        found = callback_record_read(self.zk, item.jid)
        if found is not None and found.delivered:
            log.info(
                "%s notify: callback delivered at %s (claim of session %s); not posted again",
                item.jid,
                found.delivered,
                found.session or "?",
            )
            return self._completed(item)
        if found is not None:
            log.warning(
                "%s notify: the claim of session %s started the callback at %s; it is not "
                "recorded as delivered, so it is posted again",
                item.jid,
                found.session or "?",
                found.since or "?",
            )
        try:
            record = callback_record_start(self.zk, item, url, found=found)
        except (Conflict, StaleVersion) as exc:
            # The job's lock or status changed since the claim: it is not ours to call back.
            return Stay(f"callback not posted: {exc}")
        try:
            outcome = "COMPLETED"
            post_job_callback(
                url,
                item.jid,
                clients.callback_state(item, status=outcome),
                timeout=settings.MRT_HTTP_TIMEOUT,
                policy=depositor_policy(),
                key=delivery_key(item.jid, item.status.retry_count, outcome),
                fmt=notification_format(
                    (item.configuration or {}).get("notificationFormat"),
                    profile.notification_format if profile is not None else None,
                ),
            )
        except CallbackError as exc:
            if exc.status is not None and refused_for_good(exc.status):
                # The receiver answered and will not take it (its credentials in the URL
                # refused, no such path): Merritt's ingest logs that and completes the job.
                log.warning("%s notify: %s; the job completes", item.jid, exc)
                return self._completed(item, f"callback not taken by the receiver: {exc}")
            raise StepFailed(str(exc)) from exc
        callback_record_delivered(self.zk, item.jid, record)
        return self._completed(item)

    def _completed(self, item: Job, message: str = "") -> Next:
        """On to Completed, the job's callback record deleted in the move's own multi: no
        record is left behind by a move whose answer is lost or a consumer killed after it."""
        return Next(JobState.COMPLETED, message, drops=(callback_record_path(item.jid),))

    def after(self, item: Job, step: Next) -> None:
        if step.target == JobState.COMPLETED:
            remove_workdir(item)
        super().after(item, step)
