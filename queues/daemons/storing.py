"""Job Storing: hand the storage manifest to storage, which adds a version of the object.

The per-object lock ``/locks/storage/<ark'>`` (ephemeral) keeps two jobs of the same object from
storing at once; a job whose object is locked waits in Storing. LocalStorage returns the latest
version instead of adding one when the content is the same, so a re-run stores nothing twice.
The version's manifest URL and number go into the job's ``inventory`` node for Recording.
"""

from __future__ import annotations

from typing import Any, ClassVar

from queues.daemons import clients
from queues.daemons.base import JobDaemon, Next, Stay, Step, StepFailed
from queues.steps.profiles import ProfileError, load_profile
from queues.steps.storage import StorageError
from queues.zk import paths as zpaths
from queues.zk.jobs import job_set_json
from queues.zk.locks import lock_create, lock_release
from queues.zk.nodes import exists_many
from queues.zk.records import Job


class ObjectLockDaemon(JobDaemon):
    """A step that works on an object under its per-object lock."""

    def object_lock(self, ark: str) -> str:
        raise NotImplementedError

    def accept(self, job: Job) -> bool:
        # A job whose object another job is storing waits without being claimed, so it does not
        # hide the jobs behind it in the queue.
        if not job.primary_id:
            return True
        path = self.object_lock(job.primary_id)
        return exists_many(self.zk, [path])[path] is None


class Storing(ObjectLockDaemon):
    name: ClassVar[str] = "storing"
    step: ClassVar[str] = "storing"
    state: ClassVar[str] = "Storing"

    def object_lock(self, ark: str) -> str:
        return zpaths.storage_lock(ark)

    def work(self, item: Job) -> Step:
        ark = item.primary_id
        manifest_url = (item.store or {}).get("manifest_url")
        if not ark or not isinstance(manifest_url, str) or not manifest_url:
            raise StepFailed("no ARK or storage manifest yet; resume from Processing")
        try:
            profile = load_profile(item.profile)
        except ProfileError:
            profile = None
        lock = self.object_lock(ark)
        if not lock_create(self.zk, lock):
            return Stay(f"{ark} is being stored by another job")
        try:
            stored = clients.storage(profile).store(ark=ark, manifest_url=manifest_url)
        except StorageError as exc:
            raise StepFailed(str(exc)) from exc
        finally:
            lock_release(self.zk, lock)
        inventory: dict[str, Any] = dict(item.inventory or {})
        inventory.update(
            manifest_url=stored.manifest_url, mode="add", ark=stored.ark, version=stored.version
        )
        job_set_json(self.zk, item, "inventory", inventory)
        return Next("Recording", f"stored {ark} version {stored.version}")
