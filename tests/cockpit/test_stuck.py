"""Stuck jobs: past their state's usual time (p95 of the step history times the factor) or past
MRT_STUCK_SECONDS, by time in state or by lock age; on the overview, as a job-list filter, in
/metrics and on /stuck/."""

from __future__ import annotations

import time
from array import array
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queues.models import StepRecord
from queues.operator import stuck
from queues.zk import index as zindex
from queues.zk import packed
from queues.zk import paths as zpaths
from queues.zk.locks import lock_create

from .conftest import record, wait_for

pytestmark = pytest.mark.django_db


def past_halfway(make_job: Any, state: str, gap: float) -> tuple[Any, Any, float]:
    """An old and a fresh job in ``state`` with ``gap`` seconds either side of a halfway
    moment, and that moment. Time must pass for a job to be old; the setting is then put at
    halfway when it is set, so however long making the fresh job took, it is not yet stuck."""
    old = make_job(state)
    time.sleep(gap)
    halfway = time.time()
    time.sleep(gap)
    return old, make_job(state), halfway


def estimating_history(settings: Any) -> None:
    """Estimating usually takes 0.1 s after waiting 20 s: locked 0.5 s (3 x 0.1, at least the
    floor) is far too long; 60.3 s (3 x 20.1) in the state in all."""
    settings.MRT_STUCK_SECONDS = 3600
    settings.MRT_STUCK_FACTOR = 3
    settings.MRT_STUCK_MIN_SECONDS = 0.5
    now = datetime.now(UTC)
    StepRecord.objects.bulk_create(
        [record(duration=0.1, waited=20.0, started=now - timedelta(minutes=i)) for i in range(25)]
    )


def test_a_job_past_the_setting_is_stuck_and_a_fresh_one_is_not(
    zk, make_job, settings, monkeypatch
):
    old, fresh, halfway = past_halfway(make_job, "Downloading", 0.7)
    # The judge's clock stops where the setting is measured: on the running one the fresh job
    # was stuck too once 0.7 s had passed, and the reads below can take longer on a busy machine.
    now = time.time()
    monkeypatch.setattr(stuck, "server_now", lambda _zk: now)  # the clock stuck is judged by
    settings.MRT_STUCK_SECONDS = now - halfway
    found = stuck.find_stuck(zk, fresh=True)
    assert [s.jid for s in found] == [old.jid]
    assert found[0].state == "Downloading" and found[0].threshold.source == "setting"
    assert "in Downloading for" in found[0].why
    numbers = stuck.stuck_numbers(zk)
    assert numbers == array("q", [int(old.jid[3:])])
    assert stuck.is_in(numbers, int(old.jid[3:])) and not stuck.is_in(numbers, int(fresh.jid[3:]))
    assert stuck.stuck_counts(zk)["Downloading"] == 1


def test_thresholds_follow_the_step_history(zk, make_job, settings):
    estimating_history(settings)
    limits = stuck.thresholds()
    assert limits["Estimating"].source == "history"
    assert limits["Estimating"].lock == pytest.approx(0.5)
    assert limits["Estimating"].in_state == pytest.approx(60.3)
    assert limits["Processing"].source == "setting"
    locked = make_job("Estimating")
    idle = make_job("Estimating")
    assert lock_create(zk, zpaths.job_node(locked.jid, "lock"))
    # Stuck once its lock is older than 0.5 s; the idle job stays 60 s away from it.
    deadline = time.monotonic() + 30
    while not (found := stuck.find_stuck(zk, fresh=True)):
        assert time.monotonic() < deadline, "the locked job never became stuck"
        time.sleep(0.05)
    assert [s.jid for s in found] == [locked.jid]  # the idle one waits less than usual
    assert found[0].lock_age is not None and found[0].lock_age > 0.5
    assert "locked by a consumer" in found[0].why
    assert int(idle.jid[3:]) not in stuck.stuck_numbers(zk)


def processing_history(settings: Any) -> None:
    """Processing usually takes 0.1 s after waiting 20 minutes: locked 0.5 s (3 x 0.1, at least
    the floor) is far too long; in the state without a lock, a job is stuck after an hour."""
    settings.MRT_STUCK_SECONDS = 3600
    settings.MRT_STUCK_FACTOR = 3
    settings.MRT_STUCK_MIN_SECONDS = 0.5
    now = datetime.now(UTC)
    StepRecord.objects.bulk_create(
        [
            record(
                step="processing",
                state="Processing",
                duration=0.1,
                waited=1200.0,
                started=now - timedelta(minutes=i),
            )
            for i in range(25)
        ]
    )


def test_stuck_jobs_on_the_overview_the_job_list_and_metrics(zk, make_job, viewer, settings):
    # No margin over the clock: the old job is stuck by its lock, whose age only grows (waited
    # for), and the fresh one is an hour short of its state's threshold while the pages are read.
    processing_history(settings)
    old, fresh = make_job("Processing"), make_job("Processing")
    assert lock_create(zk, zpaths.job_node(old.jid, "lock"))
    wait_for(lambda: [s.jid for s in stuck.find_stuck(zk, fresh=True)] == [old.jid])
    stuck.reset()
    page = viewer.get("/").content.decode()
    assert 'id="count-stuck-total">1<' in page
    assert "stuck=on" in page
    listing = viewer.get("/jobs/?stuck=on").content.decode()
    assert old.jid in listing and fresh.jid not in listing
    # Over every state, the stuck keys are the answer: no merge of every state's entries is
    # made for it, nor kept (a million keys at a million jobs).
    assert not zindex.for_client(zk)._all_kept
    everything = viewer.get("/jobs/").content.decode()
    assert old.jid in everything and fresh.jid in everything
    metrics = viewer.get("/metrics").content.decode()
    assert 'mrt_jobs_stuck{state="Processing"} 1' in metrics
    assert 'mrt_jobs_stuck{state="Estimating"} 0' in metrics
    assert 'mrt_consumers{mode="claiming"} 0' in metrics
    detail = viewer.get("/stuck/").content.decode()
    assert old.jid in detail and "no registered consumer" in detail


def test_a_consumer_thread_is_flagged_past_its_steps_p95(zk, zk_hosts, make_job, settings):
    from queues.views.workers import consumers_context

    from .conftest import held_consumer

    settings.MRT_STUCK_SECONDS = 3600
    settings.MRT_STUCK_FACTOR = 3
    settings.MRT_STUCK_MIN_SECONDS = 0.2
    now = datetime.now(UTC)
    # The "slow" step usually takes 0.1 s: a thread on one item for 0.3 s is far too long.
    StepRecord.objects.bulk_create(
        [record(step="slow", duration=0.1, started=now - timedelta(minutes=i)) for i in range(25)]
    )
    # Held until the test has seen it flagged: with a fixed 3 s in hand, a look that came
    # after the step ended would never see it flagged again.
    with held_consumer(zk_hosts):
        job = make_job("Estimating")
        context = wait_for(lambda: (c := consumers_context(None))["flagged_total"] and c)
        (proc,) = context["consumers"]
        (thread,) = proc["threads"]
        assert thread["item"] == job.jid and thread["flagged"]
        assert thread["limit"] == pytest.approx(0.3)
        assert proc["flagged"] == 1


def test_the_count_reads_the_lock_of_a_job_between_the_two_thresholds(zk, make_job, settings):
    """The overview's count reads a lock only for jobs longer in their state than the lock
    threshold but not yet than the state's: it finds the same stuck jobs as the list."""
    estimating_history(settings)
    locked = make_job("Estimating")
    make_job("Estimating")
    assert lock_create(zk, zpaths.job_node(locked.jid, "lock"))
    deadline = time.monotonic() + 30
    while True:
        stuck.reset()
        counts = stuck.stuck_counts(zk)
        if counts["Estimating"]:
            break
        assert time.monotonic() < deadline, "the locked job was never counted"
        time.sleep(0.05)
    assert counts == {s: int(s == "Estimating") for s in stuck.STATES}
    assert [s.jid for s in stuck.find_stuck(zk, fresh=True)] == [locked.jid]


def test_the_overview_card_gives_the_last_count_and_counts_again_in_the_background(
    zk, make_job, settings, monkeypatch
):
    processing_history(settings)
    old, _fresh = make_job("Processing"), make_job("Processing")
    assert stuck.stuck_counts(zk)["Processing"] == 0
    assert lock_create(zk, zpaths.job_node(old.jid, "lock"))  # stuck once that is 0.5 s old
    assert stuck.stuck_counts(zk, wait=False)["Processing"] == 0  # kept CACHE_SECONDS
    monkeypatch.setattr(stuck, "CACHE_SECONDS", 0.0)
    # Past that time the card does not count in the request: it gets the last count at once
    # while a thread of its own counts again, and the new count once that is done.
    assert stuck.stuck_counts(zk, wait=False)["Processing"] == 0
    assert wait_for(lambda: stuck.stuck_counts(zk, wait=False)["Processing"] == 1)
    assert [s.jid for s in stuck.find_stuck(zk)] == [old.jid]


def test_entry_times_are_kept_for_the_entries_still_listed() -> None:
    """A folder listed anew keeps the creation times of the entries it still holds (only new
    entries are read), looked up block by block through both sorted arrays."""
    from array import array

    from queues.zk import packed

    old_keys = array("q", range(0, 60_000, 2))
    old_times = array("d", (1000.0 + k for k in old_keys))
    # Every third old entry gone, odd ones new (not read yet: 0.0).
    keys = array("q", sorted({k for k in old_keys if k % 3} | set(range(1, 60_000, 10))))
    carried = packed.carried(old_keys, old_times, keys, 0.0)
    assert len(carried) == len(keys) > packed.CARRY_BLOCK * 2
    assert list(carried) == [1000.0 + k if k % 2 == 0 else 0.0 for k in keys]
    assert len(packed.carried(old_keys, old_times, array("q"), 0.0)) == 0
    assert list(packed.carried(array("q"), array("d"), keys[:3], 0.0)) == [0.0] * 3


def test_the_stuck_list_is_paged_in_its_order_looking_only_as_deep_as_a_page_needs(
    zk, make_job, viewer, settings, monkeypatch
):
    """Pages are slices of the whole list, also when locks decide (the page's search goes
    deeper when the oldest candidates turn out not to be stuck)."""
    estimating_history(settings)
    jobs = []
    for _ in range(9):
        jobs.append(make_job("Estimating"))
        time.sleep(0.02)  # distinct creation times: one order for the list and the pages
    locked = jobs[1::2]  # stuck by their lock only; the others are not stuck
    for job in locked:
        assert lock_create(zk, zpaths.job_node(job.jid, "lock"))
    deadline = time.monotonic() + 30
    while len(whole := stuck.find_stuck(zk, fresh=True)) < len(locked):
        assert time.monotonic() < deadline, "the locked jobs never became stuck"
        time.sleep(0.1)
    assert [s.jid for s in whole] == [j.jid for j in locked]
    # The job list's filter finds the same jobs, its lock reads only in the band between.
    assert list(stuck.stuck_numbers(zk)) == sorted(int(j.jid[3:]) for j in locked)
    listing = viewer.get("/jobs/?stuck=on").content.decode()
    assert all(j.jid in listing for j in locked)
    assert not any(j.jid in listing for j in jobs if j not in locked)
    pages = [stuck.stuck_page(zk, n, per_page=3) for n in (1, 2, 3)]
    assert [[s.jid for s in p.items] for p in pages] == [
        [j.jid for j in locked[:3]],
        [locked[3].jid],
        [],
    ]
    assert [(p.total, p.pages, p.has_previous, p.has_next) for p in pages[:2]] == [
        (4, 2, False, True),
        (4, 2, True, False),
    ]
    monkeypatch.setattr(stuck, "PAGE_SIZE", 3)
    second = viewer.get("/stuck/?page=2").content.decode()
    assert "4 stuck jobs · page 2 of 2" in second and "?page=1" in second
    assert locked[3].jid in second and locked[0].jid not in second
    assert viewer.get("/stuck/?page=x").status_code == 400


def test_a_cut_moving_on_with_the_clock_puts_the_new_entries_in_their_places() -> None:
    """The entries before a cut, in run order, as the cut moves on (the job list's "stuck only"
    and age filters ask again with a later cut every request): the last answer with the
    entries that crossed the cut since, the same as sorting the whole prefix again."""
    import random

    rng = random.Random(3)
    keys = array("q", sorted(rng.sample(range(1, 1 << 40), 5000)))
    # 0.0: a time not read (left out of every answer).
    ctimes = array("d", ((c + rng.random()) if (c := rng.randrange(100)) else 0.0 for _ in keys))
    stuck.reset()
    try:
        for step, cut in enumerate([10.0, 10.0, 10.5, 20.0, 20.0, 33.3, 34.0, 60.0, 99.9, 5.0]):
            for strict in (True, False):
                before = cut.__gt__ if strict else cut.__ge__
                wanted = sorted(
                    k for k, t in zip(keys, ctimes, strict=True) if t >= 1 and before(t)
                )
                found = stuck._before("Testing", keys, ctimes, cut, strict=strict)
                assert list(found) == wanted, (step, cut, strict)
    finally:
        stuck.reset()


def _time_order_peak(n: int) -> float:
    """Bytes an entry ``_time_ordered`` held at most, ordering ``n`` entries (in a fresh
    interpreter: see ``tests/scale/test_index_compact.py``'s per-job memory)."""
    import random
    import tracemalloc

    rng = random.Random(9)
    ctimes = array("d", (1.7e9 + rng.randrange(3600) for _ in range(n)))
    tracemalloc.start()
    order = array("i", stuck._time_ordered(ctimes, range(n)))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(order) == n
    return peak / n


def test_entries_are_ordered_by_time_block_by_block_as_one_sort_orders_them() -> None:
    """Sorted a block at a time and merged (ties kept in their order, unread 0.0 first), the
    same order as one stable sort, holding a block's Python numbers at most: about 12 bytes
    an entry for the two arrays, where one sort held about 80."""
    import random

    from tests.scale.test_index_compact import measured_alone

    rng = random.Random(7)
    n = 3 * packed.CARRY_BLOCK + 17
    ctimes = array("d", (float(rng.randrange(40)) for _ in range(n)))
    one_sort = sorted(range(n), key=ctimes.__getitem__)
    assert list(stuck._time_ordered(ctimes, range(n))) == one_sort
    picked = array("q", sorted(rng.sample(range(n), n // 3)))
    assert list(stuck._time_ordered(ctimes, picked)) == sorted(picked, key=ctimes.__getitem__)
    assert measured_alone("tests.cockpit.test_stuck", "_time_order_peak", 300_000) < 24


def test_the_band_between_the_two_thresholds_is_the_same_ordered_by_time() -> None:
    """The jobs whose lock is read (in their state past the lock threshold, not past the
    state's): found by bisection once the entries are ordered by time, the same positions as
    the pass over every time."""
    import random

    rng = random.Random(5)
    keys = array("q", sorted(rng.sample(range(1, 1 << 40), 5000)))
    ctimes = array("d", ((c + rng.random()) if (c := rng.randrange(100)) else 0.0 for _ in keys))
    stuck.reset()
    try:
        cuts = [(10.0, 20.0), (0.0, 100.0), (33.3, 33.4), (50.0, 50.0), (99.0, 200.0)]
        passed = [sorted(stuck._band("Testing", keys, ctimes, a, b)) for a, b in cuts]
        stuck._before("Testing", keys, ctimes, 50.0, strict=True)
        stuck._before("Testing", keys, ctimes, 50.0, strict=True)  # now ordered by time
        assert stuck._by_time["Testing"].keys is keys
        ordered = [sorted(stuck._band("Testing", keys, ctimes, a, b)) for a, b in cuts]
        assert ordered == passed
        assert passed[0] and passed[2] == [i for i, t in enumerate(ctimes) if 33.3 <= t < 33.4]
    finally:
        stuck.reset()


def test_the_stuck_keys_of_several_states_are_sorted_once_while_their_parts_hold() -> None:
    stuck.reset()
    try:
        a, b = array("q", [1, 5, 9]), array("q", [2, 3, 10])
        joined = stuck._joined([a, array("q"), b], [7])
        assert list(joined) == [1, 2, 3, 5, 7, 9, 10]
        assert stuck._joined([a, b], [7]) is joined  # the same parts: the same answer
        assert list(stuck._joined([a, array("q", [2, 3, 10])], [7])) == list(joined)
        assert stuck._joined([a, b], [4]) is not joined
        assert stuck._joined([array("q"), b], []) is b  # one state's part is its own answer
        assert list(stuck._joined([], [])) == []
    finally:
        stuck.reset()


def test_a_consumer_on_a_host_ten_minutes_behind_is_neither_stale_nor_stuck(zk, settings):
    """A process on a host whose clock runs ten minutes behind writes its times by that
    clock: its registration just written, a thread on an item for 20 s. Judged against the
    web host's clock it looked ten minutes stale and stuck; by the node's own mtime (the
    server's clock at the write) it is neither."""
    from queues.zk import consumers as zconsumers

    settings.MRT_STUCK_SECONDS = 300  # no history: a thread is stuck after five minutes
    behind = time.time() - 600

    def iso(epoch: float) -> str:
        return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")

    zconsumers.consumer_register(
        zk,
        "skewed-host-1",
        {
            "host": "skewed-host",
            "pid": 1,
            "steps": ["storing"],
            "started": iso(behind - 3600),
            "updated": iso(behind),
            "publish_seconds": 5,
            "threads": [
                {
                    "thread": "storing-0",
                    "step": "storing",
                    "item": "jid0000000001",
                    "kind": "job",
                    "state": "Storing",
                    "since": iso(behind - 20),
                },
            ],
        },
    )

    (proc,) = stuck.consumer_processes()["consumers"]

    assert not proc["stale"], proc["updated_ago"]
    (thread,) = proc["threads"]
    assert not thread["flagged"] and thread["held"] < 300, thread["held"]
    assert 3000 < proc["uptime"] < 4200, proc["uptime"]
