"""Handing an object version to storage, and reading it back.

Both clients take the URL of a storage manifest (see erc.storage_manifest) rather than files:
that is how Merritt's storage service works, and it lets the local store fetch the same URLs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple, Protocol
from urllib.parse import quote

import requests

from queues.steps.checkm import OBJECT_MANIFEST, ManifestError, parse_checkm, write_checkm
from queues.steps.erc import PRODUCER_DIR, SYSTEM_DIR
from queues.steps.fetch import DEFAULT_TIMEOUT, DownloadError, download_all, fetch_bytes
from queues.steps.submission import PayloadFile

VERSION_MANIFEST = "mrt-version-manifest.txt"
VERSION_INFO = "version.json"
_ARK = re.compile(r"^ark:/[A-Za-z0-9]+/[A-Za-z0-9_.~*@$/-]+$")


class StorageError(Exception):
    pass


class ObjectNotFound(StorageError):
    pass


@dataclass(frozen=True)
class StoredVersion:
    ark: str
    version: int
    manifest_url: str


class ObjectFile(NamedTuple):
    """A stored file: its path inside the object and where to read it (a Path or a URL)."""

    name: str
    location: Path | str


class StorageClient(Protocol):
    def store(self, *, ark: str, manifest_url: str) -> StoredVersion: ...

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


class LocalStorage:
    """A version store on the local disk: ``root/<ark folder>/<n>/producer|system/...``.

    Each version holds exactly the files of the manifest it was stored from, plus
    ``mrt-version-manifest.txt`` (checkm, file:// URLs, sha256) and ``version.json``.
    A version appears by one rename of a fully written folder, so a reader never sees half of
    one; storing content identical to the latest version returns that version instead of
    adding another, which makes a re-run Storing step harmless.
    """

    def __init__(
        self,
        root: Path,
        *,
        threads: int = 4,
        retries: int = 2,
        timeout: float = DEFAULT_TIMEOUT,
        file_roots: Sequence[Path] | None = None,
    ) -> None:
        self.root = root
        self.threads = threads
        self.retries = retries
        self.timeout = timeout
        self.file_roots = file_roots

    def object_dir(self, ark: str) -> Path:
        return self.root / ark_folder_name(ark)

    def versions(self, ark: str) -> list[int]:
        folder = self.object_dir(ark)
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and p.is_dir())

    def version_info(self, ark: str, version: int) -> dict[str, object]:
        path = self.object_dir(ark) / str(version) / VERSION_INFO
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ObjectNotFound(f"{ark} has no version {version}") from None

    def manifest_url(self, ark: str, version: int) -> str:
        return (self.object_dir(ark) / str(version) / VERSION_MANIFEST).resolve().as_uri()

    def store(self, *, ark: str, manifest_url: str) -> StoredVersion:
        files = self._read_manifest(manifest_url)
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
                )
            except DownloadError as exc:
                raise StorageError(f"could not fetch the files of {ark}: {exc}") from exc
            entries = [
                (f.filename, r.digests["sha256"]) for f, r in zip(files, results, strict=True)
            ]
            digest = content_digest(entries)
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
                # Someone else stored a version with this number meanwhile (the per-object
                # storage lock should prevent it); fine if it is our content, else an error.
                existing = self._latest_with_digest(ark, digest)
                if existing is not None:
                    return existing
                raise StorageError(f"version {version} of {ark} was written concurrently") from None
            return StoredVersion(
                ark=ark, version=version, manifest_url=self.manifest_url(ark, version)
            )
        finally:
            shutil.rmtree(incoming, ignore_errors=True)

    def _read_manifest(self, manifest_url: str) -> list[PayloadFile]:
        try:
            manifest = parse_checkm(fetch_bytes(manifest_url, file_roots=self.file_roots))
        except (DownloadError, ManifestError) as exc:
            raise StorageError(f"unusable storage manifest {manifest_url}: {exc}") from exc
        if manifest.kind not in (None, OBJECT_MANIFEST):
            raise StorageError(f"storage manifest {manifest_url} is a {manifest.kind}")
        if not manifest.rows:
            raise StorageError(f"storage manifest {manifest_url} lists no files")
        files: list[PayloadFile] = []
        seen: set[str] = set()
        for row in manifest.rows:
            top = row.filename.split("/", 1)[0]
            if top not in (PRODUCER_DIR, SYSTEM_DIR) or "/" not in row.filename:
                raise StorageError(
                    f"line {row.line}: file name {row.filename!r} is not under producer/ or system/"
                )
            if row.filename in seen:
                raise StorageError(f"line {row.line}: file name {row.filename!r} repeated")
            seen.add(row.filename)
            files.append(
                PayloadFile(
                    url=row.url,
                    filename=row.filename,
                    digest_alg=row.hash_alg or None,
                    digest_value=row.hash_value or None,
                    size=row.size,
                )
            )
        return files

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


class HttpStorage:
    """Client for Merritt's remote storage service (best effort on its wire format).

    * ``store``: ``POST {base}/add/{node}/{url-encoded ark}`` with form fields ``manifest``
      (the storage manifest URL) and ``responseForm=xml``. The new version number is taken
      from the response's ``versionID``/``identifier``/``version`` element or JSON key.
      The manifest URL handed on to inventory is ``{base}/manifest/{node}/{ark}``.
    * ``fetch_object``: ``GET {base}/manifest/{node}/{ark}[/{version}]``, read as a checkm
      object manifest whose rows give each file's name and URL.

    Only tested against a loopback server that speaks this format, not the real service.
    """

    def __init__(self, base_url: str, node_id: str | int, timeout: float = DEFAULT_TIMEOUT):
        self.base_url = base_url.rstrip("/")
        self.node_id = str(node_id)
        self.timeout = timeout

    def _object_url(self, action: str, ark: str) -> str:
        return f"{self.base_url}/{action}/{quote(self.node_id, safe='')}/{quote(ark, safe='')}"

    def store(self, *, ark: str, manifest_url: str) -> StoredVersion:
        url = self._object_url("add", ark)
        try:
            response = requests.post(
                url,
                data={"manifest": manifest_url, "responseForm": "xml"},
                timeout=self.timeout,
            )
        except requests.RequestException as exc:
            raise StorageError(f"storage service unreachable at {url}: {exc}") from None
        if not response.ok:
            raise StorageError(
                f"storage refused {ark}: HTTP {response.status_code} {response.text[:300]}"
            )
        version = version_from_response(response.text)
        if version is None:
            raise StorageError(f"storage response for {ark} names no version number")
        return StoredVersion(
            ark=ark, version=version, manifest_url=self._object_url("manifest", ark)
        )

    def fetch_object(self, ark: str, version: int | None = None) -> list[ObjectFile]:
        url = self._object_url("manifest", ark) + (f"/{version}" if version is not None else "")
        try:
            response = requests.get(url, timeout=self.timeout)
        except requests.RequestException as exc:
            raise StorageError(f"storage service unreachable at {url}: {exc}") from None
        if response.status_code == 404:
            raise ObjectNotFound(f"{ark} (version {version or 'latest'}) is not in storage")
        if not response.ok:
            raise StorageError(f"storage answered HTTP {response.status_code} for {url}")
        try:
            manifest = parse_checkm(response.content)
        except ManifestError as exc:
            raise StorageError(f"storage manifest of {ark} unreadable: {exc}") from exc
        return sorted(ObjectFile(row.filename, row.url) for row in manifest.rows)


_VERSION_XML = re.compile(
    r"<(?:[\w.-]+:)?(?:versionID|versionNumber|identifier|version)>\s*(\d+)\s*</", re.I
)


def version_from_response(text: str) -> int | None:
    try:
        data = json.loads(text)
    except ValueError:
        match = _VERSION_XML.search(text)
        return int(match.group(1)) if match else None
    return _version_in_json(data)


def _version_in_json(data: object) -> int | None:
    if isinstance(data, dict):
        for key, value in data.items():
            is_number = isinstance(value, int) or (isinstance(value, str) and value.isdigit())
            if is_number and key.lower() in ("versionid", "versionnumber", "version", "identifier"):
                return int(value)
            found = _version_in_json(value)
            if found is not None:
                return found
    elif isinstance(data, list):
        for item in data:
            found = _version_in_json(item)
            if found is not None:
                return found
    return None
