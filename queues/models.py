"""Database tables. Queue state never lives here (it is in ZooKeeper); these are records of
finished work that the local inventory keeps in place of Merritt's inventory database."""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, models
from django.db.models.functions import Now
from django.utils import timezone


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
    """A finished batch archived out of ZooKeeper by retention (``queues/operator/archive.py``).

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


class JobText(models.Model):
    """The searched texts of a live job (``queues/console/jobtext.py``): what never changes once the
    job is made (title, file name, submitter, local IDs), its ARK once minted, and the status
    message it last failed with. Not queue state: a copy, fed from the read index as it reads
    jobs, so the search reaches every job however old; rows of jobs gone from ZooKeeper are
    taken away when a search meets them. Searched by a part of any field through SQLite's FTS5
    (trigram) table ``queues_jobtext_fts`` kept by triggers, or PostgreSQL's ``pg_trgm``
    indexes (migration 0010)."""

    number = models.BigIntegerField(primary_key=True)  # the job ID's ten digits
    # When the job's configuration was made (ms since the epoch): a ZooKeeper made afresh
    # numbers its jobs from 1 again, and a row of an earlier job of the number is rewritten.
    made = models.BigIntegerField(default=0)
    title = models.TextField(blank=True)
    filename = models.TextField(blank=True)
    submitter = models.TextField(blank=True)
    local_ids = models.TextField(blank=True)  # one a line
    ark = models.TextField(blank=True)
    error = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"jid{self.number:010d}"


class StepRecord(models.Model):
    """One step a consumer daemon ran on one item (the step history,
    ``queues/operator/history.py``).

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


# The audit log and the API tokens ----------------------------------------------------------


class AuditEntry(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # The user name is kept too: the entry must still say who acted after the user is removed.
    username = models.CharField(max_length=150, blank=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)
    action = models.CharField(max_length=40)
    kind = models.CharField(max_length=20)
    item_id = models.CharField(max_length=120, blank=True, db_index=True)
    before = models.CharField(max_length=40, blank=True)
    after = models.CharField(max_length=40, blank=True)
    reason = models.TextField(blank=True)
    detail = models.TextField(blank=True)
    ok = models.BooleanField(default=True)
    via = models.CharField(max_length=10, default="web")  # "web", "api", "command", ...

    class Meta:
        app_label = "queues"
        ordering = ["-at", "-id"]
        # The console's roles are groups holding these permissions (see setupconsole).
        permissions = [
            ("view_queues", "Can view the queues"),
            ("operate_queues", "Can hold, release, resume and update reporting"),
            ("administer_queues", "Can delete, fail, repair and hold queues"),
        ]

    def __str__(self) -> str:
        return (
            f"{self.at:%Y-%m-%d %H:%M:%S} {self.username} {self.action} {self.kind} {self.item_id}"
        )


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class ApiToken(models.Model):
    """A bearer token for the JSON API and /metrics. Only its SHA-256 is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=8)  # shown in lists so a person can tell tokens apart
    created = models.DateTimeField(default=timezone.now)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "queues"
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, *, user: Any, name: str) -> tuple[ApiToken, str]:
        """Create a token; the plain key is returned once and never stored.

        A key never begins with "-": its prefix is typed as an argument (`apitoken revoke
        PREFIX`), and a command line takes a word beginning with "-" for an option.
        """
        key = secrets.token_urlsafe(32)
        while key.startswith("-"):
            key = secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, key_hash=_digest(key), prefix=key[:8])
        return token, key

    @classmethod
    def find(cls, key: str) -> ApiToken | None:
        if not key:
            return None
        token = cls.objects.select_related("user").filter(key_hash=_digest(key)).first()
        if token is None or not token.user.is_active:
            return None
        cls.objects.filter(pk=token.pk).update(last_used=timezone.now())
        return token


# Bulk runs (queues/operator/bulkrun.py works through them)
# --------------------------------------------

# A claimed run whose last heartbeat is older than this has lost its daemon.
STALE_AFTER = timedelta(seconds=30)


def db_now() -> datetime:
    """The database server's time now (aware): the one clock a run's heartbeat is written and
    judged by, whichever hosts the daemon writing it and the web process reading it run on
    (SQLite's is its one host's). Written as a value read first, not as ``Now()`` in the
    update: the writer compares and sets on the exact heartbeat it wrote, and SQLite's
    ``Now()`` is text of another form than the values Django writes."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT STATEMENT_TIMESTAMP()")
            (value,) = cursor.fetchone()
            return value.astimezone(UTC) if isinstance(value, datetime) else timezone.now()
        if connection.vendor == "sqlite":
            cursor.execute("SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'now')")
            (text,) = cursor.fetchone()
            return datetime.fromisoformat(text).replace(tzinfo=UTC)
    return timezone.now()


class _WithDbTime(models.Manager):  # type: ignore[type-arg]
    """Every row read with the database server's time of the read (``db_time``), so that a
    run's "interrupted" compares its heartbeat with the clock that wrote it (``db_now``)."""

    def get_queryset(self) -> models.QuerySet[Any]:
        return super().get_queryset().annotate(db_time=Now())


def _stale(run: Any) -> bool:
    """Whether ``run``'s heartbeat is older than STALE_AFTER by the database server's clock: its
    time when the row was read, or now when the run was not read through ``objects``."""
    now = run.__dict__.get("db_time") or db_now()
    return bool(now - run.heartbeat > STALE_AFTER)


SKIPS_KEPT = 200


_ITEM_ID = re.compile(r"\b(?:jid|bid|qid)[0-9]{10}\b")


def short_reason(why: str) -> str:
    """The reason without the item ID, so that equal reasons group in the summary."""
    return _ITEM_ID.sub("the item", why)


def bulk_summary(done: int, reasons: dict[str, int]) -> str:
    """ "N done, M skipped (the three commonest reasons)" from skip reasons and their counts."""
    text = f"{done} done, {sum(reasons.values())} skipped"
    if reasons:
        common = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
        text += " (" + "; ".join(f"{n} x {why}" for why, n in common) + ")"
    return text


class BulkRun(models.Model):
    RUNNING, FINISHED, FAILED, STOPPED = "running", "finished", "failed", "stopped"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # Who pressed "Continue" last: the items after that are done in their name (and audited so).
    continued_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    kind = models.CharField(max_length=20)
    action = models.CharField(max_length=40)
    reason = models.TextField(blank=True)
    items = models.JSONField()  # [[item id, expected status version or null], ...]
    total = models.IntegerField()  # len(items), so that the progress page never loads them
    limited = models.BooleanField(default=False)  # the filter stopped at its scan limit
    back = models.CharField(max_length=500, blank=True)  # the list the run was started from
    via = models.CharField(max_length=10, default="web")  # "web" or "api", for the audit log
    # The action's further parameters, the same for every item (a resume's chosen step "to").
    params = models.JSONField(default=dict, blank=True)
    position = models.IntegerField(default=0)  # items handled so far
    # Counts, and the first SKIPS_KEPT skips in full: the progress written twice a second must
    # not grow with the run (each move is in the audit log anyway).
    done = models.IntegerField(default=0)
    skips = models.IntegerField(default=0)
    reasons = models.JSONField(default=dict)  # why items were skipped -> how many
    skipped = models.JSONField(default=list)  # [[item id, why], ...], the first SKIPS_KEPT
    state = models.CharField(max_length=10, default=RUNNING)
    stop_requested = models.BooleanField(default=False)  # "Stop" pressed; the daemon obeys
    # The daemon working on it ("host:pid:n"); empty while it waits for one to claim it.
    owner = models.CharField(max_length=200, blank=True, default="")
    error = models.TextField(blank=True)
    started = models.DateTimeField(default=timezone.now)
    heartbeat = models.DateTimeField(default=timezone.now)  # written as db_now() once claimed
    finished = models.DateTimeField(null=True, blank=True)

    objects = _WithDbTime()

    class Meta:
        app_label = "queues"
        ordering = ["-started", "-id"]

    def __str__(self) -> str:
        return f"bulk run {self.pk}: {self.action} of {self.total} {self.kind}s"

    @property
    def percent(self) -> int:
        return 100 * self.position // self.total if self.total else 100

    @property
    def waiting(self) -> bool:
        """Recorded (or continued), not yet claimed by a bulk-runs daemon."""
        return self.state == self.RUNNING and not self.owner

    @property
    def interrupted(self) -> bool:
        return self.state == self.RUNNING and bool(self.owner) and _stale(self)

    @property
    def resumable(self) -> bool:
        return self.interrupted or self.state in (self.FAILED, self.STOPPED)

    @property
    def stoppable(self) -> bool:
        return self.state == self.RUNNING and not self.stop_requested

    @property
    def shown_state(self) -> str:
        """The state as people should read it: a run whose daemon died is "interrupted", one
        no daemon has claimed yet "waiting"."""
        if self.interrupted:
            return "interrupted"
        return "waiting" if self.waiting else self.state

    def summary(self) -> str:
        return bulk_summary(self.done, self.reasons)

    def skip(self, item_id: str, why: str) -> None:
        self.skips += 1
        short = short_reason(why)
        self.reasons[short] = self.reasons.get(short, 0) + 1
        if len(self.skipped) < SKIPS_KEPT:
            self.skipped.append([item_id, why])


# Alerts (queues/daemons/alerting.py) --------------------------------------------------------


class AlertRule(models.Model):
    """One alert rule's settings, as admins edit them on the alerts page. A row per rule kind
    the code knows, made with the kind's defaults when first read (a new kind needs no
    migration)."""

    kind = models.CharField(max_length=40, unique=True)
    enabled = models.BooleanField(default=True)
    threshold = models.FloatField()
    quiet_seconds = models.FloatField()
    # Failure spikes in one collection: hold the collection as well as alerting.
    fuse = models.BooleanField(default=False)
    updated = models.DateTimeField(default=timezone.now)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        app_label = "queues"
        ordering = ["id"]

    def __str__(self) -> str:
        return f"alert rule {self.kind}"


class AlertEpisode(models.Model):
    """One episode of one rule for one key (a collection, a step, or "" for the whole queue):
    from the round its condition was first found to the round it had been clear for the rule's
    quiet period. At most one open episode per rule and key, which the database enforces, so
    that evaluators on several hosts never both announce it."""

    kind = models.CharField(max_length=40)
    key = models.CharField(max_length=200, blank=True, default="")
    summary = models.TextField()
    detail = models.TextField(blank=True)
    opened = models.DateTimeField()
    last_seen = models.DateTimeField()
    # When the condition was last found gone while the episode was open (None: it holds now).
    clear_since = models.DateTimeField(null=True, blank=True)
    resolved = models.DateTimeField(null=True, blank=True)
    fused = models.TextField(blank=True)  # what the fuse did, said in the alert
    evaluator = models.CharField(max_length=200, blank=True)

    class Meta:
        app_label = "queues"
        ordering = ["-opened", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "key"],
                condition=models.Q(resolved__isnull=True),
                name="alertepisode_one_open",
            )
        ]
        indexes = [models.Index(fields=["opened"], name="alertepisode_opened")]

    def __str__(self) -> str:
        return f"{self.kind}[{self.key}] {self.summary}"


class AlertMessage(models.Model):
    """One message to one channel: written with the change that causes it and sent by whichever
    alerts daemon claims it, so an outage of the mail server or the webhook delays it and never
    loses it."""

    FIRED, RESOLVED, DIGEST, TEST = "fired", "resolved", "digest", "test"
    EMAIL, WEBHOOK = "email", "webhook"

    episode = models.ForeignKey(AlertEpisode, null=True, blank=True, on_delete=models.CASCADE)
    event = models.CharField(max_length=10)
    channel = models.CharField(max_length=10)
    subject = models.CharField(max_length=300)
    text = models.TextField()
    payload = models.JSONField()  # the webhook body, fixed when the message is written
    created = models.DateTimeField(default=timezone.now)
    next_try = models.DateTimeField(default=timezone.now)
    claimed_until = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(default=0)
    sent = models.DateTimeField(null=True, blank=True)
    failed = models.BooleanField(default=False)  # refused for good (a 5xx mail answer, HTTP 4xx)
    error = models.TextField(blank=True)

    class Meta:
        app_label = "queues"
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["sent", "failed", "next_try"], name="alertmessage_due")]

    def __str__(self) -> str:
        return f"{self.event} {self.channel}: {self.subject}"


class AlertDigest(models.Model):
    """The day a daily digest was written for: the row's uniqueness makes it once a day."""

    day = models.DateField(unique=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        app_label = "queues"

    def __str__(self) -> str:
        return f"alert digest {self.day}"


# Consistency check runs (queues/operator/consistency.py; the consistency daemon works through them)
# ---


class ConsistencyRun(models.Model):
    """One walk of the consistency check over the tree, with its progress; its findings are
    ``ConsistencyFinding`` rows. At most one is running at a time, on any host: the database
    refuses a second running row (``one_running_check``)."""

    RUNNING, FINISHED, FAILED = "running", "finished", "failed"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    via = models.CharField(max_length=10, default="web")  # web, api or cli
    state = models.CharField(max_length=10, default=RUNNING)
    # Constant: the running rows share it, and the unique constraint allows one of them.
    slot = models.CharField(max_length=10, default="tree", editable=False)
    owner = models.CharField(max_length=200, blank=True, default="")  # "host:pid:n"; "" waits
    phase = models.CharField(max_length=200, blank=True, default="")
    done = models.BigIntegerField(default=0)
    total = models.BigIntegerField(default=0)
    jobs = models.BigIntegerField(default=0)
    batches = models.BigIntegerField(default=0)
    index_entries = models.BigIntegerField(default=0)
    findings = models.IntegerField(default=0)
    repairable = models.IntegerField(default=0)
    kinds = models.JSONField(default=dict)  # finding kind -> how many
    error = models.TextField(blank=True)
    started = models.DateTimeField(default=timezone.now)
    heartbeat = models.DateTimeField(default=timezone.now)  # written as db_now() once claimed
    finished = models.DateTimeField(null=True, blank=True)
    repaired = models.DateTimeField(null=True, blank=True)

    objects = _WithDbTime()

    class Meta:
        app_label = "queues"
        ordering = ["-started", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["slot"], condition=models.Q(state="running"), name="one_running_check"
            )
        ]

    def __str__(self) -> str:
        return f"consistency check {self.pk} ({self.shown_state})"

    @property
    def waiting(self) -> bool:
        return self.state == self.RUNNING and not self.owner

    @property
    def interrupted(self) -> bool:
        return self.state == self.RUNNING and bool(self.owner) and _stale(self)

    @property
    def shown_state(self) -> str:
        if self.interrupted:
            return "interrupted"
        return "waiting" if self.waiting else self.state

    @property
    def percent(self) -> int:
        return min(100, 100 * self.done // self.total) if self.total else 0


class ConsistencyFinding(models.Model):
    """One finding of a run (``queues.operator.check.Finding``), kept for paging and for repair."""

    run = models.ForeignKey(ConsistencyRun, on_delete=models.CASCADE, related_name="rows")
    kind = models.CharField(max_length=40)
    path = models.TextField()
    detail = models.TextField()
    repairable = models.BooleanField(default=False)
    session = models.BigIntegerField(default=0)
    czxid = models.BigIntegerField(default=0)
    owner = models.CharField(max_length=10, blank=True, default="")
    advice = models.TextField(blank=True)
    seen = models.JSONField(default=list)
    repair = models.TextField(blank=True)  # what repair did, once it ran

    class Meta:
        app_label = "queues"
        ordering = ["id"]
        indexes = [models.Index(fields=["run", "kind", "id"], name="consistencyfinding_kind")]

    def __str__(self) -> str:
        return f"{self.kind} {self.path}"


class Note(models.Model):
    """An operator's note on a job, a batch or a collection ("depositor asked to wait", "node 9
    replaced on Monday"): shown on the item's page and timeline and as a marker in lists.

    Kept here, not in ZooKeeper: a note is the team's word about an item, never queue state,
    and outlives the item (a deleted batch's notes still say what was known of it).
    """

    KINDS = ("job", "batch", "collection")
    MAX_LENGTH = 2000

    kind = models.CharField(max_length=20)
    item_id = models.CharField(max_length=120)
    text = models.TextField()
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    author_name = models.CharField(max_length=150, blank=True)  # kept when the user goes
    created = models.DateTimeField(default=timezone.now)
    edited = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "queues"
        ordering = ["created", "id"]
        indexes = [models.Index(fields=["kind", "item_id", "created"], name="note_item")]

    def __str__(self) -> str:
        return f"note {self.pk} on {self.kind} {self.item_id} by {self.author_name}"
