"""Job Processing: settle the object's ARK, write its ERC and Dublin Core, build its storage
manifest.

The ARK, in order: one already in ``identifiers`` (given by the depositor, or minted by an
earlier run of this step), else the one inventory has for the local id (a new version of that
object), else a new one minted on the profile's shoulder and written to ``identifiers`` at once,
so a re-run never mints twice. A given ARK that differs from the one the local id already has
fails the job.

The storage manifest lists every file of ``object/`` with its sha256 and size; its URL goes into
the job's ``store`` node for Storing.
"""

from __future__ import annotations

from typing import Any, ClassVar

from queues.daemons import clients
from queues.daemons.base import JobDaemon, Next, Step, StepFailed
from queues.daemons.jobwork import STORAGE_MANIFEST, job_spec, object_dir, work_relative, workdir
from queues.steps.erc import (
    PRODUCER_DIR,
    Erc,
    http_url_for,
    write_dublin_core,
    write_erc,
    write_storage_manifest,
)
from queues.steps.minting import MintError
from queues.steps.profiles import ProfileError, load_profile
from queues.steps.submission import ObjectSpec
from queues.zk.jobs import job_set_json
from queues.zk.records import Job


def job_erc(job: Job, spec: ObjectSpec) -> Erc:
    meta = job.metadata or {}

    def pick(key: str, fallback: str | None) -> str | None:
        value = meta.get(key)
        return value if isinstance(value, str) and value.strip() else fallback

    return Erc(
        who=pick("erc_who", spec.creator),
        what=pick("erc_what", spec.title),
        when=pick("erc_when", spec.date),
    )


class Processing(JobDaemon):
    name: ClassVar[str] = "processing"
    step: ClassVar[str] = "processing"
    state: ClassVar[str] = "Processing"

    def settle_ark(self, job: Job, spec: ObjectSpec, local_id: str | None) -> str:
        ark = job.primary_id or (spec.primary_id or "")
        known = clients.ark_for_local_id(local_id) if local_id else None
        if ark and known and ark != known:
            raise StepFailed(f"ARK {ark} conflicts with {known}, which local id {local_id} has")
        if ark and ark == job.primary_id:
            return ark
        if not ark and known:
            ark = known
        if not ark:
            try:
                profile = load_profile(job.profile)
            except ProfileError as exc:
                raise StepFailed(f"cannot mint an ARK: {exc}") from exc
            try:
                ark = clients.minter(self.zk).mint(profile.ark_shoulder)
            except MintError as exc:
                raise StepFailed(str(exc)) from exc
        identifiers: dict[str, Any] = dict(job.identifiers or {})
        identifiers["primary_id"] = ark
        identifiers["local_id"] = job.local_ids or ([local_id] if local_id else [])
        job_set_json(self.zk, job, "identifiers", identifiers)
        return ark

    def work(self, item: Job) -> Step:
        spec = job_spec(item)
        folder = workdir(item)
        target = object_dir(item)
        producer = target / PRODUCER_DIR
        if not producer.is_dir() or not any(p.is_file() for p in producer.rglob("*")):
            raise StepFailed(f"no downloaded files in {producer}; resume from Downloading")
        local_id = (item.local_ids or [spec.local_id or ""])[0] or None
        erc = job_erc(item, spec)
        ark = self.settle_ark(item, spec, local_id)
        write_erc(target, erc=erc, ark=ark, local_id=local_id)
        write_dublin_core(target, erc=erc, ark=ark, local_id=local_id)
        served = clients.work_url(work_relative(target))
        manifest = write_storage_manifest(
            target,
            folder / STORAGE_MANIFEST,
            url_for=http_url_for(served) if served else None,
        )
        manifest_served = clients.work_url(work_relative(manifest))
        store: dict[str, Any] = dict(item.store or {})
        store.update(
            manifest_url=manifest_served or manifest.resolve().as_uri(), mode="add", delete=False
        )
        job_set_json(self.zk, item, "store", store)
        return Next("Storing")
