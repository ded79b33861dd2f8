"""Property tests of the contract's codecs and identifier patterns: whatever bytes another
client writes, decoding either succeeds or raises MalformedNode naming the node; nothing that is
not an exact ID ever reaches a ZooKeeper path."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from queues.zk import paths
from queues.zk.codecs import (
    TIMESTAMP_FORMAT,
    decode_any,
    decode_int,
    decode_json,
    decode_str,
    encode_int,
    encode_json,
    encode_str,
    now_stamp,
    parse_stamp,
)
from queues.zk.errors import InvalidID, MalformedNode
from queues.zk.jobs import new_status, next_status
from queues.zk.records import Status

NODE = "/jobs/jid0000000001/status"

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
json_objects = st.dictionaries(st.text(), json_values, max_size=6)
# Bytes that look like what a careless client writes: near-JSON, numbers, text, binary.
garbage = (
    st.binary(max_size=200)
    | st.text(max_size=200).map(str.encode)
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.sampled_from([b"", b"null", b"[]", b'"x"', b"{", b"NaN", b"1e999", b"\xff\xfe"])
)


@given(json_objects)
def test_json_objects_round_trip(value: dict[str, Any]) -> None:
    assert decode_json(NODE, encode_json(value)) == value


@given(st.integers())
def test_integers_round_trip(value: int) -> None:
    assert decode_int(NODE, encode_int(value)) == value


@given(st.text())
def test_strings_round_trip(value: str) -> None:
    assert decode_str(NODE, encode_str(value)) == value


def _decodes_or_names_the_node(decode: Any, data: bytes) -> None:
    try:
        decode(NODE, data)
    except MalformedNode as exc:
        assert exc.path == NODE
        assert str(exc).startswith(NODE)


@given(garbage)
@example(b"[" * 20_000)  # nesting deeper than the JSON decoder's recursion
@example(b"9" * 5_000)  # longer than Python's integer conversion limit
def test_json_decoding_of_garbage_raises_only_malformed_node(data: bytes) -> None:
    _decodes_or_names_the_node(decode_json, data)


@given(garbage)
@example(b"9" * 5_000)
def test_integer_decoding_of_garbage_raises_only_malformed_node(data: bytes) -> None:
    _decodes_or_names_the_node(decode_int, data)


@given(garbage)
def test_string_decoding_of_garbage_raises_only_malformed_node(data: bytes) -> None:
    _decodes_or_names_the_node(decode_str, data)


@given(garbage)
@example(b"[" * 20_000)
def test_dump_decoding_never_raises(data: bytes) -> None:
    decode_any(data)


@given(st.one_of(st.text(max_size=60), st.integers(), st.none(), st.floats()))
def test_timestamp_parsing_never_raises(value: Any) -> None:
    parse_stamp(value)


def test_own_timestamps_parse_back() -> None:
    assert parse_stamp(now_stamp()) is not None


# Identifiers -------------------------------------------------------------------------------

VALIDATORS = [
    (paths.bid, r"bid[0-9]{10}", "bid"),
    (paths.jid, r"jid[0-9]{10}", "jid"),
    (paths.qid, r"qid[0-9]{10}", "qid"),
    # "." and ".." are path steps, not names: the validator rightly refuses them.
    (paths.profile, r"(?!\.\.?$)[A-Za-z0-9_.-]{1,100}", "ucb_"),
]


def near_ids(prefix: str) -> st.SearchStrategy[str]:
    """Strings close to an ID: the prefix, some digits, maybe something around them."""
    digits = st.text("0123456789", min_size=8, max_size=12)
    noise = st.sampled_from(["", "/", "\n", " ", "/..", "/lock", "x", "\x00", "٣", "../"])
    return st.builds(lambda a, d, b: a + prefix + d + b, noise, digits, noise)


@pytest.mark.parametrize(("check", "pattern", "prefix"), VALIDATORS)
@given(data=st.data())
def test_validators_accept_exactly_their_pattern(check, pattern: str, prefix: str, data) -> None:
    value = data.draw(
        st.one_of(st.text(max_size=30), near_ids(prefix), st.sampled_from([".", ".."]))
    )
    matches = re.fullmatch(pattern, value, flags=re.ASCII) is not None
    try:
        assert check(value) == value
    except InvalidID as exc:
        assert not matches, f"{value!r} matches {pattern} but was refused: {exc}"
    else:
        assert matches, f"{value!r} was accepted but does not match {pattern}"


@given(st.text(max_size=40))
def test_accepted_ids_never_add_path_levels(value: str) -> None:
    for build, depth in ((paths.batch, 2), (paths.job, 2), (paths.collection_lock, 3)):
        try:
            built = build(value)
        except InvalidID:
            continue
        assert built.count("/") == depth
        assert ".." not in built.split("/")


@given(st.text(max_size=40))
def test_non_ids_are_refused_before_any_path_is_built(value: str) -> None:
    for build in (paths.job_node, paths.batch_node):
        if re.fullmatch(r"[bj]id[0-9]{10}", value, flags=re.ASCII):
            continue
        with pytest.raises(InvalidID):
            build(value, "status")


@given(st.text(max_size=60))
def test_object_lock_names_have_no_slash_and_one_underscore_per_separator(ark: str) -> None:
    try:
        name = paths.object_lock_name(ark)
    except InvalidID:
        # Only what is no node name ZooKeeper takes: empty, "." or "..", a control character,
        # a surrogate or another character ZooKeeper refuses.
        assert ark in ("", ".", "..") or paths.NODE_NAME_BAD_CHARS.search(ark)
        return
    assert "/" not in name
    separators = ark.count("/")  # each ":/" or "/" (the contract's `:?/`) becomes one "_"
    assert name.count("_") == ark.count("_") + separators
    assert len(name) == len(ark) - ark.count(":/")


@given(st.integers(0, 99), st.integers(0, 9_999_999_999))
def test_index_names_parse_back_to_priority_and_job(priority: int, number: int) -> None:
    jid = f"jid{number:010d}"
    match = paths.INDEX_ENTRY_RE.fullmatch(paths.index_name(priority, jid))
    assert match is not None
    assert (int(match.group(1)), match.group(2)) == (priority, jid)


@given(json_objects)
def test_unknown_status_keys_survive_a_transition(extra: dict[str, Any]) -> None:
    status_json = new_status("Pending")
    raw = {**extra, **status_json}
    status = Status(raw=raw, version=0, mtime=parse_stamp(now_stamp()))

    after = next_status(status, "Estimating", message="", retry=False, permanent=False)

    for key, value in extra.items():
        if key not in status_json and key != "resumable":
            assert after[key] == value


def test_now_stamp_is_the_current_second_in_local_time() -> None:
    """Made once a second and reused within it: always the second it is asked in."""
    for _ in range(3):
        before = datetime.now().astimezone().replace(microsecond=0)
        stamp = now_stamp()
        after = datetime.now().astimezone()
        assert before <= datetime.strptime(stamp, TIMESTAMP_FORMAT) <= after
        assert stamp == now_stamp() or now_stamp() > stamp
        time.sleep(0.6)
