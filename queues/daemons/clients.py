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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from queues.steps.inventory import HttpInventory, InventoryClient, LocalInventory
from queues.steps.minting import EzidMinter, LocalMinter, Minter
from queues.steps.profiles import Profile
from queues.steps.storage import HttpStorage, LocalStorage, StorageClient
from queues.zk.counters import counter_next

EMAIL_KEYS = ("notification_email", "email", "depositor_email")


def payload_roots() -> list[Path]:
    """Folders a depositor's file:// URLs (payloads, manifests, the files they list) may read.

    MRT_FILE_ROOTS, and nothing when it is empty: a depositor must not be able to ask for
    file:///etc/passwd, or for another deposit's working folder.
    """
    roots = settings.MRT_FILE_ROOTS
    if isinstance(roots, str):
        roots = [r for r in roots.split(":") if r.strip()]
    return [Path(r) for r in roots or ()]


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
        )
    return LocalMinter(lambda shoulder: counter_next(zk, f"ark-{shoulder}"))


def storage(profile: Profile | None = None) -> StorageClient:
    if settings.MRT_STORAGE_URL:
        node = (profile.storage_node if profile else "") or settings.MRT_STORAGE_NODE
        return HttpStorage(settings.MRT_STORAGE_URL, node, timeout=settings.MRT_HTTP_TIMEOUT)
    return LocalStorage(
        Path(settings.MRT_STORAGE_ROOT),
        threads=settings.MRT_DOWNLOAD_THREADS,
        retries=settings.MRT_DOWNLOAD_RETRIES,
        timeout=settings.MRT_HTTP_TIMEOUT,
        file_roots=internal_roots(),
    )


def inventory() -> InventoryClient:
    if settings.MRT_INVENTORY_URL:
        return HttpInventory(settings.MRT_INVENTORY_URL, timeout=settings.MRT_HTTP_TIMEOUT)
    return LocalInventory(file_roots=internal_roots())


def ark_for_local_id(local_id: str) -> str | None:
    """The ARK inventory already has for a depositor's local id, or None.

    Only the local inventory can answer: the steps' HTTP inventory client has no look-up call,
    so with MRT_INVENTORY_URL set every object without a given ARK gets a new one.
    """
    if not local_id or settings.MRT_INVENTORY_URL:
        return None
    from queues.models import InventoryObject

    return (
        InventoryObject.objects.filter(local_id=local_id)
        .order_by("ark")
        .values_list("ark", flat=True)
        .first()
    )


def recipients(submission: dict[str, Any], profile: Profile | None) -> list[str]:
    """Who gets a batch summary: the depositor (when an address is known) and the contacts."""
    found: list[str] = []
    candidates = [submission.get(k) for k in EMAIL_KEYS] + [submission.get("submitter")]
    for value in candidates:
        if isinstance(value, str) and "@" in value and " " not in value.strip():
            found.append(value.strip())
    found += list(profile.contacts if profile else ())
    return list(dict.fromkeys(found))


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
