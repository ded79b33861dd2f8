"""Per-collection caps on jobs in flight (issue 24) and operator priorities, with the daemons
running against a real ZooKeeper: two consumer hosts on separate sessions never have more of a
capped collection's jobs in flight than its cap, the other collection's jobs go on, and every
job completes; a waiting job's new priority decides the claim order."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from queues.core.states import JOB_WORKING
from queues.daemons.base import JobDaemon, SessionGate
from queues.daemons.job_pending import JobPending
from queues.daemons.pipeline import LockKeeper
from queues.daemons.registry import DAEMONS
from queues.daemons.runner import job_loop
from queues.zk import caps
from queues.zk.jobs import job_load, job_resume_state, job_transition
from queues.zk.nodes import read_many
from queues.zk.priorities import priority_set_waiting

from .conftest import DEMO, FileServer, make_job

pytestmark = pytest.mark.django_db

OTHER = "merritt_demo_priority"
JOB_STEPS = [
    "pending",
    "estimating",
    "provisioning",
    "downloading",
    "processing",
    "storing",
    "recording",
    "notify",
]


class ConsumerHost:
    """The job daemons of one consumer process (as ``runconsumer all`` builds them: the batched
    loop with kept locks for the short steps), on a ZooKeeper session of its own."""

    def __init__(self, zk: Any) -> None:
        keeper = LockKeeper()
        gate = SessionGate()
        self.daemons = []
        for name in JOB_STEPS:
            cls = DAEMONS[name]
            assert issubclass(cls, JobDaemon)
            self.daemons.append(cls(zk=zk, gate=gate, poll=0.1, **job_loop(cls, keeper, 1)))
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=d.run, args=(self.stop,)) for d in self.daemons]

    def __enter__(self) -> ConsumerHost:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


def _states(zk: Any, jids: list[str]) -> dict[str, str]:
    reads = read_many(zk, [f"/jobs/{j}/status" for j in jids])
    found = {}
    for jid in jids:
        read = reads[f"/jobs/{jid}/status"]
        found[jid] = read[0].decode().split('"status":"')[1].split('"')[0] if read else ""
    return found


def _job(zk: Any, files: FileServer, profile: str, name: str, *, slow: float = 0.0) -> str:
    url = files.put(name, name * 2000)
    if slow:
        files.slow[f"/{name}"] = slow
    return make_job(
        zk, {"payload_url": url, "type": "file", "filename": name, "profile": profile}
    ).jid


@pytest.mark.django_db(transaction=True)
def test_a_cap_of_two_holds_a_collection_to_two_jobs_in_flight_across_two_hosts(
    zk, other_zk, files: FileServer, profiles
) -> None:
    assert caps.cap_set(zk, DEMO, 2, by="ops", reason="campaign") == 0
    # Slow enough that the capped jobs still wait while the others go through, however busy
    # the machine (at 1 s each, under a loaded suite, all capped ones had left Pending before
    # the last other job completed).
    capped = [_job(zk, files, DEMO, f"capped-{i}.txt", slow=2.0) for i in range(5)]
    others = [_job(zk, files, OTHER, f"other-{i}.txt") for i in range(3)]
    most = 0
    others_done_while_capped_waited = False
    with ConsumerHost(zk), ConsumerHost(other_zk):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            states = _states(zk, capped + others)
            flying = sum(1 for j in capped if states[j] in JOB_WORKING)
            most = max(most, flying)
            # The cap holds the collection's jobs, not the queue: another collection's jobs
            # complete while one of the capped still waits.
            if any(states[j] == "Completed" for j in others) and any(
                states[j] == "Pending" for j in capped
            ):
                others_done_while_capped_waited = True
            if all(s in ("Completed", "Failed") for s in states.values()):
                break
            time.sleep(0.02)
    states = _states(zk, capped + others)
    assert set(states.values()) == {"Completed"}, states
    assert most == 2
    assert others_done_while_capped_waited
    # Every counted job has left flight: the next check finds the count empty again.
    caps.verify(zk, DEMO)
    cap = caps.cap_of(zk, DEMO)
    assert cap is not None and cap.limit == 2 and cap.counted == 0


def test_a_waiting_job_with_a_new_priority_is_claimed_first_and_its_entry_renamed(
    zk, files: FileServer
) -> None:
    first, second, third = (_job(zk, files, DEMO, f"p-{i}.txt") for i in range(3))
    job = priority_set_waiting(zk, job_load(zk, third), 1)
    assert job.priority == 1
    pending = set(zk.get_children("/jobs/states/pending"))
    assert f"01-{third}" in pending and f"05-{third}" not in pending
    assert zk.get("/jobs/" + third + "/priority")[0] == b"1"
    daemon = JobPending(zk=zk, poll=0.05)
    order = []
    for _ in range(3):
        assert daemon.run_once()
        order.append(daemon.last.id)
    assert order == [third, first, second]
    assert set(zk.get_children("/jobs/states/estimating")) == {
        f"01-{third}",
        f"05-{first}",
        f"05-{second}",
    }


def test_a_claimed_job_keeps_its_priority(zk, files: FileServer) -> None:
    jid = _job(zk, files, DEMO, "locked.txt")
    job = job_load(zk, jid)
    zk.create(f"/jobs/{jid}/lock", b"", ephemeral=True)
    with pytest.raises(Exception, match="being worked on"):
        priority_set_waiting(zk, job, 2)
    assert f"05-{jid}" in zk.get_children("/jobs/states/pending")


def test_a_full_collection_is_passed_over_unclaimed_until_a_job_leaves_flight(
    zk, files: FileServer
) -> None:
    caps.cap_set(zk, DEMO, 1)
    first, second = (_job(zk, files, DEMO, f"c-{i}.txt") for i in range(2))
    other = _job(zk, files, OTHER, "o.txt")
    daemon = JobPending(zk=zk, poll=0.05)
    assert daemon.run_once() and daemon.last.id == first
    # The second waits untouched (not moved, not failed); the other collection's job goes on.
    assert daemon.run_once() and daemon.last.id == other
    before = job_load(zk, second)
    assert not daemon.run_once()
    assert job_load(zk, second).status.version == before.status.version
    assert daemon.caps.waits(second)
    # The first job fails; once the count is verified the second gets its place.
    job_transition(zk, job_load(zk, first), "Failed", message="storage down")
    time.sleep(caps.RECHECK)
    assert daemon.run_once() and daemon.last.id == second
    assert _states(zk, [second])[second] == "Estimating"
    # A resume of the first is an operator's move: counted, over the cap.
    failed = job_load(zk, first)
    job_transition(zk, failed, job_resume_state(failed), admin=True, retry=True)
    assert sorted(zk.get_children(caps.flight_path(DEMO))) == sorted([first, second])


def test_jobs_in_flight_before_the_cap_are_counted_by_a_recount(zk, files: FileServer) -> None:
    flying = [_job(zk, files, DEMO, f"r-{i}.txt") for i in range(3)]
    for jid in flying:
        job_transition(zk, job_load(zk, jid), "Estimating")
    caps.cap_set(zk, DEMO, 2)
    assert caps.recount(zk, DEMO, flying) == (3, 0)
    job_transition(zk, job_load(zk, flying[0]), "Failed", message="x")
    assert caps.recount(zk, DEMO, flying[1:]) == (0, 1)
    assert caps.cap_of(zk, DEMO).counted == 2
    assert caps.cap_clear(zk, DEMO) == 2
    assert zk.exists(caps.cap_path(DEMO)) is None


def test_consumers_racing_on_two_sessions_get_exactly_the_cap(
    zk, other_zk, files: FileServer
) -> None:
    """Every reservation is written against the count's version: of ten consumers that read the
    same count at once, exactly as many as the cap get in, whatever the timing."""
    caps.cap_set(zk, DEMO, 3)
    jids = [_job(zk, files, DEMO, f"s-{i}.txt") for i in range(10)]
    barrier = threading.Barrier(len(jids))
    got: list[bool] = []

    def racer(client: Any, jid: str) -> None:
        barrier.wait()
        got.append(caps.reserve(client, DEMO, jid))

    threads = [
        threading.Thread(target=racer, args=(zk if i % 2 else other_zk, jid))
        for i, jid in enumerate(jids)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got.count(True) == 3
    assert caps.cap_of(zk, DEMO).counted == 3


def test_a_count_left_by_jobs_deleted_behind_its_back_is_repaired_by_the_next_verify(
    zk, files: FileServer
) -> None:
    """Merritt's library deletes jobs without knowing of the markers: the count is too high
    until the consumer that finds the collection full verifies it, then the job goes on."""
    caps.cap_set(zk, DEMO, 2)
    for gone in ("jid0000999998", "jid0000999999"):
        zk.create(caps.marker_path(DEMO, gone), b"")
    jid = _job(zk, files, DEMO, "after-delete.txt")
    daemon = JobPending(zk=zk, poll=0.05)
    assert not daemon.run_once()
    assert _states(zk, [jid])[jid] == "Pending"
    time.sleep(caps.RECHECK)
    assert daemon.run_once() and daemon.last.id == jid
    assert zk.get_children(caps.flight_path(DEMO)) == [jid]


def test_resumes_past_the_cap_leave_at_most_the_bound_of_markers(
    zk, files: FileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's resumes count over the cap, and nothing prunes their markers while no
    Pending job of the collection meets the cap: a collection whose jobs fail and are resumed
    again and again gathered one marker per resume (a folder that no longer lists at about
    60,000). The resume prunes at the bound; jobs still in flight keep their markers."""
    # 20,000 resumes would take minutes (raising=False: the code before had no bound to set).
    monkeypatch.setattr(caps, "MARKERS_MAX", 5, raising=False)
    caps.cap_set(zk, DEMO, 2)
    flying = [_job(zk, files, DEMO, f"fly-{i}.txt") for i in range(2)]
    for jid in flying:
        assert caps.reserve(zk, DEMO, jid)
        job_transition(zk, job_load(zk, jid), "Estimating")
    failing = [_job(zk, files, DEMO, f"fail-{i}.txt") for i in range(10)]
    for jid in failing:
        job_transition(zk, job_load(zk, jid), "Estimating")
        job_transition(zk, job_load(zk, jid), "Failed", message="payload gone")
    most = 0
    for jid in failing:  # each resumed, and failing again in Estimating
        failed = job_load(zk, jid)
        job_transition(zk, failed, job_resume_state(failed), admin=True, retry=True)
        assert jid in zk.get_children(caps.flight_path(DEMO))  # counted, over the cap
        most = max(most, len(zk.get_children(caps.flight_path(DEMO))))
        job_transition(zk, job_load(zk, jid), "Failed", message="payload gone again")
    assert most == 5
    markers = set(zk.get_children(caps.flight_path(DEMO)))
    assert set(flying) <= markers and len(markers) <= 5
    # With every marker's job still in flight, a resume is not counted: the count stays at the
    # bound (the gate shut, as it was), and the folder does not grow.
    for jid in failing[:3]:
        failed = job_load(zk, jid)
        job_transition(zk, failed, job_resume_state(failed), admin=True, retry=True)
    assert len(zk.get_children(caps.flight_path(DEMO))) == 5
    assert caps.cap_of(zk, DEMO).full
    resumed = failing[-1]
    assert caps.count_entry(zk, DEMO, resumed) is False
    assert resumed not in zk.get_children(caps.flight_path(DEMO))
