"""Processing: the ARK (minted once, reused, checked against the local id), ERC, DC, manifest."""

from __future__ import annotations

import hashlib

import pytest

from queues.daemons.processing import Processing
from queues.daemons.workfolder import object_dir
from queues.models import InventoryObject
from queues.steps.checkm import parse_checkm
from queues.steps.fetch import fetch_bytes
from queues.zk.counters import counter_path
from queues.zk.jobs import job_load, job_transition

from .conftest import make_job

pytestmark = pytest.mark.django_db


def _downloaded(zk, **kw):
    job = make_job(
        zk,
        {"payload_url": "http://x/a.txt", "type": "file", "filename": "a.txt", "title": "T"},
        state="Processing",
        **kw,
    )
    producer = object_dir(job) / "producer"
    producer.mkdir(parents=True)
    (producer / "a.txt").write_text("content")
    return job


def test_mints_an_ark_and_writes_erc_dc_and_storage_manifest(zk) -> None:
    job = _downloaded(
        zk,
        identifiers={"primary_id": "", "local_id": ["loc-9"]},
        metadata={"erc_who": "Ann", "erc_what": "Title"},
    )
    assert Processing(zk=zk).run_once()
    done = job_load(zk, job.jid)
    assert done.state == "Storing", done.status.message
    ark = done.primary_id
    assert ark.startswith("ark:/99999/fk4")
    assert done.local_ids == ["loc-9"]
    erc = (object_dir(done) / "system" / "mrt-erc.txt").read_text()
    assert f"where: {ark}" in erc
    assert "who: Ann" in erc
    assert "where: loc-9" in erc
    # Dublin Core holds the submission's DC* values (none here), as Merritt's ingest writes it.
    assert "<DublinCore " in (object_dir(done) / "system" / "mrt-dc.xml").read_text()
    manifest = parse_checkm(fetch_bytes(done.store["manifest_url"]))
    names = sorted(r.filename for r in manifest.rows)
    assert names == [
        "producer/a.txt",
        "system/mrt-dc.xml",
        "system/mrt-erc.txt",
        "system/mrt-ingest.txt",
        "system/mrt-membership.txt",
        "system/mrt-mom.txt",
    ]
    assert all(r.hash_alg == "sha256" and len(r.hash_value) == 64 for r in manifest.rows)
    assert done.store["mode"] == f"add/9501/{ark.replace(':', '%3A').replace('/', '%2F')}"
    assert done.store["delete"] == ""


def test_a_rerun_reuses_the_ark_instead_of_minting_again(zk) -> None:
    job = _downloaded(zk)
    Processing(zk=zk).run_once()
    first = job_load(zk, job.jid)
    counter = zk.get(counter_path("ark-ark:/99999/fk4"))[0]
    # An operator sends it back (e.g. a crash after the ARK was written).
    failed = job_transition(zk, first, "Failed", message="x")
    job_transition(zk, failed, "Processing", admin=True, retry=True)
    Processing(zk=zk).run_once()
    again = job_load(zk, job.jid)
    assert again.state == "Storing"
    assert again.primary_id == first.primary_id
    assert zk.get(counter_path("ark-ark:/99999/fk4"))[0] == counter


def test_local_id_known_to_inventory_reuses_its_ark(zk) -> None:
    InventoryObject.objects.create(ark="ark:/99999/fk4known", local_id="loc-1")
    job = _downloaded(zk, identifiers={"primary_id": "", "local_id": ["loc-1"]})
    Processing(zk=zk).run_once()
    assert job_load(zk, job.jid).primary_id == "ark:/99999/fk4known"


def test_given_ark_conflicting_with_the_local_id_fails(zk) -> None:
    InventoryObject.objects.create(ark="ark:/99999/fk4known", local_id="loc-1")
    job = _downloaded(zk, identifiers={"primary_id": "ark:/99999/fk4other", "local_id": ["loc-1"]})
    Processing(zk=zk).run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert "conflicts" in failed.status.message
    assert "ark:/99999/fk4known" in failed.status.message


@pytest.mark.parametrize(
    ("where", "ark"),
    [
        ("identifiers", "ark:/99999/../../shoulder/ark:/99999/fk4"),
        ("identifiers", "ark:/99999/fk4a b"),
        ("configuration", "ark:/99999/fk4x\nwho: forged"),
        ("configuration", "doi:10.5072/FK2"),
    ],
)
def test_an_ark_from_the_job_nodes_that_is_no_ark_fails_the_job(zk, where: str, ark: str) -> None:
    """The ARK another writer left in the job's ``identifiers`` (or its ``configuration``'s
    ``objectID``) went unchecked into EZID's URL (``/id/<ark>``, its ``..`` parts and all),
    the storage request and the version's files; the Storing step alone checked it."""
    if where == "identifiers":
        job = _downloaded(zk, identifiers={"primary_id": ark, "local_id": []})
    else:
        job = make_job(
            zk,
            {"payload_url": "http://x/a.txt", "type": "file", "filename": "a.txt", "objectID": ark},
            state="Processing",
        )
        producer = object_dir(job) / "producer"
        producer.mkdir(parents=True)
        (producer / "a.txt").write_text("content")

    Processing(zk=zk).run_once()

    failed = job_load(zk, job.jid)
    assert failed.state == "Failed", failed.status.message
    assert "is no ARK" in failed.status.message
    assert failed.store is None
    assert not (object_dir(failed) / "system" / "mrt-erc.txt").exists()


def test_nothing_downloaded_fails_with_advice(zk) -> None:
    job = make_job(zk, {"payload_url": "http://x/a", "type": "file"}, state="Processing")
    Processing(zk=zk).run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert "Downloading" in failed.status.message


def test_version_files_as_merritt_ingest_writes_them_with_a_merritt_profile(
    zk, files, profiles
) -> None:
    from tests.steps.test_profiles import MERRITT_PROFILE

    (profiles / "ucb_lib_letters.txt").write_text(MERRITT_PROFILE)
    manifest_text = "#%checkm_0.7\n" + files.url + "/a.txt | md5 | \n#%eof\n"
    manifest_url = files.put("o.checkm", manifest_text)
    job = make_job(
        zk,
        {
            "profile": "ucb_lib_letters",
            "payload_url": manifest_url,
            "type": "manifest",  # Merritt's name for an object manifest
            "filename": "o.checkm",
            # The console's own spelling, as it wrote jobs before it wrote Merritt's.
            "digestType": "sha256",
            "digestValue": hashlib.sha256(manifest_text.encode()).hexdigest(),
            "title": "Letters",
            "localID": "letters-001",
            "batchID": "bid-1234",
            "jobID": "jid0000000099",
            "submitted": "2026-11-21T10:02:03-08:00",
            "DCtitle": "Letters; of Ada",
            "DCsubject": "letters;mathematics",
        },
        state="Processing",
        identifiers={"primary_id": "", "local_id": ["letters-001"]},
    )
    producer = object_dir(job) / "producer"
    producer.mkdir(parents=True)
    (producer / "a.txt").write_text("content")
    assert Processing(zk=zk).run_once()
    done = job_load(zk, job.jid)
    assert done.state == "Storing", done.status.message
    ark = done.primary_id
    assert ark.startswith("ark:/13030/m5")  # the shoulder ends ObjectMinterURL
    system = object_dir(done) / "system"
    ingest = (system / "mrt-ingest.txt").read_text()
    for line in (
        "submissionDate:\t2026-11-21T10:02:03-08:00",
        "batch:\tbid-1234",
        "job:\tjid0000000099",
        "file:\to.checkm",
        "type:\tmanifest",
        "profile:\tucb_lib_letters",
        "collection:\tark:/13030/m5letters; ark:/13030/m5ucblib",
        "storageService:\thttp://store.example.org:35121",
        "notification:\tcurator@example.org;archivist@example.org",
        "suppliedIdentifier:\t(:unas)",
        # HandlerInitialize writes the job's algorithm as its DigestEnum value.
        "digestType:\tSHA-256",
        f"digestValue:\t{hashlib.sha256(manifest_text.encode()).hexdigest()}",
        "title:\tLetters",
        "localIdentifier:\tletters-001",
        "manifestValidity:\tvalid",
        f"assignedIdentifier:\t{ark}",
        "retrievedIdentifier:\t(:unas)",
    ):
        assert line in ingest.splitlines(), line
    lines = ingest.splitlines()
    # Merritt's writer leaves the storage node (an Integer) out: an empty line in its place.
    assert lines[lines.index("storageService:\thttp://store.example.org:35121") + 1] == ""
    assert (system / "mrt-mom.txt").read_text() == (
        f"primaryIdentifier:\t{ark}\ntype:\tMRT-curatorial\nrole:\tMRT-content\n"
        "localIdentifier:\tletters-001\n"
    )
    assert (system / "mrt-owner.txt").read_text() == "ark:/13030/j2ucblib"
    assert (system / "mrt-membership.txt").read_text() == (
        "ark:/13030/m5letters\nark:/13030/m5ucblib\n"
    )
    assert (system / "mrt-submission-manifest.txt").read_text() == manifest_text
    assert (system / "mrt-erc.txt").read_text().startswith("erc: \nwho: (:unas)\nwhat: Letters\n")
    dc = (system / "mrt-dc.xml").read_text()
    assert "<dc:title>Letters; of Ada</dc:title>" in dc
    assert "<dc:subject>letters</dc:subject><dc:subject>mathematics</dc:subject>" in dc
    assert done.inventory["manifest_url"].startswith(
        "http://store.example.org:35121/manifest/9501/"
    )
