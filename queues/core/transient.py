"""Which errors an outage causes, and so a wait cures: the database away or locked, the disk full.

A step that meets one of these leaves its item where it is and tries again later; a page
answers 503. Everything else is a real failure of the work (or a bug) and stays one. The rules
are exact on purpose: an ``IntegrityError`` is a wrong write whatever the server's state, and a
SQLite "no such table" is a missing migration, not an outage.

Django wraps a driver's exception in its own class and chains the driver's as ``__cause__``;
a step may wrap either in its own error the same way. So every rule looks along the chain of
causes (and at an implicit ``__context__`` unless it was suppressed) for the driver's or the
operating system's own exception.

Pure: the standard library and the drivers' exception classes only, no Django, no kazoo.
"""

from __future__ import annotations

import contextlib
import errno
import smtplib
import socket
import sqlite3
import ssl
import threading
import time
from collections.abc import Iterator

from queues.core.per_key import PerKey
from queues.core.per_thread import PerThread

try:  # PostgreSQL's driver is installed with the project; the rules stand without it.
    import psycopg
except ImportError:  # pragma: no cover - psycopg is in requirements.txt
    psycopg = None  # type: ignore[assignment]

# The operating system's answers that mean "not now" rather than "never": space or quota on
# the working disk, and file handles (freed when other work ends).
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
HANDLE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})

# SQLite primary result codes a wait cures: another writer holds the file (BUSY, LOCKED), the
# disk is full or failing for now (FULL, IOERR), the file cannot be opened at the moment
# (CANTOPEN: its folder unmounted, no file handles), the WAL lock protocol raced (PROTOCOL).
SQLITE_TRANSIENT = frozenset({5, 6, 10, 13, 14, 15})

# PostgreSQL SQLSTATEs a retry cures. Whole classes: 08 connection exception, 53 insufficient
# resources (disk full, out of memory, too many connections), 58 system error (I/O).
PG_TRANSIENT_CLASSES = frozenset({"08", "53", "58"})
PG_TRANSIENT_STATES = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "40003",  # statement_completion_unknown
        "55P03",  # lock_not_available
        "57014",  # query_canceled (a statement timeout)
        "57P01",  # admin_shutdown: the server is restarting
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now: starting up or shutting down
        "57P05",  # idle_session_timeout
    }
)

DATABASE = "database"
DISK = "disk"

MAX_CHAIN = 16  # causes looked at, against a cycle or an absurd chain


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from or while handling, nearest first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < MAX_CHAIN:
        seen.add(id(current))
        yield current
        if current.__cause__ is not None:
            current = current.__cause__
        elif not current.__suppress_context__:
            current = current.__context__
        else:
            current = None


def _database_error(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in SQLITE_TRANSIENT
        text = str(exc).lower()
        return "database is locked" in text or "database table is locked" in text
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return False
    if isinstance(exc, psycopg.InterfaceError):
        return True  # the connection is closed or unusable: a new one is the cure
    state = getattr(exc, "sqlstate", None)
    if state is None:
        # Raised by the driver itself: refused, reset, closed by the server, timed out.
        return isinstance(exc, psycopg.OperationalError)
    return state[:2] in PG_TRANSIENT_CLASSES or state in PG_TRANSIENT_STATES


def _disk_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_ERRNOS | HANDLE_ERRNOS


def _driver_error(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.Error) or (
        psycopg is not None and isinstance(exc, psycopg.Error)
    )


def transient_kind(exc: BaseException) -> str | None:
    """``"database"`` or ``"disk"`` when ``exc`` (or what it was raised from) is an outage of
    that kind, which waiting cures; None for anything else.

    The first driver error along the chain decides for the database: an integrity error raised
    while handling a lost connection is still a wrong write."""
    for cause in causes(exc):
        if _database_error(cause):
            return DATABASE
        if _driver_error(cause):
            return None
        if _disk_error(cause):
            return DISK
    return None


def is_transient(exc: BaseException) -> bool:
    return transient_kind(exc) is not None


def is_database_outage(exc: BaseException) -> bool:
    return transient_kind(exc) == DATABASE


def reason(exc: BaseException) -> str:
    """One line for a log, a step record or a page: what is away, and the driver's words."""
    kind = transient_kind(exc)
    detail = " ".join((str(exc).strip() or type(exc).__name__).split())
    if len(detail) > 300:
        detail = detail[:297] + "..."
    if kind == DATABASE:
        return f"database unavailable: {detail}"
    if kind == DISK:
        return f"working disk: {detail}"
    return detail


# A mail server that cannot take a message now, as the socket says it: nobody listening,
# the connection cut or never answered, the host or its network out of reach.
MAIL_NET_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.EHOSTDOWN,
        errno.ENETUNREACH,
        errno.ENETDOWN,
    }
)


# What a mail server answers about the console's own authentication (RFC 4954, "SMTP Service
# Extension for Authentication", section 6): 530 5.7.0 authentication required, 534 5.7.9 the
# mechanism too weak, 535 5.7.8 the credentials invalid, 538 5.7.11 encryption required for the
# mechanism. Every message the console sends would meet it alike: it is the configuration's
# (EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS) to mend, not a message's failure.
MAIL_REFUSES_US = frozenset({530, 534, 535, 538})


# A 552 to MAIL FROM is the message's size (RFC 1870, "SMTP Service Extension for Message Size
# Declaration": smtplib declares SIZE there when the server offers it), not the sender.
MAIL_TOO_LARGE = 552

MAIL_CREDENTIALS = "refuses the console's credentials"


def _mail_waits(code: int) -> bool:
    return 400 <= code < 500 or code in MAIL_REFUSES_US


def _not_offered(exc: smtplib.SMTPNotSupportedError) -> str:
    # smtplib's words say which extension the server did not advertise.
    text = str(exc).upper()
    if "STARTTLS" in text:
        return "offers no STARTTLS, and EMAIL_USE_TLS is set"
    if "AUTH" in text:
        return "offers no AUTH, and EMAIL_HOST_USER is set"
    return "does not offer what the console's mail settings ask for"


def mail_refusal(exc: BaseException) -> str | None:
    """What about the console the mail server refuses or does not offer, when ``exc``, raised
    while sending mail, is an answer every message the console sends would meet alike, whatever
    it says or to whom; None for anything else. Each is the settings' to mend (or the server's
    operator's), never a message's failure: an outage waited out (``is_mail_outage``) whose
    reason the operator must see. In words to follow "mail server":

    - "refuses the console's credentials": ``MAIL_REFUSES_US`` to the login, or to the sender or
      every recipient of a session that did not log in; any other 5xx to the login (the login is
      the console's alone).
    - "offers no AUTH, and EMAIL_HOST_USER is set", "offers no STARTTLS, and EMAIL_USE_TLS is
      set": the extension our settings need is not advertised (smtplib's SMTPNotSupportedError).
    - "offers no AUTH mechanism the console can use": only mechanisms smtplib does not speak
      (it speaks CRAM-MD5, PLAIN and LOGIN; its plain SMTPException from ``login``).
    - "refuses the console's greeting (EHLO/HELO)": a 5xx to both (SMTPHeloError).
    - "refuses the console's sender (MRT_MAIL_FROM)": a 5xx to MAIL FROM, the one address every
      message goes from, but ``MAIL_TOO_LARGE`` (this message's size).
    - "has a certificate the console does not trust": TLS certificate verification failed
      (STARTTLS or SMTPS): the server's certificate, or the authorities the console is given
      (``SSL_CERT_FILE``), to mend."""
    for cause in causes(exc):
        if isinstance(cause, smtplib.SMTPRecipientsRefused):
            codes = [answer[0] for answer in cause.recipients.values()]
            refused = bool(codes) and all(code in MAIL_REFUSES_US for code in codes)
            return MAIL_CREDENTIALS if refused else None
        if isinstance(cause, smtplib.SMTPNotSupportedError):
            return _not_offered(cause)
        if type(cause) is smtplib.SMTPException and "authentication method" in str(cause):
            return "offers no AUTH mechanism the console can use (CRAM-MD5, PLAIN, LOGIN)"
        if isinstance(cause, smtplib.SMTPResponseException):
            code = cause.smtp_code
            if code in MAIL_REFUSES_US:
                return MAIL_CREDENTIALS
            if code < 500:
                return None  # "not now": an outage, no more
            if isinstance(cause, smtplib.SMTPAuthenticationError):
                return MAIL_CREDENTIALS
            if isinstance(cause, smtplib.SMTPHeloError):
                return "refuses the console's greeting (EHLO/HELO)"
            if isinstance(cause, smtplib.SMTPSenderRefused) and code != MAIL_TOO_LARGE:
                return "refuses the console's sender (MRT_MAIL_FROM)"
            return None
        if isinstance(cause, smtplib.SMTPException):
            return None
        if isinstance(cause, ssl.SSLCertVerificationError):
            return "has a certificate the console does not trust"
    return None


def is_mail_outage(exc: BaseException) -> bool:
    """True when ``exc``, raised while sending mail, says the mail server cannot take the
    message now: it refuses or drops the connection, does not answer in time, cannot be
    resolved for now, cannot be spoken to over TLS (its certificate not trusted), answers 4xx
    ("try again later"), or gives an answer every message would meet alike (``mail_refusal``:
    the console's credentials, sender or greeting refused, an extension our settings need not
    offered). Any other 5xx answer (a recipient the server rejects, a message too large) is the
    message's own failure, and stays one.

    Apart from ``transient_kind`` on purpose: only a mail sender asks, so that a refused
    connection elsewhere (a depositor's server) is never taken for an outage of ours."""
    if mail_refusal(exc) is not None:
        return True
    for cause in causes(exc):
        if isinstance(cause, smtplib.SMTPRecipientsRefused):
            codes = [answer[0] for answer in cause.recipients.values()]
            return bool(codes) and all(_mail_waits(code) for code in codes)
        if isinstance(cause, (smtplib.SMTPConnectError, smtplib.SMTPServerDisconnected)):
            return True
        if isinstance(cause, smtplib.SMTPResponseException):
            return _mail_waits(cause.smtp_code)
        if isinstance(cause, smtplib.SMTPException):
            return False
        if isinstance(cause, socket.gaierror):
            return cause.errno == socket.EAI_AGAIN
        if isinstance(cause, ssl.SSLError):
            # The server's TLS cannot be used now (its certificate untrusted or expired, no
            # protocol in common): the mail server's or the operator's to fix, not the message's.
            return True
        if isinstance(cause, (TimeoutError, ConnectionError)):
            return True
        if isinstance(cause, OSError) and cause.errno in MAIL_NET_ERRNOS:
            return True
    return False


class Backoff:
    """The wait before trying again after an outage: ``first`` seconds, doubling with every
    outage met in a row, at most ``most``; ``clear`` when work went through again.

    A daemon waits it holding the item (``pause``), and the batched loop meets it once per job of
    a claim (MRT_CLAIM_BATCH in a row): one attempt per loop every 2 s at most costs the database
    nothing, and a stop cuts the waits short, so a claim of 32 jobs in an outage never holds up
    runconsumer's stop."""

    def __init__(self, *, first: float = 0.5, most: float = 2.0) -> None:
        self.first = first
        self.most = most
        self.failures = 0

    def next_delay(self) -> float:
        delay = min(self.most, self.first * 2 ** min(self.failures, 32))
        self.failures += 1
        return delay

    def clear(self) -> bool:
        """Forget the outage; True when there was one (to say once that it is over)."""
        had = self.failures > 0
        self.failures = 0
        return had


_backoffs: PerKey[object, Backoff] = PerKey(lambda _owner: Backoff())

_stop: PerThread[threading.Event] = PerThread()


def stopped_by(stop: threading.Event | None) -> contextlib.AbstractContextManager[None]:
    """Make ``stop`` the event that cuts this thread's back-offs short (``pause``) while the
    block runs: a loop's thread binds its own stop, a step thread the stop of the loop that gave
    it the step (``current_stop``)."""
    return _stop.bound(stop)


def current_stop() -> threading.Event | None:
    """The event bound to this thread by ``stopped_by``, if any."""
    return _stop.get()


def pause(seconds: float) -> None:
    """Wait ``seconds`` before trying again, or only until this thread's stop is set: each job of
    a claim waits its back-off in turn, and a stopping process must not wait for all of them."""
    stop = current_stop()
    if stop is None:
        time.sleep(seconds)
    else:
        stop.wait(seconds)


def backoff_of(owner: object) -> Backoff:
    """The back-off of one loop (a daemon instance), made on first use and gone with it."""
    return _backoffs(owner)
