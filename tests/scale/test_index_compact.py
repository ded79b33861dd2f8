"""The read index keeps jobs as numbers in flat arrays: IDs come back byte-exact, IDs that are
not of the contract's form still work (kept as strings), and the tables answer like the
dictionaries they replace."""

from __future__ import annotations

import gc
import os
import random
import re
import subprocess
import sys
import tracemalloc
from array import array
from pathlib import Path
from types import SimpleNamespace

import pytest

from queues.zk import index, packed
from queues.zk.errors import InvalidID
from queues.zk.index import ReadIndex
from queues.zk.packed import (
    NUM_BITS,
    NUM_MASK,
    ODD_BASE,
    PRIO_BITS,
    Entries,
    JobCodes,
    KeyTable,
    NumberMap,
    PackedTable,
    parse_entries,
)

ROOT = Path(__file__).resolve().parents[2]

ODD_IDS = [
    "jid123",  # too short
    "jid00000000012",  # too long
    "JID0000000001",  # another case
    "jid000000000\u0661",  # an Arabic-Indic digit: int() would take it, the form does not
    "jid0000000001\n",  # a trailing newline ($ would match before it)
    " jid0000000001",
    "jid+000000001",
    "jid_000000001",
    "legacy-7",
    "ü",
    "",
]


def test_contract_ids_are_numbers_that_give_the_id_back_exactly() -> None:
    codes = JobCodes()
    for jid in ("jid0000000000", "jid0000000001", "jid0123456789", "jid9999999999"):
        number = codes.number(jid)
        assert number < ODD_BASE
        assert codes.jid(number) == jid
        assert codes.jid(number).encode() == jid.encode()
    assert len(codes) == 0  # no string kept for any of them


def test_other_ids_are_kept_as_strings_and_round_trip() -> None:
    codes = JobCodes()
    numbers = [codes.number(j) for j in ODD_IDS]
    assert all(n >= ODD_BASE for n in numbers)
    assert len(set(numbers)) == len(ODD_IDS)
    assert [codes.jid(n) for n in numbers] == ODD_IDS
    assert [codes.number(j) for j in ODD_IDS] == numbers  # the same number again
    assert codes.known("never-seen") is None and codes.known("jid0000000042") == 42


def test_entries_read_like_the_list_of_pairs_they_replace() -> None:
    pairs = [(5, "jid0000000003"), (2, "jid0000000009"), (5, "jid0000000001"), (99, "jid0")]
    names = [f"{p:02d}-{j}" for p, j in pairs]
    raw = b"".join(len(n).to_bytes(4, "big") + n.encode() for n in names)
    raw = len(names).to_bytes(4, "big") + raw
    entries = Entries(parse_entries(raw))
    expected = sorted(p for p in pairs if len(p[1]) == 13)  # "jid0" is no index entry
    assert entries == expected and list(entries) == expected and len(entries) == 3
    assert entries[0] == expected[0] and entries[-1] == expected[-1]
    assert entries[1:] == expected[1:] and entries[::-1] == expected[::-1]
    with pytest.raises(IndexError):
        entries[3]
    assert entries.jids() == [j for _p, j in expected]
    assert entries.where(lambda p, _n: p == 5) == [e for e in expected if e[0] == 5]


@pytest.mark.parametrize("window", [1 << 20, 20, 21, 39, 64, 1000])
def test_entries_parse_as_one_match_a_name_would(window: int, monkeypatch) -> None:
    """``parse_entries`` sorts and converts in C, a window of the answer at a time; the rule
    it keeps is one regular expression match per name, each name's priority and number as
    two ints (its former reading), whatever the windows cut."""
    monkeypatch.setattr(packed, "_PARSE_WINDOW", window)
    rng = random.Random(11)
    odd = ["123456789012abcd", "ab-jid0000000001", "05-jid00000000012", "05-jid000000001", "x"]
    for _ in range(50):
        names = [
            f"{rng.choice([0, 5, 50, rng.randrange(100)]):02d}-jid{rng.randrange(10**10):010d}"
            for _ in range(rng.randrange(300))
        ] + rng.sample(odd, rng.randrange(len(odd)))
        rng.shuffle(names)
        raw = len(names).to_bytes(4, "big") + b"".join(
            len(n).to_bytes(4, "big") + n.encode() for n in names
        )
        one_by_one = sorted(
            int(m[1]) << packed.NUM_BITS | int(m[2])
            for m in re.finditer(rb"\x00\x00\x00\x10([0-9]{2})-jid([0-9]{10})", raw)
        )
        assert list(parse_entries(raw)) == one_by_one


def test_packed_table_answers_like_a_dictionary() -> None:
    rng = random.Random(3)
    table = PackedTable(packed.FACT_BITS)
    model: dict[int, int] = {}
    for _ in range(30_000):
        number = rng.choice([rng.randrange(0, 2**34), rng.randrange(0, 5000)])
        value = rng.randrange(0, 2**packed.FACT_BITS)
        table.set(number, value)
        model[number] = value
    for number, value in model.items():
        assert table.get(number) == value
    assert table.get(2**34 - 1) == model.get(2**34 - 1)
    assert len(table) == len(model)
    table.compact()
    assert all(table.get(n) == v for n, v in model.items()) and len(table) == len(model)


def test_a_number_map_answers_like_a_dictionary_of_wide_values() -> None:
    rng = random.Random(5)
    table = NumberMap([(7, 2**62), (3, -1)])
    model: dict[int, int] = {7: 2**62, 3: -1}
    for _ in range(20_000):  # past the tail's limit: merged into the arrays several times
        number = rng.choice([rng.randrange(0, 2**40), rng.randrange(0, 3000)])
        value = rng.randrange(-(2**63), 2**63)
        table[number] = value
        model[number] = value
    assert len(table) == len(model) and set(table) == set(model)
    assert all(table.get(n) == v for n, v in model.items())
    assert table.get(2**41) is None and 2**41 not in table and "7" not in table
    copy = table.copy()
    assert not copy.tail and list(copy.keys) == sorted(model) and dict(copy.items()) == model
    table[5] = 1  # a copy does not change with its original
    assert (5 in table, 5 in copy) == (True, model.get(5) is not None)


def test_a_number_map_forgets_what_a_sorted_array_does_not_hold() -> None:
    table = NumberMap((n, n * 10) for n in range(0, 100, 2))
    table[1001] = 5  # in the tail
    table.retain_sorted(array("q", [*range(0, 100, 2), 1001]))
    assert not table.tail and list(table.keys) == [*range(0, 100, 2), 1001]  # nothing forgotten
    kept = table.keys
    table.retain_sorted(array("q", kept))
    assert table.keys is kept  # the same numbers: compared, not rebuilt
    table.retain_sorted(array("q", [4, 5, 40, 1001, 2000]))
    assert dict(table.items()) == {4: 40, 40: 400, 1001: 5}


def test_key_table_finds_every_job_of_a_key() -> None:
    table = KeyTable()
    model: dict[str, set[int]] = {}
    rng = random.Random(5)
    for i in range(20_000):
        key = f"local-{rng.randrange(0, 8000)}"
        number = rng.choice([i, ODD_BASE + i % 7])
        table.add(key, number)
        model.setdefault(key, set()).add(number)
    for key, numbers in model.items():
        assert numbers <= set(table.find(key))  # a superset: the hash is checked by callers
    table.compact()
    for key, numbers in model.items():
        assert numbers <= set(table.find(key))


def test_merging_additions_into_a_table_gives_the_sorted_union() -> None:
    rng = random.Random(11)
    main = array("q", sorted(rng.randrange(0, 2**62) for _ in range(50_000)))
    for added in (
        sorted(rng.randrange(0, 2**62) for _ in range(5_000)),
        [0, 1, 2],  # before every element
        [2**62 + 1, 2**62 + 2],  # after every element
        [main[0], main[100], main[-1]],  # equal to elements already there
        [],
    ):
        assert packed._merged(main, added) == array("q", sorted([*main, *added]))
    assert packed._merged(array("q"), [3, 4]) == array("q", [3, 4])


def test_sorted_parts_merge_as_one_sort_orders_them() -> None:
    rng = random.Random(11)
    sizes = [3 * packed.MERGE_BLOCK, 20_000, 5, 0, 1, packed.MERGE_BLOCK // 2]
    parts = [array("q", sorted(rng.randrange(-5, 1 << 40) for _ in range(n))) for n in sizes]
    parts.append(array("q", [7] * 40_000))  # many equal keys: one cut holds them all
    every = sorted(k for part in parts for k in part)
    assert list(packed.merged_sorted(parts)) == every
    assert list(packed.merged_sorted([parts[2]])) == list(parts[2])
    assert list(packed.merged_sorted([])) == [] and packed.merged_sorted([parts[0]]) is not parts[0]


def test_the_runs_of_a_listing_give_its_numbers_and_age_keys_sorted() -> None:
    rng = random.Random(12)
    pairs = {(rng.choice([0, 3, 5, 5, 5, 99]), rng.randrange(1, 10**10)) for _ in range(50_000)}
    run_keys = array("q", sorted(p << NUM_BITS | n for p, n in pairs))
    assert list(packed.numbers_sorted(run_keys)) == sorted(n for _p, n in pairs)
    assert list(packed.age_keys(run_keys)) == sorted(n << PRIO_BITS | p for p, n in pairs)
    assert list(packed.numbers_sorted(array("q"))) == [] == list(packed.age_keys(array("q")))


def _merge_peak(n: int) -> float:
    """Bytes a key ``merged_sorted`` held at most besides its answer, merging ``n`` keys in
    ten parts (in a fresh interpreter, as ``_per_job_table_bytes``)."""
    rng = random.Random(13)
    parts = [array("q", sorted(rng.randrange(1 << 40) for _ in range(n // 10))) for _ in range(10)]
    tracemalloc.start()
    merged = packed.merged_sorted(parts)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (peak - merged.buffer_info()[1] * merged.itemsize) / n


def measured_alone(module: str, function: str, n: int) -> float:
    """``module.function(n)`` run in a fresh interpreter (Django set up), its figure: what
    tracemalloc counts there is the call's own (``test_per_job_memory_of_the_tables_is_small``
    says why)."""
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import django; django.setup(); from {module} import {function} as m; print(m({n}))",
        ],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "mrtadmin.settings"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    return float(child.stdout.split()[-1])


@pytest.mark.slow
def test_a_merge_of_sorted_parts_holds_a_block_of_python_ints_at_most() -> None:
    """Merging a million keys held a few bytes a key (one sort of them all held about 50)."""
    assert measured_alone("tests.scale.test_index_compact", "_merge_peak", 1_000_000) < 8


def test_a_merge_makes_no_python_int_per_element_of_the_table() -> None:
    """Compacting a table of 400,000 keys: at most the new array and the sorted additions
    besides the old array (sorting all together made a 32-byte int and a list slot for each
    of them, the read index's memory peak during the fill at a million jobs)."""
    rng = random.Random(13)
    table = KeyTable()
    table.main = array("q", sorted(rng.randrange(0, 2**62) for _ in range(400_000)))
    for n in range(20_000):
        table.add(f"key-{n}", n)
    assert table.tail
    gc.collect()
    tracemalloc.start()
    try:
        table.compact()
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(table.main) == 420_000 and not table.tail
    # The new array (8 bytes a key) and the 20,000 additions sorted (about 40 bytes each);
    # sorting all together allocated about 50 bytes a key, 22 MB here.
    assert peak < 2 * 8 * 420_000, peak


def test_a_table_keeps_a_bounded_number_of_additions_outside_its_array() -> None:
    assert packed._tail_limit(0) == packed.TAIL_MIN
    assert packed._tail_limit(100_000) == 100_000 >> 3
    assert packed._tail_limit(10_000_000) == packed.TAIL_MAX


def test_an_id_not_of_the_contract_form_keeps_its_string_through_the_tables() -> None:
    """Such an ID never comes from an index listing (the entries' form is fixed) and the
    contract's paths refuse it, but the index's tables hold whatever number it is given."""
    fake = SimpleNamespace(add_listener=lambda _f: None, remove_listener=lambda _f: None)
    idx = ReadIndex(fake)  # type: ignore[arg-type]
    odd, usual = "legacy-job-7", "jid0000000007"
    with idx._lock:
        for jid in (odd, usual):
            idx._facts.set(idx.codes.number(jid), idx._pair("p", jid) << 1)
            idx._keys.add("shared-local", idx.codes.number(jid))
    assert sorted(idx.codes.jid(n) for n in idx._keys.find("shared-local")) == [usual, odd]
    assert (
        idx.job_facts_by_number([idx.codes.number(odd)], read=False)[
            idx.codes.number(odd)
        ].submitter
        == odd
    )


def test_the_contract_paths_still_refuse_a_malformed_id(zk) -> None:
    idx = ReadIndex(zk)
    try:
        with pytest.raises(InvalidID):
            idx.job_facts(["legacy-job-7"])
    finally:
        idx.close()


def _per_job_table_bytes(jobs: int) -> float:
    """Bytes a job of what the index keeps for `jobs` jobs in two states with two search keys
    each, by tracemalloc."""
    fake = SimpleNamespace(add_listener=lambda _f: None, remove_listener=lambda _f: None)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        idx = ReadIndex(fake)  # type: ignore[arg-type]
        run = array("q", sorted((n % 10) << packed.NUM_BITS | n for n in range(jobs)))
        listing = index._Listing([], Entries(run))
        ReadIndex._by_age(listing)
        with idx._lock:
            for n in range(jobs):
                idx._facts.set(n, idx._pair(f"coll_{n % 40}", f"user {n % 7}") << 1)
                idx._keys.add(f"local-{n}", n)
                idx._keys.add(f"ark:/99999/fk4{n:08d}", n)
            idx._facts.compact()
            idx._keys.compact()
        gc.collect()
        per_job = (tracemalloc.get_traced_memory()[0] - before) / jobs
    finally:
        tracemalloc.stop()
    assert listing.entries is not None and len(listing.entries) == jobs
    return per_job


@pytest.mark.slow
def test_per_job_memory_of_the_tables_is_small() -> None:
    """What the index keeps for 100,000 jobs: a few dozen bytes a job (a dictionary entry alone
    costs more). Measured in a fresh interpreter: tracemalloc counts every thread's
    allocations, and in a long pytest process threads other tests left behind (a kazoo client
    closing, a server reader) allocate inside the window; in the whole suite they added 20
    bytes a job."""
    per_job = measured_alone("tests.scale.test_index_compact", "_per_job_table_bytes", 100_000)
    assert per_job < 60, per_job


def test_a_job_is_found_in_each_priority_run_and_the_oldest_is_the_lowest_number() -> None:
    pairs = [(9, 40), (1, 7), (1, 3), (5, 2), (5, 11), (9, 1)]
    run = array("q", sorted(p << packed.NUM_BITS | n for p, n in pairs))
    listing = index._Listing([], Entries(run))
    blocks = ReadIndex._priority_blocks(listing)
    assert [p for p, _i in blocks] == [1, 5, 9]
    for _p, n in pairs:
        assert packed.has_number(run, blocks, n)
    assert not any(packed.has_number(run, blocks, n) for n in (0, 4, 39, 41, 2**34 - 1))
    assert ReadIndex._oldest(listing) == "09-jid0000000001"
    assert ReadIndex._oldest(index._Listing([], Entries(array("q")))) is None


def test_the_jobs_with_matching_facts_are_found_as_one_lookup_per_entry_finds_them() -> None:
    """A collection or submitter filter takes the set of jobs whose facts match, then keeps
    the entries of those jobs in one comprehension; it answers as testing each entry did."""
    rng = random.Random(5)
    table = PackedTable(packed.FACT_BITS)
    model: dict[int, int] = {}
    for _ in range(5_000):  # main array and recent additions both
        n, v = rng.randrange(20_000), rng.randrange(40)
        table.set(n, v)
        model[n] = v
        if rng.random() < 0.001:
            table.compact()
    wanted = {3, 4, 17}
    expected = {n for n, v in model.items() if v in wanted}
    assert table.numbers_with(wanted, len(expected)) == expected
    assert table.numbers_with(wanted, len(expected) - 1) is None  # too many: another way
    names = [f"{rng.randrange(100):02d}-jid{rng.randrange(20_000):010d}" for _ in range(3_000)]
    raw = len(names).to_bytes(4, "big") + b"".join(
        len(n).to_bytes(4, "big") + n.encode() for n in names
    )
    run = Entries(parse_entries(raw))
    by_age = sorted((k & NUM_MASK) << PRIO_BITS | k >> NUM_BITS for k in run.keys)
    oldest = Entries(array("q", by_age), by_age=True)
    for entries in (run, oldest, Entries(oldest.keys, by_age=True, reverse=True)):
        one_by_one = entries.where(lambda _p, n: model.get(n) in wanted)
        assert list(entries.with_numbers(expected)) == list(one_by_one)
