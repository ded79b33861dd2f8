"""Job Downloading: GET every file at once into the job's working folder.

Each download is retried a bounded number of times with back-off (MRT_DOWNLOAD_RETRIES), checked
against the depositor's digest and size when given, and lands under its final name only when
complete. A container is unpacked into ``object/producer``. Any file that cannot be fetched fails
the job with a message naming it. ``space_needed`` is then set to what the folder really holds.

Safe to run twice: the object folder is emptied first, so a re-run never keeps a file from an
earlier attempt that the payload no longer has.
"""

from __future__ import annotations

import shutil
from typing import ClassVar

from django.conf import settings

from queues.daemons import clients
from queues.daemons.base import JobDaemon, Next, Step, StepFailed
from queues.daemons.jobwork import (
    CONTAINERS_DIR,
    disk_bytes,
    job_spec,
    object_dir,
    object_files,
    priority_for_size,
    workdir,
)
from queues.steps.erc import PRODUCER_DIR
from queues.steps.fetch import ContainerError, DownloadError, download_all, extract_container
from queues.zk.jobs import job_set_space_needed
from queues.zk.records import Job

BACKOFF = 0.5


class Downloading(JobDaemon):
    name: ClassVar[str] = "downloading"
    step: ClassVar[str] = "downloading"
    state: ClassVar[str] = "Downloading"

    def work(self, item: Job) -> Step:
        spec = job_spec(item)
        files = object_files(spec)
        folder = workdir(item)
        target = object_dir(item)
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(folder / CONTAINERS_DIR, ignore_errors=True)
        producer = target / PRODUCER_DIR
        producer.mkdir(parents=True, exist_ok=True)
        into = folder / CONTAINERS_DIR if spec.payload_type == "container" else producer
        try:
            results = download_all(
                files,
                into,
                threads=settings.MRT_DOWNLOAD_THREADS,
                retries=settings.MRT_DOWNLOAD_RETRIES,
                backoff=BACKOFF,
                timeout=settings.MRT_HTTP_TIMEOUT,
                file_roots=clients.payload_roots(),
            )
        except DownloadError as exc:
            raise StepFailed(str(exc)) from exc
        if spec.payload_type == "container":
            for result in results:
                try:
                    extract_container(result.path, producer)
                except ContainerError as exc:
                    raise StepFailed(f"container {result.url}: {exc}") from exc
                result.path.unlink(missing_ok=True)
            shutil.rmtree(folder / CONTAINERS_DIR, ignore_errors=True)
        if not any(producer.rglob("*")):
            raise StepFailed(f"{spec.payload_url} gave no files")
        space = disk_bytes(folder)
        job_set_space_needed(self.zk, item, space)
        return Next("Processing", priority=priority_for_size(item.priority, space))
