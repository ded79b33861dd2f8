"""The alerts page: the rules (admins change them), where alerts go, which process evaluates
them, the open and recent alerts, the messages sent and waiting, and a test alert."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from queues.daemons import alerting
from queues.daemons.alert_rules import KINDS, rule_rows
from queues.daemons.alerts import ROLE
from queues.models import AlertEpisode, AlertMessage, AlertRule
from queues.operator import audit
from queues.operator.auth import ADMIN, VIEWER, has_role
from queues.web.forms import YesNoField
from queues.zk.client import connected_client
from queues.zk.leader import leader_read

from .common import (
    HtmxHttpRequest,
    console_view,
    error_response,
    only_fields,
    redirect_after_post,
)

SHOWN = 50
MOST_SECONDS = 7 * 86400.0


class AlertRuleForm(forms.Form):
    # The page's checkboxes post "1"; yes/no words else, any other text a 400 (YesNoField).
    enabled = YesNoField(required=False)
    threshold = forms.FloatField(min_value=0, max_value=1e9)
    quiet_seconds = forms.FloatField(min_value=0, max_value=MOST_SECONDS)
    fuse = YesNoField(required=False)


def _leader() -> tuple[dict[str, Any] | None, str]:
    """Who evaluates the rules now, or why that cannot be said (the page must still show when
    ZooKeeper is down: that is when it matters)."""
    try:
        return leader_read(connected_client(), ROLE), ""
    except Exception as exc:
        return None, " ".join((str(exc) or type(exc).__name__).split())[:200]


def alerts_context(user: Any) -> dict[str, Any]:
    leader, leader_error = _leader()
    return {
        "rules": [{"row": r, "kind": KINDS[r.kind]} for r in rule_rows()],
        "titles": {name: kind.title for name, kind in KINDS.items()},
        "can_edit": has_role(user, ADMIN),
        "emails": alerting.email_recipients(),
        "webhook": alerting.webhook_shown(),
        "webhook_format": alerting.webhook_format(),
        "channels": alerting.channels(),
        "leader": leader,
        "leader_error": leader_error,
        "open_episodes": AlertEpisode.objects.filter(resolved__isnull=True)[:SHOWN],
        "recent": AlertEpisode.objects.filter(resolved__isnull=False)[:SHOWN],
        "messages_shown": AlertMessage.objects.select_related("episode")[:SHOWN],
        "waiting": AlertMessage.objects.filter(sent__isnull=True, failed=False).count(),
        "now": timezone.now(),
    }


@require_GET
@console_view(VIEWER)
def alerts(request: HtmxHttpRequest) -> HttpResponse:
    return render(request, "queues/alerts.html", alerts_context(request.user))


def _changes(row: AlertRule, data: dict[str, Any], fuse_allowed: bool) -> list[str]:
    said = []
    for name in ("enabled", "threshold", "quiet_seconds") + (("fuse",) if fuse_allowed else ()):
        before, after = getattr(row, name), data[name]
        if before != after:
            said.append(
                f"{name} {before:g} -> {after:g}"
                if isinstance(after, float)
                else f"{name} {before} -> {after}"
            )
            setattr(row, name, after)
    return said


@require_POST
@console_view(ADMIN)
def alert_rule_update(request: HtmxHttpRequest, kind: str) -> HttpResponse:
    if kind not in KINDS:
        raise Http404("no such alert rule")
    only_fields(request, AlertRuleForm)
    if "fuse" in request.POST and not KINDS[kind].fuse:
        # Left out, it was ignored and the rest changed: a script's fuse would do nothing.
        return error_response(
            request, f"alert rule {kind} not changed: fuse: this rule has no fuse", 400
        )
    form = AlertRuleForm(request.POST)
    if not form.is_valid():
        problems = "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in form.errors.items())
        return error_response(request, f"alert rule {kind} not changed: {problems}", 400)
    row = next(r for r in rule_rows() if r.kind == kind)
    changed = _changes(row, form.cleaned_data, KINDS[kind].fuse)
    if changed:
        row.updated = timezone.now()
        row.updated_by = request.user.get_username()
        with transaction.atomic():  # the rule and its entry, both or neither
            row.save()
            audit.record(
                user=request.user,
                action="alert-rule",
                kind="alert",
                item_id=kind,
                detail="; ".join(changed),
            )
        messages.success(request, f"Alert rule {KINDS[kind].title}: {'; '.join(changed)}")
    else:
        messages.info(request, f"Alert rule {KINDS[kind].title}: nothing changed")
    return redirect_after_post(reverse("alerts"))


@require_POST
@console_view(ADMIN)
def alert_test(request: HtmxHttpRequest) -> HttpResponse:
    only_fields(request)
    if not alerting.channels():
        return error_response(
            request,
            "no alert destination is configured: set MRT_ALERT_EMAIL or MRT_ALERT_WEBHOOK_URL",
            409,
        )
    sent = alerting.send_test(user=request.user)
    audit.record(
        user=request.user,
        action="alert-test",
        kind="alert",
        item_id="test",
        detail=", ".join(m.channel for m in sent),
    )
    for message in sent:
        if message.sent:
            messages.success(request, f"Test alert sent by {message.channel}")
        elif message.failed:
            messages.error(request, f"Test alert by {message.channel} refused: {message.error}")
        else:
            messages.error(
                request,
                f"Test alert by {message.channel} not sent yet ({message.error}); the alerts "
                "daemon tries again",
            )
    return redirect_after_post(reverse("alerts"))
