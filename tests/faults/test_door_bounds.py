"""Each door's bounds under daphne, the server that ships, through real sockets.

* every request has one deadline for the whole of it (line, headers, body): a client that
  trickles a byte now and then is answered 408 and let go (issue 52, item 10: 60 of 60 such
  connections were still open after 47 s);
* under a URL prefix (daphne's ``--root-path``) the body limit still knows ``/poster/``, and
  only the token of a user who may submit gets the upload limit there (item 11);
* an access request's ``?token=`` never reaches daphne's access log (item 12).
"""

from __future__ import annotations

import http.client
import os
import re
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from queues.services.zkserver import LocalZooKeeper
from tests.live.conftest import api_token, console_env, daphne, manage_py
from tests.zktree import chroot_on

# One worker runs this module's tests (tests/workers.py's TOGETHER): its module fixture is made
# once, not once on each worker that is given one of them.
pytestmark = pytest.mark.slow

USER, PASSWORD = "ada", "a-long-test-password-1"
VIEWER = "vic"
PREFIX = "/mrt"
ANONYMOUS_LIMIT = 64 * 1024
SIGNED_IN_LIMIT = 256 * 1024
POSTER_LIMIT = 2 * 1024**2
REQUEST_SECONDS = 2
# How long a test waits for an answer that must come (a bound, not a measurement).
ANSWER_SECONDS = 30.0


@dataclass
class Console:
    url: str  # with the prefix
    port: int
    log: Path
    depositor_key: str
    viewer_key: str


@pytest.fixture(scope="module")
def console(
    zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    """One console for the module (each costs a dozen processes to set up), on a ZooKeeper
    chroot of its own."""
    tmp_path = tmp_path_factory.mktemp("door-bounds")
    with chroot_on(zk_server) as chroot:
        yield from _console(tmp_path, f"{zk_server.hosts}{chroot}")


def _console(tmp_path: Path, hosts: str) -> Iterator[Console]:
    work = tmp_path / "var" / "work"
    env = console_env(
        hosts,
        tmp_path,
        user=USER,
        password=PASSWORD,
        MRT_MAX_ANONYMOUS_REQUEST_BYTES=str(ANONYMOUS_LIMIT),
        MRT_MAX_REQUEST_BYTES=str(SIGNED_IN_LIMIT),
        MRT_POSTER_MAX_BYTES=str(POSTER_LIMIT),
        MRT_REQUEST_SECONDS=str(REQUEST_SECONDS),
        MRT_FILE_ROOTS=str(work / "poster"),
        PYTHONUNBUFFERED="1",  # daphne's access log (its stdout) line by line
    )
    subprocess.run([*manage_py(), "setupconsole"], env=env, check=True, capture_output=True)
    subprocess.run(
        [
            *manage_py(),
            "shell",
            "-c",
            "from django.contrib.auth import get_user_model\n"
            "from queues.operator.auth import ensure_groups\n"
            f"user = get_user_model().objects.create_user({VIEWER!r}, password='x' * 20)\n"
            "user.groups.add(ensure_groups()['viewer'])\n",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    depositor = api_token(env, tmp_path / "key", user=USER, name="depositor")
    viewer = api_token(env, tmp_path / "viewer-key", user=VIEWER, name="viewer")
    log = tmp_path / "daphne.log"
    with daphne(env, log, args=["--root-path", PREFIX]) as url:
        port = int(url.rsplit(":", 1)[1])
        yield Console(url + PREFIX, port, log, depositor, viewer)


def _head(path: str, length: int, **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {length}"]
    lines.append("Content-Type: application/x-www-form-urlencoded")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _trickle_until_answered(conns: list[socket.socket], data: bytes) -> dict[int, bytes]:
    """Send ``data`` to every connection a byte at a time (each every 0.5 s), until each has
    an answer, or has been closed, or ANSWER_SECONDS have passed; the answers by index."""
    answers: dict[int, bytes] = {}
    sent = dict.fromkeys(range(len(conns)), 0)
    give_up = time.monotonic() + ANSWER_SECONDS
    while len(answers) < len(conns) and time.monotonic() < give_up:
        for number, conn in enumerate(conns):
            if number in answers or sent[number] >= len(data):
                continue
            try:
                conn.sendall(data[sent[number] : sent[number] + 1])
                sent[number] += 1
            except OSError:
                answers[number] = b"(closed while sending)"
        waiting = [c for n, c in enumerate(conns) if n not in answers]
        readable, _, _ = select.select(waiting, [], [], 0.5)
        for conn in readable:
            try:
                answers[conns.index(conn)] = conn.recv(4096) or b"(closed)"
            except OSError:
                answers[conns.index(conn)] = b"(closed)"
    return answers


def test_a_trickled_body_or_header_is_answered_408_at_the_deadline(console: Console) -> None:
    body_conns = [socket.create_connection(("127.0.0.1", console.port)) for _ in range(6)]
    header_conns = [socket.create_connection(("127.0.0.1", console.port)) for _ in range(2)]
    line_conns = [socket.create_connection(("127.0.0.1", console.port)) for _ in range(2)]
    try:
        for conn in body_conns:
            conn.sendall(_head(f"{PREFIX}/login/", 1000))
        answers = _trickle_until_answered(body_conns, b"x" * 1000)
        # The request line whole, then its headers a byte at a time.
        request = _head(f"{PREFIX}/login/", 10) + b"y" * 10
        line, rest = request.split(b"\r\n", 1)
        for conn in header_conns:
            conn.sendall(line + b"\r\n")
        headers = _trickle_until_answered(header_conns, rest)
        # The request line itself a byte at a time: Twisted makes no request before it is
        # whole, and its idle timeout starts again at every byte. The line alone takes longer
        # to send than ANSWER_SECONDS: only a deadline on the line itself answers in time.
        long_line = _head(f"{PREFIX}/login/?{'q' * 200}", 10)
        lines = _trickle_until_answered(line_conns, long_line)
    finally:
        for conn in body_conns + header_conns + line_conns:
            conn.close()

    assert len(lines) == len(line_conns)
    for answer in [*answers.values(), *headers.values(), *lines.values()]:
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert f"within {REQUEST_SECONDS} seconds".encode() in answer
    assert len(answers) == len(body_conns) and len(headers) == len(header_conns)
    # A request sent whole at once is not held to anything: the page answers it.
    page = requests.get(f"{console.url}/login/", timeout=ANSWER_SECONDS)
    assert page.status_code == 200


def test_a_kept_alive_connection_is_not_timed_between_its_requests(console: Console) -> None:
    # The deadline is a request's: a connection that asks again and again past it, and one
    # that waits past it between two requests, are answered each time. The clock of a request
    # without a body used to run on after the answer: 60 s after its first request a kept-alive
    # connection got an unasked 408, read as the answer to its next request (a browser's, the
    # page benchmark's).
    conn = http.client.HTTPConnection("127.0.0.1", console.port, timeout=ANSWER_SECONDS)
    statuses = []
    try:
        ends = time.monotonic() + 2 * REQUEST_SECONDS
        while time.monotonic() < ends:
            conn.request("GET", f"{PREFIX}/healthz")
            answer = conn.getresponse()
            answer.read()
            statuses.append(answer.status)
            time.sleep(0.25)
        time.sleep(1.5 * REQUEST_SECONDS)  # idle past the deadline, then once more
        conn.request("GET", f"{PREFIX}/healthz")
        answer = conn.getresponse()
        answer.read()
        statuses.append(answer.status)
        still_open = conn.sock is not None
    finally:
        conn.close()

    assert len(statuses) > 4 and set(statuses) == {200}, statuses
    assert still_open  # the same connection all along (http.client opens no other unasked)


def _partial_answer(console: Console, path: str, length: int, **headers: str) -> bytes:
    """The answer to a POST whose headers declare ``length`` bytes of which only a few come;
    empty when no answer comes before the request's deadline does."""
    with socket.create_connection(("127.0.0.1", console.port), timeout=ANSWER_SECONDS) as conn:
        conn.sendall(_head(path, length, **headers) + b"z" * 1024)
        return conn.recv(4096)


def test_under_a_prefix_a_depositor_uploads_past_the_signed_in_limit(console: Console) -> None:
    payload = os.urandom(2 * SIGNED_IN_LIMIT)
    answer = requests.post(
        f"{console.url}/poster/submit",
        headers={"Authorization": f"Bearer {console.depositor_key}"},
        data={
            "profile": "merritt_demo_content",
            "type": "file",
            "title": "A letter",
            "creator": "Ada Lovelace",
            "date": "1843",
            "responseForm": "xml",
        },
        files={"file": ("letter.pdf", payload)},
        timeout=ANSWER_SECONDS,
    )

    assert answer.status_code == 200, answer.text
    # Past the door's own cap the prefix changes nothing either: refused from the headers.
    refused = _partial_answer(
        console,
        f"{PREFIX}/poster/submit",
        2 * POSTER_LIMIT,
        Authorization=f"Bearer {console.depositor_key}",
    )
    assert refused.startswith(b"HTTP/1.1 413 "), refused


def test_a_viewers_token_gets_no_upload_limit_on_the_poster_door(console: Console) -> None:
    # A viewer may not submit: the door would refuse the upload after reading all of it.
    answer = _partial_answer(
        console,
        f"{PREFIX}/poster/submit",
        POSTER_LIMIT,
        Authorization=f"Bearer {console.viewer_key}",
    )

    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert f"at most {ANONYMOUS_LIMIT} bytes".encode() in answer
    # Elsewhere the viewer's token is a signed-in user's, as before.
    page = requests.post(
        f"{console.url}/",
        headers={"Authorization": f"Bearer {console.viewer_key}"},
        data=b"v" * (2 * ANONYMOUS_LIMIT),
        timeout=ANSWER_SECONDS,
    )
    assert page.status_code != 413


def test_a_download_token_is_not_written_to_the_access_log(console: Console) -> None:
    secret = "s3cret-access-token-0123456789"
    name = "small-qid0000000001-ark+=99999=fk4abc_v1.zip"
    answer = requests.get(
        f"{console.url}/downloads/{name}",
        params={"token": secret, "inline": "1"},
        timeout=ANSWER_SECONDS,
    )
    line = ""
    give_up = time.monotonic() + ANSWER_SECONDS
    while not line and time.monotonic() < give_up:
        found = re.search(r'"GET [^"]*/downloads/[^"]*"', console.log.read_text(errors="replace"))
        line = found.group(0) if found else ""
        time.sleep(0.1)

    assert answer.status_code in (302, 404), answer.status_code
    assert "token=REDACTED" in line and "inline=1" in line, line
    assert secret not in console.log.read_text(errors="replace")
