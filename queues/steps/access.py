"""Access requests: what a token asks for, and the archive that answers it.

A token node comes in three documented forms (docs/merritt-access.md has the sources):

1. **The console's own**: ``ark`` (or ``object``, ``objectID``, ``object_id``), optional
   ``version`` (latest when absent), ``content: "producer"`` (the depositor's files only) and
   ``format`` (``zip`` by default).
2. **Merritt storage's assembly request** (its ``TokenStatus`` document): ``objectIDS``,
   ``versionID`` (0 or absent: the current version), ``archiveContent`` (``object`` every
   version, ``version`` one version, ``producer`` one version's depositor files), ``archiveType``
   (``zip``, ``zipunc``, ``tar``, ``targz``) and ``filterList`` (producer file names left out).
   Recognised when the token node itself carries ``objectIDS``.
3. **Merritt's queue entry**, as its storage service and the ``mrt-zk`` library write it:
   ``token`` (a UUID), ``delivery-node``, ``cloud-content-byte``, ``status`` and optionally
   ``url``, ``anticipated-availability-time``, ``message``. It names no object: Merritt keeps
   form 2 as ``<token>/status`` on the delivery node. With ``MRT_ACCESS_REQUESTS_URL`` set (an
   http(s) URL or a folder where those documents can be read) the document is read from
   ``<base>/<token>/status``; without it the request fails, saying exactly that.

Nothing is ever guessed: a request that does not say what to assemble fails with the key it
lacks. :func:`resolve` turns a token into an :class:`AssemblyRequest`, :func:`build_archive`
writes the archive.
"""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit
from urllib.request import url2pathname

import requests

from queues.core.outside_text import url_shown
from queues.core.words import digits
from queues.steps.erc import PRODUCER_DIR
from queues.steps.fetch import DEFAULT_TIMEOUT, download
from queues.steps.merritt_wire import answered_ok, json_document, service_session
from queues.steps.netpolicy import FetchPolicy
from queues.steps.storage import ObjectFile, StorageClient, StorageError, ark_folder_name

# archive type -> file name suffix (the names and suffixes of Merritt's ArchiveBuilder types)
ARCHIVE_TYPES: dict[str, str] = {"zip": ".zip", "zipunc": ".zip", "tar": ".tar", "targz": ".tar.gz"}

VERSION = "version"  # one version (the latest unless a number is given), every file
PRODUCER = "producer"  # one version, the depositor's files only
OBJECT = "object"  # every version of the object
CONTENTS = (VERSION, PRODUCER, OBJECT)

CONSOLE_ARK_KEYS = ("ark", "object", "objectID", "object_id")

# What Merritt's storage leaves out of a producer archive when the request names no list
# (TokenManager.setProducerFilterDefault): file names, matched against a file's last part.
MERRITT_PRODUCER_FILTER = frozenset(
    {
        "mrt-erc.txt",
        "mrt-eml.txt",
        "mrt-dc.xml",
        "mrt-delete.txt",
        "mrt-dua.txt",
        "mrt-dataone-manifest.txt",
        "mrt-datacite.xml",
        "mrt-embargo.txt",
        "mrt-oaidc.xml",
        "stash-wrapper.xml",
    }
)

_TOKEN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class RequestError(Exception):
    """A token that cannot be turned into an archive; the message names what is missing.

    ``permanent`` is False only when asking again later may work (the service holding
    Merritt's assembly request did not answer).
    """

    def __init__(self, message: str, *, permanent: bool = True) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class Archive:
    path: Path
    size: int
    sha256: str


@dataclass(frozen=True)
class AssemblyRequest:
    ark: str
    version: int | None = None  # None: the latest version (unused for OBJECT)
    content: str = VERSION
    archive_type: str = "zip"
    exclude: frozenset[str] = frozenset()  # producer file names left out (form 2 only)
    form: str = "console"  # which token form it came from, for the log and the token

    def archive_name(self) -> str:
        return archive_name(
            self.ark,
            self.version,
            producer_only=self.content == PRODUCER,
            all_versions=self.content == OBJECT,
            archive_type=self.archive_type,
        )


def archive_name(
    ark: str,
    version: int | None,
    *,
    producer_only: bool = False,
    all_versions: bool = False,
    archive_type: str = "zip",
) -> str:
    stem = ark_folder_name(ark)
    if all_versions:
        stem += "_all"
    elif version is not None:
        stem += f"_v{version}"
    if producer_only:
        stem += "_producer"
    return stem + ARCHIVE_TYPES[archive_type]


# What a token asks for ---------------------------------------------------------------------


def _version(value: Any, key: str) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        number = digits(value.strip())
        value = value if number is None else number
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"{key} {value!r} is not a version number")
    return value


def _archive_type(value: Any, key: str) -> str:
    if not isinstance(value, str) or value.lower() not in ARCHIVE_TYPES:
        raise RequestError(f"{key} {value!r} is not one of: {', '.join(ARCHIVE_TYPES)}")
    return value.lower()


def console_request(token: Mapping[str, Any]) -> AssemblyRequest | None:
    """Form 1, or None when the token has none of its object keys."""
    ark = next((token[k] for k in CONSOLE_ARK_KEYS if isinstance(token.get(k), str)), "")
    if not ark.strip():
        return None
    fmt = token.get("format")
    return AssemblyRequest(
        ark=ark.strip(),
        version=_version(token.get("version"), "version"),
        content=PRODUCER if token.get("content") == "producer" else VERSION,
        archive_type="zip" if fmt in (None, "") else _archive_type(fmt, "format"),
    )


def merritt_request(doc: Mapping[str, Any], *, where: str) -> AssemblyRequest:
    """Form 2: Merritt storage's assembly request document (TokenStatus.getJson)."""
    ark = doc.get("objectIDS")
    if not isinstance(ark, str) or not ark.strip():
        raise RequestError(f"{where} names no object (objectIDS)")
    version = _version(doc.get("versionID"), "versionID")
    content = doc.get("archiveContent")
    if content in (None, ""):
        # Merritt's own rule when it builds the document (TokenManager.setArchiveContent).
        content = OBJECT if version is None else VERSION
    if content not in CONTENTS:
        raise RequestError(
            f"{where}: archiveContent {content!r} is not one of: {', '.join(CONTENTS)}"
        )
    if content == VERSION and version is None:
        raise RequestError(
            f"{where} asks for one version (archiveContent 'version') but names no versionID"
        )
    if doc.get("archiveType") in (None, ""):
        raise RequestError(f"{where} names no archive format (archiveType)")
    archive_type = _archive_type(doc.get("archiveType"), f"{where}: archiveType")
    exclude: frozenset[str] = frozenset()
    if content == PRODUCER:
        names = doc.get("filterList")
        if names is None:
            exclude = MERRITT_PRODUCER_FILTER
        elif isinstance(names, list) and all(isinstance(n, str) for n in names):
            exclude = frozenset(names)
        else:
            raise RequestError(f"{where}: filterList is not a list of file names")
    return AssemblyRequest(
        ark=ark.strip(),
        # versionID 0 is "the current version" in Merritt's requests.
        version=None if content == OBJECT or not version else version,
        content=content,
        archive_type=archive_type,
        exclude=exclude,
        form="merritt-assembly-request",
    )


def request_location(base: str, token_id: str) -> str:
    """Where Merritt's assembly request ``<token>/status`` is read from under ``base``."""
    if base.startswith(("http://", "https://")):
        return f"{base.rstrip('/')}/{quote(token_id, safe='')}/status"
    return str(_base_folder(base) / token_id / "status")


def _base_folder(base: str) -> Path:
    if base.startswith("file://"):
        return Path(url2pathname(urlsplit(base).path))
    return Path(base)


REQUEST_READ_READS = 4  # the whole read's deadline, in per-read timeouts


def read_merritt_request(base: str, token_id: str, *, timeout: float) -> dict[str, Any]:
    """Merritt's assembly request document for ``token_id``, read from ``base``."""
    where = request_location(base, token_id)
    shown = url_shown(where)  # a URL of Merritt's access service may carry its password
    if base.startswith(("http://", "https://")):
        try:
            # One deadline for the whole read: a few times the per-read timeout.
            with service_session(retries=0, deadline=REQUEST_READ_READS * timeout) as session:
                response = session.get(where, timeout=timeout)
        except requests.RequestException as exc:
            raise RequestError(
                f"the assembly request {shown} could not be read: {exc}", permanent=False
            ) from None
        if response.status_code == 404:
            raise RequestError(f"there is no assembly request at {shown} (HTTP 404)")
        if not answered_ok(response):
            raise RequestError(
                f"the assembly request {shown} could not be read: HTTP {response.status_code}",
                permanent=response.status_code < 500,
            )
        body = response.content
    else:
        try:
            body = Path(where).read_bytes()
        except FileNotFoundError:
            raise RequestError(f"there is no assembly request at {shown}") from None
        except OSError as exc:
            raise RequestError(
                f"the assembly request {shown} could not be read: {exc}", permanent=False
            ) from None
    doc = json_document(body)
    if doc is None:
        raise RequestError(f"the assembly request {shown} is not JSON")
    if not isinstance(doc, dict):
        raise RequestError(f"the assembly request {shown} is not a JSON object")
    return doc


def resolve(
    token: Mapping[str, Any], *, requests_base: str = "", timeout: float = DEFAULT_TIMEOUT
) -> AssemblyRequest:
    """What ``token`` asks to assemble, from whichever documented form it is in."""
    found = console_request(token)
    if found is not None:
        return found
    if "objectIDS" in token:
        return merritt_request(token, where="the token")
    token_id = token.get("token")
    if not isinstance(token_id, str) or not token_id.strip():
        raise RequestError(
            "the token names no object: it has none of "
            f"{', '.join((*CONSOLE_ARK_KEYS, 'objectIDS'))}, and no Merritt token (UUID) to "
            "find its assembly request by"
        )
    token_id = token_id.strip()
    node = token.get("delivery-node")
    if not requests_base:
        raise RequestError(
            f"the token names no object: Merritt keeps what request {token_id} asks for "
            f"(objectIDS, versionID, archiveContent, archiveType) in the assembly request "
            f"{token_id}/status on delivery node {node if node is not None else '(none given)'}, "
            "outside ZooKeeper, and MRT_ACCESS_REQUESTS_URL (where this console could read it) "
            "is not set"
        )
    if not _TOKEN_NAME.fullmatch(token_id) or ".." in token_id:
        raise RequestError(f"token {token_id!r} is not a name an assembly request can have")
    doc = read_merritt_request(requests_base, token_id, timeout=timeout)
    where = f"the assembly request {url_shown(request_location(requests_base, token_id))}"
    if doc.get("token") not in (None, token_id):
        raise RequestError(f"{where} is for token {doc.get('token')!r}, not {token_id!r}")
    return merritt_request(doc, where=where)


# The archive -------------------------------------------------------------------------------


class UnsupportedRequest(StorageError):
    """A request this storage client cannot answer at all (asking again will not help)."""


def _entries(
    storage: StorageClient,
    ark: str,
    *,
    version: int | None,
    producer_only: bool,
    all_versions: bool,
    exclude: Collection[str],
) -> list[tuple[str, ObjectFile]]:
    """(name inside the archive under the ARK folder, stored file) for every member."""
    if all_versions:
        lister = getattr(storage, "versions", None)
        if lister is None:
            raise UnsupportedRequest(
                f"every version of {ark} was asked for (archiveContent 'object'), and this "
                "storage client cannot list an object's versions; ask for one version"
            )
        numbers = lister(ark)
        if not numbers:
            storage.fetch_object(ark, None)  # raises ObjectNotFound in the store's own words
        return [(f"{n}/{f.name}", f) for n in numbers for f in storage.fetch_object(ark, n)]
    files = storage.fetch_object(ark, version)
    if producer_only:
        files = [f for f in files if f.name.startswith(PRODUCER_DIR + "/")]
        files = [f for f in files if f.name.rsplit("/", 1)[-1] not in exclude]
    return [(f.name, f) for f in files]


@contextmanager
def _writer(path: Path, archive_type: str) -> Iterator[Callable[[Path, str], None]]:
    """An ``add(source, name)`` for one archive: zip (deflated or stored) or tar (plain, gzip)."""
    if archive_type in ("zip", "zipunc"):
        compression = zipfile.ZIP_DEFLATED if archive_type == "zip" else zipfile.ZIP_STORED
        with zipfile.ZipFile(path, "w", compression=compression, allowZip64=True) as zf:
            yield zf.write
        return
    with tarfile.open(path, "w:gz" if archive_type == "targz" else "w") as tf:

        def add(source: Path, name: str) -> None:
            info = tf.gettarinfo(str(source), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with source.open("rb") as handle:
                tf.addfile(info, handle)

        yield add


def build_archive(
    *,
    storage: StorageClient,
    ark: str,
    downloads_dir: Path,
    version: int | None = None,
    producer_only: bool = False,
    all_versions: bool = False,
    archive_type: str = "zip",
    exclude: Collection[str] = (),
    name: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 2,
    file_roots: Sequence[Path] | None = None,
    policy: FetchPolicy | None = None,
) -> Archive:
    """Write the object (latest version unless ``version``; every version, each in a folder
    named by its number, with ``all_versions``) to ``downloads_dir/<name>``.

    Entries sit under one folder named after the ARK, so unpacking never spills files into
    the requester's current folder. The archive appears under its final name only when
    complete, so a requester polling for it never downloads half of one.
    """
    if archive_type not in ARCHIVE_TYPES:
        raise UnsupportedRequest(
            f"archive type {archive_type!r} is not one of {list(ARCHIVE_TYPES)}"
        )
    members = _entries(
        storage,
        ark,
        version=version,
        producer_only=producer_only,
        all_versions=all_versions,
        exclude=exclude,
    )
    top = ark_folder_name(ark)
    dest = downloads_dir / (
        name
        or archive_name(
            ark,
            version,
            producer_only=producer_only,
            all_versions=all_versions,
            archive_type=archive_type,
        )
    )
    downloads_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".assemble-", dir=downloads_dir) as scratch:
        part = Path(scratch) / dest.name
        with _writer(part, archive_type) as add:
            for index, (member, item) in enumerate(members):
                if isinstance(item.location, Path):
                    source = item.location
                else:
                    # Remote files go through a scratch copy: archives need a seekable source
                    # for large members, and download() retries what a plain GET would not.
                    source = Path(scratch) / f"file-{index}"
                    download(
                        item.location,
                        source,
                        retries=retries,
                        timeout=timeout,
                        file_roots=file_roots,
                        policy=policy,
                    )
                add(source, f"{top}/{member}")
                if source.parent == Path(scratch):
                    source.unlink()
        digest = hashlib.sha256()
        with part.open("rb") as handle:
            while chunk := handle.read(1024 * 1024):
                digest.update(chunk)
        size = part.stat().st_size
        os.replace(part, dest)
    return Archive(path=dest, size=size, sha256=digest.hexdigest())
