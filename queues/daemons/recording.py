"""Job Recording: record the stored version in inventory (Merritt's service or local tables).

It reads the ``inventory`` node as Merritt's inventory service does (``manifest_url``); the
version number, which only this console's Storing adds, is needed by the local inventory
alone: Merritt's inventory service reads it from the manifest.

Recording the same version twice changes nothing (both inventories key it by ARK and number),
so a re-run is harmless. The console's own per-object lock ``/mrt-console/locks/recording/<ark'>``
keeps two of our jobs of one object from recording at once. ``/locks/inventory/<ark'>`` is
Merritt's inventory's: a job waits, unclaimed, while it exists, but Recording never holds it,
since an inventory whose add tries that lock answers 200 without recording anything while it is
held (docs/merritt-services.md, "The object lock").
"""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings

from queues.core.states import JobState
from queues.core.words import LONG_MAX
from queues.daemons import clients
from queues.daemons.base import Next, Stay, Step, StepFailed
from queues.daemons.processing import job_erc
from queues.daemons.storing import ObjectLockDaemon
from queues.daemons.workfolder import job_spec
from queues.steps.inventory import InventoryError
from queues.zk import paths as zpaths
from queues.zk.locks import lock_create, lock_release
from queues.zk.records import Job


class Recording(ObjectLockDaemon):
    name: ClassVar[str] = "recording"
    step: ClassVar[str] = "recording"
    state: ClassVar[str] = JobState.RECORDING

    def object_lock(self, ark: str) -> str:
        return zpaths.recording_lock(ark)

    def object_busy(self, ark: str) -> list[str]:
        # Merritt's inventory recording the object (its queue consumer holds this node across
        # its own add): wait for it, without taking it.
        return [self.object_lock(ark), zpaths.inventory_lock(ark)]

    def services_of(self, item: Job) -> tuple[str, ...]:
        return ("inventory",) if settings.MRT_INVENTORY_URL else ()

    def work(self, item: Job) -> Step:
        inventory = item.inventory or {}
        manifest_url = inventory.get("manifest_url")
        version = inventory.get("version")
        missing = "no stored version to record yet; resume from Storing"
        ark = self.job_ark(item, missing)
        if not isinstance(version, int) and settings.MRT_INVENTORY_URL:
            version = 0  # unknown here; Merritt's inventory reads it from the manifest
        if not isinstance(manifest_url, str) or not isinstance(version, int):
            raise StepFailed(missing)
        if isinstance(version, bool) or not 0 <= version <= LONG_MAX:
            raise StepFailed(f"the stored version {str(version)[:40]} is out of range")
        spec = job_spec(item)
        lock = self.object_lock(ark)
        if not lock_create(self.zk, lock):
            return Stay(f"{ark} is being recorded by another job")
        try:
            clients.inventory().record(
                ark=ark,
                version=version,
                manifest_url=manifest_url,
                local_id=(item.local_ids or [spec.local_id or ""])[0] or None,
                erc=job_erc(item, spec),
            )
        except InventoryError as exc:
            raise StepFailed(str(exc)) from exc
        finally:
            lock_release(self.zk, lock)
        return Next(JobState.NOTIFY, f"recorded {ark}" + (f" version {version}" if version else ""))
