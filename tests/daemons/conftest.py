"""Fixtures for the consumer daemons: a real file server on loopback, per-test folders, and
helpers that put jobs where a test needs them."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import pytest
from kazoo.client import KazooClient

from queues.core.states import JOB_STEPS
from queues.daemons.base import Daemon, SessionGate
from queues.daemons.registry import DAEMONS
from queues.services.zkserver import LocalZooKeeper, free_port
from queues.steps.checkm import BATCH_MANIFEST, OBJECT_MANIFEST, write_checkm
from queues.zk import client as zkmod
from queues.zk.batches import batch_create
from queues.zk.jobs import job_create, job_transition
from queues.zk.records import Job

DEMO = "merritt_demo_content"


class FileServer:
    """Serves the files under ``root`` for GET and HEAD (with Content-Length), records POSTs,
    counts every request, and can slow a file down to simulate a long download."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = ""
        self.lock = threading.Lock()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.posts: list[tuple[str, bytes]] = []
        self.post_keys: list[str] = []  # each POST's Idempotency-Key header ("" without one)
        self.post_status = 200
        # Called with each POST's path once it is recorded, before it is answered: where a
        # test acts while a consumer waits for a callback's answer.
        self.on_post: Callable[[str], None] | None = None
        # Called with the method and path before a GET or HEAD is answered.
        self.before_answer: Callable[[str, str], None] | None = None
        # path -> seconds to spread the body over; "first" ones only slow the first GET.
        self.slow: dict[str, float] = {}
        self.slow_first: dict[str, float] = {}
        self.busy = 0  # GETs and HEADs still to be answered 503, whatever they ask for

    def requests(self) -> int:
        with self.lock:
            return sum(self.counts.values())

    def _busy(self) -> bool:
        with self.lock:
            if self.busy <= 0:
                return False
            self.busy -= 1
            return True

    def put(self, name: str, data: bytes | str) -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return f"{self.url}/{name}"

    def hits(self, method: str, name: str) -> int:
        with self.lock:
            return self.counts[(method, "/" + name)]

    def _count(self, method: str, path: str) -> int:
        with self.lock:
            self.counts[(method, path)] += 1
            return self.counts[(method, path)]


def _handler(server: FileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _file(self) -> Path | None:
            rel = unquote(urlsplit(self.path).path).lstrip("/")
            path = (server.root / rel).resolve()
            if not path.is_relative_to(server.root.resolve()) or not path.is_file():
                return None
            return path

        def _send_error(self, status: int) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_HEAD(self) -> None:
            server._count("HEAD", urlsplit(self.path).path)
            if server._busy():
                return self._send_error(503)
            if server.before_answer is not None:
                server.before_answer("HEAD", urlsplit(self.path).path)
            path = self._file()
            if path is None:
                return self._send_error(404)
            self.send_response(200)
            self.send_header("Content-Length", str(path.stat().st_size))
            self.end_headers()

        def do_GET(self) -> None:
            route = urlsplit(self.path).path
            number = server._count("GET", route)
            if server._busy():
                return self._send_error(503)
            if server.before_answer is not None:
                server.before_answer("GET", route)
            path = self._file()
            if path is None:
                return self._send_error(404)
            body = path.read_bytes()
            spread = server.slow.get(route) or (
                server.slow_first.get(route) if number == 1 else None
            )
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                if not spread:
                    self.wfile.write(body)
                    return
                pieces = 50
                step = max(1, len(body) // pieces)
                for start in range(0, len(body), step):
                    self.wfile.write(body[start : start + step])
                    self.wfile.flush()
                    time.sleep(spread / pieces)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def do_POST(self) -> None:
            route = urlsplit(self.path).path
            server._count("POST", route)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            with server.lock:
                server.posts.append((route, body))
                server.post_keys.append(self.headers.get("Idempotency-Key", ""))
            if server.on_post is not None:
                server.on_post(route)
            self._send_error(server.post_status)

    return Handler


Served = TypeVar("Served", bound=ThreadingHTTPServer)


@contextlib.contextmanager
def serving(httpd: Served) -> Iterator[Served]:
    """Serve ``httpd`` (on loopback) in a thread of its own until the block ends."""
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def _serving(root: Path, address: str = "127.0.0.1") -> Iterator[FileServer]:
    root.mkdir()
    fs = FileServer(root)
    with serving(ThreadingHTTPServer((address, 0), _handler(fs))) as httpd:
        fs.url = f"http://{address}:{httpd.server_address[1]}"
        yield fs


@pytest.fixture
def files(tmp_path: Path) -> Iterator[FileServer]:
    with _serving(tmp_path / "served") as fs:
        yield fs


@pytest.fixture
def other_files(tmp_path: Path) -> Iterator[FileServer]:
    """A second depositor's server, on a host of its own (another loopback address)."""
    with _serving(tmp_path / "served-other", "127.0.0.2") as fs:
        yield fs


@pytest.fixture(autouse=True)
def daemon_dirs(settings: Any, tmp_path: Path) -> Path:
    """Each test its own working, storage and download folders (ARKs repeat across tests)."""
    var = tmp_path / "var"
    settings.MRT_WORK_DIR = var / "work"
    settings.MRT_STORAGE_ROOT = var / "storage"
    settings.MRT_DOWNLOADS_DIR = var / "downloads"
    settings.MRT_DOWNLOAD_RETRIES = 1
    settings.MRT_HTTP_TIMEOUT = 10.0
    settings.MRT_EZID_URL = ""
    settings.MRT_STORAGE_URL = ""
    settings.MRT_INVENTORY_URL = ""
    return var


@pytest.fixture
def profiles(settings: Any, tmp_path: Path) -> Path:
    """A profiles folder of the test's own, starting with copies of the demo profiles."""
    folder = tmp_path / "profiles"
    shutil.copytree(Path(settings.BASE_DIR) / "profiles", folder)
    settings.MRT_PROFILES_DIR = folder
    return folder


def md5(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.md5(raw, usedforsecurity=False).hexdigest()


def object_manifest(rows: list[dict[str, Any]]) -> str:
    return write_checkm(rows, kind=OBJECT_MANIFEST)


def batch_manifest(rows: list[dict[str, Any]], kind: str = BATCH_MANIFEST) -> str:
    return write_checkm(rows, kind=kind)


def make_job(
    zk: Any,
    configuration: dict[str, Any],
    *,
    state: str = "Pending",
    priority: int = 5,
    identifiers: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Job:
    """A job of a fresh batch, moved along the chain of steps to ``state``."""
    config = {"profile": DEMO, "submitter": "tester", **configuration}
    batch = batch_create(zk, submission={"profile": DEMO, "submitter": "tester"})
    job = job_create(
        zk,
        bid=batch.bid,
        configuration=config,
        priority=priority,
        identifiers=identifiers,
        metadata=metadata,
    )
    for step in JOB_STEPS[1 : JOB_STEPS.index(state) + 1]:
        job = job_transition(zk, job, step)
    return job


def daemon(zk: Any, name: str, **kwargs: Any) -> Daemon:
    return DAEMONS[name](zk=zk, poll=0.05, **kwargs)


def drive(
    zk: Any, until: Callable[[], bool], *, names: list[str] | None = None, rounds: int = 100
) -> None:
    """Run the daemons' run_once in pipeline order until ``until()`` holds."""
    daemons = [daemon(zk, n) for n in (names or list(DAEMONS))]
    for _ in range(rounds):
        if until():
            return
        for d in daemons:
            d.run_once()
    assert until(), "the daemons did not get there"


def wait_for(check: Callable[[], Any], *, timeout: float = 60.0, every: float = 0.2) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting after {timeout}s")
        time.sleep(every)


def expire_session(zk: KazooClient, hosts: str) -> None:
    """End ``zk``'s session on the server, as a long network outage would."""
    thief = KazooClient(hosts=hosts, client_id=zk.client_id)
    thief.start(timeout=10)
    thief.stop()
    thief.close()


@pytest.fixture
def own_zk(zk_hosts: str) -> Iterator[tuple[KazooClient, SessionGate]]:
    """A consumer's client whose session the test may end (``expire_session``), with a gate
    fed by its state changes."""
    client = zkmod.connect(zk_hosts)
    gate = SessionGate()
    client.add_listener(lambda state: gate.on_state(str(state)))
    yield client, gate
    client.stop()
    client.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalZooKeeper]:
    """A ZooKeeper server of the test's own: what it counts (requests, writes) is the test's
    alone, and it may be stopped and started."""
    own = LocalZooKeeper(tmp_path / "zookeeper", free_port())
    own.start()
    yield own
    own.stop()
