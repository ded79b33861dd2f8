"""Callbacks as Merritt's ingest makes them: ``POST {CallbackURL}/mc/{jobID}`` with the job
state in the notification format (JSON, XML, ANVL), to a stand-in receiver; refusals and an
unreachable receiver."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import datetime
from xml.etree import ElementTree

import pytest

from queues.chaos.standins import CallbackReceiver, running, unused_url
from queues.daemons import clients
from queues.steps.notify import (
    CallbackError,
    job_callback_url,
    merritt_job_state,
    notification_format,
    post_job_callback,
)
from queues.zk.records import Job, Status

JID = "jid0000000042"


@pytest.fixture
def receiver() -> Iterator[CallbackReceiver]:
    with running(CallbackReceiver()) as stand_in:
        yield stand_in


def _job() -> Job:
    stamp = datetime(2026, 11, 21, 10, 2, 3).astimezone()
    return Job(
        jid=JID,
        bid="bid0000000007",
        priority=5,
        space_needed=0,
        configuration={
            "batchID": "bid-8c6d2d4e",
            "jobID": JID,
            "profile": "demo",
            "submitter": "jdoe",
            "filename": "notes.zip",
            "title": "Field notes",
            "creator": "Doe, Jane",
            "date": "1843",
            "note": "from a script",
            "digestType": "md5",
            "digestValue": "0cc175b9c0f1b6a831c399e269772661",
            "DCtitle": "Field notes, 1843",
            "DCrights": "CC-BY",
            "DCbogus": "not a Dublin Core element",
            "notificationFormat": "json",
            "responseForm": "xml",
        },
        status=Status({"status": "Notify"}, 0, stamp),
        created=stamp,
        identifiers={"primary_id": "ark:/99999/fk4x", "local_id": ["n-1", "n-2", "n-1"]},
        metadata={"erc_who": "someone else", "erc_what": "another title"},
        inventory={"manifest_url": "http://s/manifest/9501/ark%3A%2F99999%2Ffk4x", "version": 3},
    )


def test_the_job_state_goes_to_mc_and_the_job_id(receiver: CallbackReceiver) -> None:
    status = post_job_callback(receiver.url + "/hooks/", JID, clients.callback_state(_job()))

    assert status == 200
    [request] = receiver.seen("POST")
    assert request.path == f"/hooks/mc/{JID}"
    assert request.content_type == "application/json"
    state = receiver.received[JID]["job:jobState"]
    # The properties Merritt's JobState displays, filled as its Notify step fills them: the
    # job's configuration and identifiers. Batch ID, submitter, profile and object state are
    # no longer displayed; version and completion date are not set by Merritt's Notify.
    assert {k: v for k, v in state.items() if k != "job:submissionDate"} == {
        "xmlns:job": "http://uc3.cdlib.org/ontology/mrt/ingest/job",
        "job:jobID": JID,
        "job:packageName": "notes.zip",
        "job:jobStatus": "COMPLETED",
        "job:primaryID": "ark:/99999/fk4x",
        "job:localID": "n-1;n-2",
        "job:hashAlgorithm": "MD5",
        "job:hashValue": "0cc175b9c0f1b6a831c399e269772661",
        "job:objectCreator": "Doe, Jane",
        "job:objectTitle": "Field notes",
        "job:objectDate": "1843",
        "job:note": "from a script",
        "job:dCrights": "CC-BY",
        "job:dCtitle": "Field notes, 1843",
    }
    # Merritt's ingest sets the submission date when each step starts: the Notify step's, not
    # the job's creation; DateState's text, to the second with the zone's offset.
    submitted = datetime.fromisoformat(state["job:submissionDate"])
    assert submitted.utcoffset() is not None and submitted.microsecond == 0
    assert submitted != _job().created


@pytest.mark.parametrize(
    ("digest_type", "shown"),
    [
        ("md5", "MD5"),
        ("SHA-256", "SHA-256"),
        ("sha-512", "SHA-512"),
        # The console's own spelling, in jobs it wrote before it wrote Merritt's names.
        ("sha256", "SHA-256"),
        ("sha3-256", None),
        ("Alder-32", None),
        (None, None),
    ],
)
def test_the_hash_algorithm_is_merritts_digest_name_or_left_out(
    digest_type: str | None, shown: str | None
) -> None:
    job = _job()
    job.configuration["digestType"] = digest_type
    state = clients.callback_state(job)["job:jobState"]
    assert state.get("job:hashAlgorithm") == shown
    assert state["job:hashValue"] == "0cc175b9c0f1b6a831c399e269772661"


def test_credentials_in_the_callback_url_become_basic_auth(receiver: CallbackReceiver) -> None:
    url = receiver.url.replace("http://", "http://depositor:pw@") + "/cb"
    post_job_callback(url, JID, merritt_job_state(job_id=JID))

    [request] = receiver.seen("POST")
    assert request.headers["Authorization"] == "Basic " + base64.b64encode(b"depositor:pw").decode()


def test_a_refusal_is_named_and_not_repeated(receiver: CallbackReceiver) -> None:
    receiver.status = 403
    with pytest.raises(CallbackError) as refused:
        post_job_callback(receiver.url, JID, merritt_job_state(job_id=JID))
    assert refused.value.status == 403
    assert str(refused.value) == f"callback {receiver.url}/mc/{JID}: HTTP 403"
    assert len(receiver.seen("POST")) == 1


def test_a_failing_receiver_is_asked_again_then_named(receiver: CallbackReceiver) -> None:
    receiver.status = 503
    with pytest.raises(CallbackError, match="HTTP 503"):
        post_job_callback(receiver.url, JID, merritt_job_state(job_id=JID), retries=2, backoff=0)
    assert len(receiver.seen("POST")) == 3


def test_an_unreachable_receiver_is_a_callback_error() -> None:
    url = unused_url()
    with pytest.raises(CallbackError, match="unreachable"):
        post_job_callback(url, JID, {}, retries=0, timeout=2)


def test_the_job_id_is_one_path_segment() -> None:
    assert job_callback_url("https://x/cb/", "jid/1") == "https://x/cb/mc/jid%2F1"


# A title as a depositor may give it: every XML special character, a line break that would
# forge an ANVL line, a CR, a tab and a control character XML 1.0 cannot carry.
HOSTILE = "Notes & <draft> \"one\" 'two'\njobStatus: FAILED\r\tend\x01"


def _hostile_state() -> dict:
    return merritt_job_state(
        job_id=JID,
        status="COMPLETED",
        primary_id="ark:/99999/fk4x",
        local_ids=["n-1"],
        title=HOSTILE,
        version=3,
    )


@pytest.mark.parametrize(
    ("job_value", "profile_value", "chosen"),
    [
        ("xml", "anvl", "xml"),  # the submission's first
        (None, "anvl", "anvl"),  # else the profile's
        (None, None, "json"),  # else JSON
        ("XML", None, "json"),  # names are matched exactly, as Java's Enum.valueOf does
        ("turtle", "xml", "xml"),  # not one of Merritt's format types: as if not given
        ("", "anvl", "anvl"),
        (7, None, "json"),
        ("xhtml", "xml", "xhtml"),  # a format type Merritt has, rendered here as JSON
    ],
)
def test_the_notification_format_is_chosen_as_merritt_chooses_it(
    job_value: object, profile_value: object, chosen: str
) -> None:
    assert notification_format(job_value, profile_value) == chosen


def test_an_xml_callback_is_merritts_xml_with_outside_text_escaped(
    receiver: CallbackReceiver,
) -> None:
    post_job_callback(receiver.url, JID, _hostile_state(), fmt="xml")

    [request] = receiver.seen("POST")
    assert request.content_type == "application/json"  # Merritt labels every format so
    assert request.body.decode() == (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        "<job:jobState xmlns:job='http://uc3.cdlib.org/ontology/mrt/ingest/job'>\n"
        f"    <job:jobID>{JID}</job:jobID>\n"
        "    <job:jobStatus>COMPLETED</job:jobStatus>\n"
        "    <job:primaryID>ark:/99999/fk4x</job:primaryID>\n"
        "    <job:localID>n-1</job:localID>\n"
        "    <job:versionID>3</job:versionID>\n"
        "    <job:objectTitle>Notes &amp; &lt;draft&gt; &quot;one&quot; &apos;two&apos;"
        "&#10;jobStatus: FAILED&#13;&#9;end</job:objectTitle>\n"
        "</job:jobState>"
    )
    # Well-formed, the namespace declared; our own body, no DTD.
    root = ElementTree.fromstring(request.body)  # noqa: S314
    ns = "{http://uc3.cdlib.org/ontology/mrt/ingest/job}"
    assert root.tag == ns + "jobState"
    assert root.findtext(ns + "objectTitle") == HOSTILE.removesuffix("\x01")
    assert [child.tag for child in root].count(ns + "jobStatus") == 1


def test_an_anvl_callback_is_one_line_a_property(receiver: CallbackReceiver) -> None:
    post_job_callback(receiver.url, JID, _hostile_state(), fmt="anvl")

    [request] = receiver.seen("POST")
    assert request.content_type == "application/json"
    assert request.body.decode() == (
        f"jobID: {JID}\n"
        "jobStatus: COMPLETED\n"
        "primaryID: ark:/99999/fk4x\n"
        "localID: n-1\n"
        "versionID: 3\n"
        "objectTitle: Notes & <draft> \"one\" 'two' jobStatus: FAILED \tend\x01\n"
    )
    keys = [line.split(":", 1)[0] for line in request.body.decode().splitlines()]
    assert keys.count("jobStatus") == 1


@pytest.mark.parametrize("fmt", ["json", "xhtml", "csv"])
def test_json_and_the_formats_not_written_here_go_as_json(
    receiver: CallbackReceiver, fmt: str
) -> None:
    post_job_callback(receiver.url, JID, _hostile_state(), fmt=fmt)

    [request] = receiver.seen("POST")
    assert request.content_type == "application/json"
    assert receiver.received[JID]["job:jobState"]["job:objectTitle"] == HOSTILE


@pytest.mark.parametrize("status", [401, 503])
def test_the_callback_urls_password_is_not_in_the_words_about_it(
    receiver: CallbackReceiver, status: int
) -> None:
    receiver.status = status
    url = receiver.url.replace("http://", "http://depositor:s3cret@") + "/cb"
    with pytest.raises(CallbackError) as raised:
        post_job_callback(url, JID, merritt_job_state(job_id=JID))
    shown = receiver.url.replace("http://", "http://depositor:***@")
    assert str(raised.value).startswith(f"callback {shown}/cb/mc/{JID}: HTTP {status}")
    assert "s3cret" not in str(raised.value)
