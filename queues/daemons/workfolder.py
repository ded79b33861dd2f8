"""What the job steps share: the job's object spec, its files, and its working folder.

Working folder of a job (always MRT_WORK_DIR/<bid>/<jid>)::

    object/producer/...            the depositor's files (downloaded, containers unpacked)
    object/system/mrt-erc.txt      written by Processing
    object/system/mrt-dc.xml
    containers/                    a container while it is being downloaded and unpacked
    mrt-storage-manifest.txt       written by Processing, read by storage

The object manifest of an object-manifest payload is fetched again by each step that needs its
rows (they are small); so a resumed job sees what the depositor's server serves now.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings

from queues.core.states import JOB
from queues.daemons.base import NotProcessable, StepFailed
from queues.daemons.handoff import HandedWork
from queues.services.depositors import depositor_policy, payload_roots
from queues.steps.checkm import ADD_MANIFEST, OBJECT_MANIFEST, CheckmReader, ManifestError
from queues.steps.erc import http_url_for, write_storage_manifest
from queues.steps.fetch import fetch_bytes
from queues.steps.submission import ObjectSpec, PayloadFile, PayloadNotHere, payload_files
from queues.zk import paths as zpaths
from queues.zk.errors import MalformedNode, NotFound
from queues.zk.jobs import job_nodes, jobs_finish_load, load_paths
from queues.zk.nodes import collect_reads, start_reads
from queues.zk.records import Job

OBJECT_DIR = "object"
CONTAINERS_DIR = "containers"
STORAGE_MANIFEST = "mrt-storage-manifest.txt"
# What ``rewrite_object_profile_manifest`` reads of one: its headers, a few hundred bytes.
MANIFEST_HEAD = 64 * 1024
# Lower runs first; a very large job waits behind ordinary ones rather than blocking them.
LARGE_JOB_PRIORITY = 10

log = logging.getLogger("queues.daemons")


def job_spec(job: Job) -> ObjectSpec:
    try:
        return ObjectSpec.from_configuration(job.configuration)
    except PayloadNotHere as exc:
        # A job written by Merritt's ingest: left untouched for Merritt's consumers.
        raise NotProcessable(str(exc)) from exc
    except (ValueError, TypeError) as exc:
        # Nothing an operator can resume: the job itself describes no usable object.
        raise StepFailed(f"unusable job configuration: {exc}", permanent=True) from exc


def fetch(url: str) -> bytes:
    """A depositor's manifest, under the depositor fetch policy."""
    return fetch_bytes(
        url,
        timeout=settings.MRT_HTTP_TIMEOUT,
        retries=settings.MRT_DOWNLOAD_RETRIES,
        file_roots=payload_roots(),
        policy=depositor_policy(),
    )


def check_digest(data: bytes, alg: str | None, value: str | None, what: str) -> None:
    if not (alg and value):
        return
    actual = hashlib.new(alg.lower(), data, usedforsecurity=False).hexdigest()
    if actual != value.strip().lower():
        raise StepFailed(
            f"{what}: {alg.lower()} digest {actual} does not match the depositor's {value}",
            permanent=True,
        )


def object_files(spec: ObjectSpec) -> list[PayloadFile]:
    """The files of the object; for an object manifest its digest is checked and rows parsed.

    A corrupt manifest, or one that does not match the depositor's digest of it, fails the job
    for good: only a new submission can fix what was submitted.
    """
    if spec.payload_type != "object-manifest":
        return payload_files(spec, fetch_text=fetch)
    data = fetch(spec.payload_url)
    check_digest(data, spec.digest_alg, spec.digest_value, spec.payload_url)
    try:
        return payload_files(spec, fetch_text=lambda _url: data)
    except ManifestError as exc:
        raise StepFailed(f"object manifest {spec.payload_url}: {exc}", permanent=True) from exc


def workdir(job: Job) -> Path:
    """The job's working folder: always MRT_WORK_DIR/<bid>/<jid>, derived, never read.

    A ``working_dir`` in the configuration (written by another client, or an older version of
    this one) is ignored: the folder is deleted when the job completes, and a configuration
    must never make this process write into or delete another job's folder.
    """
    return work_root() / job.bid / job.jid


def work_root() -> Path:
    """MRT_WORK_DIR, resolved (once per value: every job's folder is named from it)."""
    return _resolved(str(settings.MRT_WORK_DIR))


@functools.lru_cache(maxsize=8)
def _resolved(root: str) -> Path:
    return Path(root).resolve()


def work_relative(path: Path) -> str:
    """``path`` relative to MRT_WORK_DIR, as a URL path."""
    return path.resolve().relative_to(work_root()).as_posix()


def object_dir(job: Job) -> Path:
    return workdir(job) / OBJECT_DIR


def write_job_storage_manifest(job: Job, work_url: Callable[[str], str | None]) -> str:
    """Write the job's storage manifest (an add manifest of its object folder, beside it) and
    return its URL as storage fetches it: under MRT_WORK_URL when ``work_url`` (the clients'
    ``work_url``) gives one, else its file:// URL."""
    target = object_dir(job)
    served = work_url(work_relative(target))
    manifest = write_storage_manifest(
        target,
        workdir(job) / STORAGE_MANIFEST,
        url_for=http_url_for(served) if served else None,
    )
    return work_url(work_relative(manifest)) or manifest.resolve().as_uri()


def rewrite_object_profile_manifest(
    job: Job, manifest_url: str, work_url: Callable[[str], str | None]
) -> bool:
    """Write the job's storage manifest again, as an add manifest, when it is the one this
    console's Processing wrote (at ``manifest_url``) but with the object-manifest profile
    (``mrt-ingest-manifest``), as consoles before 2026-12-06 wrote it: Merritt's storage refuses
    any add whose manifest has another profile than its add profile (docs/merritt-services.md),
    so a job processed by such a console (before an upgrade, or by a host not yet upgraded)
    would otherwise never be stored. True when it was written again. Any other manifest (one
    Merritt's ingest wrote, one unreadable here, one already an add manifest) is left as it is.
    """
    path = workdir(job) / STORAGE_MANIFEST
    try:
        if (work_url(work_relative(path)) or path.resolve().as_uri()) != manifest_url:
            return False
        # Its headers only, from its head: asked of every job Storing takes, whose manifest
        # may list a hundred thousand files (its profile line is its second).
        with path.open("rb") as manifest:
            head = manifest.read(MANIFEST_HEAD)
        reader = CheckmReader(head, only=(ADD_MANIFEST, OBJECT_MANIFEST))
        reader.columns()
    except (OSError, ValueError, ManifestError):
        return False
    if reader.kind != OBJECT_MANIFEST:
        return False
    write_job_storage_manifest(job, work_url)
    return True


def disk_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += (Path(dirpath) / name).lstat().st_size
            except OSError:
                continue
    return total


class FolderRemovals(HandedWork[tuple[Path, Path | None]]):
    """Completed jobs' working folders removed by a thread of the process's own: a large
    object's folder takes seconds to remove (20,000 files and 2 GiB, 2.7 s), and the loop that
    completes jobs shares its thread with the other short steps' loops."""

    def work(self, piece: tuple[Path, Path | None]) -> None:
        folder, batch = piece
        shutil.rmtree(folder, ignore_errors=True)
        if batch is not None:
            # The batch folder goes with its last job (rmdir refuses while others use it).
            with contextlib.suppress(OSError):
                batch.rmdir()

    def failed(self, piece: tuple[Path, Path | None], exc: Exception) -> None:
        log.warning("%s: working folder not removed: %s", piece[0], exc)


# The process's one remover; a stopping process waits for it (``runner.Host``).
FOLDER_REMOVALS = FolderRemovals("workdir-removals")


def remove_workdir(job: Job) -> None:
    """Hand ``job``'s working folder over for removal, with its batch's once that is empty."""
    folder = workdir(job)
    FOLDER_REMOVALS.put((folder, folder.parent if folder.parent != work_root() else None))


# A job's states no step or resume leaves: its folder has no more use.
ENDED = JOB.terminal - JOB.action_sources("resume")
SWEEP_CHUNK = 500  # jobs read a round trip


def leftover_folders(zk: Any) -> list[Path]:
    """The working folders no job will use again: of a job Completed or Deleted (notify hands a
    completed job's folder to ``FOLDER_REMOVALS``, which a killed process never got to; a job
    deleted after it failed keeps the folder it failed with), or of a job gone from ZooKeeper
    (archived or removed with its batch). A Failed job keeps its folder for a resume; a folder
    whose name is no batch and job ID, or whose job names another batch, or that is a link, is
    left alone: nothing here is taken on a guess."""
    root = work_root()
    if not root.is_dir():
        return []
    candidates: list[Path] = []
    for batch in root.iterdir():
        if batch.is_symlink() or not batch.is_dir() or not zpaths.BID_RE.match(batch.name):
            continue
        # A batch folder removed meanwhile (its last job's, by a remover) has nothing to sweep.
        with contextlib.suppress(FileNotFoundError):
            candidates += (
                folder
                for folder in batch.iterdir()
                if zpaths.JID_RE.match(folder.name) and not folder.is_symlink() and folder.is_dir()
            )
    candidates.sort()
    leftover: list[Path] = []
    for start in range(0, len(candidates), SWEEP_CHUNK):
        chunk = candidates[start : start + SWEEP_CHUNK]
        reads = collect_reads(start_reads(zk, load_paths([folder.name for folder in chunk])))
        for folder in chunk:
            jid = folder.name
            if reads[job_nodes(jid).base] is None:
                leftover.append(folder)  # gone: archived, or removed with its batch
                continue
            try:
                job = jobs_finish_load(jid, reads)
            except (NotFound, MalformedNode):
                continue  # still being made, or broken: not judged on a guess
            if job.bid == folder.parent.name and job.state in ENDED:
                leftover.append(folder)
    return leftover


def remove_leftover_folders(zk: Any) -> int:
    """Remove ``leftover_folders`` (each batch folder with its last job); how many."""
    folders = leftover_folders(zk)
    for folder in folders:
        FOLDER_REMOVALS.work((folder, folder.parent))
    return len(folders)


def priority_for_size(priority: int, space_needed: int) -> int:
    if space_needed > settings.MRT_LARGE_JOB_BYTES:
        return max(priority, LARGE_JOB_PRIORITY)
    return priority
