"""Estimating: HEAD every file, sum the sizes, never fail."""

from __future__ import annotations

from typing import Any

from queues.zk.jobs import job_load

from .conftest import FileServer, daemon, make_job, object_manifest


def test_space_needed_is_the_sum_of_every_file(zk, files: FileServer) -> None:
    rows = [
        {"url": files.put(f"f{n}", b"x" * (100 * (n + 1))), "filename": f"f{n}"} for n in range(3)
    ]
    url = files.put("m.checkm", object_manifest(rows))
    job = make_job(zk, {"payload_url": url, "type": "object-manifest"}, state="Estimating")
    daemon(zk, "estimating").run_once()
    done = job_load(zk, job.jid)
    assert done.state == "Provisioning"
    assert done.space_needed == 600
    assert [files.hits("HEAD", f"f{n}") for n in range(3)] == [1, 1, 1]
    assert done.priority == 5


def test_unknown_sizes_count_as_zero_and_never_fail(zk, files: FileServer) -> None:
    job = make_job(
        zk, {"payload_url": files.url + "/gone", "type": "object-manifest"}, state="Estimating"
    )
    daemon(zk, "estimating").run_once()
    done = job_load(zk, job.jid)
    assert done.state == "Provisioning"
    assert done.space_needed == 0


def test_very_large_job_is_moved_behind_ordinary_ones(zk, files: FileServer, settings: Any) -> None:
    settings.MRT_LARGE_JOB_BYTES = 10
    job = make_job(
        zk, {"payload_url": files.put("big", b"y" * 50), "type": "file"}, state="Estimating"
    )
    daemon(zk, "estimating").run_once()
    done = job_load(zk, job.jid)
    assert done.space_needed == 50
    assert done.priority == 10
    assert done.index_path.endswith(f"/provisioning/10-{job.jid}")
