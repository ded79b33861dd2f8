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


class ArchivedBatch(models.Model):
    """A finished batch archived out of ZooKeeper by retention (``queues/archive.py``).

    Written only once the batch and all its jobs have finished, before their nodes are removed;
    never live queue state. Keyed by the batch ID, so archiving again updates the same row.
    """

    bid = models.CharField(max_length=20, unique=True)
    batch_uuid = models.CharField(max_length=255, blank=True, db_index=True)  # batchID
    profile = models.CharField(max_length=255, blank=True)
    submitter = models.CharField(max_length=255, blank=True)
    title = models.TextField(blank=True)
    final_state = models.CharField(max_length=40)
    final_message = models.TextField(blank=True)
    created = models.DateTimeField(null=True, blank=True)
    last_modified = models.DateTimeField(null=True, blank=True)
    report_modified = models.DateTimeField(null=True, blank=True)
    successful_jobs = models.JSONField(default=list, blank=True)
    failed_jobs = models.JSONField(default=list, blank=True)
    # The nodes as they were, for the read-only page: submission, status, status-report.
    submission = models.JSONField(default=dict, blank=True)
    status = models.JSONField(default=dict, blank=True)
    status_report = models.JSONField(null=True, blank=True)
    job_ids = models.JSONField(default=list, blank=True)
    archived_at = models.DateTimeField()

    class Meta:
        ordering = ["-bid"]

    def __str__(self) -> str:
        return f"{self.bid} (archived)"


class ArchivedJob(models.Model):
    """A finished job archived out of ZooKeeper with its batch; searchable by job ID, batch ID,
    ARK and local ID through indexed columns (local IDs in ``ArchivedLocalId``)."""

    jid = models.CharField(max_length=20, unique=True)
    bid = models.CharField(max_length=20, db_index=True)
    profile = models.CharField(max_length=255, blank=True)
    submitter = models.CharField(max_length=255, blank=True)
    primary_id = models.CharField(max_length=255, blank=True, db_index=True)  # the ARK
    title = models.TextField(blank=True)
    final_state = models.CharField(max_length=40)
    final_message = models.TextField(blank=True)
    last_successful_status = models.CharField(max_length=40, blank=True)
    retry_count = models.IntegerField(default=0)
    created = models.DateTimeField(null=True, blank=True)
    last_modified = models.DateTimeField(null=True, blank=True)
    # The states it went through as far as ZooKeeper knows them: [{state, at}], at = null where
    # ZooKeeper keeps no time; and the operator actions of the audit log.
    states = models.JSONField(default=list, blank=True)
    audit = models.JSONField(default=list, blank=True)
    local_ids = models.JSONField(default=list, blank=True)
    # The nodes as they were: configuration, status, identifiers, metadata, store, inventory.
    nodes = models.JSONField(default=dict, blank=True)
    archived_at = models.DateTimeField()

    class Meta:
        ordering = ["-jid"]

    def __str__(self) -> str:
        return f"{self.jid} (archived)"


class ArchivedLocalId(models.Model):
    job = models.ForeignKey(ArchivedJob, on_delete=models.CASCADE, related_name="local_id_rows")
    value = models.CharField(max_length=255, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "value"], name="archived_local_id_unique")
        ]

    def __str__(self) -> str:
        return self.value


class StepRecord(models.Model):
    """One step a consumer daemon ran on one item (the step history, ``queues/history.py``).

    Written in batches by each daemon process's background writer
    (``queues/daemons/stephistory.py``), pruned after ``MRT_STEP_HISTORY_DAYS``. A record of
    finished work, never live queue state: ZooKeeper stays the truth about where items are.
    """

    kind = models.CharField(max_length=10)  # job | batch | access
    item_id = models.CharField(max_length=40)
    step = models.CharField(max_length=40)  # the daemon's step name
    state = models.CharField(max_length=40)  # the state the item was claimed in
    outcome = models.CharField(max_length=10)  # ok | held | failed | waiting | dropped | skipped
    started = models.DateTimeField()
    duration = models.FloatField()  # seconds
    # Seconds the item waited in its state before this step took it (from its status node's
    # modification time, i.e. the previous step's end or an operator's move); None if unknown.
    waited = models.FloatField(null=True, blank=True)
    hour = models.IntegerField()  # started, in whole hours since the epoch (UTC): the buckets
    host = models.CharField(max_length=255)
    consumer = models.CharField(max_length=255, blank=True)  # <host>-<pid>
    bytes = models.BigIntegerField(null=True, blank=True)  # bytes moved, where known
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["hour", "step", "outcome"], name="steprecord_hour_step"),
            models.Index(fields=["step", "started"], name="steprecord_step_started"),
            models.Index(fields=["state", "started"], name="steprecord_state_started"),
            models.Index(fields=["item_id", "started"], name="steprecord_item"),
            models.Index(fields=["started"], name="steprecord_started"),
        ]

    def __str__(self) -> str:
        return f"{self.item_id} {self.step} {self.outcome}"


from queues.audit import ApiToken, AuditEntry  # noqa: E402, F401
from queues.bulkrun import BulkRun  # noqa: E402, F401
