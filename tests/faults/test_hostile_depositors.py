"""Hostile depositors against real loopback servers: the fetch policy and the extraction policy.

Each test drives the real consumer daemons on a real ZooKeeper against a server this file
controls: one that trickles, one whose body never ends, a redirector, a zip bomb, symbolic-link
chains in a zip and a tar. Every hostile job must fail with a reason that names what it broke,
and nothing may be read or written outside the job's own folder.
"""

from __future__ import annotations

import io
import os
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from daemons.conftest import FileServer, daemon, make_job, wait_for
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from kazoo.client import KazooClient

from queues.daemons.base import JobDaemon
from queues.daemons.runner import Host
from queues.daemons.workfolder import workdir
from queues.operator.audit import ApiToken
from queues.services import moves
from queues.steps.erc import object_files
from queues.zk.jobs import job_load
from queues.zk.records import Job

from .conftest import logged_in, snapshot


class Hostile:
    """A loopback server with routes that misbehave in the ways depositors' servers do."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.release = threading.Event()  # ends the trickle
        self.hits: dict[str, int] = {}
        self.open_trickles = 0
        self.most_trickles = 0
        self.lock = threading.Lock()
        self.redirects: dict[str, str] = {}
        self.trickle_gap = 0.2
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._route(body=False)

            def do_GET(self) -> None:
                self._route(body=True)

            def _route(self, *, body: bool) -> None:
                path = self.path
                with outer.lock:
                    outer.hits[path] = outer.hits.get(path, 0) + 1
                try:
                    if path in outer.redirects:
                        self.send_response(302)
                        self.send_header("Location", outer.redirects[path])
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                    elif path.startswith("/trickle"):
                        self._trickle(body)
                    elif path.startswith("/endless"):
                        self._endless(body)
                    else:
                        self.send_response(200)
                        self.send_header("Content-Length", "6")
                        self.end_headers()
                        if body:
                            self.wfile.write(b"secret")
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def _trickle(self, body: bool) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "100000")
                self.end_headers()
                if not body:
                    return
                with outer.lock:
                    outer.open_trickles += 1
                    outer.most_trickles = max(outer.most_trickles, outer.open_trickles)
                try:
                    while not outer.release.wait(outer.trickle_gap):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                finally:
                    with outer.lock:
                        outer.open_trickles -= 1
                self.close_connection = True

            def _endless(self, body: bool) -> None:
                # No Content-Length: the body ends when the connection does, i.e. never.
                self.send_response(200)
                self.send_header("Connection", "close")
                self.end_headers()
                if not body:
                    return
                block = b"\0" * 65536
                while not outer.release.is_set():
                    self.wfile.write(block)
                self.close_connection = True

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    server = Hostile()
    yield server
    server.close()


@pytest.fixture
def other_host() -> Iterator[Hostile]:
    """The same kind of server on another loopback address: another depositor host."""
    server = Hostile("127.0.0.2")
    yield server
    server.close()


def _download(zk: KazooClient, job: Job) -> Job:
    daemon(zk, "downloading").run_once()
    return job_load(zk, job.jid)


def _outside_untouched(work: Path) -> None:
    """Nothing in the work folder is a link or reads as a host file."""
    for path in work.rglob("*"):
        assert not path.is_symlink(), path
        if path.is_file():
            assert b"root:" not in path.read_bytes()[:4096], path


# The symbolic-link chain of CVE-2025-4138/4330: each link checked alone stays inside.
def _chain_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, target in (("l1", "l2/l2/l2/../../../../../../../etc/passwd"), ("l2", ".")):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16
            zf.writestr(info, target)
    return buffer.getvalue()


def _chain_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        for name, target in (("l1", "l2/l2/l2/../../../../../../../etc/passwd"), ("l2", ".")):
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
        info = tarfile.TarInfo("h")
        info.type = tarfile.LNKTYPE
        info.linkname = "l1"
        tf.addfile(info)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "content"), [("chain.zip", _chain_zip()), ("chain.tgz", _chain_tar())]
)
def test_a_symlink_chain_in_a_container_fails_the_job_and_reads_nothing(
    zk: KazooClient, files: FileServer, name: str, content: bytes
) -> None:
    url = files.put(name, content)
    job = make_job(zk, {"payload_url": url, "type": "container"}, state="Downloading")
    done = _download(zk, job)
    assert done.state == "Failed"
    assert "is a symbolic link; links are not accepted in containers" in done.status.message
    _outside_untouched(workdir(job))


def test_a_link_planted_in_an_object_is_never_followed_into_the_manifest(tmp_path: Path) -> None:
    obj = tmp_path / "object"
    (obj / "producer").mkdir(parents=True)
    (obj / "producer" / "real.txt").write_text("mine")
    (obj / "producer" / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="the object holds a link, producer/passwd"):
        object_files(obj)


def test_a_zip_bomb_stops_at_the_compression_ratio_and_names_it(
    zk: KazooClient, files: FileServer, settings: Any
) -> None:
    settings.MRT_MAX_COMPRESSION_RATIO = 50
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.bin", b"\0" * (20 * 1024 * 1024))
    packed = len(buffer.getvalue())
    url = files.put("bomb.zip", buffer.getvalue())
    job = make_job(zk, {"payload_url": url, "type": "container"}, state="Downloading")
    done = _download(zk, job)
    assert done.state == "Failed"
    assert "the compression-ratio limit" in done.status.message
    assert f"50 times its packed size of {packed} bytes" in done.status.message
    written = sum(p.stat().st_size for p in workdir(job).rglob("*") if p.is_file())
    assert written <= packed * 51


def test_an_endless_body_stops_at_the_object_limit_and_leaves_nothing(
    zk: KazooClient, hostile: Hostile, settings: Any
) -> None:
    settings.MRT_MAX_OBJECT_BYTES = 1024 * 1024
    job = make_job(
        zk, {"payload_url": hostile.url + "/endless", "type": "file"}, state="Downloading"
    )
    done = _download(zk, job)
    assert done.state == "Failed"
    assert "larger than the per-object limit of 1048576 bytes" in done.status.message
    assert not [p for p in workdir(job).rglob("*") if p.is_file()], "the .part file is removed"


def test_a_trickling_server_fails_on_the_minimum_rate_not_after_hours(
    zk: KazooClient, hostile: Hostile, settings: Any
) -> None:
    settings.MRT_DOWNLOAD_MIN_RATE = 1000
    settings.MRT_DOWNLOAD_RATE_WINDOW = 1.0
    job = make_job(
        zk, {"payload_url": hostile.url + "/trickle", "type": "file"}, state="Downloading"
    )
    done = _download(zk, job)
    assert done.state == "Failed"
    assert "below the minimum of 1000 bytes/s" in done.status.message
    assert hostile.hits["/trickle"] == 1, "a server this slow is not asked again"


def test_the_deadline_ends_a_download_whatever_its_rate(
    zk: KazooClient, hostile: Hostile, settings: Any
) -> None:
    settings.MRT_DOWNLOAD_MIN_RATE = 0
    settings.MRT_DOWNLOAD_DEADLINE = 1.5
    job = make_job(
        zk, {"payload_url": hostile.url + "/trickle", "type": "file"}, state="Downloading"
    )
    done = _download(zk, job)
    assert done.state == "Failed"
    assert "took longer than the limit of 1.5s" in done.status.message


def test_one_trickling_depositor_does_not_hold_up_ten_good_jobs(
    zk: KazooClient, files: FileServer, other_host: Hostile, settings: Any
) -> None:
    # Two jobs of a slow depositor first in line, ten good jobs behind them; one process
    # with the default loops. The slow host gets one download at a time, the good jobs all
    # go through while it is still trickling, and its second job waits its turn untouched.
    settings.MRT_DOWNLOAD_MIN_RATE = 0
    settings.MRT_DOWNLOAD_JOBS = 3
    settings.MRT_DOWNLOADS_PER_HOST = 1
    slow = [
        make_job(
            zk,
            {"payload_url": other_host.url + f"/trickle{n}", "type": "file"},
            state="Downloading",
            priority=1,
        )
        for n in range(2)
    ]
    good = [
        make_job(
            zk,
            {"payload_url": files.put(f"good{n}.txt", f"good {n}"), "type": "file"},
            state="Downloading",
        )
        for n in range(10)
    ]
    host = Host("downloading", poll=0.1)
    # One batched loop whose steps run in three threads (MRT_DOWNLOAD_JOBS).
    assert [d.workers for d in host.daemons if isinstance(d, JobDaemon)] == [3]
    stop = threading.Event()
    runner = threading.Thread(target=host.run, args=(stop,), daemon=True)
    runner.start()
    try:
        wait_for(lambda: all(job_load(zk, j.jid).state == "Processing" for j in good))
        states = [job_load(zk, j.jid).state for j in slow]
        assert states == ["Downloading", "Downloading"], "still trickling"
        assert other_host.open_trickles == 1
        assert other_host.most_trickles == 1, "never two downloads from the slow host at once"
    finally:
        other_host.release.set()
        stop.set()
        runner.join(timeout=60)
        host.close()


# The fetch policy ----------------------------------------------------------------------------


def test_a_loopback_url_is_refused_in_the_daemons_and_never_requested(
    zk: KazooClient, hostile: Hostile, settings: Any
) -> None:
    settings.MRT_FETCH_ALLOW = ""
    job = make_job(
        zk, {"payload_url": hostile.url + "/django-admin/", "type": "file"}, state="Downloading"
    )
    done = _download(zk, job)
    assert done.state == "Failed"
    assert "resolves to 127.0.0.1, a loopback address, which is not fetched for depositors" in (
        done.status.message
    )
    assert hostile.hits == {}


def test_estimating_never_asks_a_refused_address_for_a_size(
    zk: KazooClient, hostile: Hostile, settings: Any
) -> None:
    settings.MRT_FETCH_ALLOW = ""
    settings.MRT_UNKNOWN_SIZE_BYTES = 777
    job = make_job(zk, {"payload_url": hostile.url + "/x", "type": "file"}, state="Estimating")
    daemon(zk, "estimating").run_once()
    assert job_load(zk, job.jid).space_needed == 777
    assert hostile.hits == {}


def test_each_redirect_hop_is_checked_again(
    zk: KazooClient, hostile: Hostile, other_host: Hostile, settings: Any
) -> None:
    # The depositor's host is allowed, the address it redirects to is not.
    settings.MRT_FETCH_ALLOW = "127.0.0.1/32"
    hostile.redirects["/go"] = other_host.url + "/secret"
    job = make_job(zk, {"payload_url": hostile.url + "/go", "type": "file"}, state="Downloading")
    done = _download(zk, job)
    assert done.state == "Failed"
    assert "resolves to 127.0.0.2, a loopback address" in done.status.message
    assert hostile.hits == {"/go": 1}
    assert other_host.hits == {}


def test_redirects_are_followed_at_most_five_times(
    zk: KazooClient, hostile: Hostile, settings: Any
) -> None:
    for n in range(10):
        hostile.redirects[f"/r{n}"] = f"{hostile.url}/r{n + 1}"
    job = make_job(zk, {"payload_url": hostile.url + "/r0", "type": "file"}, state="Downloading")
    done = _download(zk, job)
    assert done.state == "Failed"
    assert "more than 5 redirects" in done.status.message
    assert sum(hostile.hits.values()) == 6


def test_an_allowed_redirect_is_followed(zk: KazooClient, hostile: Hostile) -> None:
    hostile.redirects["/moved"] = "/payload.txt"
    job = make_job(zk, {"payload_url": hostile.url + "/moved", "type": "file"}, state="Downloading")
    done = _download(zk, job)
    assert done.state == "Processing", done.status.message
    assert (workdir(job) / "object/producer/moved").read_bytes() == b"secret"


def test_a_redirect_to_another_scheme_is_refused(zk: KazooClient, hostile: Hostile) -> None:
    hostile.redirects["/file"] = "file:///etc/passwd"
    job = make_job(zk, {"payload_url": hostile.url + "/file", "type": "file"}, state="Downloading")
    done = _download(zk, job)
    assert done.state == "Failed"
    assert "only http and https URLs are fetched, not file" in done.status.message


# At the door --------------------------------------------------------------------------------

BAD_NAMES = ["../up.txt", "/etc/abs.txt", "two\nlines.txt", "tab\there.txt", "gpj\u202eexe.txt"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_file_names_are_refused_by_the_service(zk: KazooClient, name: str) -> None:
    before = snapshot(zk)
    with pytest.raises(ValueError, match="file name"):
        moves.batch_submit(
            profile="p", submitter="me", payload_url="https://example.org/a", filename=name
        )
    assert snapshot(zk) == before


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_file_names_are_refused_at_the_form_and_the_api(
    zk: KazooClient, make_user: Any, name: str
) -> None:
    user = make_user("admin")
    admin = logged_in(user)
    _token, key = ApiToken.issue(user=user, name="t")
    before = snapshot(zk)
    fields = {
        "profile": "p",
        "submitter": "me",
        "payload_url": "https://example.org/a",
        "submission_type": "file",
        "filename": name,
    }
    response = admin.post("/submit/", fields)
    assert response.status_code == 400
    assert "file name" in response.content.decode()
    response = Client().post("/api/batches", fields, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 400
    assert "file name" in response.content.decode()
    assert snapshot(zk) == before


def test_a_url_whose_last_part_is_a_bad_name_is_refused(zk: KazooClient) -> None:
    with pytest.raises(ValueError, match="control character"):
        moves.batch_submit(profile="p", submitter="me", payload_url="https://example.org/a%0Ab.txt")


def test_submitbatch_refuses_bad_names_and_loopback_urls(zk: KazooClient, settings: Any) -> None:
    settings.MRT_FETCH_ALLOW = ""
    before = snapshot(zk)
    base = ["submitbatch", "--profile", "p", "--submitter", "me"]
    with pytest.raises(CommandError, match=r"contains '\.\.'"):
        call_command(*base, "--payload-url", "https://example.org/a", "--filename", "../x")
    with pytest.raises(CommandError, match="a loopback address"):
        call_command(*base, "--payload-url", "http://127.0.0.1:1/admin")
    assert snapshot(zk) == before


def test_a_configured_working_dir_never_points_a_job_at_another_folder(
    zk: KazooClient, files: FileServer, settings: Any
) -> None:
    victim = make_job(zk, {"payload_url": files.put("v.txt", "v"), "type": "file"})
    victim_dir = workdir(victim)
    victim_dir.mkdir(parents=True)
    (victim_dir / "keep.txt").write_text("keep")
    job = make_job(
        zk,
        {
            "payload_url": files.put("a.txt", "a"),
            "type": "file",
            "working_dir": str(victim_dir),
        },
        state="Downloading",
    )
    assert workdir(job) == Path(settings.MRT_WORK_DIR).resolve() / job.bid / job.jid
    assert _download(zk, job).state == "Processing"
    assert (victim_dir / "keep.txt").read_text() == "keep"
    assert os.listdir(victim_dir) == ["keep.txt"]
