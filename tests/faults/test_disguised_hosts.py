"""Depositors that disguise one server as several, stall below HTTP, or name files to split lines.

The real daemons on a real ZooKeeper against loopback servers this file starts: the per-host
download cap against five spellings of 127.0.0.2, estimating and downloading against a server
that trickles its response headers, a port that refuses, IPv6 addresses carrying a loopback
IPv4 one, and file names holding line and paragraph separators.
"""

from __future__ import annotations

import io
import threading
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
from daemons.conftest import FileServer, daemon, make_job, wait_for
from kazoo.client import KazooClient

from queues.daemons.runner import Host
from queues.daemons.workfolder import workdir
from queues.services import moves
from queues.zk.jobs import job_load
from queues.zk.records import Job
from tests.steps.slow_servers import HeaderTrickle, refused_port

from .conftest import snapshot
from .test_hostile_depositors import Hostile

# One server, five ways to write its address.
SPELLINGS = ["127.0.0.2", "127.2", "2130706434", "0x7f.2", "[::ffff:127.0.0.2]"]


@pytest.fixture
def slow_server() -> Iterator[Hostile]:
    server = Hostile("127.0.0.2")
    yield server
    server.close()


@pytest.fixture
def trickle() -> Iterator[HeaderTrickle]:
    server = HeaderTrickle()
    yield server
    server.close()


def _settled(server: HeaderTrickle) -> tuple[int, int, int]:
    """The trickler's counts once every connection it took has ended one way or the other."""
    return wait_for(lambda: (c := server.counts())[0] > 0 and c[1] + c[2] >= c[0] and c)


def test_spellings_of_one_address_share_its_download_cap(
    zk: KazooClient, files: FileServer, slow_server: Hostile, settings: Any
) -> None:
    # A slow depositor's five jobs first in line, each naming its server another way, and six
    # good jobs behind them; three downloading loops, one download per server. Counted by the
    # address the connection goes to, the slow server gets one loop and the good jobs the rest.
    settings.MRT_DOWNLOAD_MIN_RATE = 0
    settings.MRT_DOWNLOAD_JOBS = 3
    settings.MRT_DOWNLOADS_PER_HOST = 1
    port = slow_server.httpd.server_address[1]
    slow = [
        make_job(
            zk,
            {"payload_url": f"http://{spelling}:{port}/trickle{n}", "type": "file"},
            state="Downloading",
            priority=1,
        )
        for n, spelling in enumerate(SPELLINGS)
    ]
    good = [
        make_job(
            zk,
            {"payload_url": files.put(f"good{n}.txt", f"good {n}"), "type": "file"},
            state="Downloading",
        )
        for n in range(6)
    ]
    host = Host("downloading", poll=0.1)
    stop = threading.Event()
    runner = threading.Thread(target=host.run, args=(stop,), daemon=True)
    runner.start()
    try:
        wait_for(lambda: all(job_load(zk, j.jid).state == "Processing" for j in good))
        assert [job_load(zk, j.jid).state for j in slow] == ["Downloading"] * len(SPELLINGS)
        assert slow_server.open_trickles == 1
        assert slow_server.most_trickles == 1, "never two downloads from the one server"
    finally:
        slow_server.release.set()
        stop.set()
        runner.join(timeout=60)
        host.close()


def test_estimating_lets_go_of_a_server_trickling_its_headers(
    zk: KazooClient, trickle: HeaderTrickle, settings: Any
) -> None:
    # The response would say Content-Length 2 after half a minute; estimating's question has
    # MRT_HTTP_TIMEOUT for the whole answer and counts the size as unknown instead.
    settings.MRT_HTTP_TIMEOUT = 1.0
    settings.MRT_UNKNOWN_SIZE_BYTES = 777
    job = make_job(zk, {"payload_url": trickle.url + "/a", "type": "file"}, state="Estimating")

    daemon(zk, "estimating").run_once()

    assert job_load(zk, job.jid).space_needed == 777
    assert _settled(trickle) == (1, 1, 0), "the HEAD was abandoned, never answered in full"


def test_downloading_fails_a_server_trickling_its_headers_at_the_deadline(
    zk: KazooClient, trickle: HeaderTrickle, settings: Any
) -> None:
    settings.MRT_DOWNLOAD_MIN_RATE = 0
    settings.MRT_DOWNLOAD_DEADLINE = 1.5
    job = make_job(zk, {"payload_url": trickle.url + "/a", "type": "file"}, state="Downloading")

    daemon(zk, "downloading").run_once()

    done = job_load(zk, job.jid)
    assert done.state == "Failed"
    assert done.status.message.endswith(f"{trickle.url}/a: took longer than the limit of 1.5s")
    assert _settled(trickle) == (1, 1, 0)


def test_downloading_fails_headers_below_the_minimum_rate(
    zk: KazooClient, trickle: HeaderTrickle, settings: Any
) -> None:
    settings.MRT_DOWNLOAD_MIN_RATE = 1024
    settings.MRT_DOWNLOAD_RATE_WINDOW = 1.0
    job = make_job(zk, {"payload_url": trickle.url + "/a", "type": "file"}, state="Downloading")

    daemon(zk, "downloading").run_once()

    done = job_load(zk, job.jid)
    assert done.state == "Failed"
    assert "sent no complete response headers within 1s, below the minimum of 1024 bytes/s" in (
        done.status.message
    )
    assert _settled(trickle) == (1, 1, 0)


def test_a_refused_download_is_reported_as_refused(zk: KazooClient, settings: Any) -> None:
    settings.MRT_DOWNLOAD_RETRIES = 0
    settings.MRT_RETRY = {**settings.MRT_RETRY, "depositor": "attempts=1"}  # no second try
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}/a.txt"
        job = make_job(zk, {"payload_url": url, "type": "file"}, state="Downloading")
        daemon(zk, "downloading").run_once()

    done = job_load(zk, job.jid)
    assert done.state == "Failed"
    assert f"{url}: connection refused by 127.0.0.1:{port} (gave up after attempt)" in (
        done.status.message
    )
    assert "timed out" not in done.status.message


@pytest.mark.parametrize(
    ("address", "form"),
    [
        ("2002:7f00:2::", "a 6to4 address embedding 127.0.0.2"),
        ("64:ff9b::7f00:2", "a NAT64 address embedding 127.0.0.2"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffd", "a Teredo address embedding 127.0.0.2"),
    ],
)
def test_an_ipv6_disguise_of_loopback_is_refused_naming_what_it_embeds(
    zk: KazooClient, slow_server: Hostile, settings: Any, address: str, form: str
) -> None:
    settings.MRT_FETCH_ALLOW = ""
    port = slow_server.httpd.server_address[1]
    job = make_job(
        zk, {"payload_url": f"http://[{address}]:{port}/x", "type": "file"}, state="Downloading"
    )

    daemon(zk, "downloading").run_once()

    done = job_load(zk, job.jid)
    assert done.state == "Failed"
    assert f"{form}, a loopback address, which is not fetched for depositors" in (
        done.status.message
    )


def test_an_ipv4_mapped_spelling_of_an_allowed_address_is_fetched(
    zk: KazooClient, files: FileServer
) -> None:
    # MRT_FETCH_ALLOW (127.0.0.0/8 and ::1 in the tests) covers the same server however the
    # depositor writes its address.
    url = files.put("mapped.txt", "mapped").replace("127.0.0.1", "[::ffff:127.0.0.1]")
    job = make_job(zk, {"payload_url": url, "type": "file"}, state="Downloading")

    daemon(zk, "downloading").run_once()

    done = job_load(zk, job.jid)
    assert done.state == "Processing", done.status.message
    assert (workdir(job) / "object/producer/mapped.txt").read_text() == "mapped"


# File names --------------------------------------------------------------------------------

SPLITTERS = {
    "line\u2028separator.txt": "U+2028 (LINE SEPARATOR), which splits a log or manifest line",
    "para\u2029separator.txt": "U+2029 (PARAGRAPH SEPARATOR), which splits a log or manifest line",
    "next\x85line.txt": "the control character U+0085 (NEXT LINE)",
    "record\x1eseparator.txt": "the control character U+001E",
}


@pytest.mark.parametrize(("name", "words"), list(SPLITTERS.items()))
def test_a_file_name_that_splits_lines_is_refused_naming_the_character(
    zk: KazooClient, name: str, words: str
) -> None:
    before = snapshot(zk)
    with pytest.raises(ValueError) as caught:
        moves.batch_submit(
            profile="p", submitter="me", payload_url="https://example.org/a", filename=name
        )
    assert str(caught.value) == f"file name {name!r} contains {words}"
    assert snapshot(zk) == before


def _zip_holding(name: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("fine.txt", "fine")
        zf.writestr(name, "split")
    return buffer.getvalue()


def test_a_container_member_named_with_a_line_separator_fails_the_job(
    zk: KazooClient, files: FileServer
) -> None:
    url = files.put("split.zip", _zip_holding("a\u2028b.txt"))
    job: Job = make_job(zk, {"payload_url": url, "type": "container"}, state="Downloading")

    daemon(zk, "downloading").run_once()

    done = job_load(zk, job.jid)
    assert done.state == "Failed"
    assert "member 'a\\u2028b.txt' contains U+2028 (LINE SEPARATOR)" in done.status.message
    assert not (workdir(job) / "object/producer/fine.txt").exists(), "refused before unpacking"
