"""Job Pending: holds, permanent failures for a payload that cannot be right, else Estimating."""

from __future__ import annotations

import pytest

from queues.services import moves
from queues.steps.checkm import OBJECT_MANIFEST, profile_url
from queues.zk.errors import InvalidTransition
from queues.zk.jobs import NOT_RESUMABLE, STATUS_KEYS, is_permanent_failure, job_load
from queues.zk.locks import collection_hold_set

from .conftest import DEMO, FileServer, daemon, make_job, md5, object_manifest

PROFILE = f"#%profile | {profile_url(OBJECT_MANIFEST)}\n"


def test_pending_job_goes_on_to_estimating(zk, files: FileServer) -> None:
    job = make_job(zk, {"payload_url": files.put("a", "x"), "type": "file"})
    assert daemon(zk, "pending").run_once()
    assert job_load(zk, job.jid).state == "Estimating"


def test_collection_hold_moves_the_job_to_held(zk, files: FileServer) -> None:
    collection_hold_set(zk, DEMO)
    job = make_job(zk, {"payload_url": files.put("a", "x"), "type": "file"})
    daemon(zk, "pending").run_once()
    assert job_load(zk, job.jid).state == "Held"


def test_manifest_digest_mismatch_fails_for_good(zk, files: FileServer) -> None:
    url = files.put("m.checkm", object_manifest([{"url": files.url + "/a", "filename": "a"}]))
    job = make_job(
        zk,
        {"payload_url": url, "type": "object-manifest", "digest": {"alg": "md5", "value": md5("")}},
    )
    d = daemon(zk, "pending")
    d.run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert "digest" in failed.status.message
    assert failed.status.message.startswith(NOT_RESUMABLE + "pending: ")
    assert d.last is not None and d.last.outcome == "failed"
    with pytest.raises(InvalidTransition):
        moves.job_resume(jid=job.jid)


def test_corrupt_object_manifest_fails_naming_the_line(zk, files: FileServer) -> None:
    url = files.put("m.checkm", f"#%checkm_0.7\n{PROFILE}http://x/a | md5 | 123\n#%eof\n")
    job = make_job(zk, {"payload_url": url, "type": "object-manifest"})
    daemon(zk, "pending").run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert "line 3: md5 value must be 32 hex digits" in failed.status.message
    assert is_permanent_failure(failed.status)
    assert tuple(failed.status.raw) == STATUS_KEYS  # "not resumable" is in the message only


def test_an_object_manifest_with_headers_but_no_profile_fails_naming_the_line(
    zk, files: FileServer
) -> None:
    """Merritt's ingest refuses an object manifest whose #% lines before its first row name no
    #%profile (mrt-core2 Checkm.handleHeaders, "manifestProfile is missing"): the job fails
    for good at Pending, naming the first #% line. With no #% line before its first row the
    manifest is read, as Merritt's ingest reads it."""
    rows = f"{files.url}/a | | | | | a\n#%eof\n"
    url = files.put("m.checkm", "#%checkm_0.7\n#%prefix | nfo: | http://x.example/\n" + rows)
    job = make_job(zk, {"payload_url": url, "type": "object-manifest"})
    daemon(zk, "pending").run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert f"object manifest {url}: line 1: #% lines before the first row" in (
        failed.status.message
    )
    assert is_permanent_failure(failed.status)

    files.put("a", "x")
    job = make_job(zk, {"payload_url": files.put("n.checkm", rows), "type": "object-manifest"})
    daemon(zk, "pending").run_once()
    assert job_load(zk, job.jid).state == "Estimating"


def test_an_object_manifest_with_a_profile_merritt_does_not_take_fails_naming_those_it_takes(
    zk, files: FileServer
) -> None:
    """Merritt's object-manifest reader takes two profile URLs, each matched whole (mrt-core2
    ManifestRowIngest 450aab1, Checkm.handleHeaders: "manifestProfile does not match expected
    form"): https is not http. Such a manifest was read here before; the job now fails for good
    at Pending, naming the URLs Merritt takes."""
    files.put("a", "x")
    text = object_manifest([{"url": files.url + "/a", "filename": "a"}])
    https = text.replace(
        f"| {profile_url(OBJECT_MANIFEST)}",
        "| https" + profile_url(OBJECT_MANIFEST).removeprefix("http"),
    )
    assert https != text
    url = files.put("m.checkm", https)
    job = make_job(zk, {"payload_url": url, "type": "object-manifest"})
    daemon(zk, "pending").run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert f"object manifest {url}: line 2: #%profile 'https://" in failed.status.message
    assert profile_url(OBJECT_MANIFEST) in failed.status.message
    assert is_permanent_failure(failed.status)


def test_matching_manifest_digest_passes(zk, files: FileServer) -> None:
    text = object_manifest([{"url": files.url + "/a", "filename": "a"}])
    url = files.put("m.checkm", text)
    job = make_job(
        zk,
        {
            "payload_url": url,
            "type": "object-manifest",
            "digest": {"alg": "md5", "value": md5(text)},
        },
    )
    daemon(zk, "pending").run_once()
    assert job_load(zk, job.jid).state == "Estimating"
