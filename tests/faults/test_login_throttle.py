"""Password guessing is locked out (django-axes), audited, and leaves SSO and API tokens alone."""

from __future__ import annotations

import http.cookiejar
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse

from queues.operator.audit import ApiToken, AuditEntry
from tests.live.conftest import api_token, console_env, daphne

from .conftest import PASSWORD, SSO_SETTINGS

pytestmark = [pytest.mark.django_db]

LIMIT = settings.MRT_LOGIN_FAILURE_LIMIT  # 5 unless the environment says otherwise


def post_login(client: Client, username: str, password: str) -> Any:
    return client.post(reverse("login"), {"username": username, "password": password})


def is_logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_the_right_password_is_refused_after_too_many_wrong_ones(make_user: Callable) -> None:
    make_user("viewer", "ada")
    client = Client()
    for _ in range(LIMIT + 1):
        post_login(client, "ada", "not-the-password")
        assert not is_logged_in(client)
    response = post_login(client, "ada", PASSWORD)
    assert response.status_code == 429
    assert b"Too many failed logins" in response.content
    assert not is_logged_in(client)
    # Another browser (no cookies in common) is locked out of the name as well.
    other = Client(REMOTE_ADDR="10.20.30.40")
    assert post_login(other, "ada", PASSWORD).status_code == 429
    assert not is_logged_in(other)


def test_failures_and_the_lockout_are_in_the_audit_log(make_user: Callable, viewer: Client) -> None:
    make_user("viewer", "ada")
    client = Client()
    for _ in range(LIMIT):
        post_login(client, "ada", "not-the-password")
    failed = AuditEntry.objects.filter(action="login-failed", kind="login", item_id="ada")
    assert failed.count() == LIMIT
    assert not any(entry.ok for entry in failed)
    assert "127.0.0.1" in failed.first().detail
    assert AuditEntry.objects.filter(action="login-locked-out", item_id="ada").exists()
    page = viewer.get("/audit/", {"kind": "login"})
    assert page.status_code == 200
    assert b"login-failed" in page.content and b"login-locked-out" in page.content


def test_a_few_typos_do_not_lock_anyone_out(make_user: Callable) -> None:
    make_user("viewer", "ada")
    client = Client()
    for _ in range(LIMIT - 1):
        post_login(client, "ada", "typo")
    post_login(client, "ada", PASSWORD)
    assert is_logged_in(client)


def test_api_tokens_work_while_their_user_is_locked_out(make_user: Callable, zk: Any) -> None:
    user = make_user("viewer", "ada")
    _, key = ApiToken.issue(user=user, name="script")
    for _ in range(LIMIT + 1):
        post_login(Client(), "ada", "not-the-password")
    assert post_login(Client(), "ada", PASSWORD).status_code == 429
    response = Client().get("/api/overview", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200


@override_settings(**SSO_SETTINGS)
def test_sso_works_while_the_name_is_locked_out_for_passwords(make_user: Callable, zk: Any) -> None:
    make_user("viewer", "ada")
    for _ in range(LIMIT + 1):
        post_login(Client(), "ada", "not-the-password")
    assert post_login(Client(), "ada", PASSWORD).status_code == 429
    client = Client()
    assert client.get(reverse("overview"), HTTP_X_REMOTE_USER="ada").status_code == 200
    assert is_logged_in(client)


# ---- the same through daphne (Django's async path, where axes has its own code) ------------

USER = "ada"
REAL_PASSWORD = "a-long-test-password-1"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def browser_session() -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), NoRedirect())


def open_(opener: urllib.request.OpenerDirector, request: Any) -> tuple[int, str]:
    try:
        with opener.open(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def login(url: str, password: str) -> int:
    opener = browser_session()
    status, page = open_(opener, f"{url}/login/")
    assert status == 200
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = urllib.parse.urlencode(
        {"username": USER, "password": password, "csrfmiddlewaretoken": token}
    ).encode()
    status, _ = open_(opener, urllib.request.Request(f"{url}/login/", data=form))
    return status


@pytest.mark.live_server
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_under_daphne_lockout_holds_and_tokens_and_sso_still_work(
    zk_hosts: str, tmp_path: Path
) -> None:
    env = console_env(
        zk_hosts, tmp_path, user=USER, password=REAL_PASSWORD, MRT_SSO_HEADER="X-Remote-User"
    )
    key = api_token(env, tmp_path / "key", user=USER, name="t")
    with daphne(env, tmp_path / "daphne.log") as url:
        assert login(url, REAL_PASSWORD) == 302  # the password is right
        for _ in range(LIMIT + 1):
            assert login(url, "not-the-password") in (200, 429)
        assert login(url, REAL_PASSWORD) == 429
        api = urllib.request.Request(
            f"{url}/api/overview", headers={"Authorization": f"Bearer {key}"}
        )
        assert open_(browser_session(), api)[0] == 200
        sso = urllib.request.Request(f"{url}/", headers={"X-Remote-User": USER})
        status, page = open_(browser_session(), sso)
        assert status == 200
        assert f">{USER}</a>" in page


def _settings_with(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = (
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.AXES_LOCKOUT_PARAMETERS, s.AXES_FAILURE_LIMIT, "
        "s.AXES_COOLOFF_TIME.total_seconds()]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env={
            "PATH": "/usr/bin:/bin",
            "DJANGO_SETTINGS_MODULE": "mrtadmin.settings",
            "DJANGO_SECRET_KEY": "x" * 50,
            **env,
        },
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
    )


def test_the_lockout_is_configured_from_the_environment(tmp_path: Path) -> None:
    var = {"MRT_VAR_DIR": str(tmp_path)}
    default = _settings_with(var)
    assert default.stdout.strip().splitlines()[-1] == '[["username", "ip_address"], 5, 900.0]'
    behind_proxy = _settings_with(
        {
            **var,
            "MRT_LOGIN_LOCKOUT_BY": "username",
            "MRT_LOGIN_FAILURE_LIMIT": "10",
            "MRT_LOGIN_COOLOFF_MINUTES": "60",
        }
    )
    assert behind_proxy.stdout.strip().splitlines()[-1] == '[["username"], 10, 3600.0]'
    wrong = _settings_with({**var, "MRT_LOGIN_LOCKOUT_BY": "cookie"})
    assert wrong.returncode != 0
    assert "MRT_LOGIN_LOCKOUT_BY" in wrong.stderr
