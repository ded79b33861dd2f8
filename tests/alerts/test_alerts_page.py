"""The alerts page through Django's client: everyone with a role reads it, only admins change
rules or send a test alert (POST with CSRF), every change is audited, and text from the queue
(a collection name in an alert) is escaped."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from faults.test_mail_outage import SmtpServer

from queues.models import AlertEpisode, AlertMessage, AlertRule, AuditEntry

from .conftest import Webhook, set_rule

pytestmark = pytest.mark.django_db


def test_a_viewer_reads_the_rules_and_the_alerts_but_is_offered_no_change(
    zk: Any, viewer: Client
) -> None:
    AlertEpisode.objects.create(
        kind="collection-failures",
        key="<b>x</b>",
        summary="3 jobs of collection <script>alert(1)</script> failed",
        opened=timezone.now(),
        last_seen=timezone.now(),
    )
    page = viewer.get(reverse("alerts"))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'href="/alerts/"' in html  # in the navigation
    for title in ("Failures in 10 minutes", "Jobs stuck", "ZooKeeper unreachable"):
        assert title in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert(1)" not in html
    assert "<td>Failures in one collection</td>" in html  # the open alert, by its rule's title
    assert "send-test" not in html and "rule-form-" not in html
    assert "no alerts daemon is running" in html


@pytest.mark.parametrize("who", ["viewer", "operator"])
def test_only_an_admin_may_change_a_rule(zk: Any, who: str, request: Any) -> None:
    client = request.getfixturevalue(who)
    set_rule("failures", threshold=10.0)
    answer = client.post(
        reverse("alert-rule", args=["failures"]),
        {"enabled": "1", "threshold": "1", "quiet_seconds": "5"},
    )
    assert answer.status_code == 403
    assert AlertRule.objects.get(kind="failures").threshold == 10.0
    assert client.post(reverse("alert-test")).status_code == 403


def test_an_admin_changes_a_rule_and_the_change_is_audited(zk: Any, admin: Client) -> None:
    admin.get(reverse("alerts"))  # the rows are made with their defaults
    answer = admin.post(
        reverse("alert-rule", args=["collection-failures"]),
        {"enabled": "1", "threshold": "3", "quiet_seconds": "120", "fuse": "1"},
    )
    assert answer.status_code == 303 and answer["Location"] == reverse("alerts")
    row = AlertRule.objects.get(kind="collection-failures")
    assert (row.enabled, row.threshold, row.quiet_seconds, row.fuse) == (True, 3.0, 120.0, True)
    assert row.updated_by == "admin-user"
    entry = AuditEntry.objects.get(action="alert-rule", item_id="collection-failures")
    assert "threshold 5 -> 3" in entry.detail and "fuse False -> True" in entry.detail
    # Unchecked boxes turn a rule off.
    admin.post(reverse("alert-rule", args=["stuck"]), {"threshold": "0", "quiet_seconds": "600"})
    stuck = AlertRule.objects.get(kind="stuck")
    assert stuck.enabled is False and stuck.fuse is False


@pytest.mark.parametrize("fuse", ["1", "0", ""])
def test_a_fuse_for_a_rule_without_one_is_refused_and_nothing_changes(
    zk: Any, admin: Client, fuse: str
) -> None:
    """A fuse posted for a rule that has none was left out and the rest of the rule changed (a
    test asked for that): now the whole post is a 400 naming the field, the rule as it was."""
    set_rule("stuck", threshold=10.0, enabled=True)
    before = AlertRule.objects.filter(kind="stuck").values().get()
    answer = admin.post(
        reverse("alert-rule", args=["stuck"]),
        {"threshold": "0", "quiet_seconds": "600", "fuse": fuse},
    )
    assert answer.status_code == 400
    assert "alert rule stuck not changed: fuse: this rule has no fuse" in answer.content.decode()
    assert AlertRule.objects.filter(kind="stuck").values().get() == before
    assert not AuditEntry.objects.filter(action="alert-rule").exists()


def test_a_rule_change_that_does_not_validate_changes_nothing(zk: Any, admin: Client) -> None:
    set_rule("failures", threshold=10.0)
    bad = admin.post(
        reverse("alert-rule", args=["failures"]),
        {"enabled": "1", "threshold": "-1", "quiet_seconds": "x"},
    )
    assert bad.status_code == 400
    assert AlertRule.objects.get(kind="failures").threshold == 10.0
    unknown = admin.post("/alerts/rules/no-such-rule/", {"threshold": "1", "quiet_seconds": "1"})
    assert unknown.status_code == 404


def test_a_rule_change_without_the_csrf_token_is_refused(zk: Any, make_user: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("admin", "csrf-admin"))
    set_rule("failures", threshold=10.0)
    answer = client.post(
        reverse("alert-rule", args=["failures"]),
        {"enabled": "1", "threshold": "1", "quiet_seconds": "1"},
    )
    assert answer.status_code == 403
    assert AlertRule.objects.get(kind="failures").threshold == 10.0


def test_the_test_button_sends_to_every_destination_and_says_so(
    zk: Any, admin: Client, smtp: SmtpServer, webhook: Webhook
) -> None:
    answer = admin.post(reverse("alert-test"), follow=True)
    assert answer.status_code == 200
    html = answer.content.decode()
    assert "Test alert sent by email" in html and "Test alert sent by webhook" in html
    [mail] = smtp.messages
    assert "A test alert sent by admin-user" in mail["data"]
    [post] = webhook.posts
    assert "test alert" in post["json"]["text"]
    assert AlertMessage.objects.filter(event="test", sent__isnull=False).count() == 2
    assert AuditEntry.objects.filter(action="alert-test").count() == 1


def test_the_test_button_says_when_the_mail_server_cannot_take_it_now(
    zk: Any, admin: Client, smtp: SmtpServer
) -> None:
    smtp.down()
    html = admin.post(reverse("alert-test"), follow=True).content.decode()
    assert "Test alert by email not sent yet" in html and "the alerts daemon tries again" in html
    assert AlertMessage.objects.get(event="test").sent is None


def test_the_test_button_without_a_destination_says_what_to_set(zk: Any, admin: Client) -> None:
    answer = admin.post(reverse("alert-test"))
    assert answer.status_code == 409
    assert "MRT_ALERT_EMAIL" in answer.content.decode()


@pytest.mark.parametrize(
    "posted, named",
    [({"enabled": "maybe"}, "enabled"), ({"enabled": "1", "fuse": "false-ish"}, "fuse")],
)
def test_a_yes_no_box_takes_yes_or_no_words_only(
    zk: Any, admin: Client, posted: dict[str, str], named: str
) -> None:
    """Django's BooleanField read any text but "false" and "0" as yes: ``fuse=maybe`` turned the
    fuse on. Now a yes/no word, as a checkbox or a script posts it, or a 400 naming the field."""
    set_rule("collection-failures", threshold=5.0, enabled=False, fuse=False)
    answer = admin.post(
        reverse("alert-rule", args=["collection-failures"]),
        {"threshold": "1", "quiet_seconds": "60", **posted},
    )
    assert answer.status_code == 400 and named in answer.content.decode()
    row = AlertRule.objects.get(kind="collection-failures")
    assert (row.enabled, row.threshold, row.fuse) == (False, 5.0, False)
    assert not AuditEntry.objects.filter(action="alert-rule").exists()
    # "no" is no (it turned the rule on), "on" (a checkbox without a value) yes.
    admin.post(
        reverse("alert-rule", args=["collection-failures"]),
        {"enabled": "no", "threshold": "1", "quiet_seconds": "60", "fuse": "on"},
    )
    row = AlertRule.objects.get(kind="collection-failures")
    assert (row.enabled, row.fuse) == (False, True)
