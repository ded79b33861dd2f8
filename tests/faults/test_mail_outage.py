"""A mail server outage is not a batch's failure (issue 23, "transient is not permanent").

A real SMTP responder on loopback (a socket speaking the protocol, stdlib only) stands for the
site's mail server. While nothing listens on its port, while it accepts and never greets, or
while it answers 4xx, Batch Reporting leaves the batch in Reporting with the reason in its
result, its report written once; when the server takes mail again the batch completes with
exactly one summary. A 5xx rejection of the recipients still fails the batch, as before.
"""

from __future__ import annotations

import contextlib
import email
import json
import smtplib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from daemons.conftest import DEMO, wait_for
from django.test import override_settings

from queues.core.states import JOB_STEPS
from queues.daemons.batch_reporting import BatchReporting
from queues.services.zkserver import free_port
from queues.zk.batches import batch_create, batch_load, batch_transition
from queues.zk.jobs import job_create, job_transition


@dataclass
class SmtpServer:
    """A minimal SMTP server on 127.0.0.1:``port``: ``up`` listens, ``down`` closes the port.

    ``rcpt`` is its answer to every RCPT TO ("250 OK", "451 ...", "550 ..."), ``mail_from`` to
    every MAIL FROM; ``auth``, when set, is advertised (AUTH ``mechanisms``) and is its answer to
    every AUTH ("535 5.7.8 ...", "235 2.7.0 ..."); ``helo``, when set, its answer to every EHLO
    and HELO ("550 ..."); ``silent`` makes
    it accept connections and never greet; ``drip`` (seconds) makes it greet a byte at a time,
    a greeting of ever more lines that never ends. Every message it accepts is kept in
    ``messages``; ``hung_up`` counts the clients that closed on a dripping greeting."""

    port: int
    rcpt: str = "250 OK"
    mail_from: str = "250 OK"
    auth: str = ""
    mechanisms: str = "PLAIN LOGIN"
    helo: str = ""
    silent: bool = False
    drip: float = 0.0
    hung_up: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)
    connections: int = 0
    _listener: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _open: list[socket.socket] = field(default_factory=list)

    def up(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(8)
        self._listener = listener
        thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def down(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        for conn in self._open:
            with contextlib.suppress(OSError):
                conn.close()
        self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn, conn.makefile("rb") as lines:
            if self.silent:
                conn.recv(1)  # until the client gives up and closes
                return
            if self.drip:
                try:
                    while True:
                        for byte in b"220-mail.test\r\n":
                            conn.sendall(bytes([byte]))
                            time.sleep(self.drip)
                except OSError:
                    self.hung_up += 1
                    return
            conn.sendall(b"220 mail.test ESMTP\r\n")
            message: dict[str, Any] = {"to": []}
            for raw in lines:
                command = raw.decode("ascii", "replace").strip()
                verb = command.split(" ", 1)[0].split(":", 1)[0].upper()
                if verb in ("EHLO", "HELO") and self.helo:
                    conn.sendall(f"{self.helo}\r\n".encode())
                elif verb == "EHLO" and self.auth:
                    conn.sendall(f"250-mail.test\r\n250 AUTH {self.mechanisms}\r\n".encode())
                elif verb in ("EHLO", "HELO"):
                    conn.sendall(b"250 mail.test\r\n")
                elif verb == "AUTH" and self.auth:
                    conn.sendall(f"{self.auth}\r\n".encode())
                elif verb == "MAIL":
                    message = {"from": command, "to": []}
                    conn.sendall(f"{self.mail_from}\r\n".encode())
                elif verb == "RCPT":
                    message["to"].append(command.split(":", 1)[1].strip(" <>"))
                    conn.sendall(f"{self.rcpt}\r\n".encode())
                elif verb == "DATA":
                    conn.sendall(b"354 go on\r\n")
                    body = []
                    for data in lines:
                        if data in (b".\r\n", b".\n"):
                            break
                        body.append(data)
                    message["data"] = b"".join(body).decode("utf-8", "replace")
                    self.messages.append(message)
                    conn.sendall(b"250 queued\r\n")
                elif verb == "QUIT":
                    conn.sendall(b"221 bye\r\n")
                    return
                elif verb == "RSET":
                    conn.sendall(b"250 OK\r\n")
                else:
                    conn.sendall(b"502 not here\r\n")


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    server = SmtpServer(free_port())
    with override_settings(
        EMAIL_BACKEND="queues.steps.smtp.EmailBackend",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=server.port,
        EMAIL_USE_TLS=False,
        EMAIL_HOST_USER="",
        EMAIL_HOST_PASSWORD="",
        EMAIL_TIMEOUT=2,
    ):
        try:
            yield server
        finally:
            server.down()


def reporting_batch(zk: Any) -> str:
    """A batch in Reporting whose one job completed."""
    batch = batch_create(
        zk, submission={"profile": DEMO, "submitter": "depositor@example.org", "title": "Mine"}
    )
    job = job_create(zk, bid=batch.bid, configuration={"profile": DEMO})
    for step in JOB_STEPS[1:]:
        job = job_transition(zk, job, step)
    batch = batch_transition(zk, batch_load(zk, batch.bid), "Processing")
    batch_transition(zk, batch, "Reporting")
    return batch.bid


def report_versions(zk: Any, bid: str) -> int:
    _data, stat = zk.get(f"/batches/{bid}/status-report")
    return int(stat.version)


@pytest.mark.parametrize("outage", ["port-closed", "no-greeting", "451-recipient"])
def test_a_mail_server_outage_leaves_the_batch_waiting_and_it_completes_with_one_mail(
    zk: Any, smtp: SmtpServer, outage: str
) -> None:
    bid = reporting_batch(zk)
    if outage == "no-greeting":
        smtp.silent = True
        smtp.up()
    elif outage == "451-recipient":
        smtp.rcpt = "451 4.3.0 try again later"
        smtp.up()
    reporting = BatchReporting(zk=zk, poll=0.05)
    waits = []
    for _attempt in range(3):
        assert reporting.run_once() is False
        assert reporting.last is not None
        assert reporting.last.outcome == "waiting", reporting.last.line()
        waits.append(reporting.last.detail)
        batch = batch_load(zk, bid)
        assert batch.state == "Reporting"
        assert batch.report is not None and batch.report["mailed"] is False
    assert all(w.startswith("mail server unavailable:") for w in waits), waits
    # The report was written by the first attempt and merely reused by the others.
    written = report_versions(zk, bid)
    assert smtp.messages == []

    smtp.down()
    smtp.silent, smtp.rcpt = False, "250 OK"
    smtp.up()
    assert wait_for(reporting.run_once, timeout=30)
    batch = batch_load(zk, bid)
    assert batch.state == "Completed"
    assert batch.report["mailed"] is True
    [mail] = smtp.messages
    assert sorted(mail["to"]) == ["depositor@example.org", "merritt-demo@example.org"]
    assert bid in mail["data"]
    # One merge more: "mailed"; the report itself was not written again.
    assert report_versions(zk, bid) == written + 1
    # Nothing is mailed again once the batch has moved on.
    assert reporting.run_once() is False
    assert len(smtp.messages) == 1


@pytest.mark.parametrize(
    ("refusal", "code"),
    [("login", "535"), ("sender", "530"), ("recipients", "530")],
)
def test_a_mail_server_refusing_the_consoles_credentials_leaves_the_batch_waiting(
    zk: Any, smtp: SmtpServer, refusal: str, code: str
) -> None:
    """535 (our EMAIL_HOST_USER/PASSWORD refused) or 530 (authentication required, we sent
    none) is about the console: every batch would meet it, so it failed each batch's summary
    step. It waits now, as an outage does, the reason shown, and the batch completes with one
    mail once the settings are mended."""
    bid = reporting_batch(zk)
    credentials = {"EMAIL_HOST_USER": "console", "EMAIL_HOST_PASSWORD": "wrong"}
    if refusal == "login":
        smtp.auth = "535 5.7.8 Authentication credentials invalid"
    elif refusal == "sender":
        credentials = {}
        smtp.mail_from = "530 5.7.0 Authentication required"
    else:
        credentials = {}
        smtp.rcpt = "530 5.7.0 Authentication required"
    smtp.up()
    reporting = BatchReporting(zk=zk, poll=0.05)
    with override_settings(**credentials):
        for _attempt in range(2):
            assert reporting.run_once() is False
            assert reporting.last is not None
            assert reporting.last.outcome == "waiting", reporting.last.line()
            detail = reporting.last.detail
            assert detail.startswith("mail server refuses the console's credentials:"), detail
            assert code in detail
            batch = batch_load(zk, bid)
            assert batch.state == "Reporting"
            assert batch.report is not None and batch.report["mailed"] is False
    assert smtp.messages == []

    # Mended: the server takes the credentials (or no longer asks for any).
    smtp.auth, smtp.mail_from, smtp.rcpt = "235 2.7.0 Authentication successful", "250 OK", "250 OK"
    with override_settings(**credentials):
        assert wait_for(reporting.run_once, timeout=30)
    assert batch_load(zk, bid).state == "Completed"
    assert len(smtp.messages) == 1


@pytest.mark.parametrize(
    ("refusal", "reason"),
    [
        ("no-auth", "mail server offers no AUTH, and EMAIL_HOST_USER is set:"),
        ("no-starttls", "mail server offers no STARTTLS, and EMAIL_USE_TLS is set:"),
        ("no-mechanism", "mail server offers no AUTH mechanism the console can use"),
        ("greeting", "mail server refuses the console's greeting (EHLO/HELO):"),
        ("sender", "mail server refuses the console's sender (MRT_MAIL_FROM):"),
    ],
)
def test_a_mail_server_refusing_what_every_message_would_meet_leaves_the_batch_waiting(
    zk: Any, smtp: SmtpServer, refusal: str, reason: str
) -> None:
    """A server that offers no AUTH while the settings give a user, no STARTTLS while they ask
    for it, only AUTH mechanisms smtplib cannot speak, or that refuses our EHLO/HELO or our
    configured sender: every message would meet it alike, so it is the console's configuration
    to mend, not the batch's failure (smtplib's SMTPNotSupportedError, SMTPException,
    SMTPHeloError, SMTPSenderRefused failed the batch). The batch waits in Reporting, the reason
    naming what the server did not offer or refused; once the server is mended (restarted
    offering it) or the setting is, the next try mails the summary once."""
    bid = reporting_batch(zk)
    mail_settings: dict[str, Any] = {}
    if refusal == "no-auth":
        mail_settings = {"EMAIL_HOST_USER": "console", "EMAIL_HOST_PASSWORD": "secret"}
    elif refusal == "no-starttls":
        mail_settings = {"EMAIL_USE_TLS": True}
    elif refusal == "no-mechanism":
        mail_settings = {"EMAIL_HOST_USER": "console", "EMAIL_HOST_PASSWORD": "secret"}
        smtp.auth = "235 2.7.0 Authentication successful"
        smtp.mechanisms = "XOAUTH2 GSSAPI"
    elif refusal == "greeting":
        smtp.helo = "550 5.7.1 Client host rejected"
    else:
        smtp.mail_from = "553 5.7.1 Sender address rejected: not owned by user"
    smtp.up()
    reporting = BatchReporting(zk=zk, poll=0.05)
    with override_settings(**mail_settings):
        for _attempt in range(2):
            assert reporting.run_once() is False
            assert reporting.last is not None
            assert reporting.last.outcome == "waiting", reporting.last.line()
            assert reporting.last.detail.startswith(reason), reporting.last.detail
            batch = batch_load(zk, bid)
            assert batch.state == "Reporting"
            assert batch.report is not None and batch.report["mailed"] is False
    assert smtp.messages == []

    # Mended: the server restarted offering what was asked (AUTH, a mechanism of ours, our
    # greeting and sender taken); STARTTLS by the setting, this server speaking no TLS.
    smtp.down()
    smtp.auth, smtp.mechanisms = "235 2.7.0 Authentication successful", "PLAIN LOGIN"
    smtp.helo, smtp.mail_from = "", "250 OK"
    smtp.up()
    if refusal == "no-starttls":
        mail_settings = {"EMAIL_USE_TLS": False}
    with override_settings(**mail_settings):
        assert wait_for(reporting.run_once, timeout=30)
    assert batch_load(zk, bid).state == "Completed"
    assert len(smtp.messages) == 1


@pytest.mark.parametrize(
    ("command", "answer"),
    [("rcpt", "550 5.1.1 no such user"), ("mail_from", "552 5.3.4 Message size exceeds limit")],
)
def test_a_recipient_the_mail_server_rejects_for_good_still_fails_the_batch(
    zk: Any, smtp: SmtpServer, command: str, answer: str
) -> None:
    """A recipient refused, or a message too large for the server (552 to MAIL FROM, RFC 1870:
    this message's size, not the sender): the message's own failure."""
    bid = reporting_batch(zk)
    setattr(smtp, command, answer)
    smtp.up()
    reporting = BatchReporting(zk=zk, poll=0.05)
    reporting.run_once()
    assert reporting.last is not None
    assert reporting.last.outcome == "failed", reporting.last.line()
    batch = batch_load(zk, bid)
    assert batch.state == "Failed"
    assert "summary mail not sent" in batch.status.message
    assert smtp.messages == []


@pytest.mark.slow
def test_a_zookeeper_cut_between_the_mail_and_its_record_sends_no_second_mail(
    zk: Any, smtp: SmtpServer, proxy: Any, proxied_client: Any
) -> None:
    """The summary went out, and the write recording it (``mailed``) is dropped on its way to
    ZooKeeper with the connection: the daemon records it once the client has reconnected
    (its session lives on) instead of leaving the batch to a claim that mails again. The
    chaos run met this as a ZooKeeper restart right after a mail: two summaries."""
    from tests.zkproxy import MULTI, request

    bid = reporting_batch(zk)
    smtp.up()
    cut_off = proxied_client()
    session = cut_off.client_id[0]
    # The record goes in a multi fenced by the batch's lock (``batches._Fence``).
    proxy.cut_before(request(MULTI, b"status-report", b'"mailed":true'))
    reporting = BatchReporting(zk=cut_off, poll=0.05)
    assert reporting.run_once() is True, reporting.last and reporting.last.line()
    assert proxy.fired.is_set()  # the first record of the mail never reached the server
    assert cut_off.client_id[0] == session  # the same session, reconnected
    batch = batch_load(zk, bid)
    assert batch.state == "Completed"
    assert batch.report is not None and batch.report["mailed"] is True
    assert len(smtp.messages) == 1
    assert BatchReporting(zk=zk, poll=0.05).run_once() is False
    assert len(smtp.messages) == 1


def test_a_mail_server_that_drips_its_greeting_is_cut_off_at_the_sends_deadline(
    smtp: SmtpServer,
) -> None:
    """A byte every 0.05 s never trips the per-read timeout (0.5 s); the whole exchange's
    deadline (MAIL_EXCHANGES x 0.5 s) shuts the connection down, and that is an outage."""
    from queues.core.transient import is_mail_outage
    from queues.steps.notify import MAIL_EXCHANGES, send

    smtp.drip = 0.05
    smtp.up()
    with (
        override_settings(EMAIL_TIMEOUT=0.5),
        pytest.raises(smtplib.SMTPServerDisconnected) as caught,
    ):
        send(["depositor@example.org"], "Queued", "body")
    limit = MAIL_EXCHANGES * 0.5
    assert str(caught.value) == f"mail exchange took longer than the limit of {limit:g}s"
    assert is_mail_outage(caught.value)
    wait_for(lambda: smtp.hung_up == 1, timeout=30)
    assert smtp.connections == 1 and smtp.messages == []


def test_outside_text_in_a_subject_or_a_recipient_does_not_stop_the_mail(
    smtp: SmtpServer,
) -> None:
    """A batch title with a newline (Django refused the header, and the batch's step failed
    on it) goes as one line; a submitter written as two addresses is left out, and the
    profile's contact still gets the mail."""
    from queues.steps.notify import send

    smtp.up()
    sent = send(
        ["depositor@example.org,other@evil.example", " contact@example.org "],
        "Merritt batch queued: Thesis\r\nBcc: attacker@evil.example\x1b[2J",
        "body",
    )
    assert sent == 1
    [message] = smtp.messages
    assert message["to"] == ["contact@example.org"]
    headers = message["data"].split("\r\n\r\n", 1)[0].replace("\r\n ", " ").split("\r\n")
    [subject] = [h for h in headers if h.startswith("Subject:")]
    assert subject == "Subject: Merritt batch queued: Thesis Bcc: attacker@evil.example\\x1b[2J"
    assert not any(h.lower().startswith("bcc:") for h in headers)


def test_a_submission_names_its_depositor_only_by_one_address_each() -> None:
    from queues.daemons.clients import recipients

    submission = {"submitter": "dep@example.org,x@evil.example", "email": "a@b.example"}
    assert recipients(submission, None) == ["a@b.example"]
    assert recipients({"submitter": "  dep@example.org "}, None) == ["dep@example.org"]
    assert recipients({"submitter": "Dep <dep@example.org>"}, None) == []


def test_the_mail_servers_name_is_looked_up_within_the_sends_deadline(
    smtp: SmtpServer, held_lookups: tuple[threading.Event, list[str]]
) -> None:
    """smtplib looked ``EMAIL_HOST`` up before any socket existed for the watchdog, so the
    system resolver's timeouts came on top of the send's deadline. The lookup is now given up
    when the exchange has no time left (a temporary failure: an outage, waited out), and a name
    that answers is reached as before (``held_lookups``: the system resolver cannot be pointed
    at a loopback server for one process)."""
    from queues.core.transient import is_mail_outage
    from queues.steps.notify import send

    release, _threads = held_lookups
    smtp.up()
    with (
        override_settings(EMAIL_HOST="mail.slow.example", EMAIL_TIMEOUT=0.5),
        pytest.raises(socket.gaierror) as caught,
    ):
        send(["depositor@example.org"], "Queued", "body")
    assert not release.is_set()  # back while the lookup is still held
    assert caught.value.errno == socket.EAI_AGAIN and is_mail_outage(caught.value)
    assert "took longer than 0.5s" in str(caught.value)
    with override_settings(EMAIL_HOST="mail.two.example"):  # the second address answers
        assert send(["depositor@example.org"], "Queued", "body") == 1
    assert len(smtp.messages) == 1 and smtp.connections == 1


def test_the_report_reaches_the_mail_server_with_merritts_subject_and_attachment(
    zk: Any, smtp: SmtpServer
) -> None:
    """What the mail server receives: Merritt's subject and its ``completed.json``, labelled
    ``application/json; header=present`` (docs/merritt-services.md, "Mail")."""
    bid = reporting_batch(zk)
    uuid = batch_load(zk, bid).uuid
    smtp.up()
    assert wait_for(BatchReporting(zk=zk, poll=0.05).run_once, timeout=30)
    [mail] = smtp.messages
    parsed = email.message_from_string(mail["data"])
    subject = " ".join(str(parsed["Subject"]).split())
    assert subject.startswith(f"Ingest: OK -- Submission Processed: {uuid}; Merritt batch {bid}")
    [attached] = [p for p in parsed.walk() if p.get_filename()]
    assert attached.get_filename() == "completed.json"
    assert attached["Content-Type"] == "application/json; header=present"
    assert attached.get_content_disposition() == "attachment"
    assert len(json.loads(attached.get_payload(decode=True))["completedJobs"]) == 1
