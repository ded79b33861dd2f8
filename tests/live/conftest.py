"""Fixtures for the live console: a logged-in session, websocket clients, queue items; and what
every test through a real daphne shares: the console's environment, an API token, a log-in and
daphne itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.conf import settings
from kazoo.client import KazooClient

from queues.live.hub import reset_hub
from queues.services.zkserver import free_port
from queues.zk import batches, jobs
from queues.zk.records import Batch, Job

T = TypeVar("T")
DAPHNE = [sys.executable, "-m", "daphne", "-b", "127.0.0.1"]
CONFIGURATION = {
    "profile": "ucb_lib_test",
    "submitter": "dpr/Ada Lovelace",
    "payload_url": "https://example.org/object.zip",
    "type": "container",
}


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    """Run one async scenario on a fresh event loop, bounded so a hang fails instead."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


@pytest.fixture
def live(zk: KazooClient) -> Iterator[None]:
    """A fresh hub and channel layer per test, stopped before the test's ZooKeeper goes away."""
    reset_hub()
    channel_layers.backends.clear()
    yield
    reset_hub()
    channel_layers.backends.clear()


@pytest.fixture
def session_cookie(client: Any, django_user_model: Any) -> str:
    """The session cookie of a logged-in operator, as a browser would send it."""
    user = django_user_model.objects.create_superuser("ada", "ada@example.org", "secret-pw-1")
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def communicator(cookie: str | None) -> WebsocketCommunicator:
    from mrtadmin.asgi import application

    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if cookie is not None:
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()))
    return WebsocketCommunicator(application, "/ws/live/", headers=headers)


async def open_socket(cookie: str, topics: list[str]) -> WebsocketCommunicator:
    """Connect, read the hello, subscribe and wait for the acknowledgement."""
    socket = communicator(cookie)
    connected, _ = await socket.connect(timeout=10)
    assert connected
    hello = await socket.receive_json_from(timeout=10)
    assert hello["kind"] == "hello"
    await socket.send_json_to({"subscribe": topics})
    ack = await socket.receive_json_from(timeout=10)
    assert ack == {"kind": "subscribed", "topics": sorted(topics)}
    return socket


async def receive_until(
    socket: WebsocketCommunicator,
    done: Callable[[dict[str, Any]], bool],
    *,
    timeout: float = 20.0,
) -> list[dict[str, Any]]:
    """Every message up to and including the first one ``done`` accepts (bounded)."""
    seen: list[dict[str, Any]] = []

    async def collect() -> None:
        while True:
            message = await socket.receive_json_from(timeout=timeout)
            seen.append(message)
            if done(message):
                return

    try:
        await asyncio.wait_for(collect(), timeout)
    except TimeoutError as exc:
        raise AssertionError(f"expected message not received; got {json.dumps(seen)}") from exc
    return seen


@pytest.fixture
def make_batch(zk: KazooClient) -> Callable[[], Batch]:
    def make() -> Batch:
        return batches.batch_create(zk, submission={"profile": "ucb_lib_test", "type": "container"})

    return make


@pytest.fixture
def make_job(zk: KazooClient) -> Callable[[Batch], Job]:
    def make(batch: Batch) -> Job:
        return jobs.job_create(zk, bid=batch.bid, configuration=CONFIGURATION)

    return make


def manage_py() -> list[str]:
    """The command line that runs the console's ``manage.py`` with this interpreter."""
    return [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]


def console_env(
    zk_hosts: str, tmp_path: Path, *, user: str, password: str, **extra: str
) -> dict[str, str]:
    """Environment for console processes on the test's ZooKeeper chroot and a fresh database,
    migrated, with a superuser ``user``."""
    env = {
        **os.environ,
        "ZK_HOSTS": zk_hosts,
        "MRT_VAR_DIR": str(tmp_path / "var"),
        "MRT_DATABASE_PATH": str(tmp_path / "console.sqlite3"),
        "DJANGO_SECRET_KEY": "live-test-" + "x" * 40,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SUPERUSER_PASSWORD": password,
        "LOG_LEVEL": "WARNING",
        **extra,
    }
    manage = manage_py()
    subprocess.run([*manage, "migrate", "--noinput"], env=env, check=True, capture_output=True)
    subprocess.run(
        [*manage, "createsuperuser", "--noinput", "--username", user, "--email", "a@example.org"],
        env=env,
        check=True,
        capture_output=True,
    )
    return env


def child_env(zk_hosts: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment for a console process of a test's own: this process's without its ``MRT_``,
    ``ZK_`` and ``DJANGO_`` settings, on the test's ZooKeeper chroot and a fresh database in
    ``tmp_path`` (migrated), with ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MRT_", "ZK_", "DJANGO_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="mrtadmin.settings",
        ZK_HOSTS=zk_hosts,
        MRT_DATABASE_PATH=str(tmp_path / "console.sqlite3"),
        **extra,
    )
    subprocess.run([*manage_py(), "migrate", "--noinput"], env=env, check=True, capture_output=True)
    return env


def api_token(env: dict[str, str], key_file: Path, *, user: str, name: str) -> str:
    """A new API token of ``user``'s, made as an operator would (``manage.py apitoken create``)
    in the database of ``env`` (from ``console_env``); its key, read back from ``key_file``."""
    subprocess.run(
        [
            *manage_py(),
            "apitoken",
            "create",
            "--user",
            user,
            "--name",
            name,
            "--key-file",
            str(key_file),
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    return key_file.read_text().strip()


def api_json(url: str, key: str, form: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON answer of the console's API at ``url`` to a GET, or to a POST of ``form``, sent
    with ``key`` as its bearer token."""
    request = urllib.request.Request(
        url,
        data=urllib.parse.urlencode(form).encode() if form is not None else None,
        headers={"Authorization": f"Bearer {key}"},
        method="POST" if form is not None else "GET",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return dict(json.load(answer))


def log_in(url: str, user: str, password: str) -> requests.Session:
    """A browser-like session logged in through the console's form at ``url``."""
    session = requests.Session()
    form = session.get(f"{url}/login/", timeout=30)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    assert token is not None
    answer = session.post(
        f"{url}/login/",
        data={"username": user, "password": password, "csrfmiddlewaretoken": token.group(1)},
        headers={"Referer": f"{url}/login/"},
        timeout=30,
        allow_redirects=False,
    )
    assert answer.status_code == 302, answer.status_code
    return session


@contextlib.contextmanager
def daphne(
    env: dict[str, str],
    log: Path,
    app: str = "mrtadmin.asgi:application",
    args: Sequence[str] = (),
) -> Iterator[str]:
    """The ASGI ``app`` (the console's unless told) under daphne on a free port (pytest-django's
    live_server has no websockets), with daphne's further ``args``; yields its base URL once it
    answers."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*DAPHNE, "-p", str(port), *args, app],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{url}/healthz", timeout=5) as answer,
            ):
                if answer.status == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"daphne did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
