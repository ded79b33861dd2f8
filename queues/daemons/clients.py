"""The outside services, chosen from settings in this one place.

Each has a real client and a local default that works on one machine:

=========  =============================  =================================================
service    setting set                    setting empty
=========  =============================  =================================================
minting    MRT_EZID_URL: EZID's HTTP API  LocalMinter, its counter in ZooKeeper per shoulder
storage    MRT_STORAGE_URL: Merritt's     LocalStorage under MRT_STORAGE_ROOT, by ARK and
           storage service                version
inventory  MRT_INVENTORY_URL: Merritt's   LocalInventory, tables in this project's database
           inventory service
mail       EMAIL_HOST: SMTP               files under MRT_VAR_DIR/mail (Django's backends,
                                          chosen in settings)
=========  =============================  =================================================

Each remote service gets one pooled ``requests.Session`` per process (``_session``), with
urllib3 retries for connections that could not be made (see queues/steps/merritt_wire.py).
What each client sends and reads is in docs/merritt-services.md.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import requests
from django.conf import settings

from queues.daemons.inventory_db import LocalInventory
from queues.services.depositors import system_policy
from queues.steps.erc import Erc
from queues.steps.inventory import HttpInventory, InventoryClient, InventoryError
from queues.steps.merritt import storage_node_number
from queues.steps.merritt_wire import service_session
from queues.steps.minting import (
    EzidMinter,
    LocalMinter,
    Minter,
    MintError,
    ark_metadata,
)
from queues.steps.notify import (
    DUBLIN_CORE,
    mail_addresses,
    merritt_hash_algorithm,
    merritt_job_state,
)
from queues.steps.profiles import Profile, ProfileError, load_profile
from queues.steps.storage import HttpStorage, LocalStorage, ManifestExport, StorageClient
from queues.zk.counters import counter_next

EMAIL_KEYS = ("notification_email", "email", "depositor_email")
# Where EZID sends an ARK's resolver: Merritt's object page, ``{this}/m/{ark}``.
DEFAULT_EZID_TARGET_URL = "https://merritt.cdlib.org"
# The folder of MRT_WORK_DIR (and path of MRT_WORK_URL) where local storage publishes objects.
LOCAL_STORAGE_FOLDER = "storage"


@cache
def _session(service: str) -> requests.Session:
    """One pooled session per remote service and process, shared by the daemons' threads.
    Inventory's adds and local-id records are idempotent, so its POSTs may be repeated. Each
    exchange has one deadline: a storage add reads every file of its version, so storage's is
    MRT_STORAGE_ADD_DEADLINE; the others' MRT_SERVICE_DEADLINE."""
    deadline = (
        settings.MRT_STORAGE_ADD_DEADLINE if service == "storage" else settings.MRT_SERVICE_DEADLINE
    )
    return service_session(retry_posts=service == "inventory", deadline=deadline)


def internal_roots() -> list[Path]:
    """Folders the file:// URLs this system writes itself point into: the jobs' working
    folders (storage manifests, downloaded files) and local storage (version manifests)."""
    return [Path(settings.MRT_WORK_DIR), Path(settings.MRT_STORAGE_ROOT)]


def minter(zk: Any) -> Minter:
    if settings.MRT_EZID_URL:
        return EzidMinter(
            settings.MRT_EZID_URL,
            settings.MRT_EZID_USER,
            settings.MRT_EZID_PASSWORD,
            timeout=settings.MRT_HTTP_TIMEOUT,
            session=_session("ezid"),
        )
    return LocalMinter(lambda shoulder: counter_next(zk, f"ark-{shoulder}"))


def mint_ark(
    zk: Any,
    profile: Profile,
    *,
    erc: Erc | None = None,
    local_id: str | None = None,
    depositor_erc: str | None = None,
    retain_target: bool = False,
) -> str:
    """A new ARK on the profile's shoulder, described in EZID the way Merritt's ingest does.

    With EZID: mint with the ERC record (who/what/when, the local id), ``mrt.creator`` and
    ``_owner``, then, now that the ARK is known, update it with the ERC naming it and
    ``_target`` = ``{MRT_EZID_TARGET_URL}/m/{ARK encoded twice}`` (``ark_metadata``: the
    depositor's own ERC instead of the record, no ``_target`` when asked to retain it). If
    that update fails the ARK stays minted without its target and MintError says which ARK
    it is. Without EZID: the local minter. Raises MintError.
    """
    found = minter(zk)
    if not isinstance(found, EzidMinter):
        return found.mint(profile.ark_shoulder)

    def metadata(ark: str | None) -> dict[str, str]:
        return _ezid_metadata(profile, ark, erc, local_id, depositor_erc, retain_target)

    ark = found.mint(profile.ark_shoulder, metadata(None))
    try:
        found.update(ark, metadata(ark))
    except MintError as exc:
        raise MintError(f"minted {ark}, but could not set its EZID target: {exc}") from exc
    return ark


def describe_ark(
    zk: Any,
    profile: Profile,
    ark: str,
    *,
    erc: Erc | None = None,
    local_id: str | None = None,
    depositor_erc: str | None = None,
    retain_target: bool = False,
) -> None:
    """Describe an ARK this console did not mint (the depositor's, or the one its local id
    has) in EZID as Merritt's ingest does for every object: update it, creating it when EZID
    does not hold it. Nothing without EZID. Raises MintError."""
    found = minter(zk)
    if not isinstance(found, EzidMinter):
        return
    found.describe(ark, _ezid_metadata(profile, ark, erc, local_id, depositor_erc, retain_target))


def _ezid_metadata(
    profile: Profile,
    ark: str | None,
    erc: Erc | None,
    local_id: str | None,
    depositor_erc: str | None,
    retain_target: bool,
) -> dict[str, str]:
    erc = erc or Erc()
    return ark_metadata(
        ark,
        who=erc.who,
        what=erc.what,
        when=erc.when,
        local_id=local_id,
        target_base=settings.MRT_EZID_TARGET_URL or DEFAULT_EZID_TARGET_URL,
        owner=profile.ezid_coowner,
        creator_context=profile.context,
        depositor_erc=depositor_erc,
        retain_target=retain_target,
    )


def storage(profile: Profile | None = None, *, node: int | None = None) -> StorageClient:
    """The storage client; ``node``: the node a job's store node names, which wins over its
    profile's (a profile changed since Processing does not move the job's object)."""
    if settings.MRT_STORAGE_URL:
        node_id = node or (profile.storage_node if profile else "") or settings.MRT_STORAGE_NODE
        return HttpStorage(
            settings.MRT_STORAGE_URL,
            node_id,
            timeout=settings.MRT_HTTP_TIMEOUT,
            session=_session("storage"),
        )
    return LocalStorage(
        Path(settings.MRT_STORAGE_ROOT),
        threads=settings.MRT_DOWNLOAD_THREADS,
        retries=settings.MRT_DOWNLOAD_RETRIES,
        timeout=settings.MRT_HTTP_TIMEOUT,
        file_roots=internal_roots(),
        export=storage_export(profile),
        policy=system_policy(),
    )


def storage_export(profile: Profile | None) -> ManifestExport | None:
    """Where local storage publishes objects in Merritt storage's form, so that Merritt's
    inventory can record them: ``$MRT_WORK_DIR/storage``, served as ``$MRT_WORK_URL/storage``
    (no MRT_WORK_URL, no publishing: only this console's inventory reads local storage)."""
    base = work_url(LOCAL_STORAGE_FOLDER)
    if base is None or profile is None:
        return None
    try:
        node = storage_node_number(profile.storage_node)
    except ValueError:
        return None
    return ManifestExport(Path(settings.MRT_WORK_DIR) / LOCAL_STORAGE_FOLDER, base, node)


def inventory() -> InventoryClient:
    if settings.MRT_INVENTORY_URL:
        return HttpInventory(
            settings.MRT_INVENTORY_URL,
            timeout=settings.MRT_HTTP_TIMEOUT,
            session=_session("inventory"),
        )
    return LocalInventory(file_roots=internal_roots(), policy=system_policy())


def _owner(profile_name: str | None, local_id: str) -> str:
    """The profile's owner ARK, which Merritt's inventory files local ids under."""
    try:
        profile = load_profile(profile_name or "")
    except ProfileError as exc:
        raise InventoryError(f"cannot use local id {local_id!r} with inventory: {exc}") from exc
    if not profile.owner:
        raise InventoryError(
            f"profile {profile.name} names no Owner, under which Merritt's inventory keeps "
            f"local ids; local id {local_id!r} cannot be looked up or recorded"
        )
    return profile.owner


def ark_for_local_id(local_id: str, profile_name: str | None = None) -> str | None:
    """The ARK inventory already has for a depositor's local id, or None.

    With MRT_INVENTORY_URL: Merritt's inventory, asked under the profile's owner
    (``GET primary/{owner}/{local id}?t=json``), as Merritt's ingest asks; else the local
    inventory tables. Raises InventoryError when Merritt's inventory cannot answer.
    """
    if not local_id:
        return None
    if settings.MRT_INVENTORY_URL:
        found = inventory()
        assert isinstance(found, HttpInventory)
        return found.primary_for_local_id(_owner(profile_name, local_id), local_id)
    from queues.models import InventoryObject

    return (
        InventoryObject.objects.filter(local_id=local_id)
        .order_by("ark")
        .values_list("ark", flat=True)
        .first()
    )


def record_local_id(ark: str, local_id: str | None, profile_name: str | None) -> None:
    """Tell Merritt's inventory that ``ark`` has ``local_id`` (``POST primary/{ark}/{owner}/
    {local id}``), as Merritt's ingest does at the end of Processing. The local inventory
    records local ids itself in Recording, so without MRT_INVENTORY_URL this does nothing.
    Raises InventoryError."""
    if not local_id or not settings.MRT_INVENTORY_URL:
        return
    found = inventory()
    assert isinstance(found, HttpInventory)
    found.add_local_id(ark, _owner(profile_name, local_id), local_id)


def callback_state(job: Any, *, status: str = "COMPLETED", message: str = "") -> dict[str, Any]:
    """The JSON job state Merritt's ingest posts to ``{CallbackURL}/mc/{jobID}``, for a job
    record (queues.zk.records.Job), filled as Merritt's Notify step fills it
    (docs/merritt-services.md, "Callbacks"): from the job's configuration (``filename``,
    ``digestType``/``digestValue``, ``creator``, ``title``, ``date``, ``note``, ``DC*``) and its
    identifiers; the submission date is the moment of the Notify step, as Merritt's ingest
    sets it at the start of each step. Merritt's Notify sets no label, consumption or
    completion date, version, object note or type, and a persistent URL only from a setting
    of ingest's this console does not have: those are left out, as Merritt leaves out nulls."""
    config = job.configuration or {}

    def text(value: Any) -> str | None:
        return value if isinstance(value, str) and value.strip() else None

    return merritt_job_state(
        job_id=job.jid,
        status=status,
        package_name=text(config.get("filename")),
        submitted=datetime.now().astimezone(),
        message=message or None,
        primary_id=job.primary_id or None,
        local_ids=job.local_ids,
        hash_algorithm=merritt_hash_algorithm(config.get("digestType")),
        hash_value=text(config.get("digestValue")),
        creator=text(config.get("creator")),
        title=text(config.get("title")),
        date=text(config.get("date")),
        note=text(config.get("note")),
        dublin_core={name: text(config.get(f"DC{name}")) for name in DUBLIN_CORE},
    )


def recipients(submission: dict[str, Any], profile: Profile | None) -> list[str]:
    """Who gets a batch summary: the depositor (when an address is known) and the contacts."""
    candidates = [submission.get(k) for k in EMAIL_KEYS] + [submission.get("submitter")]
    return mail_addresses([*candidates, *(profile.contacts if profile else ())])


def work_url(relative: str) -> str | None:
    """An HTTP URL for a path under MRT_WORK_DIR, when MRT_WORK_URL says where it is served.

    Remote storage cannot read file:// URLs of this machine; it needs the working folder
    served over HTTP.
    """
    base = settings.MRT_WORK_URL
    return f"{base.rstrip('/')}/{relative}" if base else None


def download_url(name: str) -> str:
    base = settings.MRT_DOWNLOADS_URL or (settings.MRT_CONSOLE_URL.rstrip("/") + "/downloads")
    return f"{base.rstrip('/')}/{name}"
