"""Batch Pending: holds, the six submission types, corrupt manifests, restart safety."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from queues.daemons.batch_pending import BatchPending, batch_priority
from queues.services import moves
from queues.services.zkserver import free_port
from queues.steps.checkm import (
    BATCH_MANIFEST,
    CONTAINER_BATCH_MANIFEST,
    SINGLE_FILE_BATCH_MANIFEST,
    profile_url,
)
from queues.zk.batches import batch_job_ids, batch_load
from queues.zk.jobs import job_create, job_load
from queues.zk.locks import collection_hold_set, queue_hold_set
from queues.zk.sized import BATCH_JOBS_MAX

from .conftest import DEMO, FileServer, batch_manifest, daemon, md5, object_manifest


def _jobs(zk, bid: str):
    index = batch_job_ids(zk, bid)
    return [job_load(zk, j) for j in sorted({j for f in index.values() for j in f})]


def _submit(url: str, kind: str, **kw) -> str:
    return moves.batch_submit(
        profile=DEMO, submitter="depositor@example.org", payload_url=url, submission_type=kind, **kw
    )


def test_single_file_becomes_one_job_with_its_erc_and_ids(zk, files: FileServer) -> None:
    url = files.put("a/page.txt", "hello")
    bid = _submit(
        url,
        "file",
        title="A page",
        creator="Someone",
        date="2024",
        local_id="loc-1",
        digest_alg="md5",
        digest_value=md5("hello"),
    )
    assert daemon(zk, "batch-pending").run_once()
    assert batch_load(zk, bid).state == "Processing"
    [job] = _jobs(zk, bid)
    assert job.state == "Pending"
    assert job.priority == 3  # one object, profile priority 5
    config = job.configuration
    assert config["payload_url"] == url
    assert config["type"] == "file"
    assert config["filename"] == "page.txt"
    assert config["digest"] == {"alg": "md5", "value": md5("hello")}
    assert config["batch_seq"] == 1
    assert config["submission_type"] == "file"
    assert config["submitter"] == "depositor@example.org"
    assert config["working_dir"].endswith(f"{bid}/{job.jid}")
    assert job.identifiers == {"primary_id": "", "local_id": ["loc-1"]}
    assert job.metadata["erc_what"] == "A page"
    assert job.metadata["erc_who"] == "Someone"


@pytest.mark.parametrize("kind", ["container", "object-manifest"])
def test_container_and_object_manifest_are_one_job(zk, files: FileServer, kind: str) -> None:
    url = files.put("payload", b"whatever")
    bid = _submit(url, kind)
    daemon(zk, "batch-pending").run_once()
    [job] = _jobs(zk, bid)
    # Merritt ingest's name for the type; the console's stays as submission_type.
    assert job.configuration["type"] == {"object-manifest": "manifest"}.get(kind, kind)
    assert job.configuration["submission_type"] == kind


def test_manifest_of_manifests_gives_one_job_per_line_with_row_metadata(
    zk, files: FileServer
) -> None:
    rows = []
    for n in range(3):
        manifest = object_manifest([{"url": files.url + f"/f{n}", "filename": f"f{n}"}])
        rows.append(
            {
                "url": files.put(f"m{n}.checkm", manifest),
                "local_id": f"loc-{n}",
                "title": f"Object {n}",
                "primary_id": "ark:/99999/fk4given" if n == 2 else "",
            }
        )
    bid = _submit(files.put("batch.checkm", batch_manifest(rows)), "batch-manifest", title="B")
    daemon(zk, "batch-pending").run_once()
    jobs = _jobs(zk, bid)
    assert [j.configuration["batch_seq"] for j in jobs] == [1, 2, 3]
    assert {j.configuration["type"] for j in jobs} == {"manifest"}
    assert [j.metadata["erc_what"] for j in jobs] == ["Object 0", "Object 1", "Object 2"]
    assert jobs[2].identifiers["primary_id"] == "ark:/99999/fk4given"
    assert {j.priority for j in jobs} == {5}
    assert all("title" not in j.configuration or j.configuration["title"] != "B" for j in jobs)


def test_a_manifest_merritt_would_read_by_other_columns_fails_the_batch_before_any_job(
    zk, files: FileServer
) -> None:
    """Merritt's ingest reads a batch manifest's cells by position (mrt-core2 ManifestRowBatch)
    and never its #%fields: with the creator and title swapped there, it would store each as
    the other, where this console read them by name. Refused, no job made; in Merritt's order
    the same manifest makes its job, each value where its name says."""
    rows = [{"url": files.put("a/page.txt", "hello"), "creator": "Doe, J.", "title": "A title"}]
    right = batch_manifest(rows, SINGLE_FILE_BATCH_MANIFEST)
    swapped = right.replace("mrt:creator | mrt:title", "mrt:title | mrt:creator").replace(
        "Doe, J. | A title", "A title | Doe, J."
    )
    assert swapped != right
    bid = _submit(files.put("swapped.checkm", swapped), "single-file-batch-manifest")
    daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Failed"
    assert "line 5: #%fields names mrt:title as column 9, where Merritt reads mrt:creator" in (
        batch.status.message
    )
    assert _jobs(zk, bid) == []

    bid = _submit(files.put("right.checkm", right), "single-file-batch-manifest")
    daemon(zk, "batch-pending").run_once()
    (job,) = _jobs(zk, bid)
    assert (job.metadata["erc_who"], job.metadata["erc_what"]) == ("Doe, J.", "A title")


def test_a_manifest_merritt_refuses_whole_fails_the_batch_before_any_job(
    zk, files: FileServer
) -> None:
    """Merritt's reader refuses a manifest whose last line is not #%eof (mrt-core2
    ManifestRowCheckmAbs.handleEOF), after making a job of each row it read. Here the batch
    fails before any job is made; ended with #%eof, the same rows make their jobs, each cell
    decoded as Merritt decodes it (%20 a space, %7c a "|"; Checkm.dec)."""
    rows = [{"url": files.put("a/page.txt", "hello"), "title": "A | B"}]
    right = batch_manifest(rows, SINGLE_FILE_BATCH_MANIFEST)
    assert "A %7c B" in right
    cut = right.removesuffix("#%eof\n")
    bid = _submit(files.put("cut.checkm", cut), "single-file-batch-manifest")
    daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Failed"
    assert "the last line is not #%eof" in batch.status.message
    assert _jobs(zk, bid) == []

    bid = _submit(files.put("right.checkm", right), "single-file-batch-manifest")
    daemon(zk, "batch-pending").run_once()
    (job,) = _jobs(zk, bid)
    assert job.metadata["erc_what"] == "A | B"


def test_a_batch_manifest_with_headers_but_no_profile_fails_the_batch_naming_the_line(
    zk, files: FileServer
) -> None:
    """Merritt's ingest refuses a batch manifest whose #% lines before its first row name no
    #%profile (mrt-core2 Checkm.handleHeaders, "manifestProfile is missing"), and fails one
    with no #% line at all when it takes its first job's type from the profile (mrt-ingest
    HandlerDisaggregate.getObjectType). Here either fails the batch before any job is made,
    the first naming the #% line."""
    rows = [{"url": files.put("a/page.txt", "hello"), "title": "A page"}]
    right = batch_manifest(rows, SINGLE_FILE_BATCH_MANIFEST)
    headed = right.replace(f"#%profile | {profile_url(SINGLE_FILE_BATCH_MANIFEST)}\n", "")
    assert headed != right
    bid = _submit(files.put("headed.checkm", headed), "single-file-batch-manifest")
    daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Failed"
    assert "line 1: #% lines before the first row" in batch.status.message
    assert _jobs(zk, bid) == []

    bare = "".join(line + "\n" for line in right.splitlines() if not line.startswith("#%"))
    bid = _submit(files.put("bare.checkm", bare + "#%eof\n"), "single-file-batch-manifest")
    daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Failed"
    assert _jobs(zk, bid) == []


def test_a_batch_manifest_with_a_profile_merritt_does_not_take_fails_the_batch(
    zk, files: FileServer
) -> None:
    """Merritt's batch reader takes only its own profile URLs, each matched whole (mrt-core2
    ManifestRowBatch 64d6bd2, Checkm.handleHeaders: "manifestProfile does not match expected
    form"). A batch manifest naming its kind at the end of another URL was read here before;
    it now fails the batch before any job is made, naming the URLs Merritt takes. Merritt's
    legacy URL for the batch manifest is one of them."""
    rows = [{"url": files.put("a/page.txt", "hello"), "title": "A page"}]
    right = batch_manifest(rows, SINGLE_FILE_BATCH_MANIFEST)
    ours = profile_url(SINGLE_FILE_BATCH_MANIFEST)
    other = right.replace(ours, f"http://example.org/batches/{SINGLE_FILE_BATCH_MANIFEST}")
    assert other != right
    bid = _submit(files.put("other.checkm", other), "single-file-batch-manifest")
    daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Failed"
    assert "line 2: #%profile 'http://example.org/batches/" in batch.status.message
    assert ours in batch.status.message
    assert _jobs(zk, bid) == []

    legacy = batch_manifest(rows, BATCH_MANIFEST).replace(
        profile_url(BATCH_MANIFEST), f"http://uc3.cdlib.org/registry/mrt/{BATCH_MANIFEST}"
    )
    bid = _submit(files.put("legacy.checkm", legacy), "batch-manifest")
    daemon(zk, "batch-pending").run_once()
    assert batch_load(zk, bid).state != "Failed"
    assert len(_jobs(zk, bid)) == 1


@pytest.mark.parametrize(
    ("kind", "manifest_kind", "payload_type"),
    [
        ("single-file-batch-manifest", SINGLE_FILE_BATCH_MANIFEST, "file"),
        ("container-batch-manifest", CONTAINER_BATCH_MANIFEST, "container"),
    ],
)
def test_file_and_container_batch_manifests(
    zk, files: FileServer, kind: str, manifest_kind: str, payload_type: str
) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("x.txt", "x")
    rows = [{"url": files.put(f"p{n}.zip", buffer.getvalue())} for n in range(2)]
    bid = _submit(files.put("b.checkm", batch_manifest(rows, manifest_kind)), kind)
    daemon(zk, "batch-pending").run_once()
    jobs = _jobs(zk, bid)
    assert len(jobs) == 2
    assert {j.configuration["type"] for j in jobs} == {payload_type}


def test_corrupt_manifest_fails_the_batch_naming_the_line(zk, files: FileServer) -> None:
    text = batch_manifest([{"url": files.url + "/a"}]).replace(
        files.url + "/a", files.url + "/a | md5 | not-hex"
    )
    bid = _submit(files.put("bad.checkm", text), "batch-manifest")
    daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Failed"
    assert "line 6" in batch.status.message
    assert batch.status.message.startswith("batch-pending: ")
    assert _jobs(zk, bid) == []


def test_unreachable_payload_fails_the_batch_with_the_reason(zk, files: FileServer) -> None:
    bid = _submit(files.url + "/missing.checkm", "batch-manifest")
    daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Failed"
    assert "missing.checkm" in batch.status.message
    assert "404" in batch.status.message


def test_collection_hold_parks_the_batch_as_held(zk, files: FileServer) -> None:
    collection_hold_set(zk, DEMO)
    bid = _submit(files.put("f", "x"), "file")
    daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Held"
    assert DEMO in batch.status.message


def test_held_ingest_queue_parks_new_batches_as_held(zk, files: FileServer) -> None:
    queue_hold_set(zk, "ingest")
    bid = _submit(files.put("f", "x"), "file")
    daemon(zk, "batch-pending").run_once()
    assert batch_load(zk, bid).state == "Held"


def test_restart_creates_only_the_missing_jobs(zk, files: FileServer) -> None:
    rows = [{"url": files.put(f"f{n}", str(n))} for n in range(3)]
    bid = _submit(
        files.put("b.checkm", batch_manifest(rows, SINGLE_FILE_BATCH_MANIFEST)),
        "single-file-batch-manifest",
    )
    # A consumer died after creating the second job.
    for seq in (1, 2):
        job_create(zk, bid=bid, configuration={"profile": DEMO, "batch_seq": seq})
    daemon(zk, "batch-pending").run_once()
    jobs = _jobs(zk, bid)
    assert sorted(j.configuration["batch_seq"] for j in jobs) == [1, 2, 3]
    assert batch_load(zk, bid).state == "Processing"


def test_a_profile_gone_since_the_submission_fails_the_batch(
    zk, files: FileServer, profiles
) -> None:
    # A submission naming no profile here is refused (tests/core/test_commands.py); one removed
    # since, or a batch another client wrote, is failed by its first step, saying why.
    bid = _submit(files.put("f", "x"), "file")
    (profiles / f"{DEMO}.json").unlink()
    daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Failed"
    assert DEMO in batch.status.message


def test_priority_follows_batch_size() -> None:
    assert [batch_priority(5, n) for n in (1, 2, 10, 11, 100, 101)] == [3, 5, 5, 6, 6, 7]
    assert batch_priority(0, 1) == 0
    assert batch_priority(99, 500) == 99
    assert BatchPending.queue_hold is None


def _queued_mail_on(profiles) -> None:
    path = profiles / f"{DEMO}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "queued_mail": True}))


def test_queued_mail_lists_every_job_when_the_profile_asks(
    zk, files: FileServer, profiles, mailoutbox
) -> None:
    _queued_mail_on(profiles)
    rows = [{"url": files.put(f"f{n}", str(n)), "title": f"<b>Page {n}</b>"} for n in range(3)]
    bid = _submit(
        files.put("b.checkm", batch_manifest(rows, SINGLE_FILE_BATCH_MANIFEST)),
        "single-file-batch-manifest",
        title="Scans",
    )
    # A consumer died after creating the first job: the mail still names all three.
    first = job_create(zk, bid=bid, configuration={"profile": DEMO, "batch_seq": 1})
    daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Processing"
    assert "queued mail sent to 2" in batch.status.message
    [mail] = mailoutbox
    assert mail.to == ["depositor@example.org", "merritt-demo@example.org"]
    uuid = batch.submission["batchID"]
    assert mail.subject == (
        f"Ingest: OK -- Submission Queued: {uuid}; Merritt batch {bid} queued: Scans (3 jobs)"
    )
    jids = sorted(j.jid for j in _jobs(zk, bid))
    assert first.jid in jids
    for jid in jids:
        assert jid in mail.body
    assert "<b>Page 2</b>" in mail.body  # plain text: nothing to escape
    assert f"/batches/{bid}/" in mail.body


def test_no_queued_mail_unless_the_profile_asks(zk, files: FileServer, mailoutbox) -> None:
    bid = _submit(files.put("f", "x"), "file")
    daemon(zk, "batch-pending").run_once()
    assert batch_load(zk, bid).state == "Processing"
    assert mailoutbox == []


def test_a_mail_server_that_refuses_does_not_hold_the_jobs_back(
    zk, files: FileServer, profiles, settings
) -> None:
    _queued_mail_on(profiles)
    settings.EMAIL_BACKEND = "queues.steps.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", free_port()
    bid = _submit(files.put("f", "x"), "file")
    daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Processing"
    assert "queued mail not sent" in batch.status.message
    assert len(_jobs(zk, bid)) == 1


def test_a_manifest_of_more_objects_than_a_batch_holds_fails_the_batch_before_any_job(
    zk, files: FileServer
) -> None:
    # One listing of a batch's job folder must stay within the 1 MiB Merritt's clients read.
    assert BATCH_JOBS_MAX == 60_717
    rows = [{"url": f"{files.url}/p{n}.txt"} for n in range(BATCH_JOBS_MAX + 1)]
    manifest = batch_manifest(rows, SINGLE_FILE_BATCH_MANIFEST)
    bid = _submit(files.put("big.checkm", manifest), "single-file-batch-manifest")
    daemon(zk, "batch-pending").run_once()
    batch = batch_load(zk, bid)
    assert batch.state == "Failed"
    assert batch.status.message == (
        "batch-pending: the manifest lists more than 60,717 objects; one batch holds at most "
        "60,717 (the listing of its jobs must stay within ZooKeeper's default 1 MiB, which "
        "Merritt's clients read): submit it as several batches"
    )
    assert _jobs(zk, bid) == []


def test_a_manifest_server_answering_503_for_a_while_fails_no_batch(
    zk, files: FileServer, settings
) -> None:
    """Issue 50: a batch manifest whose server cannot answer now leaves the batch Pending, its
    next try on its status, until the server answers; a spent policy fails it with every try."""
    from queues.core import retries
    from tests.daemons.conftest import wait_for

    settings.MRT_RETRY = {"depositor": "attempts=6 first=0.2s most=0.4s within=1h"}
    rows = [{"url": files.put("a/page.txt", "hello")}]
    bid = _submit(
        files.put("a.checkm", batch_manifest(rows, SINGLE_FILE_BATCH_MANIFEST)),
        "single-file-batch-manifest",
    )
    files.busy = 2 * 4  # two tries of the fetch's own four asks
    pending = daemon(zk, "batch-pending")
    pending.run_once()
    waiting = batch_load(zk, bid)
    assert waiting.state == "Pending"
    assert "waiting to try again, try 2 of 6" in waiting.status.message
    assert retries.RETRY_KEY in waiting.status.raw
    assert not pending.run_once() or batch_load(zk, bid).state == "Pending"  # not due yet

    def through() -> bool:
        pending.run_once()
        return batch_load(zk, bid).state != "Pending"

    wait_for(through, timeout=60, every=0.1)
    done = batch_load(zk, bid)
    assert done.state == "Processing", done.status.message
    assert retries.RETRY_KEY not in done.status.raw
    assert len(_jobs(zk, bid)) == 1

    # Down for good: the policy's end fails the batch, naming every try.
    settings.MRT_RETRY = {"depositor": "attempts=2 first=0.1s most=0.1s within=1h"}
    rows = [{"url": files.put("b/page.txt", "hi")}]
    other = _submit(
        files.put("b.checkm", batch_manifest(rows, SINGLE_FILE_BATCH_MANIFEST)),
        "single-file-batch-manifest",
    )
    files.busy = 10_000

    def ended() -> bool:
        pending.run_once()
        return batch_load(zk, other).state != "Pending"

    wait_for(ended, timeout=60, every=0.1)
    failed = batch_load(zk, other)
    assert failed.state == "Failed"
    assert "gave up after 2 tries of depositor" in failed.status.message
    files.busy = 0
