"""The benchmark loader writes exactly the contract's layout, so what is measured is real."""

from __future__ import annotations

from kazoo.client import KazooClient

from bench.loader import bulk_load, counts_for, transition_rate
from queues.operator.check import run_check
from queues.zk.batches import batch_ids, batches_load
from queues.zk.jobs import index_entries, jobs_load
from queues.zk.records import Batch, Job


def test_counts_add_up_to_the_jobs_asked_for() -> None:
    counts = counts_for(1001, {"Completed": 0.6, "Failed": 0.3, "Pending": 0.1})
    assert sum(counts.values()) == 1001
    assert counts["Completed"] >= 600


def test_loaded_queue_passes_the_consistency_check(zk: KazooClient) -> None:
    result = bulk_load(zk, batches=7, jobs=300)

    report = run_check(zk)
    assert report.findings == []
    assert report.jobs == 300
    assert report.batches == 7
    for state, jids in result.jobs_by_state.items():
        assert sorted(j for _p, j in index_entries(zk, state)) == sorted(jids)
    loaded = jobs_load(zk, [j for jids in result.jobs_by_state.values() for j in jids])
    assert all(isinstance(j, Job) for j in loaded)
    assert {j.state for j in loaded} == set(result.jobs_by_state)


def test_batches_are_finished_only_when_all_their_jobs_are(zk: KazooClient) -> None:
    bulk_load(zk, batches=10, jobs=200)

    for batch in batches_load(zk, batch_ids(zk)):
        assert isinstance(batch, Batch)
        if batch.state in ("Completed", "Failed"):
            assert batch.report is not None
        else:
            assert batch.state == "Processing"


def test_rate_probe_counts_transactions_and_cleans_up(zk_hosts: str, zk: KazooClient) -> None:
    rate = transition_rate(zk_hosts, threads=2, seconds=0.5, items=10)

    assert rate.transactions > 0
    assert not [n for n in zk.get_children("/") if n.startswith("bench-rate")]
