from __future__ import annotations

import hashlib
import io
import re
import tarfile
import zipfile
from pathlib import Path

import pytest

from queues.steps.fetch import (
    ContainerError,
    DigestMismatch,
    DownloadError,
    DownloadsFailed,
    download,
    download_all,
    extract_container,
    fetch_bytes,
    fetch_text,
    head_all,
    head_size,
)
from queues.steps.submission import PayloadFile
from tests.steps.conftest import Loopback, Reply

BODY = b"payload bytes " * 1000


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_head_size_reads_content_length(http_server: Loopback) -> None:
    url = http_server.file("/a.bin", BODY)

    assert head_size(url) == len(BODY)
    assert http_server.seen("HEAD", "/a.bin")


def test_head_size_falls_back_to_get_when_head_is_refused(http_server: Loopback) -> None:
    http_server.add("HEAD", "/a", Reply(status=405))
    http_server.add("GET", "/a", Reply(body=BODY))

    assert head_size(http_server.url + "/a") == len(BODY)


def test_head_size_is_none_for_missing_unreachable_and_unknown(
    http_server: Loopback, tmp_path: Path
) -> None:
    http_server.add("HEAD", "/chunked", Reply(headers={"Content-Length": ""}))

    assert head_size(http_server.url + "/missing") is None
    assert head_size(http_server.url + "/chunked") is None
    assert head_size("http://127.0.0.1:9/closed", timeout=2) is None
    assert head_size((tmp_path / "nothing").as_uri()) is None
    assert head_size("ftp://h/x") is None
    assert head_size("http://[broken") is None


def test_head_size_of_a_file_url_is_the_file_size(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"12345")

    assert head_size(path.as_uri()) == 5


def test_head_size_respects_allowed_file_roots(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"12345")

    assert head_size(path.as_uri(), file_roots=[tmp_path / "elsewhere"]) is None


def test_head_all_sizes_every_url(http_server: Loopback) -> None:
    urls = [http_server.file(f"/{n}", b"x" * n) for n in range(1, 6)]

    assert head_all([*urls, http_server.url + "/gone"], threads=3) == {
        **{u: n for n, u in enumerate(urls, start=1)},
        http_server.url + "/gone": None,
    }


def test_download_streams_to_dest_and_returns_digests(
    http_server: Loopback, tmp_path: Path
) -> None:
    url = http_server.file("/a.bin", BODY)
    dest = tmp_path / "deep" / "a.bin"

    result = download(url, dest, digest_alg="MD5", digest_value=md5(BODY).upper())

    assert dest.read_bytes() == BODY
    assert result.size == len(BODY)
    assert result.digests == {"md5": md5(BODY), "sha256": sha256(BODY)}
    assert list(dest.parent.iterdir()) == [dest]


def test_download_asks_for_the_bytes_unencoded(http_server: Loopback, tmp_path: Path) -> None:
    url = http_server.file("/a", BODY)

    download(url, tmp_path / "a")

    assert http_server.seen("GET", "/a")[0].headers["Accept-Encoding"] == "identity"


def test_download_retries_server_errors_then_succeeds(
    http_server: Loopback, tmp_path: Path
) -> None:
    http_server.add("GET", "/flaky", Reply(503), Reply(500), Reply(body=BODY))

    result = download(http_server.url + "/flaky", tmp_path / "f", retries=3, backoff=0.01)

    assert result.size == len(BODY)
    assert len(http_server.seen("GET", "/flaky")) == 3


def test_download_gives_up_after_the_retries(http_server: Loopback, tmp_path: Path) -> None:
    http_server.add("GET", "/down", Reply(502))

    with pytest.raises(DownloadError) as raised:
        download(http_server.url + "/down", tmp_path / "f", retries=2, backoff=0.01)

    assert str(raised.value) == (
        f"{http_server.url}/down: HTTP 502 Bad Gateway (gave up after 3 attempts)"
    )
    assert len(http_server.seen("GET", "/down")) == 3
    assert list(tmp_path.iterdir()) == []


def test_download_does_not_retry_client_errors(http_server: Loopback, tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match=r"/missing: HTTP 404 Not Found$"):
        download(http_server.url + "/missing", tmp_path / "f", retries=3, backoff=0.01)

    assert len(http_server.seen("GET", "/missing")) == 1


def test_download_retries_a_body_cut_short(http_server: Loopback, tmp_path: Path) -> None:
    http_server.add("GET", "/cut", Reply(body=BODY, truncate_to=100), Reply(body=BODY))

    result = download(http_server.url + "/cut", tmp_path / "f", retries=1, backoff=0.01)

    assert result.size == len(BODY)
    assert (tmp_path / "f").read_bytes() == BODY


def test_download_times_out(http_server: Loopback, tmp_path: Path) -> None:
    http_server.add("GET", "/slow", Reply(body=BODY, delay=1.5))

    with pytest.raises(DownloadError, match=r"timed out after 0.3s \(gave up after attempt\)"):
        download(http_server.url + "/slow", tmp_path / "f", retries=0, timeout=0.3)


def test_digest_mismatch_fails_without_retry_and_leaves_nothing(
    http_server: Loopback, tmp_path: Path
) -> None:
    url = http_server.file("/a", BODY)
    dest = tmp_path / "a"
    dest.write_bytes(b"earlier complete download")

    with pytest.raises(DigestMismatch, match=f"md5 digest {md5(BODY)} does not match 0+$"):
        download(url, dest, digest_alg="md5", digest_value="0" * 32, retries=3)

    assert len(http_server.seen("GET", "/a")) == 1
    assert dest.read_bytes() == b"earlier complete download"
    assert [p.name for p in tmp_path.iterdir()] == ["a"]


def test_size_mismatch_fails(http_server: Loopback, tmp_path: Path) -> None:
    url = http_server.file("/a", BODY)

    with pytest.raises(DownloadError, match=f"got {len(BODY)} bytes, expected 3"):
        download(url, tmp_path / "a", expected_size=3)


def test_download_copies_file_urls(tmp_path: Path) -> None:
    source = tmp_path / "source dir" / "a b.txt"
    source.parent.mkdir()
    source.write_bytes(BODY)

    result = download(source.as_uri(), tmp_path / "out" / "x.txt")

    assert (tmp_path / "out" / "x.txt").read_bytes() == BODY
    assert result.digests["sha256"] == sha256(BODY)


def test_a_download_never_replaces_a_file_already_there(tmp_path: Path) -> None:
    """On a working disk that folds case or Unicode forms (``README`` and ``readme``, ``é``
    composed and decomposed: one file there), the second of two such names of one object
    landed on the first and replaced it: one file lost, two reported downloaded. Merritt's
    ingest refuses a file that exists (``createNewFile``) and fails the job."""
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_bytes(b"first file")
    second.write_bytes(BODY)
    dest = tmp_path / "out" / "README"
    download(first.as_uri(), dest)

    with pytest.raises(DownloadError, match="already holds a file of this object"):
        download(second.as_uri(), dest)

    assert dest.read_bytes() == b"first file"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["README"]  # no .part left


def test_file_urls_outside_the_allowed_roots_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match="outside the allowed folders"):
        download("file:///etc/hostname", tmp_path / "x", file_roots=[tmp_path])


def test_fetch_text_returns_the_body(http_server: Loopback) -> None:
    url = http_server.file("/m.checkm", "é checkm\n".encode())

    assert fetch_text(url) == "é checkm\n"


def test_fetch_bytes_refuses_oversized_bodies(http_server: Loopback) -> None:
    url = http_server.file("/big", BODY)

    with pytest.raises(DownloadError, match="larger than the limit of 100 bytes"):
        fetch_bytes(url, max_bytes=100)


def test_fetch_text_names_the_line_with_bad_utf8(http_server: Loopback) -> None:
    url = http_server.file("/bad", b"one\ntwo\nthr\xffee\n")

    with pytest.raises(DownloadError, match="line 3: not valid UTF-8"):
        fetch_text(url)


def test_download_all_fetches_every_file_in_parallel(http_server: Loopback, tmp_path: Path) -> None:
    files = [
        PayloadFile(
            http_server.file(f"/f{n}", bytes([n]) * 5000),
            f"producer/sub{n % 2}/f{n}",
            "md5",
            md5(bytes([n]) * 5000),
            5000,
        )
        for n in range(8)
    ]

    results = download_all(files, tmp_path, threads=4)

    assert [r.url for r in results] == [f.url for f in files]
    assert (tmp_path / "producer/sub1/f3").read_bytes() == bytes([3]) * 5000


def test_download_all_reports_the_failures_and_stops_starting_new_ones(
    http_server: Loopback, tmp_path: Path
) -> None:
    good = [PayloadFile(http_server.file(f"/ok{n}", b"ok"), f"ok{n}") for n in range(20)]
    files = [PayloadFile(http_server.url + "/gone", "gone"), *good]

    with pytest.raises(DownloadsFailed) as raised:
        download_all(files, tmp_path, threads=1, retries=0)

    assert [f.url for f in raised.value.failures] == [http_server.url + "/gone"]
    assert "1 of 21 downloads failed" in str(raised.value)
    assert len(http_server.requests) < 21


def test_download_all_refuses_names_leaving_the_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("contains '..'")):
        download_all([PayloadFile("http://h/x", "../x")], tmp_path)


def _zip(entries: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777 << 16) | 0
            zf.writestr(info, target)
    return buffer.getvalue()


def _tar(members: list[tarfile.TarInfo | tuple[str, bytes]], mode: str = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tf:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tf.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                tf.addfile(info, io.BytesIO(member[1]))
    return buffer.getvalue()


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def test_extract_zip_lists_the_files(tmp_path: Path) -> None:
    container = tmp_path / "c.zip"
    container.write_bytes(_zip({"b/two.txt": b"2", "a.txt": b"1", "empty/": b""}))

    names = extract_container(container, tmp_path / "out")

    assert names == ["a.txt", "b/two.txt"]
    assert (tmp_path / "out/b/two.txt").read_bytes() == b"2"


@pytest.mark.parametrize("mode", ["w", "w:gz"])
def test_extract_tar_lists_the_files(tmp_path: Path, mode: str) -> None:
    container = tmp_path / "c.tar"
    container.write_bytes(_tar([("./x/y.txt", b"y"), ("z.txt", b"z")], mode))

    assert extract_container(container, tmp_path / "out") == ["x/y.txt", "z.txt"]
    assert (tmp_path / "out/x/y.txt").read_bytes() == b"y"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (_zip({"/etc/evil": b"x"}), "is absolute"),
        (_zip({"a/../../evil": b"x"}), "contains '..'"),
        (_zip({}, {"link": "../../outside"}), "is a symbolic link"),
        (_zip({}, {"link": "/etc/passwd"}), "is a symbolic link"),
        (_tar([("../evil", b"x")]), "contains '..'"),
        (_tar([("/abs", b"x")]), "is absolute"),
        (_tar([_link("l", "../../x")]), "is a symbolic link"),
        (_tar([_link("l", "/etc/passwd")]), "is a symbolic link"),
        (_tar([_link("h", "../x", tarfile.LNKTYPE)]), "is a hard link"),
        (_tar([_link("d", "", tarfile.CHRTYPE)]), "is not a file"),
        (b"neither zip nor tar", "neither a zip nor a tar"),
    ],
    # Named by kind, not by bytes: a container's bytes hold the time it was made, and
    # pytest-xdist's workers, each making its own, must collect the same test names.
    ids=lambda value: (
        {b"PK": "zip", b"\x1f\x8b": "tar"}.get(value[:2], "bytes")
        if isinstance(value, bytes)
        else None
    ),
)
def test_unsafe_containers_are_refused(tmp_path: Path, content: bytes, problem: str) -> None:
    container = tmp_path / "c"
    container.write_bytes(content)

    with pytest.raises(ContainerError, match=re.escape(problem)):
        extract_container(container, tmp_path / "out")

    assert not (tmp_path / "evil").exists()
    assert not (tmp_path / "out" / "evil").exists()


def test_even_harmless_links_are_refused_with_a_reason(tmp_path: Path) -> None:
    # A link that stays inside is refused too: whether a chain of links stays inside depends
    # on the order they land on disk, so the one safe rule is no links at all.
    container = tmp_path / "c.tar"
    container.write_bytes(_tar([("a/real.txt", b"r"), _link("a/alias.txt", "real.txt")]))

    with pytest.raises(ContainerError, match="links are not accepted in containers"):
        extract_container(container, tmp_path / "out")
    assert not (tmp_path / "out/a/real.txt").exists(), "nothing is unpacked before the refusal"


def test_containers_over_the_size_limit_are_refused(tmp_path: Path) -> None:
    container = tmp_path / "c.zip"
    container.write_bytes(_zip({"big": b"0" * 10_000}))

    with pytest.raises(ContainerError, match="more than the per-object limit of 1000 bytes"):
        extract_container(container, tmp_path / "out", max_bytes=1000)


def test_a_body_a_server_encodes_anyway_is_kept_as_it_came(
    http_server: Loopback, tmp_path: Path
) -> None:
    """ "identity" is asked for; a server that gzips anyway had its body inflated (1.8 KB of
    gzip wrote 1 GiB, and the digest was of bytes the server never sent). It is kept as sent."""
    import gzip

    sent = gzip.compress(b"\0" * 5_000_000)
    http_server.add("GET", "/bomb", Reply(body=sent, headers={"Content-Encoding": "gzip"}))
    result = download(
        http_server.url + "/bomb",
        tmp_path / "bomb",
        digest_alg="md5",
        digest_value=md5(sent),
        expected_size=len(sent),
    )
    assert (tmp_path / "bomb").read_bytes() == sent and result.size == len(sent)


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1/x",  # an IPv6 address not closed: ValueError from urlsplit
        "https://127.0.0.1\x00.example:{port}/a",  # TypeError from the TLS layer
        "http://127.0.0.1\x00.example:{port}/a",  # the NUL went out in the Host header
        "http://127.0.0.1 .example:{port}/a",
    ],
)
def test_a_url_whose_host_cannot_be_sent_is_refused_not_raised(
    http_server: Loopback, tmp_path: Path, url: str
) -> None:
    url = url.format(port=http_server.url.rsplit(":", 1)[1])
    assert head_size(url, timeout=5) is None
    with pytest.raises(DownloadError):
        download(url, tmp_path / "f", retries=0)
    with pytest.raises(DownloadError):
        fetch_bytes(url, retries=0)
    assert not http_server.seen("GET", "/a") and not http_server.seen("HEAD", "/a")


def test_a_redirect_to_a_url_whose_host_cannot_be_read_is_refused(
    http_server: Loopback, tmp_path: Path
) -> None:
    http_server.add("GET", "/r", Reply(status=302, headers={"Location": "http://[::1/x"}))
    with pytest.raises(DownloadError, match="redirected to a URL whose host cannot be read"):
        download(http_server.url + "/r", tmp_path / "f", retries=0)


def test_credentials_and_an_international_host_go_as_the_wire_wants(
    http_server: Loopback, tmp_path: Path
) -> None:
    """Credentials past Latin-1, and a host in full-width digits (IDNA maps it to 127.0.0.1),
    raised UnicodeEncodeError. The credentials go in UTF-8 (RFC 7617), the host in its IDNA
    form."""
    import base64

    http_server.file("/a", BODY)
    url = f"http://%C3%BC:%E2%82%AC@\uff11\uff12\uff17.0.0.1:{http_server.url.rsplit(':', 1)[1]}/a"
    download(url, tmp_path / "f", retries=0)
    [seen] = http_server.seen("GET", "/a")
    assert seen.headers["Authorization"] == "Basic " + base64.b64encode("ü:€".encode()).decode()
    assert seen.headers["Host"] == f"127.0.0.1:{http_server.url.rsplit(':', 1)[1]}"
    assert (tmp_path / "f").read_bytes() == BODY


def test_a_file_url_with_a_nul_is_refused(tmp_path: Path) -> None:
    url = (tmp_path / "a").as_uri() + "%00b"
    with pytest.raises(DownloadError, match="NUL"):
        download(url, tmp_path / "f", retries=0)
    assert head_size(url) is None


def test_a_password_in_a_url_is_never_in_the_words_about_it(
    http_server: Loopback, tmp_path: Path
) -> None:
    # A depositor's URL may carry credentials (sent as HTTP Basic authentication); what is
    # said about it goes to the job's status in ZooKeeper, the logs and every viewer's pages.
    with_password = http_server.url.replace("http://", "http://depositor:s3cret@")
    shown = http_server.url.replace("http://", "http://depositor:***@")
    http_server.add("GET", "/down", Reply(502))
    http_server.add("GET", "/away", Reply(302, headers={"Location": "http://[::1/x"}))

    with pytest.raises(DownloadError) as missing:
        download(with_password + "/missing", tmp_path / "a", retries=0)
    with pytest.raises(DownloadError) as down:
        download(with_password + "/down", tmp_path / "b", retries=1, backoff=0.01)
    with pytest.raises(DownloadError) as away:
        download(with_password + "/away", tmp_path / "c", retries=0)

    assert str(missing.value) == f"{shown}/missing: HTTP 404 Not Found"
    assert str(down.value).startswith(f"{shown}/down: HTTP 502")
    assert f"{shown}/away redirected" in str(away.value)
    for raised in (missing, down, away):
        assert "s3cret" not in str(raised.value)
    # The credentials themselves still went, as Basic authentication.
    [request] = http_server.seen("GET", "/missing")
    assert request.headers["Authorization"].startswith("Basic ")
