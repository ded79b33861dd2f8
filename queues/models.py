"""Database tables. Queue state never lives here (it is in ZooKeeper); these are records of
finished work that the local inventory keeps in place of Merritt's inventory database."""

from __future__ import annotations

from django.db import models


class InventoryObject(models.Model):
    ark = models.CharField(max_length=255, unique=True)
    local_id = models.CharField(max_length=255, blank=True)
    erc_who = models.TextField(blank=True)
    erc_what = models.TextField(blank=True)
    erc_when = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    modified = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["ark"]

    def __str__(self) -> str:
        return self.ark


class InventoryVersion(models.Model):
    object = models.ForeignKey(InventoryObject, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    manifest_url = models.TextField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["object", "number"]
        constraints = [
            models.UniqueConstraint(fields=["object", "number"], name="inventory_version_unique")
        ]

    def __str__(self) -> str:
        return f"{self.object.ark} v{self.number}"


class InventoryFile(models.Model):
    version = models.ForeignKey(InventoryVersion, on_delete=models.CASCADE, related_name="files")
    path = models.TextField()
    size = models.BigIntegerField(null=True, blank=True)
    digest_alg = models.CharField(max_length=16, blank=True)
    digest = models.CharField(max_length=128, blank=True)

    class Meta:
        ordering = ["version", "path"]
        constraints = [
            models.UniqueConstraint(fields=["version", "path"], name="inventory_file_unique")
        ]

    def __str__(self) -> str:
        return self.path


from queues.audit import ApiToken, AuditEntry  # noqa: E402, F401
from queues.bulkrun import BulkRun  # noqa: E402, F401
