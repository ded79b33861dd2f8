"""Recording a stored version in an inventory: Merritt's service, or local Django tables."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import requests

from queues.steps.checkm import ManifestError, parse_checkm
from queues.steps.erc import Erc
from queues.steps.fetch import DEFAULT_TIMEOUT, DownloadError, fetch_bytes
from queues.steps.submission import filename_from_url


class InventoryError(Exception):
    pass


class InventoryClient(Protocol):
    def record(
        self,
        *,
        ark: str,
        version: int,
        manifest_url: str,
        local_id: str | None = None,
        erc: Erc | None = None,
    ) -> None: ...


class HttpInventory:
    """Merritt's inventory service: ``POST {base}/add`` with form field ``url`` (the storage
    manifest URL). The service reads everything else from that manifest, so ``local_id`` and
    ``erc`` are not sent."""

    def __init__(self, base_url: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def record(
        self,
        *,
        ark: str,
        version: int,
        manifest_url: str,
        local_id: str | None = None,
        erc: Erc | None = None,
    ) -> None:
        url = f"{self.base_url}/add"
        try:
            response = requests.post(
                url, data={"url": manifest_url, "responseForm": "xml"}, timeout=self.timeout
            )
        except requests.RequestException as exc:
            raise InventoryError(f"inventory service unreachable at {url}: {exc}") from None
        if not response.ok:
            raise InventoryError(
                f"inventory refused {ark} v{version}: HTTP {response.status_code} "
                f"{response.text[:300]}"
            )


class LocalInventory:
    """Inventory in this project's database (models InventoryObject/Version/File).

    Recording is idempotent: the object row is keyed by ARK, the version by (object, number),
    and a version's file list is replaced as a whole, so a re-run Recording step changes nothing.
    """

    def __init__(self, *, file_roots: Sequence[Path] | None = None) -> None:
        self.file_roots = file_roots

    def record(
        self,
        *,
        ark: str,
        version: int,
        manifest_url: str,
        local_id: str | None = None,
        erc: Erc | None = None,
    ) -> None:
        # Imported here so that the rest of queues.steps works without Django set up.
        from django.db import transaction

        from queues.models import InventoryFile, InventoryObject, InventoryVersion

        try:
            manifest = parse_checkm(fetch_bytes(manifest_url, file_roots=self.file_roots))
        except (DownloadError, ManifestError) as exc:
            raise InventoryError(f"unusable storage manifest {manifest_url}: {exc}") from exc
        erc = erc or Erc()
        with transaction.atomic():
            obj, _ = InventoryObject.objects.select_for_update().get_or_create(ark=ark)
            changed = False
            for field, value in (
                ("local_id", local_id),
                ("erc_who", erc.who),
                ("erc_what", erc.what),
                ("erc_when", erc.when),
            ):
                if value and getattr(obj, field) != value:
                    setattr(obj, field, value)
                    changed = True
            if changed:
                obj.save()
            stored, created = InventoryVersion.objects.get_or_create(
                object=obj, number=version, defaults={"manifest_url": manifest_url}
            )
            if not created and stored.manifest_url != manifest_url:
                stored.manifest_url = manifest_url
                stored.save(update_fields=["manifest_url"])
            stored.files.all().delete()
            InventoryFile.objects.bulk_create(
                InventoryFile(
                    version=stored,
                    path=row.filename or filename_from_url(row.url),
                    size=row.size,
                    digest_alg=row.hash_alg,
                    digest=row.hash_value,
                )
                for row in manifest.rows
            )
