"""Django's SMTP backend with its connection under the exchange's deadline.

Django's backend, and smtplib under it, bound each socket operation (``EMAIL_TIMEOUT``), not
the exchange: a mail server that sends a byte within every timeout held a send, and the
daemon's thread with it, for as long as it liked. Here each connection's socket is made by
``netpolicy.connect_in_time`` (the mail server's name looked up within the time the exchange
has left) and handed to ``netpolicy``'s watchdog as it is made (before TLS), and
``notify.send`` runs the exchange inside ``exchange_deadline``: when the deadline passes the
socket is shut down, and the send fails as a dropped connection, a mail outage the caller
waits out.
"""

from __future__ import annotations

import smtplib
import socket
from typing import Any

from django.core.mail.backends.smtp import EmailBackend as DjangoEmailBackend

from queues.steps.netpolicy import connect_in_time, watch_exchange


class _SMTP(smtplib.SMTP):
    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        # smtplib's own, but the name looked up within the exchange's time left too.
        if timeout is not None and not timeout:
            raise ValueError("Non-blocking socket (timeout=0) is not supported")
        sock = connect_in_time(host, port, timeout, source=self.source_address)
        watch_exchange(sock)
        return sock


class _SMTPSSL(smtplib.SMTP_SSL, _SMTP):
    """``SMTP_SSL`` whose plain socket, made by ``_SMTP`` before the TLS handshake, is watched."""


class EmailBackend(DjangoEmailBackend):
    """``EMAIL_BACKEND`` when ``EMAIL_HOST`` is set (``mrtadmin/settings.py``)."""

    @property
    def connection_class(self) -> Any:
        return _SMTPSSL if self.use_ssl else _SMTP
