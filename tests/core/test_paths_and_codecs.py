"""The contract's identifiers, paths and byte encodings (no ZooKeeper needed)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from queues.zk import paths
from queues.zk.batches import report_read
from queues.zk.codecs import (
    decode_any,
    decode_int,
    decode_json,
    encode_int,
    encode_json,
    now_stamp,
    parse_stamp,
)
from queues.zk.errors import InvalidID, MalformedNode
from queues.zk.records import Status, evolve

from .helpers import STAMP_RE


@pytest.mark.parametrize(
    ("check", "good", "bad"),
    [
        (paths.bid, "bid0000000042", ["bid42", "bid00000000420", "BID0000000042", "../bid"]),
        (paths.jid, "jid0000000042", ["jid42", "jid0000000042/lock", "", "jid000000004x"]),
        (paths.qid, "qid0000000042", ["qid1", "small/qid0000000042"]),
        (paths.profile, "ucb_lib.test-1", ["", ".", "..", "a/b", "a b", "x" * 101]),
        (paths.access_queue, "large", ["medium", "Large", "small/"]),
    ],
)
def test_identifiers_must_match_their_exact_pattern(check, good: str, bad: list[str]) -> None:
    for _ in range(2):  # the job and batch IDs seen last are remembered: still refused twice
        assert check(good) == good
        for value in bad:
            with pytest.raises(InvalidID):
                check(value)
        for value in (None, 42, ["jid0000000042"]):  # not text, not even hashable
            with pytest.raises(InvalidID):
                check(value)


def test_evolve_is_dataclasses_replace_and_refuses_unknown_fields() -> None:
    status = Status(raw={"status": "Pending"}, version=3, mtime=datetime.now(UTC))
    assert evolve(status, version=4) == replace(status, version=4)
    assert evolve(status, version=4) is not status and status.version == 3
    with pytest.raises(TypeError, match="no field colour"):
        evolve(status, colour="blue")


def test_paths_follow_the_contract_layout() -> None:
    assert paths.job_index_entry("Pending", 5, "jid0000000001") == (
        "/jobs/states/pending/05-jid0000000001"
    )
    assert paths.job_index_entry("Storing", 10, "jid0000000001") == (
        "/jobs/states/storing/10-jid0000000001"
    )
    assert paths.batch_index_entry("bid0000000001", "Completed", "jid0000000002") == (
        "/batches/bid0000000001/states/batch-completed/jid0000000002"
    )
    assert paths.batch_index_entry("bid0000000001", "Held", "jid0000000002").endswith(
        "/states/batch-processing/jid0000000002"
    )
    assert paths.queue_lock("access-small") == "/locks/queue/accessSmall"
    assert paths.collection_lock("ucb_lib") == "/locks/collections/ucb_lib"
    assert paths.access_node("large", "qid0000000003", "token") == (
        "/access/large/qid0000000003/token"
    )


def test_object_locks_replace_each_optional_colon_and_slash_by_one_underscore() -> None:
    ark = "ark:/13030/m5abc?v=1"
    assert paths.object_lock_name(ark) == "ark_13030_m5abc?v=1"
    assert paths.storage_lock(ark) == "/locks/storage/ark_13030_m5abc?v=1"
    assert paths.inventory_lock(ark) == "/locks/inventory/ark_13030_m5abc?v=1"
    assert paths.recording_lock(ark) == "/mrt-console/locks/recording/ark_13030_m5abc?v=1"
    assert paths.object_lock_name("ark:/13030/m5abc") == "ark_13030_m5abc"


def test_json_is_compact_utf8_and_integers_are_plain_text() -> None:
    assert (
        encode_json({"a": 1, "b": [1, 2], "t": "café"}) == '{"a":1,"b":[1,2],"t":"café"}'.encode()
    )
    assert encode_int(5) == b"5"
    assert encode_int(0) == b"0"


def test_json_encoding_is_json_dumps_byte_for_byte() -> None:
    # encode_json keeps one C encoding function for every call (no new encoder per status).
    values = [
        {},
        {"status": "Estimating", "retry_count": 0, "last_successful_status": None},
        {"z": 1.5, "a": [True, False, None, {"n": '\u2028"x\\'}], "é": "ü", "nan": float("nan")},
    ]
    for value in values:
        expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        assert encode_json(value) == expected
        assert encode_json(value) == expected  # nothing is kept from one call to the next
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode_json({"a": object()})
    assert encode_json({"after": "an error"}) == b'{"after":"an error"}'
    assert decode_int("/p", b" 10\n") == 10


@pytest.mark.parametrize("data", [None, b"", b"nope", b"[]", b'"text"', b"\xff"])
def test_json_that_is_not_an_object_is_malformed(data: bytes | None) -> None:
    with pytest.raises(MalformedNode, match=r"^/x/status: "):
        decode_json("/x/status", data)


def test_a_lone_surrogate_escape_is_malformed_and_a_pair_is_its_character() -> None:
    with pytest.raises(MalformedNode, match="lone surrogate"):
        decode_json("/x/status", b'{"a":{"b":["x\\udc00"]}}')
    with pytest.raises(MalformedNode, match="lone surrogate"):
        decode_json("/x/status", b'{"\\ud800":1}')  # a key too
    assert decode_json("/x/status", b'{"a":"\\ud83d\\ude00 \\u001b"}') == {"a": "\U0001f600 \x1b"}
    assert decode_any(b'{"a":"x\\ud800"}') == '{"a":"x\\ud800"}'  # its text, not the value


@pytest.mark.parametrize(
    ("data", "least", "most"),
    [(b"100", 0, 99), (b"-1", 0, 99), (b"9" * 41, None, None), ("\u0665".encode(), None, None)],
)
def test_an_integer_node_outside_its_range_or_not_ascii_is_malformed(
    data: bytes, least: int | None, most: int | None
) -> None:
    with pytest.raises(MalformedNode, match=r"^/x/priority: "):
        decode_int("/x/priority", data, least, most)


def test_a_status_report_as_read_keeps_job_ids_and_whole_counts_only() -> None:
    ids = [f"jid{n:010d}" for n in range(3)]
    odd: list[object] = [ids[0], 5, [1], "nope", ids[1] + "\n" + ids[2], "jid000000000\uff11"]
    head = report_read(
        "/b/status-report",
        json.dumps(
            {
                "failed_jobs": odd,
                "successful_jobs": ids,
                "failed_count": -1,
                "successful_count": True,
                "history": [{"failed_jobs": 7}, "not a report"],
            }
        ).encode(),
    )
    assert head["failed_jobs"] == [ids[0]]
    assert head["successful_jobs"] == ids
    assert "failed_count" not in head and "successful_count" not in head
    assert head["history"] == [{"failed_jobs": []}]


def test_timestamp_is_local_time_with_a_numeric_offset() -> None:
    assert STAMP_RE.fullmatch(now_stamp())
    moment = datetime(2026, 11, 21, 10, 2, 3, tzinfo=timezone(timedelta(hours=-8)))
    stamp = now_stamp(moment)
    assert STAMP_RE.fullmatch(stamp)
    assert parse_stamp(stamp) == moment


@pytest.mark.parametrize("value", [None, "", 5, "yesterday"])
def test_unparseable_timestamp_reads_as_none(value: object) -> None:
    assert parse_stamp(value) is None


def test_iso_timestamps_from_other_tools_are_understood() -> None:
    assert parse_stamp("2026-11-21T10:02:03-08:00") == datetime(
        2026, 11, 21, 10, 2, 3, tzinfo=timezone(timedelta(hours=-8))
    )


def test_dump_decoding_never_fails() -> None:
    assert decode_any(b"") is None
    assert decode_any(b'{"a":1}') == {"a": 1}
    assert decode_any(b"bid0000000001") == "bid0000000001"
    assert decode_any(b"\xff\x00") == "<2 bytes of binary data>"
