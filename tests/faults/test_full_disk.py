"""A full working disk is an outage, not a job's failure (issue 23, item 5).

The working folder is a small tmpfs the test mounts (so it needs root) and fills to the last
byte with a file of its own, as another writer would. A step that writes there waits in its
step while the disk is full, its reason shown, and completes once the space is back;
Provisioning asks the disk itself before letting a job go on, not only its own estimates.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemons.conftest import FileServer, daemon, drive, make_job

from queues.daemons.provisioning import Provisioning
from queues.zk.jobs import job_load
from tests.jobnodes import set_job_nodes

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("mount") is None,
        reason="mounting the small tmpfs this test fills needs root and mount(8)",
    ),
]

DISK_BYTES = 4 * 1024 * 1024


class SmallDisk:
    """A tmpfs of ``DISK_BYTES`` and a filler file that takes what is left of it."""

    def __init__(self, mount_point: Path) -> None:
        self.root = mount_point
        self.filler = mount_point / "filler"

    def fill(self) -> None:
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (65536, 4096, 1):
                try:
                    while os.write(fd, b"\0" * size):
                        pass
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
        finally:
            os.close(fd)
        assert shutil.disk_usage(self.root).free == 0

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path: Path, daemon_dirs: Path, settings: Any) -> Iterator[SmallDisk]:
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},mode=0755", "tmpfs", str(mount_point)],
        check=True,
        capture_output=True,
    )
    settings.MRT_WORK_DIR = mount_point / "work"
    settings.MRT_PROVISION_HIGH_WATER = 0.9
    try:
        yield SmallDisk(mount_point)
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False, capture_output=True)


def test_processing_waits_while_the_working_disk_is_full_then_completes(
    zk: Any, files: FileServer, small_disk: SmallDisk
) -> None:
    job = make_job(
        zk,
        {"payload_url": files.put("a.txt", "content"), "type": "file", "filename": "a.txt"},
        state="Downloading",
    )
    drive(zk, lambda: job_load(zk, job.jid).state == "Processing", names=["downloading"])
    small_disk.fill()
    processing = daemon(zk, "processing")
    try:
        for _attempt in range(2):
            processing.run_once()
            waited = processing.last
            assert waited is not None
            assert waited.outcome == "waiting", waited.line()
            assert waited.detail.startswith("working disk:"), waited.detail
            assert "No space left on device" in waited.detail
            assert job_load(zk, job.jid).state == "Processing"
    finally:
        small_disk.free()
    processing.run_once()
    assert processing.last is not None and processing.last.outcome == "ok", processing.last
    assert job_load(zk, job.jid).state == "Storing"


@pytest.mark.parametrize("scheme", ["http", "file"])
def test_downloading_waits_while_the_working_disk_is_full_then_completes(
    zk: Any, files: FileServer, small_disk: SmallDisk, scheme: str
) -> None:
    url = files.put("b.txt", "downloaded content")
    if scheme == "file":
        url = (files.root / "b.txt").as_uri()  # MRT_FILE_ROOTS of the tests covers tmp_path
    job = make_job(
        zk, {"payload_url": url, "type": "file", "filename": "b.txt"}, state="Downloading"
    )
    small_disk.fill()
    downloading = daemon(zk, "downloading")
    try:
        downloading.run_once()
        waited = downloading.last
        assert waited is not None
        assert waited.outcome == "waiting", waited.line()
        assert waited.detail.startswith("working disk:"), waited.detail
        assert job_load(zk, job.jid).state == "Downloading"
    finally:
        small_disk.free()
    downloading.run_once()
    assert downloading.last is not None and downloading.last.outcome == "ok", downloading.last
    assert job_load(zk, job.jid).state == "Processing"


def test_provisioning_holds_jobs_back_when_the_disk_fills_after_it_counted(
    zk: Any, small_disk: SmallDisk
) -> None:
    jobs = []
    for _n in range(3):
        job = make_job(zk, {"payload_url": "http://x/a", "type": "file"}, state="Provisioning")
        jobs.append(set_job_nodes(zk, job, space_needed=1024))
    provisioning = Provisioning(zk=zk, poll=0.05)
    assert provisioning.run_once()
    assert [job_load(zk, j.jid).state for j in jobs].count("Downloading") == 1
    # Something other than our downloads takes the disk: none of the jobs counted in goes on.
    small_disk.fill()
    assert not provisioning.run_once()
    assert [job_load(zk, j.jid).state for j in jobs].count("Downloading") == 1
    small_disk.free()
    drive(
        zk,
        lambda: all(job_load(zk, j.jid).state == "Downloading" for j in jobs),
        names=["provisioning"],
        rounds=200,
    )
