"""Loopback TLS for the tests: a certificate of their own for ``localhost``, a small HTTP/1.1
server (keep-alive, so a pooled connection is taken again) that speaks TLS with it, and a small
SMTP server that does (STARTTLS or SMTPS).

The certificate is made when a test asks (``cryptography``, which the console's runtime already
installs with daphne): nothing secret is kept in the repository, and it names ``localhost`` only,
so a request to ``https://127.0.0.1`` must fail the host name check.
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def localhost_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for ``localhost`` (its own authority) and its key, as PEM files
    in ``folder``: (certificate, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "localhost.pem", folder / "localhost.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def server_context(cert_path: Path, key_path: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context


class _Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client's pool takes the connection again

    def do_GET(self) -> None:
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        """Keeps the body (``TLSServer.posted``) and answers ``200 ok``."""
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.posted.append((self.path, body))  # type: ignore[attr-defined]
        self.do_GET()

    def log_message(self, *_args: object) -> None:
        pass


class TLSServer:
    """Answers every GET and POST ``200 ok`` over TLS on a loopback port. ``names`` holds the
    server name each client sent (SNI), ``connections`` the connections it took, ``posted`` the
    path and body of each POST."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.names: list[str | None] = []
        self.connections = 0
        context.sni_callback = self._sni
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
        self.server.daemon_threads = True
        self.posted: list[tuple[str, bytes]] = []
        self.server.posted = self.posted  # type: ignore[attr-defined]
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _sni(self, _sock: ssl.SSLObject, name: str | None, _context: ssl.SSLContext) -> None:
        self.names.append(name)
        self.connections += 1

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def tls_server(context: ssl.SSLContext) -> Iterator[TLSServer]:
    server = TLSServer(context)
    try:
        yield server
    finally:
        server.close()


class TLSMailServer:
    """An SMTP server on a loopback port that speaks TLS with ``context``: from the first byte
    (``implicit``, SMTPS, Django's ``EMAIL_USE_SSL``) or once the client asks (STARTTLS,
    ``EMAIL_USE_TLS``). ``messages`` holds each message it took (recipients, text, and whether
    it came over TLS). With ``drip`` (seconds) it answers, once TLS is up, a byte at a time and
    never finishes: ``hung_up`` counts the clients that closed on it."""

    def __init__(self, context: ssl.SSLContext, *, implicit: bool, drip: float = 0.0) -> None:
        self.context = context
        self.implicit = implicit
        self.drip = drip
        self.messages: list[dict[str, Any]] = []
        self.hung_up = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _peer = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _secure(self, conn: socket.socket) -> ssl.SSLSocket:
        tls = self.context.wrap_socket(conn, server_side=True)
        if self.drip:
            try:
                while True:  # a reply of ever more lines, never its last
                    for byte in b"250-mail.test\r\n":
                        tls.sendall(bytes([byte]))
                        time.sleep(self.drip)
            except OSError:
                self.hung_up += 1
                raise
        return tls

    def _session(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(30)
            if self.implicit:
                conn = self._secure(conn)
            conn.sendall(b"220 mail.test ESMTP\r\n")
            lines = conn.makefile("rb")
            message: dict[str, Any] = {}
            while raw := lines.readline():
                verb = raw.split(b" ", 1)[0].split(b":", 1)[0].strip().upper()
                tls = isinstance(conn, ssl.SSLSocket)
                if verb == b"EHLO":
                    conn.sendall(b"250 mail.test\r\n" if tls else b"250-x\r\n250 STARTTLS\r\n")
                elif verb == b"STARTTLS" and not tls:
                    conn.sendall(b"220 go ahead\r\n")
                    conn = self._secure(conn)
                    lines = conn.makefile("rb")
                elif verb == b"MAIL":
                    message = {"to": [], "tls": tls}
                    conn.sendall(b"250 OK\r\n")
                elif verb == b"RCPT":
                    message["to"].append(raw.split(b":", 1)[1].strip(b" <>\r\n").decode())
                    conn.sendall(b"250 OK\r\n")
                elif verb == b"DATA":
                    conn.sendall(b"354 go on\r\n")
                    message["data"] = b"".join(iter(lines.readline, b".\r\n")).decode()
                    self.messages.append(message)
                    conn.sendall(b"250 queued\r\n")
                elif verb == b"QUIT":
                    conn.sendall(b"221 bye\r\n")
                    return
                else:
                    conn.sendall(b"502 not here\r\n")

    def close(self) -> None:
        self.listener.close()
