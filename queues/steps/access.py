"""Access requests: assemble a stored object into one zip for the requester to download."""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from queues.steps.erc import PRODUCER_DIR
from queues.steps.fetch import DEFAULT_TIMEOUT, download
from queues.steps.storage import StorageClient, ark_folder_name


@dataclass(frozen=True)
class Archive:
    path: Path
    size: int
    sha256: str


def archive_name(ark: str, version: int | None, *, producer_only: bool = False) -> str:
    stem = ark_folder_name(ark) + (f"_v{version}" if version is not None else "")
    return stem + ("_producer" if producer_only else "") + ".zip"


def build_archive(
    *,
    storage: StorageClient,
    ark: str,
    downloads_dir: Path,
    version: int | None = None,
    producer_only: bool = False,
    name: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 2,
    file_roots: Sequence[Path] | None = None,
) -> Archive:
    """Zip the object (latest version unless ``version``) to ``downloads_dir/<name>``.

    Entries sit under one folder named after the ARK, so unpacking never spills files into
    the requester's current folder. The zip appears under its final name only when complete,
    so a requester polling for it never downloads half an archive.
    """
    files = storage.fetch_object(ark, version)
    if producer_only:
        files = [f for f in files if f.name.startswith(PRODUCER_DIR + "/")]
    top = ark_folder_name(ark)
    dest = downloads_dir / (name or archive_name(ark, version, producer_only=producer_only))
    downloads_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".assemble-", dir=downloads_dir) as scratch:
        part = Path(scratch) / dest.name
        with zipfile.ZipFile(part, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
            for index, item in enumerate(files):
                if isinstance(item.location, Path):
                    source = item.location
                else:
                    # Remote files go through a scratch copy: zipfile needs a seekable source
                    # for large members, and download() retries what a plain GET would not.
                    source = Path(scratch) / f"file-{index}"
                    download(
                        item.location,
                        source,
                        retries=retries,
                        timeout=timeout,
                        file_roots=file_roots,
                    )
                zf.write(source, f"{top}/{item.name}")
                if source.parent == Path(scratch):
                    source.unlink()
        digest = hashlib.sha256()
        with part.open("rb") as handle:
            while chunk := handle.read(1024 * 1024):
                digest.update(chunk)
        size = part.stat().st_size
        os.replace(part, dest)
    return Archive(path=dest, size=size, sha256=digest.hexdigest())
