"""The ZooKeeper server's clock: the one clock every host of the console reads alike.

The console's daemons and web processes run on several hosts whose clocks drift, and NTP steps
them. A node's ``mtime`` and ``ctime`` are the server's clock at the write (the leader's), so a
decision that compares such a time with "now" (is this batch old enough to archive, is this
lock held for hours, has this hold's end come) must take "now" from the same clock, or a host
whose clock runs ten minutes ahead acts ten minutes early.

``server_now`` gives the server's now: a write to ``/mrt-console/clock`` (an empty persistent
node; anyone may write it) returns the node's new ``mtime``, the server's time at the write,
taken with this process's monotonic time at the answer. Later calls add the monotonic time
elapsed since, so a step of the local clock changes nothing, and a new sample is taken every
``RESAMPLE_SECONDS`` (the server's own clock may be stepped, or another server lead). The
figure is never ahead of the server's clock: the write was stamped before its answer arrived,
so it runs behind by at most one round trip (a decision made on it waits, never hurries).
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from datetime import datetime
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from queues.zk import paths
from queues.zk.codecs import local_time
from queues.zk.errors import is_connection_error

CLOCK = f"{paths.CONSOLE}/clock"
RESAMPLE_SECONDS = 60.0

# Per client: (the server's epoch seconds at a write, this process's monotonic time then).
_samples: weakref.WeakKeyDictionary[KazooClient, tuple[float, float]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def server_now(zk: KazooClient) -> float:
    """The ZooKeeper server's time now, in epoch seconds (one write every ``RESAMPLE_SECONDS``
    per client, else none). ZooKeeper away, the last sample goes on; a connection error is the
    caller's only when this client has none yet, as for any other request."""
    mono = time.monotonic()
    with _lock:
        sample = _samples.get(zk)
    if sample is not None and 0 <= mono - sample[1] < RESAMPLE_SECONDS:
        return float(sample[0] + (mono - sample[1]))
    try:
        stat = _touch(zk)
    except Exception as exc:
        if sample is None or not is_connection_error(exc):
            raise
        # ZooKeeper away: the last sample, advanced by the monotonic clock, is still the
        # server's time give or take the clocks' drift (parts per million).
        return float(sample[0] + (time.monotonic() - sample[1]))
    answered = time.monotonic()
    server = float(stat.mtime) / 1000
    with _lock:
        _samples[zk] = (server, answered)
    return server + (time.monotonic() - answered)


def server_now_known(zk: KazooClient) -> float:
    """``server_now`` from this client's last sample, whatever its age, without a request (for
    a thread that must not wait on ZooKeeper); the host's clock when it has none yet."""
    with _lock:
        sample = _samples.get(zk)
    if sample is None:
        return time.time()
    return float(sample[0] + (time.monotonic() - sample[1]))


def shown_now(zk: KazooClient) -> float:
    """``server_now`` for a figure a page or an API answer shows (an age, "5 min ago"), not a
    decision. With the connection down it waits for nothing: the last sample goes on, and
    before any the host's clock (a page of archived jobs still answers)."""
    if not zk.connected:
        return server_now_known(zk)
    try:
        return server_now(zk)
    except Exception as exc:
        if not is_connection_error(exc):
            raise
        return server_now_known(zk)


def server_moment(zk: KazooClient) -> datetime:
    """``server_now`` as an aware datetime in the local zone (as ``stamp`` gives node times)."""
    return local_time(server_now(zk))


def forget(zk: KazooClient | None = None) -> None:
    """Drop the sample of ``zk`` (every client's when None): the next call writes again."""
    with _lock:
        if zk is None:
            _samples.clear()
        else:
            _samples.pop(zk, None)


def _touch(zk: KazooClient) -> Any:
    """Write the clock node (made on first use) and return its new Stat."""
    try:
        return zk.set(CLOCK, b"")
    except NoNodeError:
        with contextlib.suppress(NodeExistsError):  # made meanwhile by another host
            zk.create(CLOCK, b"", makepath=True)
        return zk.set(CLOCK, b"")
