"""How the read index (``index``) keeps a million jobs in about 60 bytes each: a job is a number,
not a string, and every per-job structure is a flat ``array`` of 64-bit integers with the job's
number packed beside what is kept of it.

A job ID of the contract's form (``jid`` and ten digits) is kept as its number, from which the
ID is written back exactly; any other ID gets a number of its own past the ten-digit range and
its string is kept once (``JobCodes``). A state folder's entries are (priority, number) run keys
(``Entries``, parsed straight from a listing's bytes by ``parse_entries``); facts and search
keys are sorted arrays with a small dictionary of additions merged in run by run
(``PackedTable``, ``KeyTable``); values too wide to pack beside a number are a second array
(``NumberMap``). Arrays made of sorted arrays are merged a range at a time (``merged_sorted``),
never sorted again as Python ints. ``give_back_memory`` returns what a fill's reads freed to
the system.
"""

from __future__ import annotations

import builtins
import re
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any, overload

# Job numbers. A contract job ID is "jid" and ten digits: its number is below 10**10 (< 2**34)
# and gives the ID back exactly. Any other ID is numbered from 10**10 on (a side table).
JID_FORM = re.compile(r"jid([0-9]{10})")
ODD_BASE = 10**10
NUM_BITS = 34
NUM_MASK = (1 << NUM_BITS) - 1
PRIO_BITS = 7  # priorities are two digits
PRIO_MASK = (1 << PRIO_BITS) - 1
# Facts: number << 25 | (pair index << 1 | no ARK yet).
FACT_BITS = 25
FACT_MASK = (1 << FACT_BITS) - 1
NO_ARK = 1
MAX_PAIRS = (1 << (FACT_BITS - 1)) - 1
# Search keys: 29 bits of the key's hash << 34 | number (a hash match is checked by the caller).
HASH_BITS = 29
HASH_MASK = (1 << HASH_BITS) - 1
# Additions kept in a table's dictionary before they are merged into its sorted array: an
# eighth of the array, at most TAIL_MAX (a dictionary entry costs 100-170 bytes where the array
# costs 8, so an unbounded eighth was 30-40 MB at a million jobs).
TAIL_MIN = 4096
TAIL_MAX = 1 << 16
# A state folder's answer, read from the bytes: each name is its length (16) and then
# "PP-jid" and ten digits. No name holds a NUL byte, so a match can only start at a length.
_RAW_ENTRY = re.compile(rb"\x00\x00\x00\x10([0-9]{2}-jid[0-9]{10})")
_ENTRY_BYTES = 20
_TEN_DIGITS = 10**10
# Bytes of an answer parsed at once (about 50,000 names): what parsing holds besides the keys.
_PARSE_WINDOW = 1 << 20


class JobCodes:
    """Job IDs as numbers that give them back exactly (see the module's doc)."""

    def __init__(self) -> None:
        self._odd: list[str] = []
        self._odd_numbers: dict[str, int] = {}
        self._lock = threading.Lock()

    def number(self, jid: str) -> int:
        match = JID_FORM.fullmatch(jid)
        if match:
            return int(match.group(1))
        found = self._odd_numbers.get(jid)
        if found is None:
            with self._lock:
                found = self._odd_numbers.get(jid)
                if found is None:
                    found = ODD_BASE + len(self._odd)
                    self._odd.append(jid)
                    self._odd_numbers[jid] = found
        return found

    def known(self, jid: str) -> int | None:
        """The number of ``jid`` if it has one already (never adds to the side table)."""
        match = JID_FORM.fullmatch(jid)
        if match:
            return int(match.group(1))
        return self._odd_numbers.get(jid)

    def jid(self, number: int) -> str:
        return f"jid{number:010d}" if number < ODD_BASE else self._odd[number - ODD_BASE]

    def __len__(self) -> int:
        return len(self._odd)


def jid_of(number: int) -> str:
    return f"jid{number:010d}"


class Entries(Sequence[tuple[int, str]]):
    """A state folder's (priority, job ID) entries, one 64-bit integer each.

    ``by_age`` False: priority << 34 | number (sorted: run order, the index names' own order);
    True: number << 7 | priority (sorted: oldest first). Items are made when asked for; a
    slice is a list. Entries come from index names, so their IDs are always contract IDs.
    """

    __slots__ = ("by_age", "keys", "reverse")

    def __init__(self, keys: array[int], *, by_age: bool = False, reverse: bool = False) -> None:
        self.keys = keys
        self.by_age = by_age
        self.reverse = reverse

    def _item(self, key: int) -> tuple[int, str]:
        if self.by_age:
            return key & PRIO_MASK, jid_of(key >> PRIO_BITS)
        return key >> NUM_BITS, jid_of(key & NUM_MASK)

    def number(self, key: int) -> int:
        return key >> PRIO_BITS if self.by_age else key & NUM_MASK

    def name(self, key: int) -> str:
        """The index entry's node name ("PP-jid..."), as ``paths.index_name`` writes it."""
        return f"{self.priority(key):02d}-{jid_of(self.number(key))}"

    def jid(self, key: int) -> str:
        return jid_of(self.number(key))

    def priority(self, key: int) -> int:
        return key & PRIO_MASK if self.by_age else key >> NUM_BITS

    def __len__(self) -> int:
        return len(self.keys)

    @overload
    def __getitem__(self, i: int) -> tuple[int, str]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, str]]: ...

    def __getitem__(self, i: int | slice) -> tuple[int, str] | list[tuple[int, str]]:
        keys = self.keys
        if isinstance(i, slice):
            start, stop, step = i.indices(len(keys))
            if self.reverse:
                n = len(keys)
                return [self._item(keys[n - 1 - k]) for k in range(start, stop, step)]
            if step == 1:
                return [self._item(k) for k in keys[start:stop]]
            return [self._item(keys[k]) for k in range(start, stop, step)]
        if i < 0:
            i += len(keys)
        if not 0 <= i < len(keys):
            raise IndexError(i)
        return self._item(keys[len(keys) - 1 - i] if self.reverse else keys[i])

    def __iter__(self) -> Iterator[tuple[int, str]]:
        item = self._item
        return (item(k) for k in (reversed(self.keys) if self.reverse else self.keys))

    def numbers(self) -> Iterator[int]:
        """The entries' job numbers, in order, without making their IDs."""
        keys = reversed(self.keys) if self.reverse else self.keys
        if self.by_age:
            return (k >> PRIO_BITS for k in keys)
        return (k & NUM_MASK for k in keys)

    def jids(self) -> list[str]:
        return [jid_of(n) for n in self.numbers()]

    def where(self, keep: Callable[[int, int], bool]) -> Entries:
        """The entries whose (priority, number) ``keep`` takes, in the same order."""
        number, priority = self.number, self.priority
        kept = array("q", [k for k in self.keys if keep(priority(k), number(k))])
        return Entries(kept, by_age=self.by_age, reverse=self.reverse)

    def with_numbers(self, numbers: set[int]) -> Entries:
        """The entries of ``numbers``, in the same order: one comprehension, no call per entry
        (``where`` calls its test for each of 600,000 entries: about a second)."""
        if self.by_age:
            kept = array("q", [k for k in self.keys if k >> PRIO_BITS in numbers])
        else:
            kept = array("q", [k for k in self.keys if k & NUM_MASK in numbers])
        return Entries(kept, by_age=self.by_age, reverse=self.reverse)

    def with_priority(self, priority: int) -> Entries:
        """The entries of one priority, in the same order: in run order a slice found by
        bisection (each priority is one run), not a look at every entry."""
        if self.by_age:
            return self.where(lambda p, _n: p == priority)
        keys = self.keys
        low = bisect_left(keys, priority << NUM_BITS)
        high = bisect_left(keys, (priority + 1) << NUM_BITS, low)
        return Entries(keys[low:high], reverse=self.reverse)

    def of_numbers(self, numbers: Iterable[int]) -> Entries:
        """The entries of the jobs ``numbers`` (a few: a batch's), in the same order, each
        looked for by bisection (per priority's run in run order), as ``where`` with a set of
        them would keep, without a look at every entry."""
        keys = self.keys
        size = len(keys)
        found = []
        if self.by_age:
            for number in numbers:
                i = bisect_left(keys, number << PRIO_BITS)
                while i < size and keys[i] >> PRIO_BITS == number:
                    found.append(keys[i])
                    i += 1
        else:
            blocks = run_blocks(keys)
            for number in numbers:
                for priority, start in blocks:
                    key = priority << NUM_BITS | number
                    i = bisect_left(keys, key, start)
                    if i < size and keys[i] == key:
                        found.append(key)
        return Entries(array("q", sorted(found)), by_age=self.by_age, reverse=self.reverse)

    @staticmethod
    def merged(parts: Sequence[Entries]) -> Entries:
        """Entries of one order from several states together (a few: a batch's), sorted as
        one (a state's entries are in run or age order alike, so the keys merge as they are)."""
        first = parts[0]
        keys = merged_sorted([part.keys for part in parts])
        return Entries(keys, by_age=first.by_age, reverse=first.reverse)

    def among(self, run_keys: Iterable[int]) -> Entries:
        """The entries whose run key (priority << 34 | number) is among ``run_keys``, in the
        same order; the intersection is made by sets in C, not a call per entry."""
        if self.by_age:
            wanted = {(k & NUM_MASK) << PRIO_BITS | k >> NUM_BITS for k in run_keys}
        else:
            wanted = set(run_keys)
        kept = array("q", sorted(wanted.intersection(self.keys)))
        return Entries(kept, by_age=self.by_age, reverse=self.reverse)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Entries | list | tuple):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"Entries({list(self)!r})"


EMPTY = Entries(array("q"))


def run_blocks(run_keys: array[int]) -> list[tuple[int, int]]:
    """Where each priority's run of a run-ordered array starts: (priority, index), found by
    bisection (a folder holds few distinct priorities, each a run sorted by job number)."""
    found = []
    i = 0
    while i < len(run_keys):
        priority = run_keys[i] >> NUM_BITS
        found.append((priority, i))
        i = bisect_left(run_keys, (priority + 1) << NUM_BITS, i)
    return found


def has_number(run_keys: array[int], blocks: list[tuple[int, int]], number: int) -> bool:
    for priority, start in blocks:
        key = priority << NUM_BITS | number
        i = bisect_left(run_keys, key, start)
        if i < len(run_keys) and run_keys[i] == key:
            return True
    return False


CARRY_BLOCK = 8192  # keys whose kept values are looked up in one go (see ``carried``)


def positions_of(values: array[Any], value: Any) -> list[int]:
    """Where ``values`` holds ``value`` (found by the array's own search, not a loop per item)."""
    found: list[int] = []
    at = -1
    while True:
        try:
            at = values.index(value, at + 1)
        except ValueError:
            return found
        found.append(at)


def carried(
    old_keys: array[int], old_values: array[Any], keys: array[int], missing: Any
) -> array[Any]:
    """The values ``old_values`` (one per ``old_keys``) has for ``keys``, ``missing`` where it
    has none, block by block.

    Both key arrays are sorted: each block of ``keys`` looks only at the part of ``old_keys``
    in its range. Each step is one call into C that holds the interpreter; a block keeps it
    short (a page request waits for the interpreter, not for 120,000 entries at once).
    """
    found = array(old_values.typecode)
    for start in range(0, len(keys), CARRY_BLOCK):
        block = keys[start : start + CARRY_BLOCK]
        low = bisect_left(old_keys, block[0])
        high = bisect_right(old_keys, block[-1], low)
        before = dict(zip(old_keys[low:high], old_values[low:high], strict=True))
        found.extend(map(before.get, block, repeat(missing)))
    return found


MERGE_BLOCK = 1 << 16


def merged_sorted(parts: Sequence[Sequence[int]]) -> array[int]:
    """The sorted ``parts`` as one sorted array, a range of keys at a time: each range's slices
    of every part sorted together (a sort of sorted runs is a merge), about ``MERGE_BLOCK``
    keys a range, so that no more Python ints than that exist at once. Sorting every key
    together held one per key: 44 MB for a moment for the million entries of every state.

    The ranges are cut at every ``MERGE_BLOCK // len(parts)``-th key of each part: between two
    cuts, no part has more keys than that."""
    full = [p for p in parts if len(p)]
    if len(full) <= 1:
        return array("q", full[0] if full else ())
    step = max(1, MERGE_BLOCK // len(full))
    cuts = sorted({p[i] for p in full for i in range(step, len(p), step)})
    merged = array("q")
    starts = [0] * len(full)
    for cut in [*cuts, None]:
        chunk = array("q")
        for j, part in enumerate(full):
            end = len(part) if cut is None else bisect_left(part, cut, starts[j])
            chunk.extend(part[starts[j] : end])
            starts[j] = end
        merged.extend(sorted(chunk))
    return merged


def _runs_as(run_keys: array[int], scale: int, offset: Callable[[int], int]) -> list[array[int]]:
    """Each priority's run of ``run_keys`` as ``key * scale + offset(priority)`` (sorted as
    the run is), made in C a key at a time."""
    blocks = run_blocks(run_keys)
    ends = [start for _p, start in blocks[1:]] + [len(run_keys)] * bool(blocks)
    return [
        array("q", map(offset(priority).__add__, map(scale.__mul__, run_keys[start:end])))
        for (priority, start), end in zip(blocks, ends, strict=True)
    ]


def numbers_sorted(run_keys: array[int]) -> array[int]:
    """The job numbers of run-ordered keys, sorted: each priority's run is sorted by number
    already, so the runs are merged (``merged_sorted``), not sorted as Python ints."""
    return merged_sorted(_runs_as(run_keys, 1, lambda p: -(p << NUM_BITS)))


def age_keys(run_keys: array[int]) -> array[int]:
    """The by-age keys (number << PRIO_BITS | priority) of run-ordered keys, sorted (as
    ``numbers_sorted``)."""
    scale = 1 << PRIO_BITS
    return merged_sorted(_runs_as(run_keys, scale, lambda p: p - (p << NUM_BITS) * scale))


def _tail_limit(size: int) -> int:
    return min(max(TAIL_MIN, size >> 3), TAIL_MAX)


def _merged(main: array[int], added: list[int]) -> array[int]:
    """The sorted array ``main`` and the sorted ``added`` as one new sorted array.

    Copied run by run between the places ``added`` goes (found by bisection): no Python int is
    made for the elements of ``main``. Sorting the two together made one for each (32 bytes
    and a list slot for each of 1,700,000 search keys: about 70 MB for a moment at a million
    jobs, the peak of the fill) and took longer.
    """
    return _merged_along(main, main, added, added)


def _merged_along(
    order: array[int], source: array[int], added: list[int], added_values: list[int]
) -> array[int]:
    """``source`` (an array at the places of the sorted ``order``) with ``added_values``
    put in where ``_merged(order, added)`` puts ``added``."""
    merged = array("q", [0]) * (len(source) + len(added))
    with memoryview(source) as from_, memoryview(merged) as target:
        start = at = 0
        for key, value in zip(added, added_values, strict=True):
            end = bisect_left(order, key, start)
            stop = at + end - start
            target[at:stop] = from_[start:end]
            target[stop] = value
            at = stop + 1
            start = end
        target[at:] = from_[start:]
    return merged


class PackedTable:
    """number -> small value for millions of numbers at 8 bytes each: a sorted array of
    number << bits | value, searched by bisection, and a dictionary of recent additions merged
    into it by one sort when it grows past an eighth of the array."""

    __slots__ = ("bits", "main", "mask", "tail")

    def __init__(self, bits: int) -> None:
        self.main = array("q")
        self.tail: dict[int, int] = {}
        self.bits = bits
        self.mask = (1 << bits) - 1

    def get(self, number: int) -> int | None:
        found = self.tail.get(number)
        if found is not None:
            return found
        main = self.main
        i = bisect_left(main, number << self.bits)
        if i < len(main) and main[i] >> self.bits == number:
            return main[i] & self.mask
        return None

    def set(self, number: int, value: int) -> None:
        if number in self.tail:
            self.tail[number] = value
            return
        main = self.main
        i = bisect_left(main, number << self.bits)
        if i < len(main) and main[i] >> self.bits == number:
            main[i] = number << self.bits | value
            return
        self.tail[number] = value
        if len(self.tail) > _tail_limit(len(main)):
            self.compact()

    def compact(self) -> None:
        if not self.tail:
            return
        bits = self.bits
        added = sorted([n << bits | v for n, v in self.tail.items()])
        main = self.main
        if not main or added[0] > main[-1]:
            main.extend(added)
        else:
            self.main = _merged(main, added)
        self.tail = {}

    def numbers_with(self, values: builtins.set[int], at_most: int) -> builtins.set[int] | None:
        """The numbers whose value is one of ``values``; None when more than ``at_most`` are
        (a set of ints costs about 60 bytes each: the caller goes another way)."""
        bits, mask = self.bits, self.mask
        main, tail = self.main, list(self.tail.items())  # a read sees a whole table
        found = array("q", (k >> bits for k in main if k & mask in values))
        if len(found) > at_most:
            return None
        numbers = builtins.set(found)
        numbers.update(n for n, v in tail if v in values)
        return numbers if len(numbers) <= at_most else None

    def values(self) -> Iterator[int]:
        mask = self.mask
        yield from (k & mask for k in self.main)
        yield from self.tail.values()

    def clear(self) -> None:
        self.main = array("q")
        self.tail = {}

    def __len__(self) -> int:
        return len(self.main) + len(self.tail)


class NumberMap:
    """number -> int at 16 bytes each, for values too wide to pack beside the number (as
    ``PackedTable`` does): the numbers sorted in one array, their values in another at the
    same places, searched by bisection, and a dictionary of recent additions merged in when it
    grows past an eighth of the arrays. A dictionary of ints costs about 100 bytes an entry.

    Not locked: its owner locks writes, and hands readers a ``copy()``."""

    __slots__ = ("keys", "tail", "values")

    def __init__(self, pairs: Iterable[tuple[int, int]] = ()) -> None:
        ordered = sorted(dict(pairs).items())
        self.keys = array("q", [k for k, _v in ordered])
        self.values = array("q", [v for _k, v in ordered])
        self.tail: dict[int, int] = {}

    def _place(self, number: int) -> int:
        keys = self.keys
        i = bisect_left(keys, number)
        return i if i < len(keys) and keys[i] == number else -1

    def get(self, number: int) -> int | None:
        found = self.tail.get(number)
        if found is not None:
            return found
        i = self._place(number)
        return None if i < 0 else self.values[i]

    def __contains__(self, number: object) -> bool:
        return isinstance(number, int) and self.get(number) is not None

    def __setitem__(self, number: int, value: int) -> None:
        i = -1 if number in self.tail else self._place(number)
        if i >= 0:
            self.values[i] = value
            return
        self.tail[number] = value
        if len(self.tail) > _tail_limit(len(self.keys)):
            self.compact()

    def compact(self) -> None:
        if not self.tail:
            return
        added = sorted(self.tail.items())
        keys, values = self.keys, self.values
        if not keys or added[0][0] > keys[-1]:
            keys.extend(k for k, _v in added)
            values.extend(v for _k, v in added)
        else:
            numbers = [k for k, _v in added]
            self.keys = _merged(keys, numbers)
            self.values = _merged_along(keys, values, numbers, [v for _k, v in added])
        self.tail = {}

    def retain_sorted(self, numbers: array[int]) -> None:
        """Forget every number not in ``numbers`` (sorted)."""
        self.compact()
        if self.keys == numbers:  # compared in C: the usual case
            return
        end = len(numbers)
        kept = [
            (k, v)
            for k, v in zip(self.keys, self.values, strict=True)
            if (i := bisect_left(numbers, k)) < end and numbers[i] == k
        ]
        if len(kept) < len(self.keys):
            self.keys = array("q", [k for k, _v in kept])
            self.values = array("q", [v for _k, v in kept])

    def copy(self) -> NumberMap:
        """A compact copy."""
        other = NumberMap()
        other.keys, other.values = array("q", self.keys), array("q", self.values)
        other.tail = dict(self.tail)
        other.compact()
        return other

    def items(self) -> Iterator[tuple[int, int]]:
        yield from zip(self.keys, self.values, strict=True)
        yield from list(self.tail.items())

    def __iter__(self) -> Iterator[int]:
        yield from self.keys
        yield from list(self.tail)

    def __len__(self) -> int:
        return len(self.keys) + len(self.tail)


class KeyTable:
    """Hash of a search key -> job numbers, 8 bytes a key (see ``PackedTable``)."""

    __slots__ = ("main", "size", "tail")

    def __init__(self) -> None:
        self.main = array("q")
        self.tail: dict[int, list[int]] = {}
        self.size = 0

    @staticmethod
    def _hash(key: str) -> int:
        # Of the case-folded key: a lookup in any case finds the candidates, and each caller
        # compares as it needs (the job list exactly, the search ignoring case).
        return hash(key.casefold()) & HASH_MASK

    def add(self, key: str, number: int) -> None:
        h = self._hash(key)
        packed = h << NUM_BITS | number
        main = self.main
        i = bisect_left(main, packed)
        if i < len(main) and main[i] == packed:
            return
        known = self.tail.setdefault(h, [])
        if number in known:
            return
        known.append(number)
        self.size += 1
        if self.size > _tail_limit(len(main)):
            self.compact()

    def find(self, key: str) -> list[int]:
        h = self._hash(key)
        main = self.main
        i = bisect_left(main, h << NUM_BITS)
        found = []
        while i < len(main) and main[i] >> NUM_BITS == h:
            found.append(main[i] & NUM_MASK)
            i += 1
        return found + [n for n in self.tail.get(h, ()) if n not in found]

    def compact(self) -> None:
        if not self.tail:
            return
        added = sorted([h << NUM_BITS | n for h, numbers in self.tail.items() for n in numbers])
        self.main = _merged(self.main, added)
        self.tail = {}
        self.size = 0

    def clear(self) -> None:
        self.main = array("q")
        self.tail = {}
        self.size = 0

    def __len__(self) -> int:
        return len(self.main) + self.size


def parse_entries(raw: bytes) -> array[int]:
    """A state folder's answer as sorted run keys (names that are not index entries are left
    out, as ``paths.INDEX_ENTRY_RE`` leaves them out)."""
    # Every step runs in C but one per priority and window: each window's names become
    # "PPNNNNNNNNNN" ints (PP * 10**10 + N, in the order of (priority, number)), all of them
    # are sorted, and a priority's run is moved to its key PP << NUM_BITS | N by one addition
    # per element. A million entries parse in about half the time of a match object and two
    # ints each, holding no more besides the keys (a window's names at a time).
    values = array("q")
    start, size = 0, len(raw)
    while start < size:
        end = min(size, start + _PARSE_WINDOW)
        names = _RAW_ENTRY.findall(raw, start, end)
        values.extend(map(int, b" ".join(names).replace(b"-jid", b"").split()))
        # The next window begins one entry's length short of this one's end: a name cut by
        # the end is read there, and none twice (no whole entry fits in those bytes).
        start = end if end == size else end - _ENTRY_BYTES + 1
    ordered = array("q", sorted(values))
    del values
    keys = array("q")
    start, size = 0, len(ordered)
    while start < size:
        priority = ordered[start] // _TEN_DIGITS
        end = bisect_left(ordered, (priority + 1) * _TEN_DIGITS, start)
        keys.extend(map((priority * ((1 << NUM_BITS) - _TEN_DIGITS)).__add__, ordered[start:end]))
        start = end
    return keys


def give_back_memory() -> None:
    """Return the heap memory the fill's reads freed to the system (glibc keeps freed memory
    mapped otherwise: the process would keep the fill's peak, not what the index holds)."""
    import gc

    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """glibc's malloc_trim: give the free memory of every heap back to the system.

    glibc otherwise keeps what a thread freed mapped in that thread's heap, and a freed block
    of one large read raises the size from which it maps blocks of their own: memory the fill
    freed stayed in the process, tens of MB at a million jobs, added to what it holds."""
    trim = libc_function("malloc_trim")
    if trim is not None:
        trim(0)


_libc: dict[str, Any] = {}


def libc_function(name: str) -> Any:
    """glibc's function ``name`` (through ctypes), or None where the C library has none."""
    if name not in _libc:
        import ctypes
        import ctypes.util

        try:
            library = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc[name] = getattr(library, name)
        except (OSError, AttributeError):  # not glibc: nothing to ask this way
            _libc[name] = None
    return _libc[name]
