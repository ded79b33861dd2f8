"""Downstream trouble never fails a job (issue 50): storage, inventory, EZID and a callback
receiver each answering 503 for longer than one try, then recovering. Every job completes,
none is ever Failed, the depositor hears nothing before the final outcome; a permanent answer
fails the job at once; a spent policy fails it with every try's reason."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queues.chaos.standins import (
    Answer,
    CallbackReceiver,
    EzidStandIn,
    InventoryStandIn,
    StorageStandIn,
    exception_document,
    running,
)
from queues.core import retries
from queues.daemons import breakers as breaker_module
from queues.daemons.retrying import policy_for
from queues.web.api_door import job_json
from queues.zk.jobs import job_load, job_transition
from queues.zk.records import Job

from .conftest import DEMO, FileServer, daemon, make_job, wait_for
from .test_storing_recording import _served

pytestmark = [pytest.mark.django_db, pytest.mark.zookeeper]

FAST = "attempts=6 first=0.2s most=0.4s within=1h"
STEPS = ["downloading", "processing", "storing", "recording", "notify"]


def _unavailable() -> Answer:
    return Answer(503, b"busy, try later", "text/plain")


@pytest.fixture
def services(
    settings: Any, profiles: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    settings.MRT_RETRY = {name: FAST for name in retries.SERVICES}
    monkeypatch.setattr(breaker_module, "_breakers", breaker_module.Breakers())
    with (
        running(StorageStandIn(nodes=(9501,))) as storage,
        running(InventoryStandIn()) as inventory,
        running(EzidStandIn("apitest", "s3cret")) as ezid,
        running(CallbackReceiver()) as receiver,
        _served(Path(settings.MRT_WORK_DIR)) as work_url,
    ):
        settings.MRT_STORAGE_URL = storage.url
        settings.MRT_INVENTORY_URL = inventory.url
        settings.MRT_WORK_URL = work_url
        settings.MRT_EZID_URL = ezid.url
        settings.MRT_EZID_USER, settings.MRT_EZID_PASSWORD = "apitest", "s3cret"
        path = profiles / f"{DEMO}.json"
        profile = json.loads(path.read_text())
        profile["storage_node"] = "9501"
        profile["callback_url"] = receiver.url + "/hook"
        path.write_text(json.dumps(profile))
        yield {"storage": storage, "inventory": inventory, "ezid": ezid, "receiver": receiver}


def _job(zk: Any, files: FileServer, name: str) -> Job:
    return make_job(
        zk,
        {"payload_url": files.put(name, name * 3), "type": "file", "filename": name},
        state="Downloading",
    )


class Rounds:
    """The steps' daemons, each one claim at a time, round after round; every state a job was
    seen in is kept."""

    def __init__(self, zk: Any) -> None:
        self.zk = zk
        self.daemons = [daemon(zk, name) for name in STEPS]
        self.seen: dict[str, list[str]] = {}

    def until(self, check: Any, jobs: list[Job]) -> None:
        def one_round() -> bool:
            for d in self.daemons:
                d.run_once()
            breaker_module.breakers().probe(self.zk)  # the maintenance daemon's probe
            for job in jobs:
                status = job_load(self.zk, job.jid).status
                states = self.seen.setdefault(job.jid, [])
                if not states or states[-1] != status.status:
                    states.append(status.status)
            return bool(check())

        wait_for(one_round, timeout=120, every=0.05)


def test_every_service_answering_503_for_a_while_costs_no_job(
    zk: Any, files: FileServer, services: dict[str, Any]
) -> None:
    storage, inventory, ezid, receiver = (
        services[k] for k in ("storage", "inventory", "ezid", "receiver")
    )
    # Each 503 run outlasts one try: the session's own quick repeats of a GET or a PUT
    # (three), and the callback's in-request repeats (three posts a try) come and go in it.
    for stand_in, count in ((ezid, 5), (storage, 5), (inventory, 5), (receiver, 7)):
        for _ in range(count):
            stand_in.refuse_next(_unavailable())
    jobs = [_job(zk, files, f"r{i}.txt") for i in range(3)]
    rounds = Rounds(zk)

    # While the services are away the jobs wait in their steps, unlocked, their next try on
    # the job's status.
    def a_waiting_job() -> Job | None:
        for job in jobs:
            found = job_load(zk, job.jid)
            if retries.RETRY_KEY in found.status.raw:
                return found
        return None

    rounds.until(lambda: a_waiting_job() is not None, jobs)
    held = a_waiting_job()
    assert held is not None
    assert "waiting to try again, try 2 of 6" in held.status.message, held.status.message
    assert held.status.retry_count == 0  # Merritt's count of an operator's resumes, untouched
    assert zk.exists(f"/jobs/{held.jid}/lock") is None
    shown = job_json(held)["retry"]  # what /api/jobs/<jid> answers
    assert shown["failed_tries"] == 1 and "HTTP 503" in shown["last_reason"]
    assert shown["service"] in ("ezid", "storage node 9501", "inventory")

    rounds.until(lambda: all(job_load(zk, j.jid).state == "Completed" for j in jobs), jobs)
    for job in jobs:
        assert "Failed" not in rounds.seen[job.jid], rounds.seen[job.jid]
        done = job_load(zk, job.jid)
        assert retries.RETRY_KEY not in done.status.raw and job_json(done)["retry"] is None
    # The depositor heard of each job once, when it was done.
    assert sorted(receiver.received) == sorted(j.jid for j in jobs)
    for state in receiver.received.values():
        assert "COMPLETED" in json.dumps(state)
    # One version a job: a refused add made none.
    assert len(storage.objects) == len(jobs)
    assert all(len(obj.versions) == 1 for obj in storage.objects.values())


def test_a_retry_after_that_is_no_number_is_a_wait_like_any_other(
    zk: Any, files: FileServer, services: dict[str, Any]
) -> None:
    # "²" passed str.isdigit() and then failed in float(), failing the job at once; 5,000 digits
    # failed it in urllib3's own reading; none is RFC 9110's delay-seconds or a date.
    storage, ezid = services["storage"], services["ezid"]
    for stand_in, value in ((ezid, "²"), (storage, "soon"), (storage, "9" * 5000)):
        for _ in range(4):
            stand_in.refuse_next(Answer(503, b"busy", "text/plain", {"Retry-After": value}))
    jobs = [_job(zk, files, f"w{i}.txt") for i in range(2)]
    rounds = Rounds(zk)
    rounds.until(lambda: all(job_load(zk, j.jid).state == "Completed" for j in jobs), jobs)
    for job in jobs:
        assert "Failed" not in rounds.seen[job.jid], rounds.seen[job.jid]
    # Every refusal was answered (they come first), and each was a wait, not a failure.
    assert len(ezid.seen()) > 4 and len(storage.seen()) > 8


def test_a_permanent_answer_fails_the_job_at_once(
    zk: Any, files: FileServer, services: dict[str, Any]
) -> None:
    storage = services["storage"]
    storage.refuse_next(exception_document("REQUEST_INVALID", "manifest names no files"), "POST")
    job = _job(zk, files, "p.txt")
    rounds = Rounds(zk)
    rounds.until(lambda: job_load(zk, job.jid).state in ("Failed", "Recording"), [job])
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed"
    assert retries.RETRY_KEY not in failed.status.raw
    assert "manifest names no files" in failed.status.message
    assert failed.status.message.startswith("storing: ")
    assert len([r for r in storage.seen("POST") if "/add/" in r.path]) == 1


def test_a_spent_policy_fails_the_job_with_every_try(
    zk: Any, files: FileServer, services: dict[str, Any], settings: Any
) -> None:
    settings.MRT_RETRY = {**settings.MRT_RETRY, "storage": "attempts=3 first=0.1s most=0.2s"}
    storage = services["storage"]
    for _ in range(40):  # down for good (a try may ask several times)
        storage.refuse_next(_unavailable())
    job = _job(zk, files, "s.txt")
    rounds = Rounds(zk)
    rounds.until(lambda: job_load(zk, job.jid).state in ("Failed", "Recording"), [job])
    failed = job_load(zk, job.jid)
    assert failed.state == "Failed", failed.status.message
    message = failed.status.message
    assert "gave up after 3 tries of storage node 9501" in message
    assert message.count("storage node 9501: HTTP 503") == 3
    assert not storage.objects
    storage.stop_refusing()
    # An operator's resume starts over: the count of resumes rises, the tries are forgotten.
    resumed = job_transition(zk, failed, "Storing", admin=True, retry=True)
    assert resumed.status.retry_count == 1 and retries.RETRY_KEY not in resumed.status.raw
    rounds.until(lambda: job_load(zk, job.jid).state == "Completed", [job])


def test_a_retry_after_longer_than_the_back_off_is_honoured(settings: Any) -> None:
    settings.MRT_RETRY = {"storage": "attempts=5 first=1s most=60s"}
    now = time.time()
    outage = retries.http_unavailable("storage node 9501", 503, "Busy", "30", now=now)
    assert outage is not None and outage.retry_after == 30.0
    waiting = {"status": "Storing"}
    policy = policy_for("storage node 9501")
    decision = retries.decide(policy, waiting, outage, now=now, jitter=1.0)
    assert decision.retry and decision.next_at == pytest.approx(now + 30.0)
    # Merritt's library keeps a status's unknown keys through its own moves: a record of the
    # state before is no wait in the next one, and its tries are not counted there.
    moved = {"status": "Recording", retries.RETRY_KEY: decision.state}
    assert retries.next_try(moved) is None
    assert retries.decide(policy, moved, outage, now=now).attempt == 1
    assert retries.next_try({**waiting, retries.RETRY_KEY: decision.state}) == pytest.approx(
        decision.next_at
    )
    assert retries.http_unavailable("storage node 9501", 404, "Not Found", now=now) is None


def test_a_storage_node_that_keeps_failing_is_held_by_its_breaker_until_it_answers(
    zk: Any, files: FileServer, services: dict[str, Any], settings: Any
) -> None:
    from queues.daemons.alerting import Evaluator
    from queues.daemons.breakers import BREAKER, breakers
    from queues.models import AuditEntry
    from queues.zk.maintenance import node_holds
    from tests.alerts.conftest import a_moment, only

    settings.MRT_BREAKER_FAILURES = 3
    settings.MRT_BREAKER_WINDOW = 600.0
    only("node-held", quiet_seconds=0.0, threshold=0.0)
    storage = services["storage"]
    for _ in range(200):
        storage.refuse_next(_unavailable())
    jobs = [_job(zk, files, f"b{i}.txt") for i in range(4)]
    rounds = Rounds(zk)
    rounds.until(lambda: 9501 in node_holds(zk), jobs)
    hold = node_holds(zk)[9501]
    assert hold.by == BREAKER
    assert hold.reason.startswith("breaker: 3 x 503 from node 9501 in ")
    [fired] = Evaluator(name="breaker").evaluate(zk=zk, now=a_moment())
    assert "storage node 9501 is held" in fired and "breaker: 3 x 503" in fired
    # While the breaker is open the node's jobs wait, unclaimed, and none fails.
    asked = len(storage.requests)
    for _ in range(5):
        for d in rounds.daemons:
            d.run_once()
    assert all(job_load(zk, j.jid).state == "Storing" for j in jobs)
    assert not any(zk.exists(f"/jobs/{j.jid}/lock") for j in jobs)
    assert len(storage.requests) == asked  # nothing asked of the held node

    # A probe while the node still answers 503 keeps it held; once it answers, the breaker
    # closes by itself and every job completes.
    start = time.monotonic()
    assert breakers().probe(zk, now=start) == []  # the first probe is 5 s away
    assert breakers().probe(zk, now=start + 6) == [] and 9501 in node_holds(zk)
    assert len(storage.requests) == asked + 1  # the probe, and nothing else
    storage.stop_refusing()
    assert breakers().probe(zk, now=start + 12) == []  # the next one is 10 s after the last
    assert breakers().probe(zk, now=start + 17) == ["storage node 9501"]
    assert 9501 not in node_holds(zk)
    rounds.until(lambda: all(job_load(zk, j.jid).state == "Completed" for j in jobs), jobs)
    for job in jobs:
        assert "Failed" not in rounds.seen[job.jid]
    entries = AuditEntry.objects.filter(kind="node", item_id="9501", via="daemon")
    assert sorted(e.action for e in entries) == ["hold", "release"]


def _server(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0]


@pytest.mark.parametrize("kind", ["ezid", "inventory", "callback", "depositor"])
def test_a_service_that_keeps_failing_is_held_by_its_breaker_until_it_answers(
    kind: str, zk: Any, files: FileServer, services: dict[str, Any], settings: Any
) -> None:
    from queues.daemons.alerting import Evaluator
    from queues.daemons.breakers import BREAKER, breakers
    from queues.models import AuditEntry
    from queues.zk.maintenance import held_services, service_holds
    from tests.alerts.conftest import a_moment, only

    settings.MRT_BREAKER_FAILURES = 3
    settings.MRT_BREAKER_WINDOW = 600.0
    only("service-held", quiet_seconds=0.0, threshold=0.0)
    receiver = services["receiver"]
    if kind == "depositor":
        name = f"depositor {_server(files.url)}"
        files.busy = 10_000

        def asked() -> int:
            return files.requests()

        def recover() -> None:
            files.busy = 0
    else:
        stand_in = services["receiver" if kind == "callback" else kind]
        name = f"callback {_server(receiver.url)}" if kind == "callback" else kind
        for _ in range(10_000):
            stand_in.refuse_next(_unavailable())

        def asked() -> int:
            return len(stand_in.requests)

        def recover() -> None:
            stand_in.stop_refusing()

    jobs = [_job(zk, files, f"{kind}{i}.txt") for i in range(4)]
    rounds = Rounds(zk)
    rounds.until(lambda: name in service_holds(zk), jobs)
    hold = service_holds(zk)[name]
    assert hold.by == BREAKER
    assert hold.reason.startswith(f"breaker: 3 x 503 from {name} in "), hold.reason
    [fired] = Evaluator(name="breaker").evaluate(zk=zk, now=a_moment())
    assert f"{name} is held" in fired and "breaker: 3 x 503" in fired
    wait_for(lambda: name in held_services(zk), timeout=30)  # this process's watch saw it

    # While the breaker is open the service's jobs wait before its step, unclaimed, and none
    # fails; nothing is asked of the service.
    before = asked()
    for _ in range(5):
        for d in rounds.daemons:
            d.run_once()
    assert asked() == before
    assert not any(zk.exists(f"/jobs/{j.jid}/lock") for j in jobs)
    assert not any(job_load(zk, j.jid).state in ("Failed", "Completed") for j in jobs)
    assert receiver.received == {}  # the depositor hears nothing before the final outcome

    # A probe while it still answers 503 keeps it held; once it answers, the breaker closes by
    # itself, the alert resolves and every job completes.
    start = time.monotonic()
    assert breakers().probe(zk, now=start) == []  # the first probe is 5 s away
    assert breakers().probe(zk, now=start + 6) == [] and name in service_holds(zk)
    assert asked() == before + 1  # the probe, and nothing else
    recover()
    assert breakers().probe(zk, now=start + 12) == []  # the next one is 10 s after the last
    assert breakers().probe(zk, now=start + 17) == [name]
    assert name not in service_holds(zk)
    evaluator = Evaluator(name="breaker")
    assert evaluator.evaluate(zk=zk, now=a_moment()) == []  # clear from now on
    [resolved] = evaluator.evaluate(zk=zk, now=a_moment())
    assert name in resolved and "resolved" in resolved.lower(), resolved
    rounds.until(lambda: all(job_load(zk, j.jid).state == "Completed" for j in jobs), jobs)
    for job in jobs:
        assert "Failed" not in rounds.seen[job.jid], rounds.seen[job.jid]
    assert sorted(receiver.received) == sorted(j.jid for j in jobs)
    entries = AuditEntry.objects.filter(
        kind="service", item_id=name.replace(" ", ":", 1), via="daemon"
    )
    assert sorted(e.action for e in entries) == ["hold", "release"]


@pytest.mark.parametrize("holder", ["breaker", "operator"])
def test_a_breaker_holds_a_depositors_server_no_longer_than_its_jobs_retry_window(
    holder: str,
    zk: Any,
    files: FileServer,
    services: dict[str, Any],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A depositor's server that never answers again: its breaker spares it every job's tries,
    but a job whose retry window (the policy's ``within`` since its first failure) has closed
    is not held back by it any longer; its next try meets the outage and fails it, for its
    reasons. Held by an operator instead, the jobs wait whatever their windows say (the chaos
    run's refusing depositor was held for ever by its breaker, its batch never done)."""
    from queues.daemons.breakers import BREAKER
    from queues.zk.maintenance import held_services, service_hold_clear, service_hold_set
    from queues.zk.maintenance import service_holds as holds_now

    monkeypatch.setattr(breaker_module, "_breaker_view", (float("-inf"), frozenset()))
    settings.MRT_RETRY = {
        **settings.MRT_RETRY,
        "depositor": "attempts=1000 first=0.2s most=0.4s within=3s",
    }
    settings.MRT_BREAKER_FAILURES = 3
    settings.MRT_BREAKER_WINDOW = 600.0
    name = f"depositor {_server(files.url)}"
    files.busy = 1_000_000  # 503 for good
    jobs = [_job(zk, files, f"gone{i}.txt") for i in range(3)]
    rounds = Rounds(zk)
    rounds.until(lambda: name in holds_now(zk), jobs)
    assert holds_now(zk)[name].by == BREAKER
    if holder == "operator":
        assert service_hold_clear(zk, name, by=BREAKER)
        assert service_hold_set(zk, name, by="ops", reason="their server moves")
    wait_for(lambda: name in held_services(zk), timeout=30)  # this process's watch saw it
    firsts = [
        retries.current(job_load(zk, j.jid).status.raw) or {} for j in jobs
    ]  # the jobs that failed before the hold have a window; the others never tried
    tried = [j for j, record in zip(jobs, firsts, strict=True) if record.get("first")]
    assert tried
    closes = max(float(r["first"]) for r in firsts if r.get("first")) + 3.0

    if holder == "breaker":
        rounds.until(lambda: all(job_load(zk, j.jid).state == "Failed" for j in tried), jobs)
        for job in tried:
            message = job_load(zk, job.jid).status.message
            assert "gave up after" in message and name in message, message
        assert time.time() > closes  # not before its window closed
        # A job that never met the outage has no window: it waits for the server.
        for job in jobs:
            if job not in tried:
                assert job_load(zk, job.jid).state == "Downloading"
    else:
        wait_for(lambda: time.time() > closes + 0.5, timeout=30)
        before = files.requests()
        for _ in range(5):
            for d in rounds.daemons:
                d.run_once()
        assert files.requests() == before  # nothing asked of the server an operator holds
        assert all(job_load(zk, j.jid).state == "Downloading" for j in jobs)
