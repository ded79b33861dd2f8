"""Handing an object version to storage, and reading it back.

Both clients take the URL of a storage manifest (see erc.storage_manifest) rather than files:
that is how Merritt's storage service works, and it lets the local store fetch the same URLs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple, Protocol
from urllib.parse import quote

import requests

from queues.core.outside_text import url_shown
from queues.core.retries import unavailable
from queues.core.words import digits
from queues.steps.checkm import (
    ADD_MANIFEST,
    OBJECT_MANIFEST,
    CheckmReader,
    ManifestError,
    ManifestRow,
    write_checkm,
)
from queues.steps.erc import PRODUCER_DIR, SYSTEM_DIR
from queues.steps.fetch import DEFAULT_TIMEOUT, DownloadError, download_all, fetch_bytes
from queues.steps.merritt import inventory_manifest_url
from queues.steps.merritt_wire import (
    answered_ok,
    child_text,
    is_exception_document,
    java_urlencode,
    json_document,
    local_name,
    merritt_error,
    parse_xml,
    service_session,
    state_fields,
    unavailable_answer,
)
from queues.steps.netpolicy import FetchPolicy
from queues.steps.objectmap import (
    MapFile,
    MapVersion,
    ObjectMap,
    ObjectMapError,
    VersionMissing,
    object_map_xml,
    parse_object_map,
)
from queues.steps.submission import PayloadFile, file_of_row

VERSION_MANIFEST = "mrt-version-manifest.txt"
VERSION_INFO = "version.json"
# Beside each object's folder, ``<ark folder>.lock``: the file whose flock serialises "is the
# content already the latest version?", the numbering and the publishing of a version between
# threads and processes (a regular file, which flock over NFS needs; the folder holds only
# versions).
LOCK_SUFFIX = ".lock"
_ARK = re.compile(r"^ark:/[A-Za-z0-9]+/[A-Za-z0-9_.~*@$/-]+$")


class StorageError(Exception):
    pass


class ObjectNotFound(StorageError):
    pass


class StorageBusy(StorageError):
    """Another thread or process is writing a version of the object: try again later."""


@dataclass(frozen=True)
class StoredVersion:
    ark: str
    version: int
    manifest_url: str


class ObjectFile(NamedTuple):
    """A stored file: its path inside the object and where to read it (a Path or a URL)."""

    name: str
    location: Path | str


@dataclass(frozen=True)
class StorageManifest:
    """A storage manifest as read: its URL, the sha256 of its bytes and the files it lists."""

    url: str
    sha256: str
    files: list[PayloadFile]


class StorageClient(Protocol):
    def read_manifest(self, manifest_url: str) -> StorageManifest: ...

    def stored_as(self, *, ark: str, manifest: StorageManifest) -> StoredVersion | None: ...

    def store(self, *, ark: str, manifest_url: str) -> StoredVersion: ...

    def latest_version(self, ark: str) -> int: ...

    def existing(self, ark: str, version: int) -> StoredVersion: ...

    def fetch_object(self, ark: str, version: int | None = None) -> list[ObjectFile]: ...


def ark_folder_name(ark: str) -> str:
    """The ARK as one folder name, Merritt style: ``ark:/99999/fk4x`` -> ``ark+=99999=fk4x``.

    Reversible because "+" and "=" are refused in ARKs here, and unlike the lock-node form
    (every ":?/" -> "_") it tells ``ark:/1/a_b`` and ``ark:/1/a/b`` apart.
    """
    if not _ARK.match(ark) or ".." in ark:
        raise StorageError(f"{ark!r} is not an ARK this store accepts")
    return ark.replace(":", "+").replace("/", "=")


def content_digest(entries: Sequence[tuple[str, str]]) -> str:
    """One digest over (name, sha256) pairs; equal digests mean the same object content."""
    digest = hashlib.sha256()
    for name, sha256 in sorted(entries):
        digest.update(f"{name}\0{sha256}\n".encode())
    return digest.hexdigest()


def parse_storage_manifest(manifest_url: str, data: bytes) -> StorageManifest:
    """A storage manifest's files, each under producer/ or system/ and named once."""
    files: list[PayloadFile] = []
    seen: set[str] = set()
    try:
        # Row by row: of each row its file alone is kept.
        # An add manifest, as Processing writes it for storage; an object manifest from a
        # console before this one (a job already past Processing).
        for row in CheckmReader(data, only=(ADD_MANIFEST, OBJECT_MANIFEST)):
            _take_stored_file(row, files, seen)
    except ManifestError as exc:
        raise StorageError(f"unusable storage manifest {url_shown(manifest_url)}: {exc}") from exc
    if not files:
        raise StorageError(f"storage manifest {url_shown(manifest_url)} lists no files")
    return StorageManifest(manifest_url, hashlib.sha256(data).hexdigest(), files)


def _take_stored_file(row: ManifestRow, files: list[PayloadFile], seen: set[str]) -> None:
    """A storage manifest's row as the file it names, each under producer/ or system/ and
    named once."""
    top = row.filename.split("/", 1)[0]
    if top not in (PRODUCER_DIR, SYSTEM_DIR) or "/" not in row.filename:
        raise StorageError(
            f"line {row.line}: file name {row.filename!r} is not under producer/ or system/"
        )
    if row.filename in seen:
        raise StorageError(f"line {row.line}: file name {row.filename!r} repeated")
    seen.add(row.filename)
    files.append(file_of_row(row, row.filename))


@dataclass(frozen=True)
class ManifestExport:
    """Where local storage publishes each object the way Merritt's storage serves it, for
    Merritt's inventory service (which reads a job's ``inventory.manifest_url`` as
    ``<storage>/manifest/<node>/<url-encoded ark>`` and the files as
    ``<storage>/content/<node>/<ark>/<version>/<file>``): under ``folder``, which a web server
    publishes at ``base_url`` (the working folder under MRT_WORK_URL).

    The manifest is written to ``folder/manifest/<node>/<ark>`` and each version is linked at
    ``folder/content/<node>/<ark>/<version>``, the ARK's ``/`` making folders: a web server
    decodes the URL's ``%3A%2F`` before it looks for the file, as nginx and Python's do.
    """

    folder: Path
    base_url: str
    node: int

    def manifest_url(self, ark: str) -> str:
        return inventory_manifest_url(self.base_url, ark, self.node)

    def _place(self, kind: str, ark: str) -> Path:
        ark_folder_name(ark)  # refuses what is not an ARK, ".." included
        return self.folder / kind / str(self.node) / Path(*ark.split("/"))

    def publish(self, storage: LocalStorage, ark: str) -> None:
        content = self._place("content", ark)
        content.mkdir(parents=True, exist_ok=True)
        for number in storage.versions(ark):
            # A link another writer made meanwhile points at the same version folder.
            with contextlib.suppress(FileExistsError):
                (content / str(number)).symlink_to(storage.object_dir(ark).resolve() / str(number))
        target = self._place("manifest", ark)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, part = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(object_map_xml(ark, storage.object_map_versions(ark)))
            os.replace(part, target)
        except BaseException:
            Path(part).unlink(missing_ok=True)
            raise


class LocalStorage:
    """A version store on the local disk: ``root/<ark folder>/<n>/producer|system/...``.

    Each version holds exactly the files of the manifest it was stored from, plus
    ``mrt-version-manifest.txt`` (checkm, file:// URLs, sha256) and ``version.json``.
    A version appears by one rename of a fully written folder, so a reader never sees half of
    one; storing content identical to the latest version returns that version instead of
    adding another, which makes a re-run Storing step harmless. That check, the numbering and
    the rename happen under the object's file lock (``<ark folder>.lock`` beside its folder),
    so no two writers, even one paused past its ZooKeeper session, make two versions of one
    content or two versions with one number.
    """

    def __init__(
        self,
        root: Path,
        *,
        threads: int = 4,
        retries: int = 2,
        timeout: float = DEFAULT_TIMEOUT,
        file_roots: Sequence[Path] | None = None,
        lock_wait: float = 60.0,
        export: ManifestExport | None = None,
        policy: FetchPolicy | None = None,
    ) -> None:
        self.root = root
        self.policy = policy  # its HTTP fetches' (None: the system's own, with ``timeout``)
        self.export = export
        self.threads = threads
        self.retries = retries
        self.timeout = timeout
        self.file_roots = file_roots
        self.lock_wait = lock_wait

    def object_dir(self, ark: str) -> Path:
        return self.root / ark_folder_name(ark)

    def versions(self, ark: str) -> list[int]:
        folder = self.object_dir(ark)
        if not folder.is_dir():
            return []
        found = ((digits(p.name), p) for p in folder.iterdir())
        return sorted(n for n, p in found if n is not None and p.is_dir())

    def version_info(self, ark: str, version: int) -> dict[str, object]:
        path = self.object_dir(ark) / str(version) / VERSION_INFO
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ObjectNotFound(f"{ark} has no version {version}") from None

    def manifest_url(self, ark: str, version: int) -> str:
        return (self.object_dir(ark) / str(version) / VERSION_MANIFEST).resolve().as_uri()

    def read_manifest(self, manifest_url: str) -> StorageManifest:
        try:
            data = fetch_bytes(
                manifest_url, timeout=self.timeout, file_roots=self.file_roots, policy=self.policy
            )
        except DownloadError as exc:
            raise StorageError(
                f"unusable storage manifest {url_shown(manifest_url)}: {exc}"
            ) from exc
        return parse_storage_manifest(manifest_url, data)

    def stored_as(self, *, ark: str, manifest: StorageManifest) -> StoredVersion | None:
        """The latest version when it holds exactly the manifest's files (by name and sha256);
        None when it does not, or when the manifest does not give every file's sha256."""
        if any(f.digest_alg != "sha256" or not f.digest_value for f in manifest.files):
            return None
        entries = [(f.filename, (f.digest_value or "").lower()) for f in manifest.files]
        found = self._latest_with_digest(ark, content_digest(entries))
        return None if found is None else self._published(found)

    def store(self, *, ark: str, manifest_url: str) -> StoredVersion:
        return self._published(self._store(ark=ark, manifest_url=manifest_url))

    def latest_version(self, ark: str) -> int:
        """The object's number of versions (0: not stored)."""
        return max(self.versions(ark), default=0)

    def existing(self, ark: str, version: int) -> StoredVersion:
        """Version ``version`` of the object, as an add that made it would have answered."""
        if version not in self.versions(ark):
            raise ObjectNotFound(f"{ark} has no version {version}")
        return self._published(StoredVersion(ark, version, self.manifest_url(ark, version)))

    def _published(self, stored: StoredVersion) -> StoredVersion:
        """With an export, the object's manifest is published in Merritt's form and its URL is
        the one handed on to inventory; without, the version's own checkm manifest's."""
        if self.export is None:
            return stored
        self.export.publish(self, stored.ark)
        return replace(stored, manifest_url=self.export.manifest_url(stored.ark))

    def object_map_versions(self, ark: str) -> list[MapVersion]:
        """Every version of the object with its files, for its manifest in Merritt's form."""
        found = []
        for number in self.versions(ark):
            data = (self.object_dir(ark) / str(number) / VERSION_MANIFEST).read_bytes()
            created = self.version_info(ark, number).get("created")
            files = tuple(
                MapFile(
                    name=row.filename,
                    size=row.size,
                    digest_type=row.hash_alg or None,
                    digest=row.hash_value or None,
                    created=created if isinstance(created, str) else None,
                )
                for row in CheckmReader(data)
            )
            found.append(MapVersion(number, files, created if isinstance(created, str) else None))
        return found

    def _store(self, *, ark: str, manifest_url: str) -> StoredVersion:
        files = self.read_manifest(manifest_url).files
        folder = self.object_dir(ark)
        folder.mkdir(parents=True, exist_ok=True)
        incoming = Path(tempfile.mkdtemp(prefix=".incoming-", dir=folder))
        try:
            try:
                results = download_all(
                    files,
                    incoming,
                    threads=self.threads,
                    retries=self.retries,
                    timeout=self.timeout,
                    file_roots=self.file_roots,
                    policy=self.policy,
                )
            except DownloadError as exc:
                raise StorageError(f"could not fetch the files of {ark}: {exc}") from exc
            entries = [
                (f.filename, r.digests["sha256"]) for f, r in zip(files, results, strict=True)
            ]
            digest = content_digest(entries)
            # The object's ZooKeeper lock goes with its holder's session, and a paused or
            # cut-off holder goes on running when it wakes: this lock, on the disk, still holds.
            with self._object_lock(ark):
                existing = self._latest_with_digest(ark, digest)
                if existing is not None:
                    return existing
                version = (self.versions(ark) or [0])[-1] + 1
                target = folder / str(version)
                rows = [
                    {
                        "url": (target / f.filename).resolve().as_uri(),
                        "hash_alg": "sha256",
                        "hash_value": r.digests["sha256"],
                        "size": r.size,
                        "filename": f.filename,
                    }
                    for f, r in zip(files, results, strict=True)
                ]
                (incoming / VERSION_MANIFEST).write_text(
                    write_checkm(rows, kind=OBJECT_MANIFEST), encoding="utf-8"
                )
                info = {
                    "ark": ark,
                    "version": version,
                    "content_digest": digest,
                    "source_manifest_url": manifest_url,
                    "created": datetime.now(UTC).isoformat(timespec="seconds"),
                }
                (incoming / VERSION_INFO).write_text(json.dumps(info), encoding="utf-8")
                try:
                    os.rename(incoming, target)
                except OSError:
                    # Only a writer that does not take the lock (a console from before it, or a
                    # filesystem without flock) can have made this number meanwhile.
                    existing = self._latest_with_digest(ark, digest)
                    if existing is not None:
                        return existing
                    raise StorageError(
                        f"version {version} of {ark} was written by another process meanwhile"
                    ) from None
            return StoredVersion(
                ark=ark, version=version, manifest_url=self.manifest_url(ark, version)
            )
        finally:
            shutil.rmtree(incoming, ignore_errors=True)

    @contextmanager
    def _object_lock(self, ark: str) -> Iterator[None]:
        """Hold the object's version lock; StorageBusy after ``lock_wait`` seconds without it.

        Polled, not waited for: a thread blocked in flock cannot be stopped, and the holder may
        be a process paused for as long as anyone lets it be."""
        path = self.root / f"{ark_folder_name(ark)}{LOCK_SUFFIX}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + self.lock_wait
            pause = 0.02
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StorageBusy(
                            f"{ark}: another process is writing a version in local storage"
                        ) from None
                    time.sleep(pause)
                    pause = min(pause * 2, 0.5)
            yield
        finally:
            # Closing the descriptor releases the lock.
            os.close(fd)

    def _latest_with_digest(self, ark: str, digest: str) -> StoredVersion | None:
        versions = self.versions(ark)
        if not versions:
            return None
        latest = versions[-1]
        if self.version_info(ark, latest).get("content_digest") != digest:
            return None
        return StoredVersion(ark=ark, version=latest, manifest_url=self.manifest_url(ark, latest))

    def fetch_object(self, ark: str, version: int | None = None) -> list[ObjectFile]:
        versions = self.versions(ark)
        if not versions:
            raise ObjectNotFound(f"{ark} is not in storage")
        number = versions[-1] if version is None else version
        if number not in versions:
            raise ObjectNotFound(f"{ark} has no version {number}")
        base = self.object_dir(ark) / str(number)
        found: list[ObjectFile] = []
        for top in (PRODUCER_DIR, SYSTEM_DIR):
            for path in sorted((base / top).rglob("*")):
                if path.is_file():
                    found.append(ObjectFile(path.relative_to(base).as_posix(), path))
        return sorted(found)


# The exception kinds (mrt-core2 TExceptionEnum) mrt-store answers with a 500 that no wait
# cures, with the words their reason must hold (``unavailable_answer``'s ``refusals``):
# FIXITY_CHECK_FAILS and INVALID_DATA_FORMAT name content that is not what its manifest says;
# INVALID_OR_MISSING_PARM is the object state's answer on a node storage does not know
# ("Required node not found:N", JerseyBase.getObjectState), a wrong node in a profile, but also
# what storage throws for its own configuration ("Unable to instantiate CloudStore"), which an
# operator mends: only the node's answer. Each fails the job with the service's reason
# (docs/merritt-services.md, "Refusals"); GENERAL_EXCEPTION, which mrt-store also answers for a
# failed write to its cloud, stays an outage.
STORAGE_REFUSALS: dict[str, tuple[str, ...]] = {
    "FIXITY_CHECK_FAILS": (),
    "INVALID_DATA_FORMAT": (),
    "INVALID_OR_MISSING_PARM": ("node not found",),
}


class HttpStorage:
    """Client for Merritt's storage service (mrt-store), speaking its own wire format.

    * ``store``: ``POST {base}/add/{node}/{ark}``, the ARK URL-encoded as Merritt's ingest
      encodes it, with a url-encoded form: ``url`` = the storage manifest's URL (``manifest``
      would be the manifest's text) and ``t=xml``. Storage answers a version-state document,
      root ``ver:versionState``, whose ``ver:identifier`` is the new version number.
      The manifest URL handed on to inventory is ``{base}/manifest/{node}/{ark}``, the
      object's manifest, as Merritt's ingest writes it into the job's ``inventory`` node.
    * ``fetch_object``: ``GET {base}/manifest/{node}/{ark}``, the object's manifest: Merritt's
      XML document (root ``objectInfo``, every version with its files; ``queues.steps.objectmap``)
      or, from a mirror of this project's storage, a checkm object manifest (current version
      only). Each file of the version asked for (the current one by default) is read from
      ``{base}/content/{node}/{ark}/{version}/{file}``, the file's path %-encoded whole.
    * A refusal is the service's exception document; its reason ends up in StorageError, raised
      from an outage (the job waits and is tried again) for a 408, 429 or 5xx unless its kind
      is one of ``STORAGE_REFUSALS`` (an unknown node's, wrong data).

    One pooled session per client; a storage add is never sent twice (a second add would make a
    second version), only retried when the connection could not be made at all.
    """

    def __init__(
        self,
        base_url: str,
        node_id: str | int,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        session: requests.Session | None = None,
        retries: int = 3,
    ):
        self.base_url = base_url.rstrip("/")
        node = str(node_id).strip()
        if digits(node) is None:
            # Merritt's storage (and its queue consumer) read the node as an integer.
            raise StorageError(f"storage node {node_id!r} is not a node number")
        self.node_id = node
        self.service = f"storage node {node}"  # its retry policy and breaker (queues.core.retries)
        self.timeout = timeout
        self.session = session or service_session(retries=retries)

    def _object_url(self, action: str, ark: str) -> str:
        return f"{self.base_url}/{action}/{self.node_id}/{java_urlencode(ark)}"

    def manifest_url(self, ark: str) -> str:
        return self._object_url("manifest", ark)

    def read_manifest(self, manifest_url: str) -> StorageManifest:
        try:
            response = self.session.get(manifest_url, timeout=self.timeout)
        except requests.RequestException as exc:
            raise StorageError(
                f"storage manifest {url_shown(manifest_url)} unreachable: {exc}"
            ) from unavailable(self.service, exc)
        if not answered_ok(response):
            # The manifest is on the console's own web server (MRT_WORK_URL), not storage's:
            # only "not now" waits here, as before.
            raise StorageError(
                f"storage manifest {url_shown(manifest_url)} unreadable: "
                f"HTTP {response.status_code}"
            ) from unavailable_answer(self.service, response, refuses_us=(), own_answer=_any)
        return parse_storage_manifest(manifest_url, response.content)

    def stored_as(self, *, ark: str, manifest: StorageManifest) -> StoredVersion | None:
        """The object's current version when it holds exactly the manifest's files, by storage's
        state documents: the object's (its number of versions, the last one current), that
        version's (its number of files) and each file's (its size, and its digest where the
        answer gives one in the manifest's algorithm). None when the object or any file is not
        there or differs. One request per file: this runs only for a job whose add may have been
        sent before its claim was lost."""
        state = self._state(ark)
        latest = _int(state.get("numVersions")) if state is not None else None
        if not latest:
            return None
        version = self._state(ark, str(latest))
        if version is None or _int(version.get("numFiles")) != len(manifest.files):
            return None
        for entry in manifest.files:
            file_state = self._state(ark, str(latest), entry.filename)
            if file_state is None or not _same_file(entry, file_state):
                return None
        return StoredVersion(ark=ark, version=latest, manifest_url=self.manifest_url(ark))

    def latest_version(self, ark: str) -> int:
        """The object's number of versions by its state document (0: not stored). A state
        without a number of versions is no answer, not 0: read as 0, an add already made would
        be made again (``storing._landed``)."""
        state = self._state(ark)
        if state is None:
            return 0
        latest = _int(state.get("numVersions"))
        if latest is None:
            url = self._object_url("state", ark)
            why = f"storage answered {url_shown(url)} without a number of versions"
            raise StorageError(why) from unavailable(self.service, why)
        return latest

    def existing(self, ark: str, version: int) -> StoredVersion:
        """Version ``version`` of the object, as storage's answer to its add would have given
        it (the object's manifest is what is handed on to inventory)."""
        return StoredVersion(ark=ark, version=version, manifest_url=self.manifest_url(ark))

    def _state(self, ark: str, *below: str) -> dict[str, str] | None:
        """``GET state/{node}/{ark}[/{version}[/{file}]]?t=xml`` as its fields; None for 404.

        A file name is %-encoded whole (``producer%2Fa%20b.txt``): a path segment decodes a
        ``+`` as itself, and storage reads the name from one segment."""
        url = self._object_url("state", ark) + "".join(f"/{quote(p, safe='')}" for p in below)
        try:
            response = self.session.get(url, params={"t": "xml"}, timeout=self.timeout)
        except requests.RequestException as exc:
            raise StorageError(
                f"storage service unreachable at {url_shown(url)}: {exc}"
            ) from unavailable(self.service, exc)
        if response.status_code == 404 and is_exception_document(response.content):
            return None  # storage's own answer: no such object, version or file
        if not answered_ok(response):
            raise StorageError(
                f"storage service refused the state of {ark} on node {self.node_id} "
                f"({url_shown(url)}): {merritt_error(response)}"
            ) from unavailable_answer(self.service, response, refusals=STORAGE_REFUSALS)
        document = state_fields(response.content)
        if document is None:
            raise StorageError(f"storage answered {url_shown(url)} without a state document")
        expected = _STATE_ROOTS[len(below)]
        if document[0] != expected:
            # Another document (a proxy's page, another endpoint's answer): its fields would be
            # read as the state's (an HTML page's <numVersions> did).
            why = f"storage answered {url_shown(url)} with {document[0][:60]!r}, not {expected}"
            raise StorageError(why) from unavailable(self.service, why)
        return document[1]

    def store(self, *, ark: str, manifest_url: str) -> StoredVersion:
        url = self._object_url("add", ark)
        try:
            response = self.session.post(
                url, data={"url": manifest_url, "t": "xml"}, timeout=self.timeout
            )
        except requests.RequestException as exc:
            raise StorageError(
                f"storage service unreachable at {url_shown(url)}: {exc}"
            ) from unavailable(self.service, exc)
        if not answered_ok(response):
            raise StorageError(
                f"storage service refused to add {ark} on node {self.node_id}: "
                f"{merritt_error(response)}"
            ) from unavailable_answer(self.service, response, refusals=STORAGE_REFUSALS)
        version = version_from_response(response.text)
        if version is None or version < 1:
            # Not storage's answer (a page of whatever stands at the configured URL): every add
            # would meet it. Whether a version was made is asked before the next add
            # (``storing.Storing.store_once``).
            why = (
                f"storage service answered the add of {ark} without a version state "
                f"(ver:versionState/ver:identifier): {response.text[:200]!r}"
            )
            raise StorageError(why) from unavailable(self.service, why, ours=True)
        return StoredVersion(ark=ark, version=version, manifest_url=self.manifest_url(ark))

    def _object_manifest(self, ark: str) -> bytes:
        url = self.manifest_url(ark)
        try:
            response = self.session.get(url, timeout=self.timeout)
        except requests.RequestException as exc:
            raise StorageError(
                f"storage service unreachable at {url_shown(url)}: {exc}"
            ) from unavailable(self.service, exc)
        if response.status_code == 404:
            raise ObjectNotFound(f"{ark} is not in storage: {merritt_error(response)}")
        if not answered_ok(response):
            raise StorageError(
                f"storage service refused the manifest of {ark}: {merritt_error(response)}"
            ) from unavailable_answer(self.service, response, refusals=STORAGE_REFUSALS)
        return response.content

    def _object_map(self, ark: str, data: bytes) -> ObjectMap:
        try:
            return parse_object_map(data)
        except ObjectMapError as exc:
            raise StorageError(f"storage manifest of {ark} unreadable: {exc}") from exc

    def versions(self, ark: str) -> list[int]:
        """The object's version numbers, from Merritt's object manifest."""
        data = self._object_manifest(ark)
        if parse_xml(data) is None:
            raise StorageError(
                f"storage answered the manifest of {ark} as checkm, which does not list the "
                "object's versions"
            )
        return sorted(self._object_map(ark, data).versions)

    def fetch_object(self, ark: str, version: int | None = None) -> list[ObjectFile]:
        data = self._object_manifest(ark)
        if parse_xml(data) is not None:
            try:
                found = self._object_map(ark, data).version(version)
            except VersionMissing as exc:
                raise ObjectNotFound(str(exc)) from None
            return sorted(
                ObjectFile(f.name, self.content_url(ark, found.number, f.name)) for f in found.files
            )
        if version is not None:
            raise StorageError(
                f"storage answered the manifest of {ark} as checkm, which lists only the "
                f"current version; version {version} cannot be listed through it"
            )
        try:
            return sorted(ObjectFile(row.filename, row.url) for row in CheckmReader(data))
        except ManifestError as exc:
            raise StorageError(f"storage manifest of {ark} unreadable: {exc}") from exc

    def content_url(self, ark: str, version: int, name: str) -> str:
        """``GET content/{node}/{ark}/{version}/{file}``: a stored file's bytes."""
        return f"{self._object_url('content', ark)}/{version}/{quote(name, safe='')}"


def _any(_content: bytes) -> bool:
    return True


# The root of storage's state documents by how far below the object they are (object,
# version, file), in XML and JSON alike (docs/merritt-services.md).
_STATE_ROOTS = ("objectState", "versionState", "fileState")


def version_entries(data: bytes, version: int) -> list[PayloadFile]:
    """The files a version's manifest lists: a checkm manifest (this console's, one version),
    or Merritt's object manifest (XML, every version; the one numbered ``version`` is read).
    ManifestError when it is neither, or lacks that version."""
    if parse_xml(data) is None:
        return [file_of_row(row, row.filename) for row in CheckmReader(data)]
    try:
        found = parse_object_map(data).version(version)
    except ObjectMapError as exc:
        raise ManifestError(str(exc)) from exc
    return [
        PayloadFile(
            url="",
            filename=f.name,
            digest_alg=f.digest_type,
            digest_value=f.digest,
            size=f.size,
        )
        for f in found.files
    ]


def version_from_response(text: str) -> int | None:
    """The version number in storage's version state: ``ver:versionState`` with
    ``ver:identifier``, as XML (``t=xml``) or JSON (``t=json``); None when it is not one."""
    root = parse_xml(text)
    if root is not None:
        if local_name(root.tag) != "versionState":
            return None
        return _int(child_text(root, "identifier"))
    data = json_document(text)
    if not isinstance(data, dict):
        return None
    state = next((v for k, v in data.items() if local_name(k) == "versionState"), None)
    if not isinstance(state, dict):
        return None
    value = next((v for k, v in state.items() if local_name(k) == "identifier"), None)
    return _int(value)


def _same_file(entry: PayloadFile, state: dict[str, str]) -> bool:
    """A file state (``fil:size``, ``fil:messageDigest`` as ``algorithm=value``) against the
    manifest's line for the file."""
    size = _int(state.get("size"))
    if size is None or (entry.size is not None and size != entry.size):
        return False
    algorithm, _, value = state.get("messageDigest", "").partition("=")
    wanted = (entry.digest_alg or "").lower().replace("-", "")
    if value and wanted and algorithm.strip().lower().replace("-", "") == wanted:
        return value.strip().lower() == (entry.digest_value or "").lower()
    return True


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str):
        return digits(value.strip())
    return None
