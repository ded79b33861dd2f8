"""The audit log of operator actions and the API tokens, the console's only own tables.

Queue state never lives here: an entry records what a person asked for and what ZooKeeper said,
so that "who deleted bid0000000042, and why?" has an answer after the batch is gone.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone


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
    via = models.CharField(max_length=10, default="web")  # "web" or "api"

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


def record(
    *,
    user: Any,
    action: str,
    kind: str,
    item_id: str,
    before: str = "",
    after: str = "",
    reason: str = "",
    detail: str = "",
    ok: bool = True,
    via: str = "web",
) -> AuditEntry:
    """Write one audit entry; refused attempts are recorded too, with ``ok=False``."""
    authenticated = user is not None and getattr(user, "is_authenticated", False)
    return AuditEntry.objects.create(
        user=user if authenticated else None,
        username=user.get_username() if authenticated else "",
        action=action[:40],
        kind=kind[:20],
        item_id=item_id[:120],
        before=before[:40],
        after=after[:40],
        reason=reason,
        detail=detail,
        ok=ok,
        via=via,
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
        """Create a token; the plain key is returned once and never stored."""
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


# "retry 2; failed in Downloading: HTTP 404 on payload": the detail of a resume's entry, which
# keeps the failure message the move replaced (the status node keeps only its five keys).
_FAILURE = re.compile(
    r"^retry (?P<retry>[0-9]+); failed in (?P<step>[A-Za-z]+): (?P<message>.*)$", re.S
)


@dataclass(frozen=True)
class EarlierFailure:
    at: Any
    step: str  # the step it failed in (where the resume restarted it)
    message: str
    retry: int
    resumed_by: str
    resumed_to: str
    reason: str


def failure_of(entry: AuditEntry) -> EarlierFailure | None:
    """The failure a successful resume entry moved the job away from, or None."""
    if entry.action != "resume" or entry.kind != "job" or not entry.ok:
        return None
    match = _FAILURE.match(entry.detail or "")
    if match is None:
        return None
    return EarlierFailure(
        at=entry.at,
        step=match["step"],
        message=match["message"],
        retry=int(match["retry"]),
        resumed_by=entry.username,
        resumed_to=entry.after,
        reason=entry.reason,
    )


def earlier_failures(jid: str) -> list[EarlierFailure]:
    """The job's failures before its current status, oldest first, from its resume entries."""
    entries = AuditEntry.objects.filter(item_id=jid, kind="job", action="resume", ok=True)
    found = (failure_of(e) for e in entries.order_by("at", "id")[:200])
    return [f for f in found if f is not None]
