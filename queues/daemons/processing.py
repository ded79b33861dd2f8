"""Job Processing: settle the object's ARK, write the version's system files, build its storage
manifest, and write the ``store`` and ``inventory`` nodes as Merritt's ingest does.

The ARK, in order: one already in ``identifiers`` (given by the depositor, or minted by an
earlier run of this step), else the one inventory has for the local id (a new version of that
object), else a new one minted on the profile's shoulder and written to ``identifiers`` at once,
so a re-run never mints twice. A given ARK that differs from the one the local id already has
fails the job.

The system files are those Merritt's ingest writes (``docs/merritt-ingest-formats.md``):
``mrt-erc.txt``, ``mrt-dc.xml``, ``mrt-ingest.txt``, ``mrt-mom.txt``, ``mrt-owner.txt`` and
``mrt-membership.txt`` (when the profile names an owner and collections), the depositor's
manifest as ``mrt-submission-manifest.txt`` for an object manifest, and on an update the
depositor's ``mrt-delete.txt``.

The storage manifest lists every file of ``object/`` with its sha256 and size. Processing ends
by writing, in one transaction, ``store`` = ``{"manifest_url", "mode": "add/<node>/<url-encoded
ark>", "delete": ""}`` and ``inventory`` = ``{"manifest_url": "<storage>/manifest/<node>/<url-
encoded ark>", "mode": ""}``: what Merritt's storage service (which claims Storing jobs) and
inventory service (Recording) read, and what this console's own Storing and Recording read.
"""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from django.conf import settings

from queues.core.outside_text import url_without_credentials
from queues.core.states import JobState
from queues.daemons import clients
from queues.daemons.base import JobDaemon, Next, Step, StepFailed
from queues.daemons.workfolder import (
    fetch,
    job_spec,
    object_dir,
    write_job_storage_manifest,
)
from queues.steps import merritt
from queues.steps.erc import (
    PRODUCER_DIR,
    Erc,
    dublin_core_elements,
    write_dublin_core,
    write_erc,
)
from queues.steps.merritt_wire import is_ark_answer
from queues.steps.minting import MintError
from queues.steps.objectfiles import (
    IngestRecord,
    VersionFiles,
    move_delete_file,
    write_submission_manifest,
    write_version_files,
)
from queues.steps.profiles import Profile, ProfileError, load_profile
from queues.steps.submission import ObjectSpec, filename_from_url
from queues.zk.jobs import job_set_json, job_set_nodes
from queues.zk.records import Job

# The steps that made the version, as mrt-ingest.txt's "handlers" line names them.
HANDLERS = tuple(
    f"queues.daemons.{name}/not-available"
    for name in (
        "job_pending.JobPending",
        "estimating.Estimating",
        "provisioning.Provisioning",
        "downloading.Downloading",
        "processing.Processing",
    )
)


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


def ezid_asks(job: Job) -> dict[str, Any]:
    """What the depositor asked of EZID (the poster door's ``erc`` and ``retainTargetURL``)."""
    config = job.configuration
    erc = config.get("erc")
    return {
        "depositor_erc": erc if isinstance(erc, str) and erc.strip() else None,
        "retain_target": str(config.get("retainTargetURL", "")).lower() == "true",
    }


class Processing(JobDaemon):
    name: ClassVar[str] = "processing"
    step: ClassVar[str] = "processing"
    state: ClassVar[str] = JobState.PROCESSING

    def services_of(self, item: Job) -> tuple[str, ...]:
        return ("ezid",) if settings.MRT_EZID_URL else ()  # every object's ARK is described

    def settle_ark(self, job: Job, spec: ObjectSpec, local_id: str | None) -> str:
        ark = job.primary_id or (spec.primary_id or "")
        if ark and not is_ark_answer(ark):
            # Written by another client (the door checks a depositor's): it would be sent into
            # EZID's URL, the storage request and the version's files as it is.
            where = "identifiers" if job.primary_id else "configuration"
            raise StepFailed(
                f"the ARK {ark[:80]!r} in the job's {where} is no ARK "
                "(ark:/NAAN/name, printable ASCII without spaces, no '.' or '..' part)",
                permanent=True,
            )
        known = clients.ark_for_local_id(local_id, job.profile) if local_id else None
        self.retrieved_ark = known
        if ark and known and ark != known:
            raise StepFailed(f"ARK {ark} conflicts with {known}, which local id {local_id} has")
        if ark and ark == job.primary_id:
            clients.record_local_id(ark, local_id, job.profile)
            self.describe_ark(job, spec, ark, local_id)
            return ark
        if not ark and known:
            ark = known
        if ark:
            self.describe_ark(job, spec, ark, local_id)
        else:
            try:
                profile = load_profile(job.profile)
            except ProfileError as exc:
                raise StepFailed(f"cannot mint an ARK: {exc}") from exc
            try:
                ark = clients.mint_ark(
                    self.zk, profile, erc=job_erc(job, spec), local_id=local_id, **ezid_asks(job)
                )
            except MintError as exc:
                raise StepFailed(str(exc)) from exc
        identifiers: dict[str, Any] = dict(job.identifiers or {})
        identifiers["primary_id"] = ark
        identifiers["local_id"] = job.local_ids or ([local_id] if local_id else [])
        job_set_json(self.zk, job, "identifiers", identifiers)
        clients.record_local_id(ark, local_id, job.profile)
        return ark

    # The ARK the local ID had already (``settle_ark``), for the ingest record of the same step:
    # per thread, as the batched loop runs a step's jobs in several threads at once.
    _found = threading.local()

    @property
    def retrieved_ark(self) -> str | None:
        return getattr(self._found, "ark", None)

    @retrieved_ark.setter
    def retrieved_ark(self, ark: str | None) -> None:
        self._found.ark = ark

    def describe_ark(self, job: Job, spec: ObjectSpec, ark: str, local_id: str | None) -> None:
        """EZID is told about an ARK this step did not mint, as Merritt's ingest does."""
        try:
            profile = load_profile(job.profile)
            clients.describe_ark(
                self.zk, profile, ark, erc=job_erc(job, spec), local_id=local_id, **ezid_asks(job)
            )
        except (ProfileError, MintError) as exc:
            raise StepFailed(f"cannot describe {ark} in EZID: {exc}") from exc

    def work(self, item: Job) -> Step:
        spec = job_spec(item)
        target = object_dir(item)
        producer = target / PRODUCER_DIR
        if not producer.is_dir() or not any(p.is_file() for p in producer.rglob("*")):
            raise StepFailed(f"no downloaded files in {producer}; resume from Downloading")
        try:
            profile = load_profile(item.profile)
        except ProfileError as exc:
            raise StepFailed(str(exc)) from exc
        try:
            node = merritt.storage_node_number(profile.storage_node)
        except ValueError as exc:
            raise StepFailed(f"profile {profile.name}: {exc}") from exc
        local_id = (item.local_ids or [spec.local_id or ""])[0] or None
        erc = job_erc(item, spec)
        self.retrieved_ark = None
        ark = self.settle_ark(item, spec, local_id)
        config = item.configuration
        update = config.get("update") is True
        write_erc(target, erc=erc, ark=ark, local_id=local_id)
        write_dublin_core(target, dublin_core_elements(config))
        validity = None
        if spec.payload_type == "object-manifest":
            write_submission_manifest(target, fetch(spec.payload_url))
            validity = "valid"
        delete = move_delete_file(target) if update else ""
        storage_url = storage_service_url(profile)
        write_version_files(
            target,
            self.version_files(item, spec, profile, ark, local_id, erc, storage_url, validity),
        )
        manifest_url = write_job_storage_manifest(item, clients.work_url)
        store = merritt.store_node(
            manifest_url=manifest_url, ark=ark, node=node, update=update, delete=delete
        )
        inventory = merritt.inventory_node(storage_url=storage_url, ark=ark, node=node)
        kept = {k: v for k, v in (item.inventory or {}).items() if k not in ("version", "ark")}
        job_set_nodes(
            self.zk,
            item,
            {"store": {**(item.store or {}), **store}, "inventory": {**kept, **inventory}},
        )
        return Next(JobState.STORING)

    def version_files(
        self,
        item: Job,
        spec: ObjectSpec,
        profile: Profile,
        ark: str,
        local_id: str | None,
        erc: Erc,
        storage_url: str,
        validity: str | None,
    ) -> VersionFiles:
        config = item.configuration
        supplied = spec.primary_id
        retrieved = self.retrieved_ark if not supplied and self.retrieved_ark == ark else None
        assigned = ark if not supplied and not retrieved else None
        submitted = config.get("submitted")
        if not isinstance(submitted, str) or not submitted:
            submitted = datetime.now().astimezone().isoformat(timespec="seconds")
        note = config.get("note")
        record = IngestRecord(
            submission_date=submitted,
            batch=str(config.get("batchID") or config.get("batch_uuid") or item.bid),
            job=str(config.get("jobID") or item.jid),
            filename=spec.filename or filename_from_url(spec.payload_url),
            package_type=merritt.merritt_type(spec.payload_type),
            profile=profile.name,
            collections=profile.all_collections,
            storage_service=storage_url,
            notification=profile.contacts,
            supplied_identifier=supplied,
            # As Merritt's HandlerInitialize writes it: the DigestEnum value (SHA-256).
            digest_type=merritt.merritt_digest_name(spec.digest_alg) if spec.digest_alg else None,
            digest_value=spec.digest_value,
            creator=erc.who,
            title=erc.what,
            date=erc.when,
            local_identifier=local_id,
            note=note if isinstance(note, str) else None,
            user_agent=item.submitter or None,
            manifest_validity=validity,
            assigned_identifier=assigned,
            retrieved_identifier=retrieved,
            handlers=HANDLERS,
        )
        return VersionFiles(
            ingest=record,
            primary_identifier=ark,
            local_identifier=local_id,
            owner=profile.owner,
            collections=profile.all_collections,
            object_type=profile.object_type,
            object_role=profile.object_role,
            aggregate=profile.aggregate,
        )


def storage_service_url(profile: Profile) -> str:
    """The storage service a version goes to: the profile's (a Merritt profile names it), else
    MRT_STORAGE_URL, else local storage as published under MRT_WORK_URL
    (``clients.storage_export``), else local storage's folder as a file URL. Without its
    credentials: it is written into the object's ``mrt-ingest.txt`` and the job's nodes."""
    return url_without_credentials(
        profile.storage_service
        or settings.MRT_STORAGE_URL
        or clients.work_url(clients.LOCAL_STORAGE_FOLDER)
        or Path(settings.MRT_STORAGE_ROOT).resolve().as_uri()
    ).rstrip("/")
