"""Request bodies are judged before they are read, under daphne, the server that ships.

Measured before: daphne (Twisted) wrote every body to a temporary file as it came in and only
then called the application, so an anonymous 400 MB POST to /poster/submit, /login/ or a URL
that does not exist was on disk whole before anything looked at it, and no answer came until
the client had sent it all. Here each client sends the headers and a little of the body, and
waits: the 413 must come then, and daphne must hold no file in its temporary folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.test import override_settings

from mrtadmin.bodylimit import BodyLimit, _declared_length
from tests.live.conftest import api_token, console_env, daphne, log_in, manage_py
from tests.zktree import chroot_on

pytestmark = [pytest.mark.slow]

USER, PASSWORD = "ada", "a-long-test-password-1"
ANONYMOUS_LIMIT = 64 * 1024
SIGNED_IN_LIMIT = 4 * 1024**2
POSTER_LIMIT = 8 * 1024**2
HUGE = 400 * 1000**2
ANSWER_SECONDS = 20.0


@dataclass
class Console:
    url: str
    port: int
    pid: int
    tmp: Path
    key: str
    home: Path  # its folder: the database, the work folder


def daphne_pid(port: int) -> int:
    """The daphne process serving ``port`` (found by its command line)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"daphne" in argv and str(port).encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no daphne on port {port}")


def spooled(console: Console) -> list[str]:
    """Files daphne holds open in, or left in, its temporary folder (Twisted's body files are
    unlinked at once, so an open descriptor is the only trace of one)."""
    held = []
    for fd in Path(f"/proc/{console.pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(console.tmp)):
            held.append(target)
    return held + [str(p) for p in console.tmp.iterdir()]


# One worker runs this module's tests (tests/workers.py's TOGETHER): its console (a setup, a
# token and a daphne: 15-20 s of processes) is made once, not once for each test.
@pytest.fixture(scope="module")
def console(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    tmp_path = tmp_path_factory.mktemp("request-bodies")
    with chroot_on(zk_server) as chroot:
        yield from _console(f"{zk_server.hosts}{chroot}", tmp_path)


def _console(zk_hosts: str, tmp_path: Path) -> Iterator[Console]:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    work = tmp_path / "var" / "work"
    env = console_env(
        zk_hosts,
        tmp_path,
        user=USER,
        password=PASSWORD,
        TMPDIR=str(tmp),
        MRT_MAX_ANONYMOUS_REQUEST_BYTES=str(ANONYMOUS_LIMIT),
        MRT_MAX_REQUEST_BYTES=str(SIGNED_IN_LIMIT),
        MRT_POSTER_MAX_BYTES=str(POSTER_LIMIT),
        MRT_FILE_ROOTS=str(work / "poster"),
        LOG_LEVEL="INFO",
    )
    subprocess.run([*manage_py(), "setupconsole"], env=env, check=True, capture_output=True)
    key = api_token(env, tmp_path / "key", user=USER, name="bodies")
    with daphne(env, tmp_path / "daphne.log") as url:
        port = int(url.rsplit(":", 1)[1])
        yield Console(url, port, daphne_pid(port), tmp, key, tmp_path)


def head(path: str, length: int | None, **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1"]
    if length is None:
        lines.append("Transfer-Encoding: chunked")
    else:
        lines.append(f"Content-Length: {length}")
    lines.append("Content-Type: multipart/form-data; boundary=xyz")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer_to_a_slow_body(
    console: Console, path: str, length: int | None, *, sent: int = 32 * 1024, **headers: str
) -> tuple[bytes, list[str]]:
    """Send the headers and ``sent`` bytes of the body, then wait for an answer without
    sending more; return the answer's first bytes and what daphne spooled meanwhile."""
    with socket.create_connection(("127.0.0.1", console.port), timeout=ANSWER_SECONDS) as conn:
        conn.sendall(head(path, length, **headers))
        chunk = b"x" * sent
        conn.sendall(chunk if length is not None else b"%x\r\n%s\r\n" % (len(chunk), chunk))
        try:
            answer = conn.recv(4096)
        except TimeoutError:
            answer = b""
        return answer, spooled(console)


@pytest.mark.parametrize("path", ["/poster/submit", "/login/", "/no/such/page/"])
def test_an_anonymous_huge_post_is_refused_before_its_body_is_read(
    console: Console, path: str
) -> None:
    answer, held = answer_to_a_slow_body(console, path, HUGE)
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert held == []


def test_an_anonymous_chunked_body_is_refused_once_it_passes_the_limit(console: Console) -> None:
    # Less than the limit says nothing yet; more than it is refused before the body ends.
    with socket.create_connection(("127.0.0.1", console.port), timeout=ANSWER_SECONDS) as conn:
        conn.sendall(head("/login/", None))
        chunk = b"y" * 16 * 1024
        answer = b""
        for _ in range(ANONYMOUS_LIMIT // len(chunk) + 2):
            conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        with contextlib.suppress(TimeoutError):
            answer = conn.recv(4096)
        held = spooled(console)
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert held == []


def test_a_made_up_token_gets_the_anonymous_limit(console: Console) -> None:
    for authorization in ("Bearer not-a-key", "Basic YWRhOm5vdC1hLWtleQ=="):
        answer, held = answer_to_a_slow_body(
            console, "/poster/submit", POSTER_LIMIT, Authorization=authorization
        )
        assert answer.startswith(b"HTTP/1.1 413 "), answer
        assert held == []


def test_a_signed_in_page_may_send_more_than_an_anonymous_one(console: Console) -> None:
    session = log_in(console.url, USER, PASSWORD)
    body = b"z" * (4 * ANONYMOUS_LIMIT)
    cookies = {"sessionid": session.cookies["sessionid"], "csrftoken": session.cookies["csrftoken"]}
    # Read whole and answered by the page (no such form there), not refused for its size.
    signed = requests.post(f"{console.url}/", data=body, cookies=cookies, timeout=30)
    assert signed.status_code != 413
    # The same body with a session that is not one.
    forged = requests.post(
        f"{console.url}/", data=body, cookies={"sessionid": "x" * 32}, timeout=30
    )
    assert forged.status_code == 413
    # A session is not a depositor's token: /poster/ takes large uploads with a token only.
    answer, held = answer_to_a_slow_body(
        console,
        "/poster/submit",
        2 * SIGNED_IN_LIMIT,
        Cookie=f"sessionid={cookies['sessionid']}",
    )
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert held == []


def test_a_depositor_with_a_token_uploads_past_the_anonymous_limit(console: Console) -> None:
    payload = os.urandom(4 * ANONYMOUS_LIMIT)
    answer = requests.post(
        f"{console.url}/poster/submit",
        headers={"Authorization": f"Bearer {console.key}", "Expect": "100-continue"},
        data={
            "profile": "merritt_demo_content",
            "type": "file",
            "title": "A letter",
            "creator": "Ada Lovelace",
            "date": "1843",
            "responseForm": "xml",
        },
        files={"file": ("letter.pdf", payload)},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    batch = answer.headers["X-Batch-ID"]
    uploads = list((console.home / "var" / "work" / "poster").glob("bid-*/letter.pdf"))
    assert [p.read_bytes() == payload for p in uploads] == [True], batch
    # Over the door's own cap, with the token: refused before the body is read.
    refused, held = answer_to_a_slow_body(
        console, "/poster/submit", POSTER_LIMIT * 2, Authorization=f"Bearer {console.key}"
    )
    assert refused.startswith(b"HTTP/1.1 413 "), refused
    assert held == []


async def asgi_post(path: str, length: int | None, chunks: list[bytes]) -> list[dict]:
    """POST through BodyLimit in front of Django's ASGI handler, the body in ``chunks``; the
    messages the application sent back, stopping at the first that ends the answer."""
    headers = [(b"host", b"localhost"), (b"content-type", b"application/octet-stream")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": headers,
        "query_string": b"",
        "client": ("127.0.0.1", 5000),
        "server": ("localhost", 80),
    }
    app = ApplicationCommunicator(BodyLimit(get_asgi_application()), scope)
    for number, chunk in enumerate(chunks):
        more = number < len(chunks) - 1
        await app.send_input({"type": "http.request", "body": chunk, "more_body": more})
    sent = [await app.receive_output(20)]
    while sent[-1]["type"] != "http.response.body" or sent[-1].get("more_body"):
        sent.append(await app.receive_output(20))
    with contextlib.suppress(Exception):
        await app.wait(5)
    return sent


@pytest.mark.django_db
@override_settings(MRT_MAX_ANONYMOUS_REQUEST_BYTES=ANONYMOUS_LIMIT)
def test_in_front_of_any_asgi_server_the_same_limits_hold() -> None:
    declared = asyncio.run(asgi_post("/login/", HUGE, [b""]))
    assert declared[0]["status"] == 413
    # A streamed body without a length: refused once it passes the limit.
    streamed = asyncio.run(asgi_post("/login/", None, [b"s" * 16 * 1024] * 8))
    assert streamed[0]["status"] == 413
    # Under the limit the page answers for itself (a login POST without a CSRF cookie: 403).
    small = asyncio.run(asgi_post("/login/", 1024, [b"t" * 1024]))
    assert small[0]["status"] == 403


def test_a_large_request_meets_a_database_outage_with_503_not_413(console: Console) -> None:
    """Whether a large request's sender is signed in is a database question: while the
    database cannot answer, the request is told to come back, not refused for its size."""
    database = console.home / "console.sqlite3"
    moved = console.home / "console.sqlite3.away"
    database.rename(moved)
    database.mkdir()  # SQLite cannot open a folder: "unable to open database file"
    try:
        answer, held = answer_to_a_slow_body(
            console, "/poster/submit", POSTER_LIMIT, Authorization=f"Bearer {console.key}"
        )
    finally:
        database.rmdir()
        moved.rename(database)
    assert answer.startswith(b"HTTP/1.1 503 "), answer
    assert b"Retry-After: 10" in answer
    assert held == []


@pytest.mark.parametrize(
    ("headers", "length"),
    [
        ({}, 0),  # a GET: no body, so no sender check (a database look-up) in front of the page
        ({"content-length": "12"}, 12),
        ({"transfer-encoding": "chunked"}, None),
        ({"content-length": "x"}, None),
    ],
)
def test_a_request_without_a_length_or_a_coding_has_an_empty_body(
    headers: dict[str, str], length: int | None
) -> None:
    assert _declared_length(headers) == length
