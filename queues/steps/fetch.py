"""Fetching payloads over HTTP(S) and file:// URLs, and unpacking containers.

Everything here is safe to run twice: downloads land under their final name only when complete
and verified, so a consumer that dies half-way leaves at most a ``.part`` file behind.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Protocol, TypeVar
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

import requests

from queues.steps.checkm import HASH_LENGTHS, filename_problem

USER_AGENT = "merritt-queue-console"
CHUNK = 1024 * 1024
DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_TEXT = 50 * 1024 * 1024
# 408/429 are the two client errors that mean "try again later" rather than "you asked wrong".
RETRY_STATUSES = frozenset({408, 429})
# Servers that gzip on the fly would otherwise hand us bytes whose digest is not the file's.
BASE_HEADERS = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}

T = TypeVar("T")


class DownloadError(Exception):
    """A URL that could not be fetched; ``reason`` says why in words a depositor understands."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url}: {reason}")


class DigestMismatch(DownloadError):
    pass


class DownloadsFailed(DownloadError):
    """Several downloads of one object failed; ``failures`` has each of them."""

    def __init__(self, failures: Sequence[DownloadError], total: int) -> None:
        self.failures = list(failures)
        details = "; ".join(str(f) for f in self.failures)
        super().__init__(
            self.failures[0].url, f"{len(self.failures)} of {total} downloads failed: {details}"
        )


class ContainerError(ValueError):
    """A zip or tar that cannot be unpacked safely."""


class _Retry(Exception):
    """An attempt failed in a way that another attempt may fix."""


@dataclass(frozen=True)
class DownloadResult:
    url: str
    path: Path
    size: int
    # Always has "sha256" (the storage manifest needs it) plus the depositor's algorithm if any.
    digests: dict[str, str] = field(default_factory=dict)


class DownloadItem(Protocol):
    """What download_all needs of each file; submission.PayloadFile fits."""

    @property
    def url(self) -> str: ...
    @property
    def filename(self) -> str: ...
    @property
    def digest_alg(self) -> str | None: ...
    @property
    def digest_value(self) -> str | None: ...
    @property
    def size(self) -> int | None: ...


def _scheme(url: str) -> str:
    return urlsplit(url).scheme.lower()


def local_path(url: str, *, file_roots: Sequence[Path] | None = None) -> Path:
    """The filesystem path of a file:// URL.

    ``file_roots`` limits which folders may be read, so that a depositor cannot ask for
    file:///etc/passwd; an empty list allows none, None any path (library use and tests).
    """
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise DownloadError(url, f"file URL on another host {parts.netloc!r} is not supported")
    path = Path(url2pathname(unquote(parts.path)))
    if file_roots is not None:
        if not file_roots:
            raise DownloadError(url, "file URLs are not accepted here (MRT_FILE_ROOTS is empty)")
        resolved = path.resolve()
        if not any(resolved.is_relative_to(root.resolve()) for root in file_roots):
            raise DownloadError(url, "file URL outside the allowed folders")
    return path


def _retrying(url: str, attempt: Callable[[], T], *, retries: int, backoff: float) -> T:
    number = 0
    while True:
        try:
            return attempt()
        except _Retry as exc:
            if number >= retries:
                tries = "attempt" if retries == 0 else f"{retries + 1} attempts"
                raise DownloadError(url, f"{exc} (gave up after {tries})") from None
        time.sleep(backoff * 2**number)
        number += 1


@contextmanager
def _get(url: str, timeout: float) -> Iterator[requests.Response]:
    """A streaming GET that turns transport trouble into _Retry and 4xx into DownloadError."""
    try:
        response = requests.get(url, stream=True, timeout=timeout, headers=BASE_HEADERS)
    except requests.Timeout:
        raise _Retry(f"timed out after {timeout:g}s") from None
    except requests.ConnectionError as exc:
        raise _Retry(f"connection failed ({_short(exc)})") from None
    except requests.RequestException as exc:
        raise DownloadError(url, f"bad request ({_short(exc)})") from None
    with response:
        if response.status_code >= 500 or response.status_code in RETRY_STATUSES:
            raise _Retry(f"HTTP {response.status_code} {response.reason}")
        if response.status_code >= 400:
            raise DownloadError(url, f"HTTP {response.status_code} {response.reason}")
        yield response


def _chunks(response: requests.Response, timeout: float) -> Iterator[bytes]:
    try:
        yield from response.iter_content(CHUNK)
    except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
        raise _Retry(f"connection broke off ({_short(exc)})") from None
    except requests.Timeout:
        raise _Retry(f"timed out after {timeout:g}s") from None


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def head_size(
    url: str, timeout: float = 10.0, *, file_roots: Sequence[Path] | None = None
) -> int | None:
    """The size of what ``url`` points at, or None when it cannot be told. Never raises.

    Used for estimating, which must not fail a job: an unknown size just counts as 0.
    """
    try:
        if _scheme(url) == "file":
            return local_path(url, file_roots=file_roots).stat().st_size
        if _scheme(url) not in ("http", "https"):
            return None
        response = requests.head(url, timeout=timeout, allow_redirects=True, headers=BASE_HEADERS)
        if response.status_code in (405, 501):
            # Some servers refuse HEAD; a GET whose body we never read tells the same.
            with requests.get(url, stream=True, timeout=timeout, headers=BASE_HEADERS) as got:
                response = got
        if response.status_code >= 400:
            return None
        length = response.headers.get("Content-Length", "")
        return int(length) if length.isdigit() else None
    except (requests.RequestException, OSError, ValueError, DownloadError):
        return None


def head_all(
    urls: Iterable[str],
    *,
    threads: int = 8,
    timeout: float = 10.0,
    file_roots: Sequence[Path] | None = None,
) -> dict[str, int | None]:
    """head_size for many URLs at once; the result maps each URL to its size or None."""
    unique = list(dict.fromkeys(urls))
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        sizes = pool.map(lambda u: head_size(u, timeout, file_roots=file_roots), unique)
        return dict(zip(unique, sizes, strict=True))


def fetch_bytes(
    url: str,
    *,
    max_bytes: int = DEFAULT_MAX_TEXT,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 2,
    backoff: float = 0.5,
    file_roots: Sequence[Path] | None = None,
) -> bytes:
    """The body at ``url``, refusing more than ``max_bytes`` (manifests, not payloads)."""
    if _scheme(url) == "file":
        path = local_path(url, file_roots=file_roots)
        try:
            with path.open("rb") as handle:
                data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise DownloadError(url, exc.strerror or str(exc)) from None
        if len(data) > max_bytes:
            raise DownloadError(url, f"larger than the limit of {max_bytes} bytes")
        return data
    _require_http(url)

    def attempt() -> bytes:
        with _get(url, timeout) as response:
            body = bytearray()
            for chunk in _chunks(response, timeout):
                body += chunk
                if len(body) > max_bytes:
                    raise DownloadError(url, f"larger than the limit of {max_bytes} bytes")
            return bytes(body)

    return _retrying(url, attempt, retries=retries, backoff=backoff)


def fetch_text(
    url: str,
    *,
    max_bytes: int = DEFAULT_MAX_TEXT,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 2,
    backoff: float = 0.5,
    file_roots: Sequence[Path] | None = None,
) -> str:
    """fetch_bytes decoded as UTF-8; a decoding error names the line it is on."""
    data = fetch_bytes(
        url,
        max_bytes=max_bytes,
        timeout=timeout,
        retries=retries,
        backoff=backoff,
        file_roots=file_roots,
    )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DownloadError(url, f"line {line}: not valid UTF-8") from None


def _require_http(url: str) -> None:
    if _scheme(url) not in ("http", "https"):
        raise DownloadError(url, "only http, https and file URLs can be fetched")


def _hashers(digest_alg: str | None) -> dict[str, hashlib._Hash]:
    algs = {"sha256"}
    if digest_alg:
        if digest_alg.lower() not in HASH_LENGTHS:
            raise ValueError(f"unsupported hash algorithm {digest_alg!r}")
        algs.add(digest_alg.lower())
    # md5/sha1 here check the depositor's transfer, not security.
    return {alg: hashlib.new(alg, usedforsecurity=False) for alg in sorted(algs)}


def download(
    url: str,
    dest: Path,
    *,
    retries: int = 3,
    backoff: float = 0.5,
    timeout: float = DEFAULT_TIMEOUT,
    digest_alg: str | None = None,
    digest_value: str | None = None,
    expected_size: int | None = None,
    file_roots: Sequence[Path] | None = None,
) -> DownloadResult:
    """Fetch ``url`` into ``dest``, verifying the depositor's digest and size when given.

    Connection errors, timeouts and 5xx are retried ``retries`` times with back-off
    ``backoff * 2**n`` seconds; 4xx, a digest mismatch or a size mismatch fail at once because
    asking again will give the same answer.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)

    def copy_into(handle: IO[bytes], chunks: Iterable[bytes]) -> tuple[int, dict[str, str]]:
        hashers = _hashers(digest_alg)
        size = 0
        for chunk in chunks:
            handle.write(chunk)
            size += len(chunk)
            for hasher in hashers.values():
                hasher.update(chunk)
        return size, {alg: h.hexdigest() for alg, h in hashers.items()}

    def attempt() -> tuple[Path, int, dict[str, str]]:
        handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open past this block
            dir=dest.parent, prefix=f".{dest.name}.", suffix=".part", delete=False
        )
        try:
            with handle:
                if _scheme(url) == "file":
                    size, digests = _copy_local(url, handle, copy_into, file_roots)
                else:
                    with _get(url, timeout) as response:
                        size, digests = copy_into(handle, _chunks(response, timeout))
        except BaseException:
            Path(handle.name).unlink(missing_ok=True)
            raise
        return Path(handle.name), size, digests

    if _scheme(url) != "file":
        _require_http(url)
    part, size, digests = _retrying(url, attempt, retries=retries, backoff=backoff)
    try:
        if expected_size is not None and size != expected_size:
            raise DownloadError(url, f"got {size} bytes, expected {expected_size}")
        if digest_alg and digest_value:
            actual = digests[digest_alg.lower()]
            if actual != digest_value.strip().lower():
                raise DigestMismatch(
                    url, f"{digest_alg.lower()} digest {actual} does not match {digest_value}"
                )
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return DownloadResult(url=url, path=dest, size=size, digests=digests)


def _copy_local(
    url: str,
    handle: IO[bytes],
    copy_into: Callable[[IO[bytes], Iterable[bytes]], tuple[int, dict[str, str]]],
    file_roots: Sequence[Path] | None,
) -> tuple[int, dict[str, str]]:
    path = local_path(url, file_roots=file_roots)
    try:
        with path.open("rb") as source:
            return copy_into(handle, iter(lambda: source.read(CHUNK), b""))
    except OSError as exc:
        raise DownloadError(url, exc.strerror or str(exc)) from None


def target_path(workdir: Path, filename: str) -> Path:
    """Where ``filename`` goes under ``workdir``; refuses names that would leave it."""
    problem = filename_problem(filename)
    if problem or not filename.strip("/"):
        raise ValueError(f"file name {filename!r} {problem or 'is empty'}")
    path = workdir / PurePosixPath(filename.replace("\\", "/"))
    if not path.resolve().is_relative_to(workdir.resolve()):
        raise ValueError(f"file name {filename!r} leaves the working folder")
    return path


def download_all(
    files: Sequence[DownloadItem],
    workdir: Path,
    *,
    threads: int = 4,
    retries: int = 3,
    backoff: float = 0.5,
    timeout: float = DEFAULT_TIMEOUT,
    file_roots: Sequence[Path] | None = None,
) -> list[DownloadResult]:
    """Download every file to ``workdir/<filename>`` with ``threads`` workers, in input order.

    After the first failure no new download starts (a wrong base URL should not cost an hour
    of retries); DownloadsFailed then lists every download that failed.
    """
    targets = [target_path(workdir, f.filename) for f in files]
    stop = threading.Event()

    def one(item: DownloadItem, dest: Path) -> DownloadResult:
        if stop.is_set():
            raise DownloadError(item.url, "not attempted after an earlier failure")
        try:
            return download(
                item.url,
                dest,
                retries=retries,
                backoff=backoff,
                timeout=timeout,
                digest_alg=item.digest_alg,
                digest_value=item.digest_value,
                expected_size=item.size,
                file_roots=file_roots,
            )
        except BaseException:
            stop.set()
            raise

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        futures = [pool.submit(one, f, t) for f, t in zip(files, targets, strict=True)]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            future.cancel()
        wait(futures)
    failures: list[DownloadError] = []
    results: list[DownloadResult] = []
    for item, future in zip(files, futures, strict=True):
        if future.cancelled():
            continue
        error = future.exception()
        if error is None:
            results.append(future.result())
        elif isinstance(error, DownloadError):
            if error.reason != "not attempted after an earlier failure":
                failures.append(error)
        else:
            failures.append(DownloadError(item.url, _short(error)))
    if failures:
        raise DownloadsFailed(failures, len(files))
    return results


def is_zip(path: Path) -> bool:
    with path.open("rb") as handle:
        # Checking the leading signature, not zipfile.is_zipfile: that one looks at the end of
        # the file and also says yes to a tar whose last member happens to be a zip.
        return handle.read(4) in (b"PK\x03\x04", b"PK\x05\x06")


def extract_container(path: Path, dest: Path, *, max_bytes: int | None = None) -> list[str]:
    """Unpack a zip or tar(.gz/.bz2/.xz) into ``dest``; return the file paths, sorted, posix.

    Refuses absolute names, ``..``, links pointing outside ``dest``, device files, and (with
    ``max_bytes``) archives that would unpack to more than that many bytes.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if is_zip(path):
        return _extract_zip(path, dest, max_bytes)
    try:
        is_tar = tarfile.is_tarfile(path)
    except OSError as exc:
        raise ContainerError(f"{path.name}: {exc}") from None
    if is_tar:
        return _extract_tar(path, dest, max_bytes)
    raise ContainerError(f"{path.name} is neither a zip nor a tar file")


def _member_name(name: str, container: str) -> str:
    problem = filename_problem(name)
    if problem:
        raise ContainerError(f"{container}: member {name!r} {problem}")
    parts = [p for p in PurePosixPath(name.replace("\\", "/")).parts if p != "."]
    return "/".join(parts)


def _check_link(dest: Path, link_dir: PurePosixPath, target: str, container: str) -> None:
    # resolve() follows links already on disk, so calling this again right before creating each
    # link also catches chains of individually harmless links that together climb out.
    root = dest.resolve()
    if target.startswith("/") or not (root / link_dir / target).resolve().is_relative_to(root):
        raise ContainerError(f"{container}: link to {target!r} points outside the object")


def _check_total(total: int, max_bytes: int | None, container: str) -> None:
    if max_bytes is not None and total > max_bytes:
        raise ContainerError(f"{container} unpacks to {total} bytes, over {max_bytes}")


def _extract_zip(path: Path, dest: Path, max_bytes: int | None) -> list[str]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ContainerError(f"{path.name}: {exc}") from None
    names: list[str] = []
    with archive:
        infos = archive.infolist()
        _check_total(sum(i.file_size for i in infos), max_bytes, path.name)
        plan: list[tuple[zipfile.ZipInfo, str, bool]] = []
        for info in infos:
            name = _member_name(info.filename, path.name)
            is_link = stat.S_ISLNK(info.external_attr >> 16)
            if is_link:
                target = archive.read(info).decode("utf-8", "replace")
                _check_link(dest, PurePosixPath(name).parent, target, path.name)
            plan.append((info, name, is_link))
        root = dest.resolve()
        try:
            for info, name, is_link in plan:
                if not name:
                    continue
                out = dest / name
                if not out.parent.resolve().is_relative_to(root):
                    raise ContainerError(f"{path.name}: member {name!r} goes through a link")
                if info.is_dir():
                    out.mkdir(parents=True, exist_ok=True)
                    continue
                out.parent.mkdir(parents=True, exist_ok=True)
                if is_link:
                    target = archive.read(info).decode("utf-8", "replace")
                    _check_link(dest, PurePosixPath(name).parent, target, path.name)
                    out.unlink(missing_ok=True)
                    out.symlink_to(target)
                else:
                    with archive.open(info) as source, out.open("wb") as sink:
                        while chunk := source.read(CHUNK):
                            sink.write(chunk)
                names.append(name)
        except (zipfile.BadZipFile, OSError, RuntimeError) as exc:
            # RuntimeError is how zipfile reports encrypted members.
            raise ContainerError(f"{path.name}: {exc}") from None
    return sorted(names)


def _extract_tar(path: Path, dest: Path, max_bytes: int | None) -> list[str]:
    try:
        archive = tarfile.open(path, "r:*")  # noqa: SIM115 - closed by the with below
    except (tarfile.TarError, OSError) as exc:
        raise ContainerError(f"{path.name}: {exc}") from None
    names: list[str] = []
    with archive:
        try:
            members = archive.getmembers()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ContainerError(f"{path.name}: {exc}") from None
        _check_total(sum(m.size for m in members if m.isfile()), max_bytes, path.name)
        for member in members:
            name = _member_name(member.name, path.name)
            if member.issym():
                _check_link(dest, PurePosixPath(name).parent, member.linkname, path.name)
            elif member.islnk():
                # Hard link targets are archive paths, relative to the archive root.
                _check_link(dest, PurePosixPath(), member.linkname, path.name)
            elif not (member.isfile() or member.isdir()):
                raise ContainerError(f"{path.name}: member {member.name!r} is not a file")
            if name and not member.isdir():
                names.append(name)
        try:
            archive.extractall(dest, members=members, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ContainerError(f"{path.name}: {exc}") from None
    return sorted(names)
