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


def test_an_unreadable_manifest_counts_as_unknown_and_never_fails(
    zk, files: FileServer, settings: Any
) -> None:
    settings.MRT_UNKNOWN_SIZE_BYTES = 12345
    job = make_job(
        zk, {"payload_url": files.url + "/gone", "type": "object-manifest"}, state="Estimating"
    )
    daemon(zk, "estimating").run_once()
    done = job_load(zk, job.jid)
    assert done.state == "Provisioning"
    assert done.space_needed == 12345


def test_a_size_no_one_tells_is_never_counted_as_zero(zk, files: FileServer, settings: Any) -> None:
    # One file the server sizes, one it does not (HEAD refused with 404 here: unknown), one
    # the depositor declared: only the unknown one is counted as MRT_UNKNOWN_SIZE_BYTES.
    settings.MRT_UNKNOWN_SIZE_BYTES = 1000
    rows = [
        {"url": files.put("known", b"k" * 7), "filename": "known"},
        {"url": files.url + "/nowhere", "filename": "unknown"},
        {"url": files.url + "/declared", "filename": "declared", "size": 30},
    ]
    url = files.put("m.checkm", object_manifest(rows))
    job = make_job(zk, {"payload_url": url, "type": "object-manifest"}, state="Estimating")
    daemon(zk, "estimating").run_once()
    assert job_load(zk, job.jid).space_needed == 7 + 1000 + 30


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
