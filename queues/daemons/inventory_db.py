"""The local inventory: what Merritt's inventory service would record, kept in this project's
own database. Used when MRT_INVENTORY_URL is empty (standalone, one machine).

It lives outside ``queues.steps`` because it is the one inventory that needs the ORM; the steps
themselves never touch the database.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from django.conf import settings
from django.db import transaction

from queues.core.outside_text import url_shown, url_with_credentials_of
from queues.models import InventoryFile, InventoryObject, InventoryVersion
from queues.steps.checkm import ManifestError
from queues.steps.erc import Erc
from queues.steps.fetch import DownloadError, fetch_bytes
from queues.steps.inventory import InventoryError
from queues.steps.netpolicy import FetchPolicy
from queues.steps.storage import version_entries
from queues.steps.submission import filename_from_url


class LocalInventory:
    """Inventory in this project's database (models InventoryObject/Version/File).

    Recording is idempotent: the object row is keyed by ARK, the version by (object, number),
    and a version's file list is replaced as a whole, so a re-run Recording step changes nothing.
    """

    def __init__(
        self, *, file_roots: Sequence[Path] | None = None, policy: FetchPolicy | None = None
    ) -> None:
        self.file_roots = file_roots
        self.policy = policy  # its HTTP fetches' (None: the system's own)

    def record(
        self,
        *,
        ark: str,
        version: int,
        manifest_url: str,
        local_id: str | None = None,
        erc: Erc | None = None,
    ) -> None:
        try:
            # Handed on without storage's credentials (``inventory_manifest_url``): fetched
            # from MRT_STORAGE_URL's server, it goes with them again.
            data = fetch_bytes(
                url_with_credentials_of(manifest_url, settings.MRT_STORAGE_URL),
                file_roots=self.file_roots,
                policy=self.policy,
            )
            files = version_entries(data, version)
        except (DownloadError, ManifestError) as exc:
            raise InventoryError(
                f"unusable storage manifest {url_shown(manifest_url)}: {exc}"
            ) from exc
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
                    digest_alg=row.digest_alg or "",
                    digest=row.digest_value or "",
                )
                for row in files
            )
