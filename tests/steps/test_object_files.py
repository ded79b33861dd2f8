"""The version files Merritt's inventory reads, and the other texts written as Merritt writes
them (store/inventory nodes, type names, submission keys). The expected texts follow the
handlers named in docs/merritt-ingest-formats.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from queues.steps import merritt
from queues.steps.objectfiles import (
    IngestRecord,
    VersionFiles,
    anvl_text,
    delete_list,
    ingest_text,
    membership_text,
    mom_text,
    move_delete_file,
    owner_text,
    write_submission_manifest,
    write_version_files,
)
from queues.steps.profiles import parse_properties
from queues.steps.submission import ObjectSpec, merritt_submission_keys, processing_problem

RECORD = IngestRecord(
    submission_date="2026-11-21T10:02:03-08:00",
    batch="bid-0b0a6c1e",
    job="jid0000000042",
    filename="letters.pdf",
    package_type="file",
    profile="merritt_demo_content",
    collections=("ark:/13030/m5demo01", "ark:/13030/m5demo02"),
    storage_service="http://store.example.org:35121",
    notification=("a@example.org", "b@example.org"),
    creator="Lovelace, Ada",
    title="Letters",
    user_agent="dpr/Ada Lovelace",
    assigned_identifier="ark:/99999/fk4abc",
    handlers=("queues.daemons.processing.Processing/not-available",),
)


def test_ingest_file_has_merritts_keys_in_its_order_with_tabs() -> None:
    text = ingest_text(RECORD)

    assert text.splitlines() == [
        "ingest:\tMerritt queue console",
        "submissionDate:\t2026-11-21T10:02:03-08:00",
        "batch:\tbid-0b0a6c1e",
        "job:\tjid0000000042",
        "userAgent:\tdpr/Ada Lovelace",
        "file:\tletters.pdf",
        "type:\tfile",
        "profile:\tmerritt_demo_content",
        "collection:\tark:/13030/m5demo01; ark:/13030/m5demo02",
        "storageService:\thttp://store.example.org:35121",
        "",
        "notification:\ta@example.org;b@example.org",
        "suppliedIdentifier:\t(:unas)",
        "digestType:\t(:unas)",
        "digestValue:\t(:unas)",
        "creator:\tLovelace, Ada",
        "title:\tLetters",
        "date:\t(:unas)",
        "localIdentifier:\t(:unas)",
        "note:\t(:unas)",
        "assignedIdentifier:\tark:/99999/fk4abc",
        "retrievedIdentifier:\t(:unas)",
        "handlers:\tqueues.daemons.processing.Processing/not-available",
    ]
    # Merritt's inventory loads it as Java properties and reads these keys (InvIngest).
    props = parse_properties(text)
    assert props["file"] == "letters.pdf"
    assert props["type"] == "file"
    assert props["batch"] == "bid-0b0a6c1e"
    assert props["job"] == "jid0000000042"
    assert props["userAgent"] == "dpr/Ada Lovelace"
    assert props["submissionDate"] == "2026-11-21T10:02:03-08:00"


def test_a_manifest_submission_says_its_manifest_was_valid() -> None:
    record = IngestRecord(**{**RECORD.__dict__, "manifest_validity": "valid"})
    lines = ingest_text(record).splitlines()
    assert lines.index("manifestValidity:\tvalid") == lines.index("note:\t(:unas)") + 1


def test_a_value_cannot_forge_another_key() -> None:
    text = anvl_text([("title", "one\nprofile:\tforged")])
    assert text == "title:\tone profile: forged\n"


def test_mom_owner_and_membership_files() -> None:
    assert mom_text(primary_identifier="ark:/99999/fk4abc", local_identifier="L1") == (
        "primaryIdentifier:\tark:/99999/fk4abc\n"
        "type:\tMRT-curatorial\n"
        "role:\tMRT-content\n"
        "localIdentifier:\tL1\n"
    )
    system_object = mom_text(
        primary_identifier="ark:/1/x",
        object_type="MRT-system",
        object_role="MRT-class",
        aggregate="MRT-collection",
    )
    assert system_object == (
        "primaryIdentifier:\tark:/1/x\ntype:\tMRT-system\nrole:\tMRT-class\n"
        "aggregate:\tMRT-collection\n"
    )
    assert owner_text("ark:/13030/j2owner") == "ark:/13030/j2owner"  # no line break
    assert membership_text(["ark:/13030/a", "ark:/13030/b"]) == "ark:/13030/a\nark:/13030/b\n"


def test_version_files_are_written_and_stale_ones_removed(tmp_path: Path) -> None:
    files = VersionFiles(
        ingest=RECORD,
        primary_identifier="ark:/99999/fk4abc",
        owner="ark:/13030/j2owner",
        collections=RECORD.collections,
    )
    write_version_files(tmp_path, files)
    system = tmp_path / "system"
    assert sorted(p.name for p in system.iterdir()) == [
        "mrt-ingest.txt",
        "mrt-membership.txt",
        "mrt-mom.txt",
        "mrt-owner.txt",
    ]
    assert (system / "mrt-owner.txt").read_bytes() == b"ark:/13030/j2owner"
    # The profile lost its owner before a re-run: no stale owner file stays behind.
    write_version_files(tmp_path, VersionFiles(ingest=RECORD, primary_identifier="ark:/1/x"))
    assert not (system / "mrt-owner.txt").exists()
    assert not (system / "mrt-membership.txt").exists()


def test_submission_manifest_is_kept_byte_for_byte(tmp_path: Path) -> None:
    data = b"#%checkm_0.7\r\nhttp://h/a | md5 | x\r\n#%eof\r\n"
    path = write_submission_manifest(tmp_path, data)
    assert path == tmp_path / "system" / "mrt-submission-manifest.txt"
    assert path.read_bytes() == data


def test_delete_file_moves_to_system_and_becomes_the_store_delete_list(tmp_path: Path) -> None:
    (tmp_path / "producer").mkdir()
    (tmp_path / "producer" / "mrt-delete.txt").write_text("a.txt\n\nproducer/b/c.txt\n")
    assert move_delete_file(tmp_path) == "producer/a.txt\nproducer/b/c.txt\n"
    assert (tmp_path / "system" / "mrt-delete.txt").is_file()
    assert not (tmp_path / "producer" / "mrt-delete.txt").exists()
    assert move_delete_file(tmp_path / "elsewhere") == ""
    assert delete_list("") == ""


# Nodes, names and keys ----------------------------------------------------------------------


def test_store_and_inventory_nodes_and_how_merritts_storage_reads_them() -> None:
    ark = "ark:/13030/m5~x y*z"
    store = merritt.store_node(manifest_url="http://i/m.txt", ark=ark, node="9501")
    assert store == {
        "manifest_url": "http://i/m.txt",
        "mode": "add/9501/ark%3A%2F13030%2Fm5%7Ex+y*z",  # java.net.URLEncoder's encoding
        "delete": "",
    }
    mode = merritt.parse_store_mode(store["mode"])
    assert (mode.action, mode.node, mode.ark) == ("add", 9501, ark)
    assert merritt.inventory_node(storage_url="http://s:35121/", ark="ark:/1/x", node=7) == {
        "manifest_url": "http://s:35121/manifest/7/ark%3A%2F1%2Fx",
        "mode": "",
    }
    assert merritt.store_mode("ark:/1/x", 7, update=True) == "update/7/ark%3A%2F1%2Fx"


@pytest.mark.parametrize("bad", ["add", "add/x/ark", "fix/1/ark", "add/1/", 5, None])
def test_store_modes_merritt_would_refuse_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        merritt.parse_store_mode(bad)


def test_storage_node_must_be_a_number() -> None:
    with pytest.raises(ValueError, match="not a number"):
        merritt.store_mode("ark:/1/x", "node-a")


@pytest.mark.parametrize(
    ("given", "ours", "theirs"),
    [
        ("file", "file", "file"),
        ("manifest", "object-manifest", "manifest"),
        ("object-manifest", "object-manifest", "manifest"),
        ("object_manifest", "object-manifest", "manifest"),
        ("batchManifest", "batch-manifest", "batchManifest"),
        ("batchManifestFile", "single-file-batch-manifest", "batchManifestFile"),
        ("batchManifestContainer", "container-batch-manifest", "batchManifestContainer"),
        ("container-batch-manifest", "container-batch-manifest", "batchManifestContainer"),
    ],
)
def test_type_names_in_either_spelling(given: str, ours: str, theirs: str) -> None:
    assert merritt.canonical_type(given) == ours
    assert merritt.merritt_type(given) == theirs


def test_java_date_text_looks_like_java_util_date() -> None:
    assert re.fullmatch(
        r"[A-Z][a-z]{2} [A-Z][a-z]{2} \d\d \d\d:\d\d:\d\d \S+ \d{4}", merritt.java_date_text()
    )


def test_batch_submission_gets_merritts_keys_beside_ours() -> None:
    keys = merritt_submission_keys(
        {
            "type": "object-manifest",
            "payload_url": "https://h/objects/o.checkm",
            "primaryID": "ark:/99999/fk4x",
            "digest": {"alg": "md5", "value": "ab"},
        }
    )
    assert keys["type"] == "manifest"
    assert keys["submission_type"] == "object-manifest"
    assert keys["update"] is False
    assert keys["objectID"] == "ark:/99999/fk4x"
    assert (keys["digestType"], keys["digestValue"]) == ("MD5", "ab")  # Merritt's DigestEnum value
    assert keys["filename"] == "o.checkm"
    assert keys["notificationFormat"] == "xml"
    assert keys["submissionDate"]
    # An update request and a date already there are kept.
    again = merritt_submission_keys({"type": "manifest", "update": True, "submissionDate": "d"})
    assert (again["update"], again["submissionDate"]) == (True, "d")


def test_a_job_in_merritts_keys_is_read() -> None:
    spec = ObjectSpec.from_configuration(
        {
            "payload_url": "http://h/o.checkm",
            "type": "manifest",
            "objectID": "ark:/99999/fk4given",
            "digestType": "SHA-256",
            "digestValue": "ab" * 32,
            "size": "12",
            "filename": "o.checkm",
        }
    )
    assert spec.payload_type == "object-manifest"
    assert spec.primary_id == "ark:/99999/fk4given"
    assert (spec.digest_alg, spec.digest_value) == ("sha256", "ab" * 32)
    assert spec.size == 12


def test_a_job_without_payload_url_is_not_processable_here_and_says_why() -> None:
    config = {"batchID": "bid-1", "jobID": "jid-2", "type": "file", "update": False}
    assert processing_problem(config) == (
        "written by Merritt's ingest: no payload_url, the payload is on ingest's own disk "
        "(queue/bid-1/jid-2/producer)"
    )
    assert processing_problem({"payload_url": "http://h/a"}) is None
