"""A URL's server (``host:port``), kept by the URL's scheme and authority: the same answer as
parsing the whole URL, for every shape of URL a job may name."""

from __future__ import annotations

import pytest

from queues.core import retries
from queues.core.retries import server_of_url, url_server
from queues.daemons.fetching import depositor_server


def _whole(url: str) -> str:
    """The server as the whole URL gives it: the parse of ``url_server``, not kept, on all of
    the URL rather than its scheme and authority."""
    return str(retries._server_of.__wrapped__(url))


URLS = [
    "http://example.org/a/b.zip",
    "HTTPS://Example.ORG:8443/x?y=1#z",
    "https://example.org",
    "https://example.org?x=/y",
    "https://example.org#frag/with/slash",
    "http://user:pw@Host.example:81/p",
    "http://[::1]:8080/x",
    "http://[2001:DB8::1]/x",
    "file:///tmp/payload.zip",
    "ftp://files.example/x",
    "http://exa\tmple.org/x",
    "http://example.org\n:81/x",
    "  http://example.org:82/x",
    "http://example.org:/x",
    "//example.org:83/x",
    "example.org/x",
    "",
]


@pytest.mark.parametrize("url", URLS)
def test_a_kept_server_is_the_whole_urls(url: str) -> None:
    assert url_server(url) == _whole(url)
    assert depositor_server(url) == _whole(url)
    assert server_of_url(url) == (_whole(url) or "?")
    assert url_server(url) == _whole(url)  # asked again: from what was kept


@pytest.mark.parametrize(
    "url", ["http://example.org:99999/x", "http://example.org:port/x", "http://[::1/x"]
)
def test_a_port_that_is_none_is_refused_every_time(url: str) -> None:
    for _ in range(2):
        with pytest.raises(ValueError):
            url_server(url)
        with pytest.raises(ValueError):
            _whole(url)
        assert server_of_url(url) == "?"


def test_urls_of_one_server_share_its_answer() -> None:
    first = url_server("https://kept.example:444/one")
    assert url_server("https://kept.example:444/two?x#y") is first
