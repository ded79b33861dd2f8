from __future__ import annotations

import json

import pytest

from queues.steps.notify import (
    QUEUED_LISTED,
    CallbackError,
    batch_queued,
    batch_summary,
    post_callback,
    send_batch_summary,
)
from tests.steps.conftest import Loopback, Reply

REPORT = {
    "last_modified": "2026-11-21 10:02:03 -0800",
    "successful_jobs": ["jid0000000001", "jid0000000003"],
    "failed_jobs": ["jid0000000002"],
}


def test_callback_posts_json(http_server: Loopback) -> None:
    http_server.add("POST", "/cb", Reply(204))

    status = post_callback(http_server.url + "/cb", {"jid": "jid1", "ark": "ark:/9/x"})

    assert status == 204
    [request] = http_server.seen("POST", "/cb")
    assert request.headers["Content-Type"] == "application/json"
    assert json.loads(request.body) == {"jid": "jid1", "ark": "ark:/9/x"}


def test_callback_client_error_raises_at_once_with_the_status(http_server: Loopback) -> None:
    http_server.add("POST", "/cb", Reply(403))

    with pytest.raises(CallbackError, match="HTTP 403") as raised:
        post_callback(http_server.url + "/cb", {}, retries=3, backoff=0.01)

    assert raised.value.status == 403
    assert len(http_server.seen("POST", "/cb")) == 1


def test_callback_retries_server_errors(http_server: Loopback) -> None:
    http_server.add("POST", "/cb", Reply(503), Reply(200))

    assert post_callback(http_server.url + "/cb", {}, retries=1, backoff=0.01) == 200


def test_callback_gives_up_with_the_last_status(http_server: Loopback) -> None:
    http_server.add("POST", "/cb", Reply(500))

    with pytest.raises(CallbackError) as raised:
        post_callback(http_server.url + "/cb", {}, retries=2, backoff=0.01)

    assert raised.value.status == 500
    assert len(http_server.seen("POST", "/cb")) == 3


def test_unreachable_callback_raises() -> None:
    with pytest.raises(CallbackError, match="unreachable") as raised:
        post_callback("http://127.0.0.1:9/cb", {}, retries=0, timeout=2)

    assert raised.value.status is None


def test_summary_lists_successful_and_failed_jobs() -> None:
    subject, body = batch_summary(
        batch_id="bid0000000042",
        title="Theses 2026",
        submitter="jdoe",
        profile_name="merritt_demo_content",
        report=REPORT,
        previous=None,
        state="Failed",
        console_url="http://console/",
    )

    assert subject == (
        "Ingest: Fail -- Submission Processed: bid0000000042;"
        " Merritt batch bid0000000042 failed: Theses 2026 (2/3 ok)"
    )
    assert "Successful jobs (2):\n  jid0000000001\n  jid0000000003\n" in body
    assert "Failed jobs (1):\n  jid0000000002\n" in body
    assert "since the last report" not in body
    assert body.rstrip().endswith("http://console/batches/bid0000000042/")


def test_update_summary_says_what_changed() -> None:
    previous = {
        "successful_jobs": ["jid1"],
        "failed_jobs": ["jid2", "jid3"],
    }
    report = {"successful_jobs": ["jid1", "jid2"], "failed_jobs": ["jid3", "jid4"]}

    _, body = batch_summary(
        batch_id="bid1",
        title=None,
        submitter=None,
        profile_name="p",
        report=report,
        previous=previous,
        state="Failed",
        console_url="http://c",
    )

    assert "Completed since the last report:\n  jid2\n" in body
    assert "Failed since the last report:\n  jid4\n" in body
    assert "Still failed:\n  jid3\n" in body


@pytest.mark.django_db
def test_summary_mail_goes_to_the_contacts(settings) -> None:
    from django.core import mail

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DEFAULT_FROM_EMAIL = "queue@example.org"

    sent = send_batch_summary(
        batch_id="bid7",
        title="T",
        submitter="s",
        profile_name="p",
        to=["a@example.org", "b@example.org"],
        report=REPORT,
        previous=None,
        state="Completed",
        console_url="http://c",
    )

    assert sent == 1
    [message] = mail.outbox
    assert message.to == ["a@example.org", "b@example.org"]
    assert message.from_email == "queue@example.org"
    assert "jid0000000002" in message.body


def test_no_contacts_means_no_mail() -> None:
    assert (
        send_batch_summary(
            batch_id="b",
            title=None,
            submitter=None,
            profile_name="p",
            to=[],
            report=REPORT,
            previous=None,
            state="Completed",
            console_url="http://c",
        )
        == 0
    )


def test_queued_mail_names_each_job_and_counts_what_it_leaves_out() -> None:
    jobs = [(f"jid{n:010d}", f"object {n}") for n in range(QUEUED_LISTED + 5)]
    subject, body = batch_queued(
        batch_id="bid0000000001",
        title=None,
        submitter="dpr",
        profile_name="p",
        jobs=jobs,
        console_url="http://c/",
    )
    assert subject == (
        "Ingest: OK -- Submission Queued: bid0000000001;"
        f" Merritt batch bid0000000001 queued: bid0000000001 ({len(jobs)} jobs)"
    )
    assert "  jid0000000000  object 0\n" in body
    assert f"jid{QUEUED_LISTED - 1:010d}" in body
    assert f"jid{QUEUED_LISTED:010d}" not in body
    assert "  ... and 5 more\n" in body
    assert body.endswith("Details: http://c/batches/bid0000000001/\n")
    one, _ = batch_queued(
        batch_id="b", title="T", submitter=None, profile_name="p", jobs=jobs[:1], console_url=""
    )
    assert one == "Ingest: OK -- Submission Queued: b; Merritt batch b queued: T (1 job)"
    uuid, _ = batch_queued(
        batch_id="b",
        title="T",
        submitter=None,
        profile_name="p",
        jobs=jobs[:1],
        console_url="",
        batch_uuid="bid-1f0c",
    )
    assert uuid.startswith("Ingest: OK -- Submission Queued: bid-1f0c; Merritt batch b queued:")


@pytest.mark.parametrize(("state", "word"), [("Completed", "OK"), ("Failed", "Fail")])
def test_summary_subject_is_merritts_with_the_batch_uuid_then_ours(state: str, word: str) -> None:
    """Merritt's batch report mail reads ``Ingest: <OK|Fail> -- Submission Processed:
    <batchID>;`` (mrt-ingest FormatterUtil.getSubject): depositors' filters key on it."""
    subject, _ = batch_summary(
        batch_id="bid0000000042",
        title="T",
        submitter=None,
        profile_name="p",
        report=REPORT,
        previous=None,
        state=state,
        console_url="http://c",
        batch_uuid="bid-8c6d0f3e",
    )
    assert subject.startswith(f"Ingest: {word} -- Submission Processed: bid-8c6d0f3e; ")
    assert subject.endswith(f"Merritt batch bid0000000042 {state.lower()}: T (2/3 ok)")
