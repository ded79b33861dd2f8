"""Fetching payloads over HTTP(S) and file:// URLs, and unpacking containers.

Everything here is safe to run twice: downloads land under their final name only when complete
and verified, so a consumer that dies half-way leaves at most a ``.part`` file behind.
"""

from __future__ import annotations

import errno
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
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path, PurePosixPath
from typing import IO, Protocol, TypeVar
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname
from zlib import error as zlib_error

from queues.core import transient
from queues.core.outside_text import url_shown
from queues.core.retries import origin_of, outage_of, service_at, unavailable
from queues.core.words import digits
from queues.steps.checkm import HASH_LENGTHS, filename_problem
from queues.steps.netpolicy import (
    SYSTEM,
    FetchPolicy,
    FetchRefused,
    OpenResponse,
    Repeats,
    TooSlow,
    TransferFailed,
    short_error,
)
from queues.steps.netpolicy import (
    USER_AGENT as USER_AGENT,  # notify's callbacks send the same User-Agent
)

CHUNK = 1024 * 1024
DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_TEXT = 50 * 1024 * 1024
# 408/429 are the two client errors that mean "try again later" rather than "you asked wrong".
RETRY_STATUSES = frozenset({408, 429})

T = TypeVar("T")


class DownloadError(Exception):
    """A URL that could not be fetched; ``reason`` says why in words a depositor understands."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url_shown(url)}: {reason}")


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


class Budget:
    """Bytes one object may still take on disk, shared by the threads downloading its files.

    Checked while the bytes arrive, so an endless body or a lying Content-Length stops at the
    limit instead of filling the disk. ``what`` names the limit in the failure message.
    """

    def __init__(self, limit: int | None, what: str = "the per-object limit") -> None:
        self.limit = limit
        self.what = what
        self.used = 0
        self._lock = threading.Lock()

    def take(self, size: int, url: str) -> None:
        if self.limit is None:
            return
        with self._lock:
            self.used += size
            over = self.used > self.limit
        if over:
            raise DownloadError(url, f"the object is larger than {self.what} of {self.limit} bytes")

    def give_back(self, size: int) -> None:
        with self._lock:
            self.used -= size


class _Retry(Exception):
    """An attempt failed in a way that another attempt may fix."""


class _TooSlowError(DownloadError):
    """The server was slower than the policy allows (``TooSlow``): its deadline or its rate."""


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
    try:
        return urlsplit(url).scheme.lower()
    except ValueError:  # "http://[::1/x": an IPv6 address not closed
        raise DownloadError(url, "the URL's host cannot be read") from None


def local_path(url: str, *, file_roots: Sequence[Path] | None = None) -> Path:
    """The filesystem path of a file:// URL.

    ``file_roots`` limits which folders may be read, so that a depositor cannot ask for
    file:///etc/passwd; an empty list allows none, None any path (library use and tests).
    """
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise DownloadError(url, f"file URL on another host {parts.netloc!r} is not supported")
    text = unquote(parts.path)
    if "\x00" in text:
        raise DownloadError(url, "the file URL's path contains a NUL character")
    path = Path(url2pathname(text))
    if file_roots is not None:
        if not file_roots:
            raise DownloadError(url, "file URLs are not accepted here (MRT_FILE_ROOTS is empty)")
        resolved = path.resolve()
        if not any(resolved.is_relative_to(root.resolve()) for root in file_roots):
            raise DownloadError(url, "file URL outside the allowed folders")
    return path


def _retrying(url: str, attempt: Callable[[], T], repeats: Repeats) -> T:
    """``attempt()`` until it succeeds, repeated after an outage (``_Retry``) as ``repeats``
    allow: never past the exchange's deadline. An outage given up on is raised as one (the job
    waits and tries again later, ``queues.core.retries``), and so is a repeat of one that the
    deadline cut off: the server was away, not too slow."""
    outage: _Retry | None = None
    while True:
        try:
            return attempt()
        except _Retry as exc:
            outage = exc
            if repeats.spent:
                tries = "attempt" if repeats.retries == 0 else repeats.attempts
                given_up = f"gave up after {tries}"
            else:
                why = repeats.wait()
                if why is None:
                    continue
                given_up = f"gave up after {repeats.attempts}: {why}"
            reason = str(exc)
        except _TooSlowError as exc:
            if outage is None or repeats.left() != 0:
                raise
            reason, given_up = f"{outage}, then {exc.reason}", f"gave up after {repeats.attempts}"
        raise DownloadError(url, f"{reason} ({given_up})") from unavailable(
            service_at("depositor", url), reason, probe=origin_of(url)
        )


def _policy(policy: FetchPolicy | None, timeout: float) -> FetchPolicy:
    """The caller's policy, or the system's own (any address, the exchange bounded) with
    ``timeout``."""
    if policy is not None:
        return policy
    return replace(SYSTEM, timeout=timeout)


@contextmanager
def _get(url: str, policy: FetchPolicy, started: float) -> Iterator[OpenResponse]:
    """A GET under ``policy``: transport trouble becomes _Retry, a refusal or 4xx DownloadError."""
    try:
        response = policy.open(url, started=started)
    except TransferFailed as exc:
        raise _Retry(str(exc)) from None
    except FetchRefused as exc:
        raise DownloadError(url, exc.reason) from None
    except TooSlow as exc:
        raise _TooSlowError(url, exc.reason) from None
    with response:
        if response.status >= 500 or response.status in RETRY_STATUSES:
            raise _Retry(f"HTTP {response.status} {response.reason}")
        if response.status >= 400:
            raise DownloadError(url, f"HTTP {response.status} {response.reason}")
        yield response


def _chunks(url: str, response: OpenResponse) -> Iterator[bytes]:
    try:
        yield from response.chunks(CHUNK)
    except TransferFailed as exc:
        raise _Retry(str(exc)) from None
    except TooSlow as exc:
        # A server this slow is not retried: it would hold a download slot for as long again.
        raise _TooSlowError(url, exc.reason) from None


def head_size(
    url: str,
    timeout: float = 10.0,
    *,
    file_roots: Sequence[Path] | None = None,
    policy: FetchPolicy | None = None,
) -> int | None:
    """The size of what ``url`` points at, or None when it cannot be told. Never raises.

    Used for estimating, which must not fail a job: an unknown size is the caller's to judge.
    The question as a whole (the HEAD, and the GET when HEAD is refused, redirects included)
    has ``timeout`` seconds: a server that trickles its headers cannot hold estimating for as
    long as a download may take.
    """
    try:
        if _scheme(url) == "file":
            return local_path(url, file_roots=file_roots).stat().st_size
        if _scheme(url) not in ("http", "https"):
            return None
        rules = _policy(policy, timeout)
        rules = replace(rules, deadline=min(rules.deadline or timeout, timeout))
        started = time.monotonic()
        with rules.open(url, method="HEAD", started=started) as response:
            status, length = response.status, response.header("Content-Length")
        if status in (405, 501):
            # Some servers refuse HEAD; a GET whose body we never read tells the same.
            with rules.open(url, started=started) as response:
                status, length = response.status, response.header("Content-Length")
        if status >= 400:
            return None
        return digits(length)
    except (FetchRefused, TransferFailed, TooSlow, OSError, ValueError, DownloadError):
        return None


def head_all(
    urls: Iterable[str],
    *,
    threads: int = 8,
    timeout: float = 10.0,
    file_roots: Sequence[Path] | None = None,
    policy: FetchPolicy | None = None,
) -> dict[str, int | None]:
    """head_size for many URLs at once; the result maps each URL to its size or None."""
    unique = list(dict.fromkeys(urls))
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        sizes = pool.map(
            lambda u: head_size(u, timeout, file_roots=file_roots, policy=policy), unique
        )
        return dict(zip(unique, sizes, strict=True))


def fetch_bytes(
    url: str,
    *,
    max_bytes: int = DEFAULT_MAX_TEXT,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 2,
    backoff: float = 0.5,
    file_roots: Sequence[Path] | None = None,
    policy: FetchPolicy | None = None,
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
    rules = _policy(policy, timeout)
    started = time.monotonic()

    def attempt() -> bytes:
        with _get(url, rules, started) as response:
            body = bytearray()
            for chunk in _chunks(url, response):
                body += chunk
                if len(body) > max_bytes:
                    raise DownloadError(url, f"larger than the limit of {max_bytes} bytes")
            return bytes(body)

    return _retrying(url, attempt, rules.repeats(retries, backoff, started))


def fetch_text(
    url: str,
    *,
    max_bytes: int = DEFAULT_MAX_TEXT,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 2,
    backoff: float = 0.5,
    file_roots: Sequence[Path] | None = None,
    policy: FetchPolicy | None = None,
) -> str:
    """fetch_bytes decoded as UTF-8; a decoding error names the line it is on."""
    data = fetch_bytes(
        url,
        max_bytes=max_bytes,
        timeout=timeout,
        retries=retries,
        backoff=backoff,
        file_roots=file_roots,
        policy=policy,
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
    policy: FetchPolicy | None = None,
    budget: Budget | None = None,
) -> DownloadResult:
    """Fetch ``url`` into ``dest``, verifying the depositor's digest and size when given.

    Connection errors, timeouts and 5xx are retried ``retries`` times with back-off
    ``backoff * 2**n`` seconds, inside the policy's deadline (all attempts): a repeat whose
    back-off would end past it is not made, and the DownloadError is the outage (the job tries
    again later). 4xx, a digest mismatch, a size mismatch, a refusal by the policy, a body
    slower than the policy allows or one over ``budget`` fail at once because asking again will
    give the same answer; but the deadline spent in the repeat of an outage is that outage.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    budget = budget or Budget(None)
    rules = _policy(policy, timeout)
    started = time.monotonic()

    def copy_into(handle: IO[bytes], chunks: Iterable[bytes]) -> tuple[int, dict[str, str]]:
        hashers = _hashers(digest_alg)
        size = 0
        try:
            for chunk in chunks:
                budget.take(len(chunk), url)
                size += len(chunk)
                handle.write(chunk)
                for hasher in hashers.values():
                    hasher.update(chunk)
        except BaseException:
            # A failed attempt's bytes are deleted with its .part file: not counted any more.
            budget.give_back(size)
            raise
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
                    with _get(url, rules, started) as response:
                        size, digests = copy_into(handle, _chunks(url, response))
        except BaseException:
            Path(handle.name).unlink(missing_ok=True)
            raise
        return Path(handle.name), size, digests

    if _scheme(url) != "file":
        _require_http(url)
    part, size, digests = _retrying(url, attempt, rules.repeats(retries, backoff, started))
    try:
        if expected_size is not None and size != expected_size:
            raise DownloadError(url, f"got {size} bytes, expected {expected_size}")
        if digest_alg and digest_value:
            actual = digests[digest_alg.lower()]
            if actual != digest_value.strip().lower():
                raise DigestMismatch(
                    url, f"{digest_alg.lower()} digest {actual} does not match {digest_value}"
                )
        _land(part, dest, url)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return DownloadResult(url=url, path=dest, size=size, digests=digests)


# What a file system without hard links answers ``link``: the download is moved instead.
NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS})


def _land(part: Path, dest: Path, url: str) -> None:
    """Put a finished download at ``dest``, never over what is there: a hard link made with
    the name fails when it is taken, in one step, whichever thread comes second. Two names of
    one object that are distinct (the file-name rule and ``checkm.ObjectNames`` judge them as
    Merritt does, byte by byte) are one file on a working disk that folds case or Unicode
    forms; there the second replaced the first, one file lost and two reported downloaded.
    Merritt's ingest refuses a file that exists (``createNewFile``) and fails the job."""
    try:
        os.link(part, dest)
    except FileExistsError:
        raise DownloadError(url, _taken(dest)) from None
    except OSError as exc:
        if exc.errno not in NO_LINKS:
            raise
        if os.path.lexists(dest):  # no hard links here: looked at, then moved
            raise DownloadError(url, _taken(dest)) from None
        os.replace(part, dest)
        return
    part.unlink()


def _taken(dest: Path) -> str:
    return (
        f"{dest.name!r} already holds a file of this object: two of its names are one file on "
        "the working disk, as on a disk that folds case or Unicode forms"
    )


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
        # Chained: a full working disk is an outage the daemon waits out (queues.core.transient).
        raise DownloadError(url, exc.strerror or str(exc)) from exc


def target_path(workdir: Path, filename: str) -> Path:
    """Where ``filename`` goes under ``workdir``; refuses names that would leave it."""
    problem = filename_problem(filename)
    if problem or not filename.strip("/"):
        raise ValueError(f"file name {filename!r} {problem or 'is empty'}")
    path = workdir / PurePosixPath(filename)
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
    policy: FetchPolicy | None = None,
    max_bytes: int | None = None,
) -> list[DownloadResult]:
    """Download every file to ``workdir/<filename>`` with ``threads`` workers, in input order.

    ``max_bytes`` caps the files together, checked as the bytes arrive. After the first failure
    no new download starts (a wrong base URL should not cost an hour of retries);
    DownloadsFailed then lists every download that failed.
    """
    targets = [target_path(workdir, f.filename) for f in files]
    stop = threading.Event()
    budget = Budget(max_bytes)

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
                policy=policy,
                budget=budget,
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
        elif transient.is_transient(error):
            raise error  # the working disk full, not the file: the job waits, it did not fail
        else:
            failures.append(DownloadError(item.url, short_error(error)))
    if failures:
        # Tried again later (queues.core.retries) only when every failure was the server's "not
        # now": one wrong URL among them fails the job at once.
        outages = [outage_of(f) for f in failures]
        common = outages[0] if all(outages) else None
        raise DownloadsFailed(failures, len(files)) from common
    return results


def is_zip(path: Path) -> bool:
    with path.open("rb") as handle:
        # Checking the leading signature, not zipfile.is_zipfile: that one looks at the end of
        # the file and also says yes to a tar whose last member happens to be a zip.
        return handle.read(4) in (b"PK\x03\x04", b"PK\x05\x06")


def extract_container(
    path: Path,
    dest: Path,
    *,
    max_bytes: int | None = None,
    max_ratio: float | None = None,
) -> list[str]:
    """Unpack a zip or tar(.gz/.bz2/.xz) into ``dest``; return the file paths, sorted, posix.

    The one extraction policy for depositors' containers: only regular files and folders are
    unpacked. Absolute names, ``..``, symbolic and hard links (a chain of individually harmless
    links can climb out of the object, CVE-2025-4138/4330), device files and FIFOs are refused.
    The bytes written are counted as they are written (a member's declared size can lie):
    more than ``max_bytes`` in all, or more than ``max_ratio`` times the container's own size
    (a compression bomb), stops the extraction with a message naming the limit.
    """
    dest.mkdir(parents=True, exist_ok=True)
    limit = _Unpacked(path, max_bytes, max_ratio)
    if is_zip(path):
        return _extract_zip(path, dest, limit)
    try:
        is_tar = tarfile.is_tarfile(path)
    except OSError as exc:
        raise ContainerError(f"{path.name}: {exc}") from None
    if is_tar:
        return _extract_tar(path, dest, limit)
    raise ContainerError(f"{path.name} is neither a zip nor a tar file")


class _Unpacked:
    """Bytes written so far by one extraction, against its two limits."""

    def __init__(self, path: Path, max_bytes: int | None, max_ratio: float | None) -> None:
        self.container = path.name
        self.caps: list[tuple[int, str]] = []
        if max_bytes is not None:
            self.caps.append((max_bytes, f"the per-object limit of {max_bytes} bytes"))
        if max_ratio is not None:
            packed = path.stat().st_size
            self.caps.append(
                (
                    int(max(packed, 1) * max_ratio),
                    f"{max_ratio:g} times its packed size of {packed} bytes "
                    "(the compression-ratio limit)",
                )
            )
        self.total = 0

    def check(self, size: int) -> None:
        for cap, words in self.caps:
            if size > cap:
                raise ContainerError(f"{self.container} unpacks to more than {words}")

    def add(self, size: int) -> None:
        self.total += size
        self.check(self.total)

    def copy(self, source: IO[bytes], out: Path) -> None:
        # O_EXCL and O_NOFOLLOW: the member is a new regular file, never a file reached
        # through something already on disk.
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as sink:
            while chunk := source.read(CHUNK):
                self.add(len(chunk))
                sink.write(chunk)


def _member_name(name: str, container: str) -> str:
    problem = filename_problem(name)
    if problem:
        raise ContainerError(f"{container}: member {name!r} {problem}")
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    return "/".join(parts)


def _no_link(container: str, name: str, kind: str) -> ContainerError:
    return ContainerError(
        f"{container}: member {name!r} is a {kind}; links are not accepted in containers "
        "(unpack them into plain files)"
    )


def _prepare(dest: Path, name: str, container: str, *, is_dir: bool) -> Path:
    """The path for member ``name`` under ``dest``, its parent folders made (never via a link)."""
    out = dest / name
    parent = out if is_dir else out.parent
    current = dest
    for part in parent.relative_to(dest).parts:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            raise ContainerError(f"{container}: member {name!r} goes through a non-folder")
        current.mkdir(exist_ok=True)
    if not is_dir and (out.is_symlink() or out.exists()):
        raise ContainerError(f"{container}: member {name!r} appears twice")
    return out


# One member to unpack: its cleaned name, whether it is a folder, and how to open its bytes.
_Member = tuple[str, bool, Callable[[], IO[bytes] | None]]


def _unpack(dest: Path, plan: Sequence[_Member], limit: _Unpacked, container: str) -> list[str]:
    """Write the checked members of one container; the file paths, sorted."""
    names: list[str] = []
    for name, is_dir, opener in plan:
        if not name:
            continue
        if is_dir:
            _prepare(dest, name, container, is_dir=True)
            continue
        out = _prepare(dest, name, container, is_dir=False)
        source = opener()
        if source is None:
            raise ContainerError(f"{container}: member {name!r} has no data")
        with source:
            limit.copy(source, out)
        names.append(name)
    return sorted(names)


def _extract_zip(path: Path, dest: Path, limit: _Unpacked) -> list[str]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ContainerError(f"{path.name}: {exc}") from None
    with archive:
        infos = archive.infolist()
        # The declared sizes first: a bomb that admits it is refused before a byte is written.
        limit.check(sum(i.file_size for i in infos))
        plan: list[_Member] = []
        for info in infos:
            name = _member_name(info.filename, path.name)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise _no_link(path.name, info.filename, "symbolic link")
            # Zips made on Windows or by zipfile.writestr carry no file type at all.
            if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise ContainerError(f"{path.name}: member {info.filename!r} is not a file")
            plan.append((name, info.is_dir(), partial(archive.open, info)))
        try:
            return _unpack(dest, plan, limit, path.name)
        except (zipfile.BadZipFile, OSError, RuntimeError, EOFError) as exc:
            # RuntimeError is how zipfile reports encrypted members. Chained: a full working
            # disk is an outage the daemon waits out (queues.core.transient).
            raise ContainerError(f"{path.name}: {exc}") from exc


def _extract_tar(path: Path, dest: Path, limit: _Unpacked) -> list[str]:
    try:
        archive = tarfile.open(path, "r:*")  # noqa: SIM115 - closed by the with below
    except (tarfile.TarError, OSError) as exc:
        raise ContainerError(f"{path.name}: {exc}") from None
    with archive:
        try:
            members = archive.getmembers()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ContainerError(f"{path.name}: {exc}") from None
        limit.check(sum(m.size for m in members if m.isfile()))
        plan: list[_Member] = []
        for member in members:
            name = _member_name(member.name, path.name)
            if member.issym():
                raise _no_link(path.name, member.name, "symbolic link")
            if member.islnk():
                raise _no_link(path.name, member.name, "hard link")
            if not (member.isfile() or member.isdir()):
                raise ContainerError(f"{path.name}: member {member.name!r} is not a file")
            plan.append((name, member.isdir(), partial(archive.extractfile, member)))
        try:
            return _unpack(dest, plan, limit, path.name)
        except (tarfile.TarError, OSError, EOFError, zlib_error) as exc:
            raise ContainerError(f"{path.name}: {exc}") from exc  # as for zip files
