"""The multiRead request: many node reads in one request, against the real server."""

from __future__ import annotations

import pytest

from queues.zk import multiread
from queues.zk.nodes import exists_many, read_many


def test_reads_data_stats_and_missing_nodes_in_one_request(zk):
    zk.create("/a", b"hello")
    zk.create("/a/lock", b"", ephemeral=True)
    zk.create("/empty", b"")

    reads = read_many(zk, ["/a", "/a/lock", "/empty", "/missing", "/missing/deeper"])

    assert reads["/a"][0] == b"hello"
    assert reads["/a"][1].numChildren == 1
    assert reads["/a/lock"][1].ephemeralOwner == zk.client_id[0]
    assert reads["/empty"][0] == b""
    assert reads["/missing"] is None
    assert reads["/missing/deeper"] is None
    assert multiread.supported(zk)


def test_paths_are_inside_the_clients_chroot(zk, zk_hosts):
    zk.create("/inside", b"mine")
    # Another client at the server's root sees the node under the chroot, not at /inside.
    root = zk_hosts.split("/", 1)[1]
    assert read_many(zk, ["/inside"])["/inside"][0] == b"mine"
    assert read_many(zk, [f"/{root}/inside"])[f"/{root}/inside"] is None


def test_more_reads_than_one_request_carries(zk):
    count = multiread.CHUNK * 2 + 7
    txn = zk.transaction()
    for i in range(count):
        txn.create(f"/n{i:04d}", str(i).encode())
    txn.commit()

    reads = read_many(zk, [f"/n{i:04d}" for i in range(count)])

    assert [reads[f"/n{i:04d}"][0] for i in range(count)] == [str(i).encode() for i in range(count)]


def test_exists_many_gives_stats_or_none(zk):
    zk.create("/here", b"")
    stats = exists_many(zk, ["/here", "/gone"])
    assert stats["/here"].version == 0
    assert stats["/gone"] is None


def test_no_reads_sends_nothing(zk):
    assert read_many(zk, []) == {}


def test_a_server_without_multiread_gets_one_request_per_node(zk, monkeypatch):
    zk.create("/a", b"x")
    # An opcode the server does not know: it answers "unimplemented", as a 3.5 server answers
    # multiRead. The client remembers that and reads node by node from then on.
    monkeypatch.setattr(multiread.MultiReadRequest, "type", 99)

    reads = read_many(zk, ["/a", "/missing"])

    assert reads == {"/a": (b"x", reads["/a"][1]), "/missing": None}
    assert not multiread.supported(zk)
    assert read_many(zk, ["/a"])["/a"][0] == b"x"


@pytest.mark.parametrize(
    "answer",
    [
        b"",  # nothing at all
        b"\x00\x00\x00\x04\x00\xff\xff\xff\xff\x00\x00\x00\x10ab",  # data shorter than announced
        b"\x00\x00\x00\x04\x00\xff\xff\xff\xff",  # a read's header and nothing after it
        b"\x00\x00\x00\x05\x00\xff\xff\xff\xff",  # an operation a read-only multi cannot answer
    ],
)
def test_a_garbled_answer_is_an_error_not_a_wrong_result(answer):
    with pytest.raises(multiread.MalformedAnswer):
        multiread.MultiReadRequest([]).deserialize(answer, 0)


def test_a_multiread_request_is_jutes_getdata_operations_in_a_multi_header_frame():
    """ZooKeeper's MultiOperationRecord of GetDataRequests: per read a MultiHeader (type 4,
    done false, err -1), the path as a length-prefixed string and the watch flag; then the
    closing header (-1, true, -1)."""
    import struct

    from queues.zk.multiread import MultiReadRequest

    paths = ["/jobs/jid0000000001/status", "/a/\u00e9t\u00e9"]
    expected = b"".join(
        struct.pack("!i?i", 4, False, -1)
        + struct.pack("!i", len(p.encode()))
        + p.encode()
        + b"\x00"
        for p in paths
    ) + struct.pack("!i?i", -1, True, -1)
    assert MultiReadRequest(paths).serialize() == expected
