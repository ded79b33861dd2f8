"""Single sign-on through the server that ships: daphne, which takes Django's async path.

With MRT_SSO_HEADER=X-Remote-User the proxy's header logs the user in and nothing else does:
not a client's ``HTTP-X-Remote-User`` (which Django's async remote-user middleware used to read
as the header), not ``X_Remote_User`` (an underscore spelling of the same META key), and with
MRT_SSO_PROXIES not the real header either when it comes from another address.
"""

from __future__ import annotations

import http.client
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from django.urls import reverse

from tests.live.conftest import console_env, daphne

from .conftest import SSO_SETTINGS

pytestmark = [pytest.mark.slow]

PASSWORD = "a-long-test-password-1"


def get(
    base: str, path: str, headers: dict[str, str], *, source: str | None = None
) -> tuple[int, str, str]:
    """One GET without following redirects: (status, Location, body)."""
    parts = urlsplit(base)
    connection = http.client.HTTPConnection(
        parts.hostname,
        parts.port,
        timeout=30,
        source_address=(source, 0) if source else None,
    )
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return (
            response.status,
            response.getheader("Location") or "",
            response.read().decode("utf-8", "replace"),
        )
    finally:
        connection.close()


def sso_console(zk_hosts: str, tmp_path: Path, **extra: str) -> Iterator[str]:
    env = console_env(
        zk_hosts, tmp_path, user="admin", password=PASSWORD, MRT_SSO_HEADER="X-Remote-User", **extra
    )
    manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
    subprocess.run([*manage, "setupconsole"], env=env, check=True, capture_output=True)
    with daphne(env, tmp_path / "daphne.log") as url:
        yield url


@pytest.fixture
def console(zk_hosts: str, tmp_path: Path) -> Iterator[str]:
    yield from sso_console(zk_hosts, tmp_path)


@pytest.fixture
def console_behind_proxy(zk_hosts: str, tmp_path: Path) -> Iterator[str]:
    """Only 127.0.0.2 (the 'proxy') may send the header; the test connects from either."""
    yield from sso_console(zk_hosts, tmp_path, MRT_SSO_PROXIES="127.0.0.2/32, 10.0.0.0/8")


def logged_in_as(answer: tuple[int, str, str], name: str) -> bool:
    status, _, body = answer
    return status == 200 and f">{name}</a>" in body


def refused(answer: tuple[int, str, str]) -> bool:
    status, location, _ = answer
    return status == 302 and location.startswith("/login/")


def test_under_daphne_only_the_configured_header_logs_in(console: str) -> None:
    assert logged_in_as(get(console, "/", {"X-Remote-User": "someone"}), "someone")
    # The spellings that reached the same META key, or the key Django's async path read.
    assert refused(get(console, "/", {"HTTP-X-Remote-User": "admin"}))
    assert refused(get(console, "/", {"X_Remote_User": "admin"}))
    assert refused(get(console, "/", {"x_remote_user": "admin"}))
    # Two values (a client's header passed on next to the proxy's) name nobody.
    assert refused(get(console, "/", {"X-Remote-User": "admin, someone"}))


def test_with_trusted_proxies_the_header_counts_only_from_them(console_behind_proxy: str) -> None:
    url = console_behind_proxy
    assert refused(get(url, "/", {"X-Remote-User": "admin"}, source="127.0.0.1"))
    assert logged_in_as(get(url, "/", {"X-Remote-User": "grace"}, source="127.0.0.2"), "grace")


def test_sso_settings_refuse_a_proxy_that_is_no_address(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "MRT_VAR_DIR": str(tmp_path),
        "DJANGO_SECRET_KEY": "x" * 50,
        "MRT_SSO_HEADER": "X-Remote-User",
        "MRT_SSO_PROXIES": "proxy.example.org",
    }
    done = subprocess.run(
        [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "check"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "MRT_SSO_PROXIES" in done.stderr


@override_settings(**SSO_SETTINGS)
def test_the_sync_path_reads_the_same_header_and_no_other(zk, make_user) -> None:
    make_user("admin", "admin")
    overview = reverse("overview")
    # What the test client calls HTTP_HTTP_X_REMOTE_USER is a client's "HTTP-X-Remote-User".
    response = Client().get(overview, HTTP_HTTP_X_REMOTE_USER="admin")
    assert response.status_code == 302
    client = Client()
    assert client.get(overview, HTTP_X_REMOTE_USER="grace").status_code == 200
    assert get_user_model().objects.filter(username="grace").exists()
    assert client.get(overview).status_code == 200  # the session persists


@override_settings(**SSO_SETTINGS, MRT_SSO_PROXIES=["10.1.2.0/24"])
def test_the_sync_path_honours_the_proxy_list(zk, make_user) -> None:
    make_user("viewer", "someone-else")
    overview = reverse("overview")
    outsider = Client(REMOTE_ADDR="127.0.0.1")
    assert outsider.get(overview, HTTP_X_REMOTE_USER="grace").status_code == 302
    proxy = Client(REMOTE_ADDR="10.1.2.3")
    assert proxy.get(overview, HTTP_X_REMOTE_USER="grace").status_code == 200
