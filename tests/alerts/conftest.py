"""Fixtures for the alerts: a real SMTP server and a real webhook receiver on loopback, the
alert destinations pointed at them, and helpers to make failed, pending and finished items in
the test's own ZooKeeper chroot."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

# The console's users and roles, for the page tests.
from console.conftest import admin, make_user, operator, viewer  # noqa: F401
from daemons.conftest import DEMO
from django.test import override_settings
from django.utils import timezone
from faults.test_mail_outage import SmtpServer

# A PostgreSQL of the tests' own that a test may stop, for the database-down alert.
from faults.test_transient_database import on_pg, own_pg  # noqa: F401

from queues.core.states import JOB_STEPS
from queues.daemons import registry  # noqa: F401  (hands the owned steps to the rules)
from queues.daemons.alert_rules import KINDS
from queues.daemons.alerting import Evaluator
from queues.models import AlertRule
from queues.services.zkserver import free_port
from queues.zk.batches import batch_create
from queues.zk.jobs import job_create, job_transition
from queues.zk.records import Job

WEBHOOK_PATH = "/services/T000/B000/secret-token"


@dataclass
class Webhook:
    """An HTTP server on 127.0.0.1 that keeps every JSON body POSTed to it and answers
    ``status``; ``down`` closes its port, ``up`` opens it again on the same one."""

    port: int
    status: int = 200
    posts: list[dict[str, Any]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{WEBHOOK_PATH}"

    def up(self) -> None:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if hook.status < 300:
                    hook.posts.append(
                        {
                            "path": self.path,
                            "type": self.headers.get("Content-Type"),
                            "json": json.loads(body),
                        }
                    )
                self.send_response(hook.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    server = SmtpServer(free_port())
    server.up()
    with override_settings(
        EMAIL_BACKEND="queues.steps.smtp.EmailBackend",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=server.port,
        EMAIL_USE_TLS=False,
        EMAIL_HOST_USER="",
        EMAIL_HOST_PASSWORD="",
        EMAIL_TIMEOUT=2,
        MRT_ALERT_EMAIL="oncall@example.org, merritt-team@example.org",
    ):
        try:
            yield server
        finally:
            server.down()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook(free_port())
    hook.up()
    with override_settings(MRT_ALERT_WEBHOOK_URL=hook.url, MRT_ALERT_WEBHOOK_FORMAT="slack"):
        try:
            yield hook
        finally:
            hook.down()


@pytest.fixture
def evaluator(db: Any) -> Evaluator:
    return Evaluator(name="test-evaluator")


def set_rule(kind: str, **values: Any) -> None:
    """Change one rule's row (made with its defaults when missing), as an admin would."""
    rule = KINDS[kind]
    row, _made = AlertRule.objects.get_or_create(
        kind=kind, defaults={"threshold": rule.threshold, "quiet_seconds": rule.quiet}
    )
    for name, value in values.items():
        setattr(row, name, value)
    row.save()


def only(*kinds: str, **values: Any) -> None:
    """Enable just ``kinds`` (with ``values``), so a test hears only the rule it is about."""
    for kind in KINDS:
        set_rule(kind, enabled=kind in kinds, **(values if kind in kinds else {}))


def later(now: datetime, seconds: float) -> datetime:
    return now + timedelta(seconds=seconds)


def a_moment() -> datetime:
    return timezone.now()


def failed_job(zk: Any, profile: str = DEMO) -> Job:
    """A job that failed in Downloading just now."""
    batch = batch_create(zk, submission={"profile": profile, "submitter": "tester"})
    job = job_create(zk, bid=batch.bid, configuration={"profile": profile, "submitter": "t"})
    for step in JOB_STEPS[1:4]:
        job = job_transition(zk, job, step)
    return job_transition(zk, job, "Failed", message="downloading: HTTP 404")


def pending_job(zk: Any, profile: str = DEMO) -> Job:
    batch = batch_create(zk, submission={"profile": profile, "submitter": "tester"})
    return job_create(zk, bid=batch.bid, configuration={"profile": profile, "submitter": "t"})


def mails_with(smtp: SmtpServer, text: str) -> list[dict[str, Any]]:
    return [m for m in smtp.messages if text in m.get("data", "")]
