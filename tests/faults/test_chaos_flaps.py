"""The flapping services of a chaos run (``chaosrun --flaps``), server by server over loopback
HTTP with the project's own clients, and what the judge makes of what the depositor was told:
each kind of bad answer is the one asked for and tells the client "not now", a reset halfway
through an answer has carried the request out (a storage version made, an ARK minted, a callback
counted), a spell's end brings good answers back; a callback or a summary mail that tells
something other than the job's or the batch's final outcome is a violation."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests
from django.core.mail import EmailMessage, get_connection

from queues.chaos import judge
from queues.chaos.flapping import RESET, SLOW, UNAVAILABLE, UNAVAILABLE_RETRY_AFTER, Flapping
from queues.chaos.servers import DepositorRoutes, depositor_server
from queues.chaos.standins import EzidStandIn, InventoryStandIn, StorageStandIn
from queues.core.retries import outage_of
from queues.steps.inventory import HttpInventory, InventoryError
from queues.steps.merritt import inventory_manifest_url
from queues.steps.minting import EzidMinter, MintError
from queues.steps.notify import batch_summary, job_state_body
from queues.steps.storage import HttpStorage, StorageError
from queues.zk import batches, jobs

from .test_chaos_judge import a_job

ARK = "ark:/99999/fk4flap"


def add(storage: StorageStandIn, manifest: str) -> requests.Response:
    """One storage add of ``manifest`` (its text), straight (no retries of the client's own)."""
    return requests.post(
        f"{storage.url}/add/9501/ark%3A%2F99999%2Ffk4flap",
        data={"manifest": manifest, "t": "xml"},
        timeout=30,
    )


def test_storage_answers_each_kind_of_its_spell_then_well_again(add_manifest: str) -> None:
    flapping = Flapping(seed=5)
    storage = StorageStandIn(flapping=flapping).start()
    try:
        flapping.set(UNAVAILABLE)
        refused = add(storage, add_manifest)
        assert (refused.status_code, refused.headers.get("Retry-After")) == (503, None)
        assert "EXTERNAL_SERVICE_UNAVAILABLE" in refused.text
        flapping.set(UNAVAILABLE_RETRY_AFTER)
        later = add(storage, add_manifest)
        assert later.status_code == 503 and later.headers["Retry-After"] in ("1", "2")
        assert storage.versions() == {}
        flapping.set(RESET)
        # Each reset is either at once or halfway through the answer; the seed gives both
        # within a few requests, and the loop stops as soon as it has.
        for _ in range(40):
            with pytest.raises(
                (requests.ConnectionError, requests.exceptions.ChunkedEncodingError)
            ):
                add(storage, add_manifest)
            if len(flapping.figures()["storage"]) == 4:
                break
        kinds = flapping.figures()["storage"]
        assert kinds["reset at once"] > 0 and kinds["reset mid-answer"] > 0
        # Every reset halfway through an answer had made its version; none at once had.
        assert len(storage.versions()[ARK]) == kinds["reset mid-answer"]
        flapping.set(SLOW)
        assert add(storage, add_manifest).ok
        flapping.set(None)
        assert add(storage, add_manifest).ok
        assert len(storage.versions()[ARK]) == kinds["reset mid-answer"] + 2
        assert flapping.figures()["storage"][SLOW] == 1
    finally:
        storage.stop()


def test_the_storage_client_takes_a_flapping_answer_for_an_outage() -> None:
    flapping = Flapping(seed=6)
    storage = StorageStandIn(flapping=flapping).start()
    client = HttpStorage(storage.url, "9501", timeout=10)
    try:
        for kind in (UNAVAILABLE, UNAVAILABLE_RETRY_AFTER, RESET):
            flapping.set(kind)
            with pytest.raises(StorageError) as raised:
                client.latest_version(ARK)
            assert outage_of(raised.value) is not None, (kind, raised.value)
        flapping.set(None)
        assert client.latest_version(ARK) == 0
    finally:
        storage.stop()


def test_ezid_and_inventory_flap_for_their_clients_then_answer() -> None:
    flapping = Flapping(seed=7)
    ezid = EzidStandIn("user", "secret", flapping=flapping).start()
    inventory = InventoryStandIn(flapping=flapping).start()
    # Where inventory reads the object's manifest when it records it (not flapping here).
    storage = StorageStandIn(nodes=(9501,)).start()
    minter = EzidMinter(ezid.url, "user", "secret", timeout=10)
    recorder = HttpInventory(inventory.url, timeout=10)
    try:
        for kind in (UNAVAILABLE, UNAVAILABLE_RETRY_AFTER, RESET):
            flapping.set(kind)
            with pytest.raises(MintError) as minted:
                minter.mint("ark:/99999/fk4")
            assert outage_of(minted.value) is not None, (kind, minted.value)
            with pytest.raises(InventoryError) as looked:
                recorder.primary_for_local_id("ark:/99999/j2owner", "chaos-1")
            assert outage_of(looked.value) is not None, (kind, looked.value)
        flapping.set(SLOW)
        ark = minter.mint("ark:/99999/fk4")
        flapping.set(None)
        minter.update(ark, {"who": "Chaos"})
        recorder.add_local_id(ark, "ark:/99999/j2owner", "chaos-1")
        assert recorder.primary_for_local_id("ark:/99999/j2owner", "chaos-1") == ark
        storage.put_object(9501, ark, [{"producer/a.txt": b"a"}])
        manifest_url = inventory_manifest_url(storage.url, ark, 9501)
        recorder.record(ark=ark, version=1, manifest_url=manifest_url)
        assert inventory.added == [manifest_url]
        assert set(flapping.figures()) == {"EZID", "inventory"}
    finally:
        ezid.stop()
        inventory.stop()
        storage.stop()


def test_the_callback_receiver_counts_what_it_received_and_the_status_told(
    tmp_path: Path,
) -> None:
    flapping = Flapping(seed=8)
    served = depositor_server(str(tmp_path), flapping=flapping)
    (tmp_path / "f.txt").write_bytes(b"good file\n")
    body = {"job:jobState": {"job:jobID": "jid0000000001", "job:jobStatus": "COMPLETED"}}
    url = f"{served.url}/callback/mc/jid0000000001"
    try:
        flapping.set(UNAVAILABLE)
        assert requests.post(url, json=body, timeout=10).status_code == 503
        assert requests.get(f"{served.url}/f.txt", timeout=10).status_code == 503
        assert DepositorRoutes.callbacks["jid0000000001"] == 0
        flapping.set(None)
        assert requests.post(url, json=body, timeout=10).ok
        assert requests.get(f"{served.url}/f.txt", timeout=10).content == b"good file\n"
        assert DepositorRoutes.told == {"jid0000000001": ["COMPLETED"]}
    finally:
        served.stop()


@pytest.mark.parametrize("fmt", ["json", "xml", "anvl"])
def test_the_callback_receiver_reads_the_status_in_every_format_merritt_posts(
    tmp_path: Path, fmt: str
) -> None:
    served = depositor_server(str(tmp_path), flapping=Flapping(seed=8))
    state = {"job:jobState": {"job:jobID": "jid0000000002", "job:jobStatus": "COMPLETED"}}
    try:
        answer = requests.post(
            f"{served.url}/callback/mc/jid0000000002",
            data=job_state_body(state, fmt),
            headers={"Content-Type": "application/json"},
            timeout=10,
        )
        assert answer.ok
        assert DepositorRoutes.told["jid0000000002"] == ["COMPLETED"]
    finally:
        served.stop()


def completed(zk: Any, job: Any) -> Any:
    for state in ("Estimating", "Provisioning", "Downloading", "Processing", "Storing"):
        job = jobs.job_transition(zk, job, state)
    for state in ("Recording", "Notify", "Completed"):
        job = jobs.job_transition(zk, job, state)
    return job


def test_a_callback_before_or_other_than_the_final_outcome_is_a_violation(zk: Any) -> None:
    done = completed(zk, a_job(zk, "chaos-20"))
    failed = jobs.job_transition(zk, a_job(zk, "chaos-21"), "Estimating")
    failed = jobs.job_transition(zk, failed, "Failed", message="estimating: HTTP 404")
    told = {done.jid: ["COMPLETED", "COMPLETED"], failed.jid: ["COMPLETED"]}
    keys = {done.jid: {f"{done.jid}.0.completed"}, failed.jid: {f"{failed.jid}.0.completed"}}
    posts = Counter({done.jid: 2, failed.jid: 1})
    verdict, said = judge.Verdict(), []
    judge.judge_callbacks(zk, judge.load_jobs(zk, verdict), posts, verdict, said.append, keys, told)
    assert verdict.violations == [
        f"callback for job {failed.jid} told COMPLETED but the job ended Failed"
    ]


def test_a_summary_mail_that_is_not_the_batch_final_outcome_is_a_violation(
    zk: Any, tmp_path: Path
) -> None:
    batch = batches.batch_create(zk, submission={"profile": "merritt_demo_content"})
    configuration = {"profile": "merritt_demo_content", "payload_url": "http://127.0.0.1:1/f"}
    ended = [
        completed(zk, jobs.job_create(zk, bid=batch.bid, configuration=configuration))
        for _ in range(2)
    ]
    connection = get_connection(
        "django.core.mail.backends.filebased.EmailBackend", file_path=str(tmp_path)
    )
    for ok, state in (([j.jid for j in ended], "Completed"), ([ended[0].jid], "Failed")):
        report = {"successful_jobs": ok, "failed_jobs": [ended[1].jid] if len(ok) == 1 else []}
        subject, text = batch_summary(
            batch_id=batch.bid, title="A title long enough for the subject line to be folded",
            submitter=None, profile_name="merritt_demo_content", report=report,
            previous=None, state=state, console_url="http://127.0.0.1:8000",
        )  # fmt: skip
        connection.send_messages([EmailMessage(subject, text, "a@example.org", ["b@example.org"])])
    verdict = judge.Verdict()
    judge.judge_mail_outcomes(zk, tmp_path, judge.load_jobs(zk, verdict), verdict)
    assert verdict.violations == [
        f"batch {batch.bid}: summary mail told failed (1/2 ok), but its jobs ended 2 of 2 Completed"
    ]


def test_summary_mails_are_counted_by_message_id(tmp_path: Path) -> None:
    """A summary sent again under its Message-ID (a consumer killed between sending it and
    recording it) is one summary; another Message-ID is another."""
    connection = get_connection(
        "django.core.mail.backends.filebased.EmailBackend", file_path=str(tmp_path)
    )
    for bid, message_id in (
        ("bid0000000001", "<batch-summary.bid0000000001.Reporting-3@example.org>"),
        ("bid0000000001", "<batch-summary.bid0000000001.Reporting-3@example.org>"),
        ("bid0000000002", "<batch-summary.bid0000000002.Reporting-3@example.org>"),
        ("bid0000000002", "<batch-summary.bid0000000002.Reporting-4@example.org>"),
    ):
        mail = EmailMessage(
            f"Merritt batch {bid} completed: A title (1/1 ok)",
            "text",
            "a@example.org",
            ["b@example.org"],
            headers={"Message-ID": message_id},
        )
        connection.send_messages([mail])
    sent = judge.mails(tmp_path)
    assert {bid: sum(ids.values()) for bid, ids in sent.items()} == {
        "bid0000000001": 2,
        "bid0000000002": 2,
    }
    assert {bid: len(ids) for bid, ids in sent.items()} == {
        "bid0000000001": 1,
        "bid0000000002": 2,
    }


def test_a_good_batch_failed_at_its_manifest_is_a_violation_a_hostile_one_is_not(zk: Any) -> None:
    # As the first 1,000-job run with flaps found: a batch whose manifest URL answered 503 went
    # to Failed at once, and made none of its jobs.
    message = "batch-pending: cannot read the payload: HTTP 503 Service Unavailable"
    good, hostile = (
        batches.batch_transition(
            zk, batches.batch_create(zk, submission={"profile": "merritt_demo_content"}),
            "Failed", message=message,
        )
        for _ in range(2)
    )  # fmt: skip
    verdict = judge.Verdict()
    judge._judge_batch(zk, good.bid, {"chaos-00900"}, good, {}, verdict)
    assert f"good batch {good.bid} failed: {message!r}" in verdict.violations
    verdict = judge.Verdict()
    judge._judge_batch(zk, hostile.bid, {"hostile-bomb"}, hostile, {}, verdict)
    assert not [v for v in verdict.violations if v.startswith("good batch")]
