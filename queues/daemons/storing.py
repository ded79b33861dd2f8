"""Job Storing: hand the storage manifest to storage, which adds a version of the object.

It reads the ``store`` node as Merritt's storage service does (that service claims Storing
jobs itself when this console runs beside Merritt): ``manifest_url``, ``mode`` split on ``/``
into the action, the integer storage node and the URL-encoded ARK, and ``delete`` (a string).

The per-object lock ``/locks/storage/<ark'>`` (ephemeral) keeps two jobs of the same object from
storing at once; a job whose object is locked waits in Storing. A storage add is a side effect
that no ZooKeeper lock fences once its holder's session is gone, so before sending one the step
records it (``queues.zk.store_intents``, in one transaction checked under the job's lock); a
claimer that finds the record asks storage what the object holds and does not add a version whose
content is already the latest (Merritt's storage makes a new version for every add). The
version's manifest URL and number go into the job's ``inventory`` node for Recording (its
``mode`` is left as Processing wrote it); the record goes in the move to Recording (its
multi deletes it, ``Next.drops``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from queues.core.outside_text import url_without_credentials
from queues.core.states import JobState
from queues.core.words import digits
from queues.daemons import clients
from queues.daemons.base import JobDaemon, Next, Stay, Step, StepFailed
from queues.daemons.breakers import STORAGE_NODE
from queues.daemons.waiting import chained
from queues.daemons.workfolder import rewrite_object_profile_manifest
from queues.steps.merritt import parse_store_mode
from queues.steps.merritt_wire import is_ark_answer
from queues.steps.profiles import ProfileError, load_profile
from queues.steps.storage import StorageBusy, StorageClient, StorageError, StoredVersion
from queues.zk import paths as zpaths
from queues.zk.errors import Conflict, StaleVersion
from queues.zk.jobs import job_set_json
from queues.zk.locks import lock_create, lock_release
from queues.zk.maintenance import job_store_node, node_held
from queues.zk.nodes import exists_many
from queues.zk.records import Job
from queues.zk.store_intents import (
    StoreIntent,
    store_intent_path,
    store_intent_read,
    store_intent_record,
)
from queues.zk.waits import NodeScreen, node_holds_watch

log = logging.getLogger("queues.daemons")


class ObjectLockDaemon(JobDaemon):
    """A step that works on an object under its per-object lock.

    The jobs bound for a held storage node (an operator's hold, or an open breaker's) wait
    unclaimed: the listing passes them over (``NodeScreen``: their nodes read once, the holds
    watched), and a release wakes the idle loop at once."""

    _screen: NodeScreen | None = None

    def object_lock(self, ark: str) -> str:
        raise NotImplementedError

    def object_busy(self, ark: str) -> list[str]:
        """The nodes whose presence keeps a job of ``ark`` waiting, unclaimed: the step's own
        per-object lock."""
        return [self.object_lock(ark)]

    @staticmethod
    def job_ark(item: Job, missing: str) -> str:
        """The job's ARK (``identifiers.primary_id``); StepFailed with ``missing`` when it has
        none, and saying so when what it has is no ARK (another client wrote it)."""
        ark = item.primary_id
        if not ark:
            raise StepFailed(missing)
        if not is_ark_answer(ark):
            raise StepFailed(f"the job's primary_id {ark[:80]!r} is no ARK")
        return ark

    def unclaimed_screen(self) -> Callable[[list[str]], list[str]] | None:
        return chained(self.listing_screen(), super().unclaimed_screen())

    def listing_screen(self) -> Callable[[list[str]], list[str]] | None:
        if self._screen is None:
            self._screen = NodeScreen(self.zk)
        return self._screen

    def wake_on(self, event: threading.Event) -> None:
        super().wake_on(event)
        node_holds_watch(self.zk).subscribe(event)

    def accept(self, job: Job) -> bool:
        # A job bound for a held storage node waits, unclaimed, until the node is released.
        node = job_store_node(job)
        if node is not None and node_held(self.zk, node):
            return False
        # A job whose object another job is storing waits without being claimed, so it does not
        # hide the jobs behind it in the queue.
        if not is_ark_answer(job.primary_id):
            return True  # none, or no ARK: the step says so
        held = exists_many(self.zk, self.object_busy(job.primary_id))
        return all(stat is None for stat in held.values())


class Storing(ObjectLockDaemon):
    name: ClassVar[str] = "storing"
    step: ClassVar[str] = "storing"
    state: ClassVar[str] = JobState.STORING

    def services_of(self, item: Job) -> tuple[str, ...]:
        node = job_store_node(item)
        return (f"{STORAGE_NODE}{node}",) if node is not None else ()

    def object_lock(self, ark: str) -> str:
        return zpaths.storage_lock(ark)

    def work(self, item: Job) -> Step:
        store = item.store or {}
        manifest_url = store.get("manifest_url")
        missing = "no ARK or storage manifest yet; resume from Processing"
        primary_id = self.job_ark(item, missing)
        if not isinstance(manifest_url, str) or not manifest_url:
            raise StepFailed(missing)
        try:
            mode = parse_store_mode(store.get("mode"))
        except ValueError as exc:
            raise StepFailed(f"{exc}; resume from Processing") from exc
        ark = mode.ark
        if ark != primary_id:
            raise StepFailed(f"the store node names {ark}, the job {primary_id}")
        delete = store.get("delete", "")
        if not isinstance(delete, str):
            raise StepFailed("the store node's delete is not a string; resume from Processing")
        if mode.action == "update":
            # An update adds only the files sent and deletes those listed: Merritt's storage
            # service does that; the clients here store whole versions.
            raise StepFailed("an update version needs Merritt's storage service (MRT_OWN_STEPS)")
        if rewrite_object_profile_manifest(item, manifest_url, clients.work_url):
            log.info(
                "%s storing: its storage manifest, written with the object-manifest profile "
                "(a console before 2026-12-06), written again as an add manifest",
                item.jid,
            )
        try:
            profile = load_profile(item.profile)
        except ProfileError:
            profile = None
        lock = self.object_lock(ark)
        if not lock_create(self.zk, lock):
            return Stay(f"{ark} is being stored by another job")
        try:
            stored = self.store_once(
                item,
                clients.storage(profile, node=mode.node),
                ark=ark,
                node=str(mode.node),
                url=manifest_url,
            )
        except StorageBusy as exc:
            return Stay(str(exc))
        except StorageError as exc:
            raise StepFailed(str(exc)) from exc
        except (Conflict, StaleVersion) as exc:
            # The job's lock or status changed before the add was recorded: it is not ours.
            return Stay(f"not stored: {exc}")
        finally:
            lock_release(self.zk, lock)
        inventory: dict[str, Any] = dict(item.inventory or {})
        inventory.setdefault("mode", "")
        # For inventory, Merritt's or ours: without storage's credentials (read by every client
        # of ZooKeeper; ours adds them again when it fetches it).
        handed = url_without_credentials(stored.manifest_url)
        inventory.update(manifest_url=handed, ark=stored.ark, version=stored.version)
        try:
            job_set_json(self.zk, item, "inventory", inventory)
        except (Conflict, StaleVersion) as exc:
            # The session (and the job's lock) went during the add: the add is recorded, and
            # whoever claims the job next finds its version instead of adding one.
            return Stay(f"stored {ark} version {stored.version}, but not recorded: {exc}")
        return Next(
            JobState.RECORDING,
            f"stored {ark} version {stored.version}",
            drops=(store_intent_path(item.jid),),
        )

    def store_once(
        self, item: Job, storage: StorageClient, *, ark: str, node: str, url: str
    ) -> StoredVersion:
        """Add the manifest's version unless an add recorded by an earlier claim of this job
        already made it: then that version, as storage reports it."""
        manifest = storage.read_manifest(url)
        intent = store_intent_read(self.zk, item.jid)
        if intent is not None:
            found = storage.stored_as(ark=ark, manifest=manifest)
            if found is None:
                found = self._landed(storage, intent, ark)
            if found is not None:
                log.info(
                    "%s storing: version %d of %s was added by the claim of session %s at %s; "
                    "not added again",
                    item.jid,
                    found.version,
                    ark,
                    intent.session or "?",
                    intent.since or "?",
                )
                return found
        before = storage.latest_version(ark)
        store_intent_record(
            self.zk,
            item,
            manifest_url=url,
            manifest_sha256=manifest.sha256,
            node=node,
            ark=ark,
            replace=intent is not None,
            versions_before=before,
        )
        return storage.store(ark=ark, manifest_url=url)

    @staticmethod
    def _landed(storage: StorageClient, intent: StoreIntent, ark: str) -> StoredVersion | None:
        """The version an earlier claim's add made, when storage holds more versions than it
        did just before that add (under the object's lock, the next one is that add's). Its
        content may differ from the working folder's now: a step of a claim lost meanwhile
        (paused past its session) may have written the folder again after the add was sent."""
        before = digits(intent.versions_before)
        if before is None or intent.ark != ark:
            return None
        if storage.latest_version(ark) <= before:
            return None
        return storage.existing(ark, before + 1)
