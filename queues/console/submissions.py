"""What the console keeps of each live batch's submission, for the batch list's filters and the
search alike: its own ID, title, file name, submitter and collection.

A submission never changes once its batch is made: each is read once, by whichever page asks
first, and forgotten when its batch is gone. One copy serves both pages (each kept its own
before, in two cases: about 7 MB between them at 20,000 batches).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from queues.core.per_key import PerKey
from queues.zk import index as zindex
from queues.zk import paths as zpaths
from queues.zk.nodes import json_objects
from queues.zk.records import text_field


@dataclass(frozen=True, slots=True)
class Submission:
    own_id: str  # the submission's batchID (Merritt's bid-… or a UUID)
    title: str
    filename: str
    submitter: str
    profile: str


NONE = Submission("", "", "", "", "")


class _Kept:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_bid: dict[str, Submission] = {}


_kept_for: PerKey[Any, _Kept] = PerKey(lambda _idx: _Kept())


def _of(node: dict[str, Any]) -> Submission:
    return Submission(
        text_field(node, "batchID"),
        text_field(node, "title"),
        text_field(node, "filename"),
        sys.intern(text_field(node, "submitter")),  # a few submitters make thousands of batches
        sys.intern(text_field(node, "profile")),
    )


def read(
    zk: Any,
    bids: Sequence[str],
    *,
    chunk: int = zindex.READ_CHUNK,
    between: Callable[[int], None] | None = None,
) -> dict[str, Submission]:
    """The submissions of ``bids`` (batches of ``zk``'s queue), those not known yet read a
    chunk at a time and kept as each chunk is read. ``between(known)``, after each chunk but
    the last, may raise to stop (what is read stays kept). A batch whose submission is
    missing or not a JSON object is left out, and read again when asked again."""
    kept = _kept_for(zindex.for_client(zk))
    with kept.lock:
        todo = [b for b in bids if b not in kept.by_bid]
    bid_of = {zpaths.batch_node(b, "submission"): b for b in todo}
    done = 0
    for found in json_objects(zk, list(bid_of), chunk):
        fresh = {bid_of[path]: _of(node) for path, (node, _stat) in found.items()}
        with kept.lock:
            kept.by_bid.update(fresh)
            known = len(kept.by_bid)
        done += chunk
        if between is not None and done < len(todo):
            between(known)
    with kept.lock:
        return {b: s for b in bids if (s := kept.by_bid.get(b)) is not None}


def forget_gone(zk: Any, live: Iterable[str]) -> None:
    """Forget the submissions of batches not in ``live`` (the read index's whole batch list)."""
    kept = _kept_for(zindex.for_client(zk))
    alive = set(live)
    with kept.lock:
        for gone in [b for b in kept.by_bid if b not in alive]:
            del kept.by_bid[gone]
