"""A request body is never handed to another host by a redirect (issue 52, item 8).

Every outside request goes through ``netpolicy.FetchPolicy.open``: a 307 or 308 keeps the
method and the body, so it is followed only to the same origin (scheme, host, port); one to
another host is refused before anything is sent there. A 303 after a POST turns into a GET
without the body, and may go elsewhere unless the policy says ``cross_origin_redirects=False``
(Merritt's ingest: its answer must come from itself). A 301 or 302 of a POST with a body is not
followed: its answer is the 3xx.
"""

from __future__ import annotations

import pytest

from queues.chaos.standins import CallbackReceiver, running
from queues.steps.netpolicy import FetchPolicy, FetchRefused
from tests.steps.conftest import Loopback, Reply

POLICY = FetchPolicy(restrict=False, deadline=10.0, timeout=5.0)


class Chunked:
    """A body sent in pieces (``netpolicy.RequestBody``), counting how often it was read."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads = 0

    @property
    def length(self) -> int:
        return len(self.data)

    def chunks(self):  # type: ignore[no-untyped-def]
        self.reads += 1
        for start in range(0, len(self.data), 7):
            yield self.data[start : start + 7]


def test_origin_is_scheme_host_and_port() -> None:
    from queues.steps.netpolicy import origin

    assert origin("http://Ingest.example.org/a") == ("http", "ingest.example.org", 80)
    assert origin("http://ingest.example.org:80/b") == origin("http://ingest.example.org/c")
    assert origin("https://ingest.example.org/a") != origin("http://ingest.example.org/a")
    assert origin("http://127.0.0.1:8080/") != origin("http://127.0.0.1:8081/")


@pytest.mark.parametrize("status", [307, 308])
def test_a_body_is_not_carried_to_another_host(http_server: Loopback, status: int) -> None:
    with running(CallbackReceiver()) as elsewhere:
        target = f"{elsewhere.url}/mc/jid-1"
        http_server.add("POST", "/mc/jid-1", Reply(status, headers={"Location": target}))

        with pytest.raises(FetchRefused, match=r"to another host .* nothing was sent there"):
            POLICY.open(
                f"{http_server.url}/mc/jid-1",
                method="POST",
                body=b'{"secret": "the job state"}',
                content_type="application/json",
            )

        assert elsewhere.seen() == [], "the other host was never asked"
    assert len(http_server.seen("POST", "/mc/jid-1")) == 1


def test_a_body_follows_a_redirect_to_the_same_origin_whole(http_server: Loopback) -> None:
    http_server.add("POST", "/old", Reply(307, headers={"Location": "/new"}))
    http_server.add("POST", "/new", Reply(200, body=b"taken"))
    body = Chunked(b"field=value&" * 100)

    with POLICY.open(
        f"{http_server.url}/old", method="POST", body=body, content_type="text/plain"
    ) as response:
        assert response.status == 200
        assert b"".join(response.chunks(1024)) == b"taken"

    [moved] = http_server.seen("POST", "/new")
    assert moved.body == body.data and moved.headers["Content-Length"] == str(len(body.data))
    assert "Transfer-Encoding" not in moved.headers
    assert body.reads == 2, "sent again from its start"


def test_a_see_other_after_a_post_goes_elsewhere_without_the_body(http_server: Loopback) -> None:
    with running(CallbackReceiver()) as elsewhere:
        http_server.add("POST", "/done", Reply(303, headers={"Location": elsewhere.url + "/x"}))

        with POLICY.open(f"{http_server.url}/done", method="POST", body=b"data") as response:
            assert response.status == 404  # the receiver's answer to a GET

        [request] = elsewhere.seen()
        assert (request.method, request.body) == ("GET", b"")

        strict = FetchPolicy(restrict=False, deadline=10.0, cross_origin_redirects=False)
        with pytest.raises(FetchRefused, match=r"redirected the request to another host"):
            strict.open(f"{http_server.url}/done", method="POST", body=b"data")
        assert len(elsewhere.seen()) == 1


@pytest.mark.parametrize("status", [301, 302])
def test_a_moved_answer_to_a_callback_is_no_delivery(http_server: Loopback, status: int) -> None:
    """Followed as a GET without the body, a callback's 301 or 302 came back 200 from wherever
    it pointed and the job's state was counted delivered, though no receiver ever got it."""
    from queues.steps.notify import CallbackError, post_callback

    with running(CallbackReceiver()) as elsewhere:
        target = elsewhere.url + "/hook"
        http_server.add("POST", "/hook", Reply(status, headers={"Location": target}))
        with pytest.raises(CallbackError, match=f"HTTP {status}"):
            post_callback(f"{http_server.url}/hook", {"job": "x"}, policy=POLICY)
        assert elsewhere.seen() == []
