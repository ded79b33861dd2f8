"""The alerts page in a real Chromium: reached from the navigation, a rule changed and saved,
a test alert sent to the real SMTP server and webhook receiver; a viewer gets no controls."""

from __future__ import annotations

from typing import Any

import pytest
from console.conftest import PASSWORD
from faults.test_mail_outage import SmtpServer

from queues.models import AlertRule
from tests.browser import logged_in, shot

from .conftest import Webhook

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_admin_changes_a_rule_and_sends_a_test_alert(
    browser: Any,
    live_server: Any,
    make_user: Any,
    zk: Any,
    smtp: SmtpServer,
    webhook: Webhook,
) -> None:
    make_user("admin", "ada")
    with logged_in(browser, live_server.url, "ada", PASSWORD) as page:
        page.click("nav >> text=Alerts")
        page.wait_for_url(f"{live_server.url}/alerts/")
        row = page.locator("#rule-failures")
        row.locator("input[name=threshold]").fill("4")
        row.locator("input[name=quiet_seconds]").fill("900")
        row.locator("button:has-text('Save')").click()
        page.wait_for_selector("#messages .message-success")
        assert "threshold 10 -> 4" in page.inner_text("#messages")
        rule = AlertRule.objects.get(kind="failures")
        assert (rule.threshold, rule.quiet_seconds) == (4.0, 900.0)
        assert page.locator("#rule-failures input[name=threshold]").input_value() == "4"

        page.click("#send-test")
        page.wait_for_selector("#messages .message-success")
        assert "Test alert sent by email" in page.inner_text("#messages")
        assert "Test alert sent by webhook" in page.inner_text("#messages")
        assert len(smtp.messages) == 1 and len(webhook.posts) == 1
        assert "sent" in page.inner_text("#alert-messages")
        shot(page, "alerts")


def test_a_viewer_sees_the_rules_without_controls(
    browser: Any, live_server: Any, make_user: Any, zk: Any
) -> None:
    make_user("viewer", "vic")
    with logged_in(browser, live_server.url, "vic", PASSWORD) as page:
        page.goto(f"{live_server.url}/alerts/")
        assert "Failures in 10 minutes" in page.inner_text("#alert-rules")
        assert page.locator("#send-test").count() == 0
        assert page.locator("#alert-rules button").count() == 0
