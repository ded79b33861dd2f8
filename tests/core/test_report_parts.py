"""Status reports of any size on a server that takes ZooKeeper's default 1 MiB per request:
a report too large for one node keeps its lists in part nodes below ``status-report``
(docs/zookeeper-contract-notes.md, "Status reports of any size")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from queues.zk import batches, sized
from queues.zk.batches import batch_create, batch_load, batch_remove, batch_transition
from queues.zk.errors import MalformedNode
from queues.zk.records import Batch


def jids(start: int, count: int) -> list[str]:
    return [f"jid{n:010d}" for n in range(start, start + count)]


@pytest.fixture
def batch(zk_1mib: Any) -> Batch:
    made = batch_create(zk_1mib, submission={"profile": "demo", "batchID": "bid-reports"})
    for state in ("Processing", "Reporting"):
        made = batch_transition(zk_1mib, made, state)
    return made


def head_of(zk: Any, bid: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(zk.get(f"/batches/{bid}/status-report")[0])
    return value


def sizes(zk: Any, bid: str) -> list[int]:
    path = f"/batches/{bid}/status-report"
    return [len(zk.get(path)[0])] + [len(zk.get(f"{path}/{n}")[0]) for n in zk.get_children(path)]


def test_a_report_too_large_for_one_node_is_kept_in_parts_and_reads_back_whole(
    zk_1mib: Any, batch: Batch
) -> None:
    failed, successful = jids(0, 5_000), jids(5_000, 95_000)
    written = batches.batch_write_report(zk_1mib, batch, failed=failed, successful=successful)
    assert written["failed_jobs"] == failed and written["successful_jobs"] == successful

    head = head_of(zk_1mib, batch.bid)
    # The contract's keys stay, as lists; the counts and the parts say where the IDs are.
    assert head["failed_jobs"] == [] and head["successful_jobs"] == []
    assert (head["failed_count"], head["successful_count"]) == (5_000, 95_000)
    assert sorted(zk_1mib.get_children(f"/batches/{batch.bid}/status-report")) == head["parts"]
    assert len(head["parts"]) >= 2
    assert max(sizes(zk_1mib, batch.bid)) <= sized.NODE_BUDGET

    loaded = batch_load(zk_1mib, batch.bid)
    assert batches.report_counts(loaded.report) == (5_000, 95_000)
    whole = batches.report_resolve(zk_1mib, batch.bid, loaded.report)
    assert whole is not None
    assert whole["failed_jobs"] == failed and whole["successful_jobs"] == successful
    assert "parts" not in whole


def test_a_report_that_fits_keeps_the_contract_form_and_history_moves_out_oldest_first(
    zk_1mib: Any, batch: Batch
) -> None:
    # 25,000 IDs are about 400 KiB: two reports fit one node, three do not.
    first, second, third = jids(0, 25_000), jids(30_000, 25_000), jids(60_000, 25_000)
    for ids in (first, second):
        batches.batch_write_report(zk_1mib, batch, failed=[], successful=ids)
    head = head_of(zk_1mib, batch.bid)
    assert "parts" not in head and head["history"][0]["successful_jobs"] == first
    assert zk_1mib.get_children(f"/batches/{batch.bid}/status-report") == []

    batches.batch_write_report(zk_1mib, batch, failed=[], successful=third)
    head = head_of(zk_1mib, batch.bid)
    assert head["successful_jobs"] == third and "parts" not in head
    newer, oldest = head["history"]
    assert newer["successful_jobs"] == second and "parts" not in newer
    assert oldest["successful_jobs"] == [] and oldest["successful_count"] == 25_000
    whole = batches.report_resolve(zk_1mib, batch.bid, head)
    assert whole is not None
    assert [h["successful_jobs"] for h in whole["history"]] == [second, first]
    assert max(sizes(zk_1mib, batch.bid)) <= sized.NODE_BUDGET


def test_parts_no_report_names_any_more_are_deleted(zk_1mib: Any, batch: Batch) -> None:
    batches.batch_write_report(zk_1mib, batch, failed=jids(0, 70_000), successful=[])
    big = head_of(zk_1mib, batch.bid)
    for n in range(batches.REPORT_HISTORY + 1):
        batches.batch_write_report(zk_1mib, batch, failed=[], successful=jids(n, 1))
    # The large report has left the history, and its parts with it.
    assert zk_1mib.get_children(f"/batches/{batch.bid}/status-report") == []
    # A reader still holding the old head reads the node again instead of failing.
    again = batches.report_resolve(zk_1mib, batch.bid, big)
    assert again is not None and again == head_of(zk_1mib, batch.bid)


def test_a_missing_part_is_named_not_read_as_fewer_jobs(zk_1mib: Any, batch: Batch) -> None:
    batches.batch_write_report(zk_1mib, batch, failed=jids(0, 70_000), successful=[])
    head = head_of(zk_1mib, batch.bid)
    lost = head["parts"][-1]
    zk_1mib.delete(f"/batches/{batch.bid}/status-report/{lost}")
    with pytest.raises(MalformedNode, match=lost):
        batches.report_resolve(zk_1mib, batch.bid, head)


def test_deleting_a_batch_removes_its_report_parts(zk_1mib: Any, batch: Batch) -> None:
    batches.batch_write_report(zk_1mib, batch, failed=jids(0, 70_000), successful=[])
    failed = batch_transition(zk_1mib, batch_load(zk_1mib, batch.bid), "Failed")
    batch_remove(zk_1mib, failed)
    assert zk_1mib.exists(f"/batches/{batch.bid}") is None


def test_a_write_past_the_limit_is_refused_before_it_is_sent(zk_1mib: Any, batch: Batch) -> None:
    batches.batch_write_report(zk_1mib, batch, failed=[], successful=jids(0, 10))
    before = head_of(zk_1mib, batch.bid)
    with pytest.raises(sized.TooLarge, match=r"jute\.maxbuffer"):
        batches.batch_report_update(zk_1mib, batch.bid, {"note": "x" * sized.JUTE_MAXBUFFER})
    assert head_of(zk_1mib, batch.bid) == before
    assert zk_1mib.connected


def test_a_submission_past_the_limit_is_refused_before_anything_is_created(zk_1mib: Any) -> None:
    zk_1mib.ensure_path("/batches")
    with pytest.raises(sized.TooLarge, match="submission"):
        batch_create(zk_1mib, submission={"profile": "demo", "title": "t" * (1024 * 1024)})
    assert zk_1mib.get_children("/batches") == []
    assert zk_1mib.connected


@pytest.mark.parametrize("key", sorted(batches.REPORT_KEYS))
def test_marks_may_not_name_the_reports_own_keys(zk_1mib: Any, batch: Batch, key: str) -> None:
    path = f"/batches/{batch.bid}/status-report"
    with pytest.raises(ValueError, match=key):
        batches.batch_write_report(zk_1mib, batch, failed=[], successful=jids(0, 3), marks={key: 1})
    assert zk_1mib.exists(path) is None  # nothing written

    batches.batch_write_report(zk_1mib, batch, failed=[], successful=jids(0, 3), marks={"round": 2})
    before = zk_1mib.get(path)
    with pytest.raises(ValueError, match=key):
        batches.batch_report_update(zk_1mib, batch.bid, {"mailed": True, key: []})
    assert zk_1mib.get(path) == before  # nor changed
    after = batches.batch_report_update(zk_1mib, batch.bid, {"mailed": True})
    assert after["round"] == 2 and after["mailed"] is True
    assert after["successful_jobs"] == jids(0, 3)
