"""Loopback HTTPS for the tests: a certificate of their own for ``localhost``, and a small
HTTP/1.1 server (keep-alive, so a pooled connection is taken again) that speaks TLS with it.

The certificate is made when a test asks (``cryptography``, which the console's runtime already
installs with daphne): nothing secret is kept in the repository, and it names ``localhost`` only,
so a request to ``https://127.0.0.1`` must fail the host name check.
"""

from __future__ import annotations

import datetime
import http.server
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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

    def log_message(self, *_args: object) -> None:
        pass


class TLSServer:
    """Answers every GET ``200 ok`` over TLS on a loopback port. ``names`` holds the server
    name each client sent (SNI), ``connections`` the connections it took."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.names: list[str | None] = []
        self.connections = 0
        context.sni_callback = self._sni
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
        self.server.daemon_threads = True
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
