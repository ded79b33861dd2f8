"""The console as an operator serves it: behind a TLS proxy, under a URL prefix.

daphne runs with ``--root-path /queue`` and ``DJANGO_SECURE=1``; the test plays the proxy over
plain HTTP: it sends the name browsers use (``Host``), ``X-Forwarded-Proto: https`` and the
browser's ``Origin``, and keeps the (Secure) cookies itself. A proxy may pass the path on whole
(``/queue/jobs/``) or without its prefix (``/jobs/``); both are tried where they differ.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path
from typing import Any

import pytest
import requests
import websockets

from queues.services.zkserver import LocalZooKeeper
from tests.browser import close_context, log_in
from tests.live.conftest import api_token, console_env, daphne, manage_py
from tests.zktree import chroot_on

pytestmark = pytest.mark.slow

USER, PASSWORD = "ada", "a-long-test-password-1"
HOST = "merritt-ops.example.org"
PREFIX = "/queue"
ORIGIN = f"https://{HOST}"
PROXY = {"Host": HOST, "X-Forwarded-Proto": "https"}
# Every URL a page names for the browser to follow or fetch.
URL_ATTRIBUTE = re.compile(r'\b(?:href|src|action|hx-get|hx-post|data-live-socket)="([^"]*)"')


@dataclass
class Console:
    base: str  # daphne's own address, without the prefix
    port: int
    db: Path
    key: str
    env: dict[str, str]
    tmp_path: Path


@dataclass
class Browser:
    """A browser behind the proxy: its requests reach daphne with the proxy's headers, and it
    keeps its cookies (Secure ones included: the proxy speaks HTTPS to it)."""

    console: Console
    cookies: dict[str, str] = field(default_factory=dict)

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {**PROXY, **kwargs.pop("headers", {})}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        answer = requests.request(
            method,
            self.console.base + path,
            headers=headers,
            allow_redirects=False,
            timeout=30,
            **kwargs,
        )
        for cookie in answer.cookies:
            self.cookies[cookie.name] = cookie.value
        return answer

    def post(self, path: str, data: dict[str, str], **headers: str) -> requests.Response:
        return self.request(
            "POST", path, data=data, headers={"Origin": ORIGIN, "Referer": ORIGIN + path, **headers}
        )


@pytest.fixture(scope="module")
def console(
    zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    tmp_path = tmp_path_factory.mktemp("under-prefix")
    with chroot_on(zk_server) as chroot:
        env = console_env(
            f"{zk_server.hosts}{chroot}",
            tmp_path,
            user=USER,
            password=PASSWORD,
            DJANGO_ALLOWED_HOSTS=f"127.0.0.1,localhost,{HOST}",
            DJANGO_SECURE="1",
            DJANGO_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto",
            DJANGO_SSL_REDIRECT="1",
            MRT_CONSOLE_URL=ORIGIN + PREFIX,
        )
        subprocess.run([*manage_py(), "setupconsole"], env=env, check=True, capture_output=True)
        key = api_token(env, tmp_path / "key", user=USER, name="prefix")
        with daphne(env, tmp_path / "daphne.log", args=["--root-path", PREFIX]) as url:
            port = int(url.rsplit(":", 1)[1])
            yield Console(url, port, tmp_path / "console.sqlite3", key, env, tmp_path)


def _csrf(page: requests.Response) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert found is not None, page.text[:500]
    return found.group(1)


@pytest.fixture
def signed_in(console: Console) -> Browser:
    """A browser that went to the console's address and logged in through its form."""
    browser = Browser(console)
    first = browser.request("GET", f"{PREFIX}/")
    assert first.status_code == 302
    assert first.headers["Location"] == f"{PREFIX}/login/?next={PREFIX}/"
    form = browser.request("GET", f"{PREFIX}/login/")
    assert form.status_code == 200
    answer = browser.post(
        f"{PREFIX}/login/",
        {"username": USER, "password": PASSWORD, "csrfmiddlewaretoken": _csrf(form)},
    )
    assert answer.status_code == 302, answer.text[:500]
    assert answer.headers["Location"] == f"{PREFIX}/"
    session = next(c for c in answer.cookies if c.name == "sessionid")
    assert session.secure and session.has_nonstandard_attr("HttpOnly")
    return browser


def _urls(page: requests.Response) -> list[str]:
    return [unescape(u) for u in URL_ATTRIBUTE.findall(page.text) if u.startswith("/")]


def test_every_url_a_page_names_is_under_the_prefix_and_answers(signed_in: Browser) -> None:
    overview = signed_in.request("GET", f"{PREFIX}/")
    assert overview.status_code == 200
    assert overview.headers["Strict-Transport-Security"].startswith("max-age=")
    urls = _urls(overview)
    # The nav, the scripts and styles, the live socket, htmx's polling.
    for needed in ("/jobs/", "/holds/", "/static/css/console.css", "/static/js/live.js"):
        assert f"{PREFIX}{needed}" in urls, needed
    assert f"{PREFIX}/ws/live/" in urls
    outside = [u for u in urls if not u.startswith(f"{PREFIX}/")]
    assert outside == [], outside
    for url in sorted(set(urls) - {f"{PREFIX}/ws/live/", f"{PREFIX}/logout/"}):
        answer = signed_in.request("GET", url)
        assert answer.status_code == 200, (url, answer.status_code)


def test_a_path_passed_on_without_the_prefix_is_answered_as_under_it(signed_in: Browser) -> None:
    """A proxy that strips the prefix (nginx's ``proxy_pass http://daphne/;``): the page links,
    polls and sends ``?next=`` under the prefix all the same."""
    jobs = signed_in.request("GET", "/jobs/?state=Failed")
    assert jobs.status_code == 200
    urls = _urls(jobs)
    assert f"{PREFIX}/jobs/?state=Failed" in urls  # htmx's refresh of the list
    outside = [u for u in urls if not u.startswith(f"{PREFIX}/")]
    assert outside == [], outside
    anonymous = Browser(signed_in.console).request("GET", "/jobs/")
    assert anonymous.headers["Location"] == f"{PREFIX}/login/?next={PREFIX}/jobs/"


def test_a_hold_with_a_reason_is_posted_with_the_https_origin_and_redirects_back(
    signed_in: Browser, console: Console
) -> None:
    holds = signed_in.request("GET", f"{PREFIX}/holds/")
    answer = signed_in.post(
        f"{PREFIX}/holds/queue/ingest/hold/",
        {"reason": "under the prefix", "csrfmiddlewaretoken": _csrf(holds)},
    )
    assert answer.status_code == 303, answer.text[:500]
    assert answer.headers["Location"] == f"{PREFIX}/holds/"
    # The release, as htmx sends it: the token in a header, the panel in the answer.
    released = signed_in.post(
        f"{PREFIX}/holds/queue/ingest/release/",
        {},
        **{"HX-Request": "true", "X-CSRFToken": _csrf(holds)},
    )
    assert released.status_code == 200, released.text[:500]
    assert all(u.startswith(f"{PREFIX}/") for u in _urls(released))
    with sqlite3.connect(console.db) as db:
        done = list(
            db.execute(
                "SELECT action, reason, ok FROM queues_auditentry WHERE kind = 'queue' ORDER BY id"
            )
        )
    assert done == [("hold", "under the prefix", 1), ("release", "", 1)]


def test_the_api_health_and_metrics_answer_under_the_prefix(console: Console) -> None:
    browser = Browser(console)
    bearer = {"Authorization": f"Bearer {console.key}"}
    overview = browser.request("GET", f"{PREFIX}/api/overview", headers=bearer)
    assert overview.status_code == 200 and "jobs" in overview.json()
    assert browser.request("GET", f"{PREFIX}/api/overview").status_code == 401
    assert browser.request("GET", f"{PREFIX}/metrics", headers=bearer).status_code == 200
    assert browser.request("GET", f"{PREFIX}/healthz").status_code == 200


def test_health_checks_over_plain_http_are_not_sent_to_https(console: Console) -> None:
    """A health check asks daphne itself, over plain HTTP, with or without the prefix; a page so
    asked is sent to HTTPS under the prefix."""
    for path in ("/healthz", f"{PREFIX}/healthz", "/metrics", f"{PREFIX}/metrics"):
        answer = requests.get(console.base + path, allow_redirects=False, timeout=30)
        assert answer.status_code in (200, 401), (path, answer.status_code)
    page = requests.get(
        f"{console.base}{PREFIX}/jobs/", headers={"Host": HOST}, allow_redirects=False, timeout=30
    )
    assert page.status_code == 301
    assert page.headers["Location"] == f"https://{HOST}{PREFIX}/jobs/"


async def _hello(console: Console, path: str, origin: str, cookies: dict[str, str]) -> Any:
    async with websockets.connect(
        f"ws://{HOST}{path}",
        host="127.0.0.1",
        port=console.port,
        additional_headers={
            "Origin": origin,
            "Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items()),
        },
        open_timeout=20,
    ) as socket:
        return await asyncio.wait_for(socket.recv(), 20)


@pytest.mark.parametrize("path", [f"{PREFIX}/ws/live/", "/ws/live/"], ids=["whole", "stripped"])
def test_the_live_socket_opens_for_the_https_origin_only(
    signed_in: Browser, console: Console, path: str
) -> None:
    hello = asyncio.run(_hello(console, path, ORIGIN, signed_in.cookies))
    assert '"kind": "hello"' in hello
    with pytest.raises(websockets.InvalidStatus) as refused:
        asyncio.run(_hello(console, path, "https://elsewhere.example.org", signed_in.cookies))
    assert refused.value.response.status_code == 403


@pytest.mark.browser
def test_the_live_script_opens_its_socket_under_the_prefix(browser: Any, console: Console) -> None:
    """The page's own script, in Chromium: the socket it opens is under the prefix and the page
    follows ZooKeeper through it. Chromium speaks plain HTTP to a daphne of its own (the same
    console without the redirect to HTTPS); it keeps Secure cookies from localhost."""
    plain = {**console.env, "DJANGO_SSL_REDIRECT": "0"}
    with daphne(plain, console.tmp_path / "daphne-plain.log", args=["--root-path", PREFIX]) as url:
        context = browser.new_context()
        context.set_default_timeout(60_000)
        try:
            _follow_live(context, url.replace("127.0.0.1", "localhost") + PREFIX)
        finally:
            close_context(context)


def _follow_live(context: Any, base: str) -> None:
    page = context.new_page()
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    log_in(page, base, USER, PASSWORD)
    page.wait_for_function("() => window.mrtLive && window.mrtLive.following()")
    assert sockets and all(s == base.replace("http:", "ws:") + "/ws/live/" for s in sockets)
