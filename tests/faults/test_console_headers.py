"""Content-Security-Policy on every page, and what DJANGO_SECURE turns on behind TLS.

The policy allows the console's own scripts, styles and websocket only. Chromium reports any
violation as a ``securitypolicyviolation`` event and a console message; the pages, htmx and the
live script must produce none, and live updates must still arrive.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from kazoo.client import KazooClient

from queues.zk import batches, jobs
from tests.browser import shot
from tests.live.conftest import CONFIGURATION, console_env, daphne

USER, PASSWORD = "ada", "a-long-test-password-1"
WAIT_MS = 20_000
PAGES = [
    "/",
    "/batches/",
    "/jobs/",
    "/jobs/?state=Pending",
    "/failed/",
    "/reports/",
    "/holds/",
    "/access/",
    "/consistency/",
    "/submit/",
    "/audit/",
    "/tokens/",
    "/bulk/",
    "/django-admin/",
    "/django-admin/auth/user/",
    "/django-admin/auth/user/1/change/",
]
# Collects every violation the page reports, from the first script on.
WATCH_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cspViolations.push(e.violatedDirective + " " + e.blockedURI + " " + e.sourceFile);
});
"""


def directives(policy: str) -> dict[str, list[str]]:
    found = {}
    for part in policy.split(";"):
        words = part.split()
        if words:
            found[words[0]] = words[1:]
    return found


@pytest.mark.django_db
def test_every_answer_carries_a_policy_without_inline_script() -> None:
    for path in ("/login/", "/healthz", "/django-admin/login/"):
        response = Client().get(path)
        policy = directives(response["Content-Security-Policy"])
        assert policy["default-src"] == ["'self'"]
        assert policy["script-src"] == ["'self'"]
        assert policy["style-src"] == ["'self'"]
        assert policy["connect-src"] == ["'self'"]
        assert policy["frame-ancestors"] == ["'none'"]
        assert policy["object-src"] == ["'none'"]


def test_no_template_has_inline_script_or_style() -> None:
    """The rule the policy enforces, checked where it is kept: in the templates."""
    templates = Path(settings.BASE_DIR) / "templates"
    for template in templates.rglob("*.html"):
        text = template.read_text(encoding="utf-8")
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), template
        assert not re.search(r"<style\b|\sstyle=|\son[a-z]+=|javascript:", text), template


# ---- in Chromium ------------------------------------------------------------------------------


@pytest.fixture
def console_url(zk_hosts: str, tmp_path: Path) -> Iterator[str]:
    env = console_env(zk_hosts, tmp_path, user=USER, password=PASSWORD)
    with daphne(env, tmp_path / "daphne.log") as url:
        yield url


@pytest.fixture
def context(browser: Any, console_url: str) -> Iterator[tuple[Any, list[str]]]:
    """A browser context that records CSP violations of every page, logged in as ada."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT_MS)
    context.add_init_script(WATCH_VIOLATIONS)
    messages: list[str] = []

    def on_console(message: Any) -> None:
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            messages.append(message.text)

    context.on("console", on_console)
    page = context.new_page()
    page.goto(f"{console_url}/login/")
    assert page.evaluate("window.__cspViolations") == []
    page.fill("#id_username", USER)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{console_url}/")
    page.close()
    yield context, messages
    context.close()


def violations(page: Any) -> list[str]:
    return page.evaluate("window.__cspViolations")


@pytest.mark.slow
@pytest.mark.browser
def test_pages_report_no_violation_and_live_updates_still_arrive(
    context: tuple[Any, list[str]], console_url: str, other_zk: KazooClient
) -> None:
    browser_context, messages = context
    batch = batches.batch_create(other_zk, submission={"profile": "ucb_lib_test"})
    job = jobs.job_create(other_zk, bid=batch.bid, configuration=CONFIGURATION)
    page = browser_context.new_page()
    for path in [*PAGES, f"/batches/{batch.bid}/", f"/jobs/{job.jid}/"]:
        page.goto(f"{console_url}{path}")
        page.wait_for_load_state("networkidle")
        assert violations(page) == [], path

    # An error page's Back link (it was a javascript: URL) goes back without a violation.
    page.goto(f"{console_url}/")
    page.goto(f"{console_url}/jobs/jid9999999999/")
    page.click("a[data-back]")
    page.wait_for_url(f"{console_url}/")
    assert violations(page) == []

    # The live script connects its websocket under the policy, and htmx applies what it hears.
    page.goto(f"{console_url}/")
    # Predicates as functions: Playwright would eval() a bare expression, which the policy forbids.
    page.wait_for_function("() => window.mrtLive && window.mrtLive.following()")
    assert (page.text_content("#count-job-Pending") or "").startswith("1 ")
    jobs.job_transition(other_zk, job, "Estimating")
    page.wait_for_function(
        "() => document.querySelector('#count-job-Estimating')?.textContent.startsWith('1 ')"
    )
    assert violations(page) == []
    assert messages == []
    shot(page, "faults-csp-overview")
    page.close()


# ---- TLS: HSTS and Secure cookies ---------------------------------------------------------------


def settings_in(env: dict[str, str], *names: str) -> dict[str, Any]:
    """The named settings as a fresh process computes them from ``env``."""
    code = (
        "import django, json; django.setup(); from django.conf import settings; "
        f"print(json.dumps({{n: getattr(settings, n, None) for n in {list(names)!r}}}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "DJANGO_SETTINGS_MODULE": "mrtadmin.settings"},
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


SECURITY_SETTINGS = (
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_HSTS_SECONDS",
    "SECURE_SSL_REDIRECT",
    "SECURE_PROXY_SSL_HEADER",
)


def test_plain_http_by_default(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "MRT_VAR_DIR": str(tmp_path), "DJANGO_SECRET_KEY": "x" * 50}
    assert settings_in(env, *SECURITY_SETTINGS) == {
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_PROXY_SSL_HEADER": None,
    }


def request(
    base: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None
) -> http.client.HTTPResponse:
    parts = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def cookie(response: http.client.HTTPResponse, name: str) -> str:
    found = [c for c in response.headers.get_all("Set-Cookie") or [] if c.startswith(f"{name}=")]
    assert found, f"no {name} cookie"
    return found[0]


@pytest.mark.live_server
@pytest.mark.slow
def test_behind_a_tls_proxy_django_secure_sends_hsts_and_secure_cookies(
    zk_hosts: str, tmp_path: Path
) -> None:
    env = console_env(
        zk_hosts,
        tmp_path,
        user=USER,
        password=PASSWORD,
        DJANGO_SECURE="1",
        DJANGO_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto",
    )
    with daphne(env, tmp_path / "daphne.log") as url:
        host = urllib.parse.urlsplit(url).netloc
        tls = {"X-Forwarded-Proto": "https", "Host": host}
        login_page = request(url, "GET", "/login/", tls)
        assert login_page.status == 200
        assert login_page.headers["Strict-Transport-Security"] == "max-age=31536000"
        csrf = cookie(login_page, "csrftoken")
        assert "Secure" in csrf
        # Log in over "TLS": the session cookie is Secure too.
        token = csrf.split(";")[0].split("=", 1)[1]
        form = urllib.parse.urlencode(
            {"username": USER, "password": PASSWORD, "csrfmiddlewaretoken": token}
        ).encode()
        answer = request(
            url,
            "POST",
            "/login/",
            {
                **tls,
                "Cookie": f"csrftoken={token}",
                "Referer": f"https://{host}/login/",
                "Content-Type": "application/x-www-form-urlencoded",
            },
            form,
        )
        assert answer.status == 302, answer.status
        assert "Secure" in cookie(answer, "sessionid")
        assert "HttpOnly" in cookie(answer, "sessionid")
        # Plain HTTP (no proxy header) gets no HSTS and is not redirected (health checks).
        plain = request(url, "GET", "/healthz", {"Host": host})
        assert plain.status == 200
        assert plain.headers["Strict-Transport-Security"] is None
