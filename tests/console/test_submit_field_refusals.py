"""The submission doors refuse what Merritt's ingest would refuse or what cannot be right (the
fuzz found each of these making a batch): a digest value that is not hex of its algorithm's
length, a primary ID that is no ARK, a control character or a bidirectional override in free
text, a file name with a folder in it. The console's ``/submit/`` form, ``POST /api/batches``
and ``submitbatch`` share one rule (``steps.submission.submission_problems``): each answers
400 (a command error) naming the field and why, and no batch is made."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from kazoo.client import KazooClient

from queues.services import moves
from queues.zk.batches import batch_ids, batch_load

from .conftest import post_json

pytestmark = pytest.mark.django_db

VALID = {
    "profile": "merritt_demo_content",
    "submitter": "me",
    "payload_url": "https://example.org/a.txt",
    "submission_type": "file",
}

# (fields changed, the field named, words of the reason)
BAD = [
    ({"digest_alg": "md5", "digest_value": "zz<script>"}, "digest_value", "32 hex digits"),
    ({"digest_alg": "sha256", "digest_value": "ab" * 16}, "digest_value", "64 hex digits"),
    ({"digest_alg": "crc32", "digest_value": "abcd"}, "digest_alg", "crc32"),
    ({"digest_value": "ab" * 16}, "digest_alg", "give both a digest algorithm"),
    ({"primary_id": "not-an-ark <b>"}, "primary_id", "must be an ARK"),
    ({"primary_id": "ark:/13030/has space"}, "primary_id", "must be an ARK"),
    ({"submitter": "me\x1b[31m"}, "submitter", "control character U+001B (ESCAPE)"),
    ({"title": "gpj\u202eexe.txt"}, "title", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ({"creator": "Ada\u2066Lovelace"}, "creator", "U+2066 (LEFT-TO-RIGHT ISOLATE)"),
    ({"local_id": "a\nb"}, "local_id", "control character U+000A (LINE FEED)"),
    ({"date": "20\x8526"}, "date", "control character U+0085 (NEXT LINE)"),
    ({"filename": "a/b"}, "filename", "names a folder too"),
    ({"filename": "a\\b"}, "filename", "contains '\\', which Merritt keeps as part of the name"),
    ({"payload_url": "https://example.org/a%2Fb"}, "filename", "names a folder too"),
]
IDS = [f"{field}-{n}" for n, (_c, field, _w) in enumerate(BAD)]


@pytest.mark.parametrize(("changes", "field", "words"), BAD, ids=IDS)
def test_the_form_refuses_naming_the_field_and_makes_nothing(
    admin, zk: KazooClient, changes, field, words
) -> None:
    answer = admin.post("/submit/", {**VALID, **changes})
    assert answer.status_code == 400
    errors = answer.context["form"].errors
    assert list(errors) == [field], errors
    assert words in " ".join(errors[field])
    assert batch_ids(zk) == []


@pytest.mark.parametrize(("changes", "field", "words"), BAD, ids=IDS)
def test_the_api_refuses_naming_the_field_and_makes_nothing(
    zk: KazooClient, token_for, changes, field, words
) -> None:
    from django.test import Client

    answer = post_json(Client(), "/api/batches", {**VALID, **changes}, **token_for("admin"))
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert f"* {field}\n" in error and words in error, error
    assert "&#" not in error and "&lt;" not in error  # the words themselves, not HTML
    assert batch_ids(zk) == []


@pytest.mark.parametrize(("changes", "field", "words"), BAD, ids=IDS)
def test_the_service_refuses_as_the_doors_do(zk: KazooClient, changes, field, words) -> None:
    fields = {k: v for k, v in {**VALID, **changes}.items() if k != "submission_type"}
    with pytest.raises(ValueError) as refused:
        moves.batch_submit(**fields)
    assert words in str(refused.value)
    assert batch_ids(zk) == []


def test_submitbatch_refuses_a_digest_that_is_not_hex(zk: KazooClient) -> None:
    with pytest.raises(CommandError, match="md5 value must be 32 hex digits"):
        call_command(
            "submitbatch",
            *("--profile", "merritt_demo_content", "--submitter", "me"),
            *("--payload-url", "https://example.org/a.txt"),
            *("--digest-alg", "md5", "--digest-value", "zz<script>"),
        )
    assert batch_ids(zk) == []


def test_good_values_of_the_same_fields_are_taken(admin, zk: KazooClient) -> None:
    """The rules refuse no right value: an upper-case digest of the right length, an ARK,
    right-to-left text with its marks, a plain file name, sha512 (Merritt's SHA-512)."""
    answer = admin.post(
        "/submit/",
        {
            **VALID,
            "digest_alg": "sha512",
            "digest_value": "AB" * 64,
            "primary_id": "ark:/13030/m5x0y1z2",
            "title": "\u05e9\u05dc\u05d5\u05dd\u200f (shalom)",
            "creator": "Ada Lovelace",
            "local_id": "letters-001",
            "filename": "letter one.pdf",
        },
    )
    assert answer.status_code == 303, answer.content.decode()[:500]
    (bid,) = batch_ids(zk)
    submission = batch_load(zk, bid).submission
    assert submission["digest"] == {"alg": "sha512", "value": "ab" * 64}
    assert submission["objectID"] == "ark:/13030/m5x0y1z2"
    assert submission["filename"] == "letter one.pdf"
