"""Delivery: a mail server or webhook that is down delays an alert and never loses it; one that
refuses it for good marks it refused; the webhook speaks Slack's format or plain JSON; a
message claimed by one alerts daemon is not sent by another."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from faults.test_mail_outage import SmtpServer

from queues.core.clock import clock_text
from queues.daemons import alerting
from queues.daemons.alerting import RETRY_FIRST, Evaluator, claim, deliver_due
from queues.models import AlertMessage

from .conftest import WEBHOOK_PATH, Webhook, a_moment, later, mails_with, only, pending_job

pytestmark = pytest.mark.django_db


def fire(zk: Any, evaluator: Evaluator) -> Any:
    only("oldest-pending", threshold=0.0, quiet_seconds=0.0)
    pending_job(zk)
    t = a_moment()
    assert len(evaluator.evaluate(zk=zk, now=t)) == 1
    return t


@pytest.mark.parametrize("outage", ["port-closed", "no-greeting", "451-recipient"])
def test_an_alert_waits_out_a_mail_server_outage_and_goes_once_it_is_back(
    zk: Any, smtp: SmtpServer, webhook: Webhook, evaluator: Evaluator, outage: str
) -> None:
    smtp.down()
    if outage == "no-greeting":
        smtp.silent = True
        smtp.up()
    elif outage == "451-recipient":
        smtp.rcpt = "451 4.3.0 try again later"
        smtp.up()
    t = fire(zk, evaluator)
    assert deliver_due(now=t) == 1  # the webhook's
    mail = AlertMessage.objects.get(channel="email")
    assert mail.sent is None and not mail.failed and mail.attempts == 1
    assert mail.error.startswith("mail:")
    assert mail.next_try == later(t, RETRY_FIRST)
    tried = smtp.connections
    assert deliver_due(now=later(t, RETRY_FIRST - 1)) == 0  # not due yet: the server is left be
    assert smtp.connections == tried

    smtp.down()
    smtp.silent, smtp.rcpt = False, "250 OK"
    smtp.up()
    assert deliver_due(now=later(t, RETRY_FIRST)) == 1
    assert len(mails_with(smtp, "ALERT")) == 1
    mail.refresh_from_db()
    assert mail.sent is not None and mail.attempts == 2 and mail.error == ""
    assert deliver_due(now=later(t, 3600)) == 0
    assert len(mails_with(smtp, "ALERT")) == 1


def test_a_mail_server_that_rejects_the_recipients_for_good_marks_the_alert_refused(
    zk: Any, smtp: SmtpServer, evaluator: Evaluator
) -> None:
    smtp.rcpt = "550 5.1.1 no such user"
    t = fire(zk, evaluator)
    assert deliver_due(now=t) == 0
    mail = AlertMessage.objects.get(channel="email")
    assert mail.failed and "550" in mail.error
    assert deliver_due(now=later(t, 3600)) == 0
    assert AlertMessage.objects.get(channel="email").attempts == 1


def test_a_mail_server_refusing_the_consoles_credentials_keeps_the_alert_waiting(
    zk: Any, smtp: SmtpServer, evaluator: Evaluator, settings: Any
) -> None:
    """535 (our EMAIL_HOST_USER/PASSWORD refused) is about the console, not the alert: it
    waits with the reason shown, as an outage does, and goes once the settings are mended."""
    settings.EMAIL_HOST_USER, settings.EMAIL_HOST_PASSWORD = "console", "wrong"
    smtp.auth = "535 5.7.8 Authentication credentials invalid"
    t = fire(zk, evaluator)
    deliver_due(now=t)
    mail = AlertMessage.objects.get(channel="email")
    assert mail.sent is None and not mail.failed and mail.attempts == 1
    assert "refuses the console's credentials" in mail.error and "535" in mail.error
    assert mail.next_try == later(t, RETRY_FIRST)

    smtp.auth = "235 2.7.0 Authentication successful"
    deliver_due(now=later(t, RETRY_FIRST))
    assert len(mails_with(smtp, "ALERT")) == 1
    mail.refresh_from_db()
    assert mail.sent is not None and mail.error == ""


def test_a_webhook_answering_500_is_tried_again_and_gets_the_alert_once(
    zk: Any, webhook: Webhook, evaluator: Evaluator
) -> None:
    webhook.status = 500
    t = fire(zk, evaluator)
    assert deliver_due(now=t) == 0
    message = AlertMessage.objects.get(channel="webhook")
    assert "HTTP 500" in message.error and not message.failed
    assert WEBHOOK_PATH not in message.error and "secret-token" not in message.error
    webhook.down()
    assert deliver_due(now=later(t, RETRY_FIRST)) == 0  # refused connection: waits again
    webhook.status = 200
    webhook.up()
    assert deliver_due(now=later(t, 3 * RETRY_FIRST)) == 1
    [post] = webhook.posts
    assert post["path"] == WEBHOOK_PATH and post["type"] == "application/json"
    assert list(post["json"]) == ["text"] and "ALERT" in post["json"]["text"]


def test_a_webhook_answering_404_marks_the_alert_refused_without_naming_its_secret(
    zk: Any, webhook: Webhook, evaluator: Evaluator
) -> None:
    webhook.status = 404
    t = fire(zk, evaluator)
    assert deliver_due(now=t) == 0
    message = AlertMessage.objects.get(channel="webhook")
    assert message.failed and "HTTP 404" in message.error
    assert "secret-token" not in message.error


@pytest.mark.parametrize("status", [404, 500, None])
def test_a_webhook_with_a_password_fails_without_naming_its_path_or_password(
    zk: Any, webhook: Webhook, evaluator: Evaluator, settings: Any, status: int | None
) -> None:
    """A webhook URL with user:password (a JSON receiver behind Basic authentication): the
    alert's error (on the alerts page, in the log) names its scheme and host only."""
    settings.MRT_ALERT_WEBHOOK_URL = webhook.url.replace("http://", "http://hook:s3cret@")
    if status is None:
        webhook.down()  # the connection refused
    else:
        webhook.status = status
    t = fire(zk, evaluator)
    assert deliver_due(now=t) == 0
    message = AlertMessage.objects.get(channel="webhook")
    assert "callback http://127.0.0.1/…" in message.error
    assert "secret-token" not in message.error and "s3cret" not in message.error


def test_the_plain_json_webhook_form_carries_the_alerts_fields(
    zk: Any, webhook: Webhook, evaluator: Evaluator, settings: Any
) -> None:
    settings.MRT_ALERT_WEBHOOK_FORMAT = "json"
    t = fire(zk, evaluator)
    deliver_due(now=t)
    [post] = webhook.posts
    body = post["json"]
    assert body["event"] == "fired" and body["rule"] == "oldest-pending"
    assert body["title"] == "Oldest Pending job" and body["key"] == ""
    assert body["summary"].startswith("the oldest Pending job has waited")
    assert body["resolved"] is None and body["opened"]
    assert body["console"].endswith("/alerts/")


def test_a_message_claimed_by_one_alerts_daemon_is_not_sent_by_another(
    zk: Any, smtp: SmtpServer, evaluator: Evaluator
) -> None:
    t = fire(zk, evaluator)
    message = AlertMessage.objects.get(channel="email")
    assert claim(message.pk, t)  # another daemon has it in hand
    assert deliver_due(now=t) == 0
    assert smtp.messages == []
    # A claim nobody finished (the daemon died) is taken again after it runs out.
    assert deliver_due(now=later(t, 180)) == 1
    assert len(smtp.messages) == 1


def test_a_slack_message_shows_outside_text_as_written() -> None:
    """Issue 52, item 13: an operator's hold reason went into Slack unescaped (``<!channel>``)."""
    from queues.daemons.alerting import SLACK, Draft, payload

    draft = Draft("hold", "held by <!channel>", "reason: a & b <https://x|y>", {})
    assert payload(draft, SLACK) == {
        "text": "held by &lt;!channel&gt;\nreason: a &amp; b &lt;https://x|y&gt;"
    }


def test_a_mail_outage_is_logged_when_it_begins_every_ten_minutes_and_when_it_ends(
    zk: Any,
    smtp: SmtpServer,
    webhook: Webhook,
    evaluator: Evaluator,
    caplog: Any,
    monkeypatch: Any,
) -> None:
    """An alert waiting for the mail server is tried again and again (15 s, doubling); the log
    says the wait once, then only every WAIT_SAID_EVERY or when its reason changes, not once a
    try: an outage of a night is a few lines, not one every round."""
    monkeypatch.setattr(alerting, "_channel_waits", alerting._ChannelWaits())
    smtp.down()
    t = fire(zk, evaluator)
    caplog.set_level(logging.DEBUG, logger="queues.alerts")
    tries = [t]
    mail = AlertMessage.objects.get(channel="email")
    for _ in range(6):
        deliver_due(now=tries[-1])
        mail.refresh_from_db()
        assert mail.sent is None and not mail.failed
        tries.append(mail.next_try)
    waits = [r for r in caplog.records if "waits: mail:" in r.getMessage()]
    assert len(waits) == 6
    said = [r for r in waits if r.levelno == logging.WARNING]
    quiet = [r for r in waits if r.levelno == logging.DEBUG]
    # Tries at 0, 15, 45, 105, 225 and 465 s: said at the first only.
    assert (len(said), len(quiet)) == (1, 5)
    assert tries[-1] - t >= alerting.WAIT_SAID_EVERY
    deliver_due(now=tries[-1])  # ten minutes on: said again
    waits = [r for r in caplog.records if "waits: mail:" in r.getMessage()]
    assert [r.levelno for r in waits[-2:]] == [logging.DEBUG, logging.WARNING]

    smtp.up()
    caplog.clear()
    assert deliver_due(now=later(tries[-1], 3600)) == 1
    back = [r.getMessage() for r in caplog.records if "takes messages again" in r.getMessage()]
    assert back == [
        f"alerts: the email channel takes messages again (it waited from {clock_text(t)})"
    ]
