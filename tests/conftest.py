"""Shared fixtures: one real ZooKeeper server per worker (tests/workers.py), a fresh chroot per
test."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import global_settings, settings

from queues.services.zkserver import LocalZooKeeper, jute_maxbuffer_from_env
from queues.zk import client as zkmod
from tests.browser import CHROMIUM, CHROMIUM_ARGS
from tests.liveserver import install as keep_flush_after_requests
from tests.markers import (  # noqa: F401  (the hooks that mark, check and pick the quick tier)
    pytest_addoption,
    pytest_configure,
    pytest_fixture_setup,
    pytest_runtest_call,
    pytest_runtest_makereport,
    pytest_runtest_setup,
)
from tests.markers import pytest_collection_modifyitems as mark_and_pick
from tests.workers import free_port, heavy_first, install, refuse_xdist_groups
from tests.workers import pytest_cmdline_main as pytest_cmdline_main
from tests.workers import pytest_xdist_make_scheduler as pytest_xdist_make_scheduler
from tests.zkproxy import ZkProxy
from tests.zktree import chroot_on, shared_client_on

# Every port the suite's processes hand a server comes from a block of their own (tests/workers.py).
install()
# A test's flush waits for the live server's requests still being answered (tests/liveserver.py).
keep_flush_after_requests()

LOOPBACK = "127.0.0.0/8,::1"
log = logging.getLogger(__name__)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    refuse_xdist_groups(items)
    mark_and_pick(config, items)
    heavy_first(items)


# The suite starts dozens of ZooKeeper servers that live seconds to minutes: without C2
# (the optimizing compiler) and with the serial collector, a server used 2.8 s of CPU for
# 6,000 requests instead of 4.1 s; without a disk flush per write (the tests' servers die
# with their data) 9.0 s instead of 12.7 s for 30,000.
os.environ.setdefault(
    "ZK_LOCAL_JVMFLAGS",
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dzookeeper.forceSync=no",
)


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalZooKeeper]:
    server = LocalZooKeeper(tmp_path_factory.mktemp("zookeeper"), free_port())
    server.start()
    yield server
    server.stop()


# ZooKeeper's own jute.maxbuffer (1 MiB - 1), which Merritt's ensemble most likely keeps.
ZOOKEEPER_DEFAULT_MAXBUFFER = 0xFFFFF


@pytest.fixture(scope="session")
def zk_server_1mib(
    zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalZooKeeper]:
    """A server that takes no request past ZooKeeper's default 1 MiB: the session's own when it
    has that limit (the default, unless ZK_JUTE_MAXBUFFER says otherwise), else one started."""
    if (zk_server.jute_maxbuffer or jute_maxbuffer_from_env()) == ZOOKEEPER_DEFAULT_MAXBUFFER:
        yield zk_server
        return
    server = LocalZooKeeper(
        tmp_path_factory.mktemp("zookeeper-1mib"),
        free_port(),
        jute_maxbuffer=ZOOKEEPER_DEFAULT_MAXBUFFER,
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def zk_1mib(zk_server_1mib: LocalZooKeeper) -> Iterator[Any]:
    """``zk`` on the 1 MiB server: the process's shared client, in a chroot of its own."""
    with chroot_on(zk_server_1mib) as chroot, shared_client_on(f"{zk_server_1mib.hosts}{chroot}"):
        yield zkmod.client()


@pytest.fixture
def zk_own_1mib(tmp_path: Path) -> Iterator[Any]:
    """``zk`` on a 1 MiB server of the test's own, stopped with it: for a test that loads more
    than the session's shared server (and its heap) should carry for every test after it."""
    server = LocalZooKeeper(tmp_path / "zookeeper", free_port(), jute_maxbuffer=0xFFFFF)
    server.start()
    try:
        with shared_client_on(server.hosts):
            yield zkmod.client()
    finally:
        server.stop()


@pytest.fixture(scope="session", autouse=True)
def _var_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Point everything the project writes locally at a temporary folder."""
    var = tmp_path_factory.mktemp("var")
    settings.MRT_VAR_DIR = var
    settings.MRT_WORK_DIR = var / "work"
    settings.MRT_STORAGE_ROOT = var / "storage"
    settings.MRT_DOWNLOADS_DIR = var / "downloads"
    settings.EMAIL_FILE_PATH = var / "mail"
    # The tests' file:// payloads are written under their tmp_path folders.
    settings.MRT_FILE_ROOTS = [tmp_path_factory.getbasetemp()]
    # The tests' depositors are loopback servers; tests of the fetch policy itself set "".
    settings.MRT_FETCH_ALLOW = LOOPBACK
    os.environ["MRT_FETCH_ALLOW"] = LOOPBACK  # for the daemons and servers tests start
    # Django's default hasher takes half a second of CPU per password, by design; the suite makes
    # and checks hundreds (a login-throttle test alone dozens). Passwords the tests set in this
    # process are hashed with MD5; the default stays in the list, so a password set by a
    # manage.py or daphne process the test started (which keeps the real setting) still checks.
    settings.PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.MD5PasswordHasher",
        *global_settings.PASSWORD_HASHERS,
    ]
    return var


@pytest.fixture(autouse=True)
def _batch_moves_settled() -> Iterator[None]:
    """The batches a test's loops completed are moved on (``queues/daemons/completions.py``,
    a thread of the process's own) before the next test binds a client of its own, and its
    completed jobs' folders removed (``FOLDER_REMOVALS``) before the next test's folders."""
    yield
    from queues.daemons.completions import REPORTING_MOVES
    from queues.daemons.workfolder import FOLDER_REMOVALS

    REPORTING_MOVES.settle(timeout=60)
    FOLDER_REMOVALS.settle(timeout=60)


@pytest.fixture
def zk_hosts(zk_server: LocalZooKeeper) -> Iterator[str]:
    """A connection string into a chroot of its own, so tests never see each other's nodes."""
    with chroot_on(zk_server) as chroot:
        hosts = f"{zk_server.hosts}{chroot}"
        with shared_client_on(hosts):
            yield hosts


@pytest.fixture
def zk(zk_hosts: str):
    """The process's shared client, connected into the test's chroot."""
    return zkmod.client()


@pytest.fixture
def proxy(zk_server: LocalZooKeeper) -> Iterator[ZkProxy]:
    """A loopback proxy in front of the test's server, to cut or black-hole a connection."""
    between = ZkProxy(zk_server.port)
    yield between
    between.close()


@pytest.fixture
def proxied_client(
    proxy: ZkProxy, zk_server: LocalZooKeeper, zk_hosts: str
) -> Iterator[Callable[..., Any]]:
    """``connect(timeout=10)``: a client with its own session whose connection goes through
    ``proxy``, in the test's chroot (a consumer on another host); closed after the test."""
    made: list[Any] = []

    def connect(timeout: float = 10.0) -> Any:
        client = zkmod.connect(proxy.hosts + zk_hosts[len(zk_server.hosts) :], timeout=timeout)
        made.append(client)
        return client

    yield connect
    for client in made:
        client.stop()
        client.close()


@pytest.fixture
def other_zk(zk_hosts: str):
    """A second client with its own session, like another consumer on another host."""
    client = zkmod.connect(zk_hosts)
    yield client
    client.stop()
    client.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright; in CI a missing browser fails, never skips."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"no Chromium at {CHROMIUM}: bin/run-tests installs it")
        pytest.skip(f"no Chromium at {CHROMIUM} (bin/run-tests installs it)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; Django would refuse ORM calls.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def held_lookups(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[str]]]:
    """The lookup of any name ending ``.slow.example`` waits (up to a minute) until the test
    lets it go; a name ending ``.two.example`` has two loopback addresses, the first refusing
    connections; every other name as the system resolves it. The one stand-in of this suite
    for a part outside it (as in tests/steps/test_fetch_deadlines.py): the system resolver
    cannot be pointed at a loopback server for one process. Yields the event that lets the held
    lookups go, and the threads the lookups were made in."""
    real = socket.getaddrinfo
    release = threading.Event()
    threads: list[str] = []

    def lookup(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        if isinstance(host, str) and host.endswith(".slow.example"):
            release.wait(60)
            raise socket.gaierror(socket.EAI_NONAME, "let go by the test")
        if isinstance(host, str) and host.endswith(".two.example"):
            return [info for ip in ("127.0.0.2", "127.0.0.1") for info in real(ip, port, **kwargs)]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    try:
        yield release, threads
    finally:
        release.set()
