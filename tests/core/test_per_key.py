"""``PerKey``: one object per live key, made once however many threads ask, gone with its key."""

from __future__ import annotations

import gc
import threading

from queues.core.per_key import PerKey


class _Key:
    """A key that can be weakly referenced (as a read index or a client is)."""


def test_one_object_per_key_made_once_however_many_threads_ask() -> None:
    made: list[int] = []

    def make(key: _Key) -> object:
        made.append(id(key))
        return object()

    per_key: PerKey[_Key, object] = PerKey(make)
    key = _Key()
    start = threading.Barrier(8)
    answers: list[object] = []

    def ask() -> None:
        start.wait()
        answers.append(per_key(key))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made == [id(key)] and len(answers) == 8 and all(a is answers[0] for a in answers)
    assert per_key(_Key()) is not answers[0]


def test_a_keys_object_goes_with_its_key() -> None:
    per_key: PerKey[_Key, list[int]] = PerKey(lambda _key: [1])
    kept, gone = _Key(), _Key()
    assert per_key(kept) is per_key(kept) and per_key(gone) is not per_key(kept)
    del gone
    gc.collect()
    assert list(per_key._made) == [kept]
