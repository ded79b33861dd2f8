"""Notify's callback is a side effect outside ZooKeeper: a consumer that loses its session after
posting callbacks and before their move does not make the next claimer post them again (the
contract's "Side effects outside ZooKeeper"), and every record of them goes with the job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from queues.daemons.notify import Notify
from queues.daemons.pipeline import JobPipeline
from queues.zk import paths as zpaths
from queues.zk.errors import Conflict, StaleVersion
from queues.zk.jobs import job_load, job_remove
from queues.zk.kazoo_private import session_id
from queues.zk.locks import lock_create
from queues.zk.records import Job
from queues.zk.side_effects import (
    callback_record_delivered,
    callback_record_path,
    callback_record_read,
    callback_record_start,
)

from .conftest import FileServer, expire_session, make_job, wait_for
from .test_batched import cycle_until_idle
from .test_notify import _with_callback

pytestmark = pytest.mark.django_db


def _in_notify(zk: KazooClient, n: int) -> list[Job]:
    return [
        make_job(zk, {"payload_url": "http://x/a", "type": "file"}, state="Notify")
        for _ in range(n)
    ]


def _posted(files: FileServer) -> list[str]:
    """The job IDs whose callback was posted, in order."""
    return [path.rpartition("/")[2] for path, _body in files.posts]


def test_callbacks_delivered_before_a_lost_session_are_not_posted_again(
    zk: KazooClient, zk_hosts: str, own_zk, files: FileServer, profiles: Path
) -> None:
    client, gate = own_zk
    _with_callback(profiles, files.url + "/hook")
    jobs = _in_notify(zk, 3)
    old = client.client_id[0]
    seen: list[tuple[str, str, str]] = []

    def lose_the_session_at_the_third(route: str) -> None:
        jid = route.rpartition("/")[2]
        record = callback_record_read(zk, jid)
        assert record is not None
        seen.append((jid, record.session, record.delivered))  # recorded before it was posted
        if len(files.posts) == 3:
            # The receiver has the third callback; its answer has not reached the consumer.
            files.on_post = None
            expire_session(client, zk_hosts)
            wait_for(lambda: client.connected and client.client_id[0] != old, timeout=30)

    files.on_post = lose_the_session_at_the_third
    # One batch: three callbacks, then one move, refused (the locks went with the session).
    cycle_until_idle(JobPipeline(Notify(zk=client, gate=gate, batch=3, poll=0.05)))
    assert gate.generation == 1
    assert all(job_load(zk, j.jid).state == "Notify" for j in jobs)
    # The next claimer finds the three delivered and moves them on without posting.
    cycle_until_idle(JobPipeline(Notify(zk=zk, batch=3, poll=0.05)))
    assert seen == [(j, f"{old:x}", "") for j in _posted(files)]
    assert sorted(_posted(files)) == sorted(j.jid for j in jobs)  # each posted once
    for job in jobs:
        done = job_load(zk, job.jid)
        assert done.state == "Completed"
        assert done.lock is None
        assert zk.exists(callback_record_path(job.jid)) is None  # gone once Completed


def test_a_callback_not_recorded_as_delivered_is_posted_again(
    zk: KazooClient, other_zk: KazooClient, files: FileServer, profiles: Path, caplog
) -> None:
    _with_callback(profiles, files.url + "/hook")
    (job,) = _in_notify(zk, 1)
    # An earlier claim recorded its callback and ended before the receiver's answer (a crash).
    lock = zpaths.job_node(job.jid, "lock")
    assert lock_create(other_zk, lock)
    callback_record_start(other_zk, job, files.url + "/hook", found=None)
    other_zk.delete(lock)
    Notify(zk=zk, poll=0.05).run_once()
    assert _posted(files) == [job.jid]
    assert job_load(zk, job.jid).state == "Completed"
    assert zk.exists(callback_record_path(job.jid)) is None
    assert f"the claim of session {other_zk.client_id[0]:x} started the callback" in caplog.text


def test_a_claim_no_longer_holding_the_job_records_and_posts_nothing(
    zk: KazooClient, other_zk: KazooClient, files: FileServer
) -> None:
    (job,) = _in_notify(zk, 1)
    url = files.url + "/hook"
    lock = zpaths.job_node(job.jid, "lock")
    # Another session holds the lock: not ours to record under.
    assert lock_create(other_zk, lock)
    with pytest.raises(Conflict, match="not this session's"):
        callback_record_start(zk, job, url, found=None)
    other_zk.delete(lock)
    # Ours, but the job's status was written since it was read (by Merritt's library, say).
    assert lock_create(zk, lock)
    status = zpaths.job_node(job.jid, "status")
    other_zk.set(status, other_zk.get(status)[0])
    with pytest.raises(StaleVersion):
        callback_record_start(zk, job, url, found=None)
    assert zk.exists(callback_record_path(job.jid)) is None
    # As written under the lock: this session's, not yet delivered.
    record = callback_record_start(zk, job_load(zk, job.jid), url, found=None)
    assert callback_record_read(zk, job.jid) == record
    assert record.session == f"{session_id(zk):x}" and record.delivered == ""
    # Written again over an undelivered one (a claim that posts again), then marked: only the
    # latest write may be marked, by its version.
    again = callback_record_start(zk, job_load(zk, job.jid), url, found=record)
    assert again.version == record.version + 1
    assert not callback_record_delivered(zk, job.jid, record)  # an older claim's
    assert callback_record_delivered(zk, job.jid, again)
    marked = callback_record_read(zk, job.jid)
    assert marked is not None and marked.delivered and marked.version == again.version + 1
    assert files.posts == []


def test_a_failed_callback_keeps_its_record_until_the_job_is_deleted(
    zk: KazooClient, files: FileServer, profiles: Path, settings: Any
) -> None:
    settings.MRT_RETRY = {**settings.MRT_RETRY, "callback": "attempts=1"}  # no second try
    _with_callback(profiles, files.url + "/hook")
    files.post_status = 503
    (job,) = _in_notify(zk, 1)
    Notify(zk=zk, poll=0.05).run_once()
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    record = callback_record_read(zk, job.jid)
    assert record is not None and record.delivered == ""  # a resume posts it again
    job_remove(zk, failed)
    assert zk.exists(callback_record_path(job.jid)) is None
    assert zk.exists(zpaths.job(job.jid)) is None


def test_a_job_written_since_its_claim_is_not_called_back_by_that_claim(
    zk: KazooClient, other_zk: KazooClient, files: FileServer, profiles: Path
) -> None:
    _with_callback(profiles, files.url + "/hook")
    (job,) = _in_notify(zk, 1)
    worker = Notify(zk=zk, batch=1, poll=0.05)
    loop = JobPipeline(worker)
    assert loop.cycle()  # the claim and the job's reads go out
    wait_for(lambda: loop.pending[0].reads.ready())  # answered: the job is read
    # Merritt's library (or an operator) writes the job's status after it was read.
    status = zpaths.job_node(job.jid, "status")
    other_zk.set(status, other_zk.get(status)[0])
    assert loop.cycle()  # the step runs on what it read: the record is refused
    assert worker.last is not None and worker.last.outcome == "waiting"
    assert "callback not posted" in worker.last.detail
    assert files.posts == [] and zk.exists(callback_record_path(job.jid)) is None
    loop._finish_move()
    loop.share.leave()
    # The next claim reads it again and calls back once.
    cycle_until_idle(JobPipeline(Notify(zk=zk, batch=1, poll=0.05)))
    assert _posted(files) == [job.jid]
    assert job_load(zk, job.jid).state == "Completed"


def test_a_callback_posted_again_carries_the_key_of_its_first_attempt(
    zk: KazooClient, zk_hosts: str, own_zk, files: FileServer, profiles: Path
) -> None:
    """Issue 49: an outage between a callback's post and its "delivered" mark made the next
    claim post it again, and the receiver had nothing to tell the repeat by."""
    client, gate = own_zk
    _with_callback(profiles, files.url + "/hook")
    (job,) = _in_notify(zk, 1)
    old = client.client_id[0]
    record_path = callback_record_path(job.jid)

    def lose_the_mark_and_the_session(_route: str) -> None:
        files.on_post = None
        zk.set(record_path, zk.get(record_path)[0])  # the mark, by version, now misses
        expire_session(client, zk_hosts)
        wait_for(lambda: client.connected and client.client_id[0] != old, timeout=30)

    files.on_post = lose_the_mark_and_the_session
    cycle_until_idle(JobPipeline(Notify(zk=client, gate=gate, batch=1, poll=0.05)))
    assert job_load(zk, job.jid).state == "Notify"
    cycle_until_idle(JobPipeline(Notify(zk=zk, batch=1, poll=0.05)))
    assert job_load(zk, job.jid).state == "Completed"
    assert _posted(files) == [job.jid, job.jid]  # posted twice: the receiver tells by the key
    assert files.post_keys == [f"{job.jid}.0.completed"] * 2


@pytest.mark.parametrize("batched", [True, False], ids=["batched loop", "one-job loop"])
def test_the_callback_record_goes_with_the_move_and_a_missing_one_does_not_stop_it(
    zk: KazooClient, files: FileServer, profiles: Path, batched: bool
) -> None:
    _with_callback(profiles, files.url + "/hook")
    kept, gone = _in_notify(zk, 2)
    seen: dict[str, int] = {}

    def note_the_record(route: str) -> None:
        jid = route.rpartition("/")[2]
        seen[jid] = zk.exists(callback_record_path(jid)) is not None
        if jid == gone.jid:
            zk.delete(callback_record_path(jid))  # an operator's repair, say

    files.on_post = note_the_record
    notify = Notify(zk=zk, batch=2, poll=0.05)
    if batched:
        cycle_until_idle(JobPipeline(notify))
    else:
        while notify.run_once():
            pass
    assert seen == {kept.jid: True, gone.jid: True}
    for job in (kept, gone):
        assert job_load(zk, job.jid).state == "Completed"
        assert zk.exists(callback_record_path(job.jid)) is None
