"""Mail over TLS, as a site's mail server is mostly reached: STARTTLS (``EMAIL_USE_TLS``) and
SMTPS (``EMAIL_USE_SSL``), against a real loopback SMTP server speaking TLS with a certificate
of its own for ``localhost`` (tests/steps/tls_servers.py).

The mail backend (queues/steps/smtp.py) hands its plain socket to the send's watchdog before TLS
is set up on it; these show that a message still goes out over TLS either way, checked against
the authority the operator trusts (Django's context is ``ssl.create_default_context()``: the
system's default paths, which ``SSL_CERT_FILE`` names), and that a server dripping its answer
over TLS is still cut off at the send's deadline, an outage waited out.
"""

from __future__ import annotations

import json
import smtplib
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from queues.core.transient import is_mail_outage, mail_refusal
from queues.steps.notify import MAIL_EXCHANGES, send
from tests.daemons.conftest import wait_for
from tests.steps.tls_servers import TLSMailServer, localhost_certificate, server_context

MODES = {"starttls": False, "smtps": True}  # implicit TLS?


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return localhost_certificate(tmp_path_factory.mktemp("tls"))


@contextmanager
def mail_server(
    certificate: tuple[Path, Path], mode: str, *, drip: float = 0.0, timeout: float = 5
) -> Iterator[TLSMailServer]:
    server = TLSMailServer(server_context(*certificate), implicit=MODES[mode], drip=drip)
    try:
        with override_settings(
            EMAIL_BACKEND="queues.steps.smtp.EmailBackend",
            EMAIL_HOST="localhost",  # the name the certificate is for
            EMAIL_PORT=server.port,
            EMAIL_USE_TLS=mode == "starttls",
            EMAIL_USE_SSL=mode == "smtps",
            EMAIL_HOST_USER="",
            EMAIL_HOST_PASSWORD="",
            EMAIL_TIMEOUT=timeout,
        ):
            yield server
    finally:
        server.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_message_goes_out_over_tls(
    certificate: tuple[Path, Path], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with mail_server(certificate, mode) as server:
        # Not an authority the system trusts: refused, nothing sent.
        with pytest.raises(ssl.SSLCertVerificationError, match="self-signed certificate") as bad:
            send(["depositor@example.org"], "Queued", "body")
        assert server.messages == []
        # The mail server's to fix (or the operator's trust): waited out, as an outage, not a
        # batch failed for its mail, the reason saying what to mend.
        assert is_mail_outage(bad.value)
        assert mail_refusal(bad.value) == "has a certificate the console does not trust"

        # The operator's authority, where OpenSSL's default paths look.
        monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
        assert send(["depositor@example.org"], "Queued", "the body") == 1
        [message] = server.messages
        assert message["tls"] is True
        assert message["to"] == ["depositor@example.org"]
        assert "the body" in message["data"]


@pytest.mark.parametrize("mode", MODES)
def test_a_server_dripping_its_answer_over_tls_is_cut_off_at_the_sends_deadline(
    certificate: tuple[Path, Path], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once TLS is up (at once for SMTPS, after STARTTLS otherwise) the server answers a byte
    every 0.05 s, never tripping the per-read timeout (0.5 s): the watchdog shuts the
    connection down at the send's deadline (MAIL_EXCHANGES x 0.5 s), an outage."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    with mail_server(certificate, mode, drip=0.05, timeout=0.5) as server:
        with pytest.raises(smtplib.SMTPServerDisconnected) as caught:
            send(["depositor@example.org"], "Queued", "body")
        limit = MAIL_EXCHANGES * 0.5
        # The watchdog's words: cut at the send's deadline, not by a read's timeout.
        assert str(caught.value) == f"mail exchange took longer than the limit of {limit:g}s"
        assert is_mail_outage(caught.value)
        wait_for(lambda: server.hung_up == 1, timeout=30)
        assert server.messages == []


def mail_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The mail settings a fresh process computes from ``env``."""
    code = (
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.EMAIL_USE_TLS, s.EMAIL_USE_SSL, s.EMAIL_TIMEOUT]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env={
            "PATH": "/usr/bin:/bin",
            "MRT_VAR_DIR": str(tmp_path),
            "DJANGO_SECRET_KEY": "x" * 50,
            "DJANGO_SETTINGS_MODULE": "mrtadmin.settings",
            "EMAIL_HOST": "mail.example.org",
            **env,
        },
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
    )


def test_smtps_is_a_setting_of_its_own(tmp_path: Path) -> None:
    """``EMAIL_USE_SSL`` was not read from the environment: a mail server that takes TLS only
    from the first byte (port 465) could not be used."""
    for env, expected in (
        ({}, [False, False, 60.0]),
        ({"EMAIL_USE_SSL": "1"}, [False, True, 60.0]),
        ({"EMAIL_TIMEOUT": "20"}, [False, False, 20.0]),  # was never read either
    ):
        done = mail_settings(tmp_path, **env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1]) == expected
    both = mail_settings(tmp_path, EMAIL_USE_TLS="1", EMAIL_USE_SSL="1")
    assert both.returncode != 0
    assert "EMAIL_USE_TLS (STARTTLS) and EMAIL_USE_SSL (SMTPS): set one or the other" in both.stderr
    for bad in ("abc", "0", "7200"):  # a time above 0, at most an hour: else it does not start
        refused = mail_settings(tmp_path, EMAIL_TIMEOUT=bad)
        assert refused.returncode != 0
        assert f"EMAIL_TIMEOUT must be a number above 0 and at most 3,600, got '{bad}'" in (
            refused.stderr
        )
