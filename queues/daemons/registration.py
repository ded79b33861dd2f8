"""What a ``runconsumer`` process tells about itself, and the step history it keeps.

:class:`ProcessObserver` is hooked into every daemon of a :class:`~queues.daemons.runner.Host`
(``Daemon.observer``): ``begin``/``end`` around each item a thread handles, ``draining`` before
each claim. Both sides are cheap for the daemon threads (a dictionary entry under a lock, one
tuple appended for the step history); the ZooKeeper writes and database inserts happen in
background threads:

- the registration node (``queues/zk/consumers.py``) is rewritten every
  ``MRT_CONSUMER_PUBLISH_SECONDS`` (default 5): host, pid, version, steps, start time, each
  thread's item and since when, draining/drained, and the locks the process believes its
  session holds (``queues.zk.locks.ledger_of``). It is ephemeral: a lost process vanishes with
  its ZooKeeper session; after a lost session the next write creates it again. Its owner being
  the process's session, the consistency check and /consumers/ can tell a lock of that session
  that no thread claims (an orphan) from one at work.
- a drain request node is watched (and read again at each write): while it exists the daemons
  claim nothing, finish what they hold, and the node says ``drained`` once no thread holds
  anything. Deleting the request lets them claim again.
- step records go to :class:`~queues.daemons.stephistory.StepRecorder`.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings

from queues.daemons.fetching import HOST_SLOTS
from queues.daemons.stephistory import StepRecorder, record_of
from queues.daemons.vardir import ensure_shared_var_dir
from queues.zk import consumers as zconsumers
from queues.zk.codecs import encode_json
from queues.zk.errors import is_connection_error
from queues.zk.locks import ledger_of, unclaimed_locks
from queues.zk.sized import TooLarge

log = logging.getLogger("queues.daemons")

_version: str | None = None


def version() -> str:
    """``MRT_VERSION`` if set, else ``git describe`` of the checkout, else ``unknown``."""
    global _version
    if _version is None:
        value = settings.MRT_VERSION.strip()
        if not value:
            try:
                out = subprocess.run(
                    ["git", "describe", "--always", "--tags", "--dirty"],
                    cwd=settings.BASE_DIR,
                    capture_output=True,
                    text=True,
                    timeout=3,
                    check=False,
                )
                value = out.stdout.strip() if out.returncode == 0 else ""
            except (OSError, subprocess.SubprocessError):
                value = ""
        _version = value or "unknown"
    return _version


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="seconds")


def largest_parts(data: dict[str, Any], most: int = 3) -> str:
    """The ``most`` largest fields of a registration, encoded as it is sent, with their sizes."""
    sizes = sorted(((len(encode_json({k: v})), k) for k, v in data.items()), reverse=True)
    return ", ".join(f"{key} {size:,} bytes" for size, key in sizes[:most])


class ProcessObserver:
    """Registration, drain and step history of one daemon process."""

    def __init__(
        self,
        zk: Any,
        daemons: list[Any],
        *,
        record: bool = True,
        publish_seconds: float | None = None,
        host: str | None = None,
        pid: int | None = None,
        ledger: Callable[[], frozenset[str]] | None = None,
        var_dir: Path | None = None,
    ) -> None:
        self.zk = zk
        self.daemons = daemons
        self.host = host or socket.gethostname()
        self.pid = pid if pid is not None else os.getpid()
        self.name = zconsumers.consumer_name(self.host, self.pid)
        # Before anything is claimed: a daemon whose MRT_VAR_DIR is not the shared one would
        # fail every job whose working folder another host wrote (raises VarDirNotShared).
        ensure_shared_var_dir(
            zk, Path(var_dir if var_dir is not None else settings.MRT_VAR_DIR), host=self.host
        )
        # The locks of this client's session, the one that owns the registration node.
        self.ledger = ledger if ledger is not None else ledger_of(zk).held
        self.started = time.time()
        self.publish_seconds = float(
            publish_seconds
            if publish_seconds is not None
            else settings.MRT_CONSUMER_PUBLISH_SECONDS
        )
        self.recorder = StepRecorder(consumer=self.name, host=self.host) if record else None
        # Locks of this session that no thread claims, by when they were first met (see
        # ``check_unclaimed``), and those met twice: the orphans the registration shows.
        self._unclaimed: dict[str, float] = {}
        self.orphans: list[str] = []
        self._busy: dict[int, tuple[str, str, str, float]] = {}
        self._lock = threading.Lock()
        self._draining = threading.Event()
        self._drain_info: dict[str, Any] | None = None
        self._drained_logged = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.handled = 0
        self.failed = 0
        self.published = 0
        self._started = False

    # The daemons' side ------------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def begin(self, daemon: Any, item: Any) -> tuple[Any, ...]:
        return self.begin_many(daemon, [item])[0]

    def begin_many(self, daemon: Any, items: list[Any]) -> list[tuple[Any, ...]]:
        """``begin`` of each of ``items``, taken on by ``daemon`` together (a batched loop's
        batch): one lock and one clock for them all."""
        wall = time.time()
        mono = time.monotonic()
        tokens: list[tuple[Any, ...]] = []
        for item in items:
            try:
                kind, state, waited, nbytes = record_of(daemon, item, wall)
                ident = daemon.item_id(item)
            except Exception:  # never let the bookkeeping fail a step
                kind, state, waited, nbytes, ident = "item", "", None, None, "?"
            tokens.append((daemon, ident, kind, state, waited, nbytes, wall, mono))
        if tokens:
            # What the registration shows of the thread's item (the time made ISO at the
            # publish, ``snapshot``, not for every item): the last one taken on.
            _daemon, ident, kind, state, *_rest = tokens[-1]
            with self._lock:
                self._busy[id(daemon)] = (ident, kind, state, wall)
        return tokens

    def end(self, token: tuple[Any, ...], result: Any) -> None:
        self.end_many([(token, result)])

    def end_many(self, ended: list[tuple[tuple[Any, ...], Any]]) -> None:
        """``end`` of each ``(token, result)``: one lock for them all, one hand-over of their
        records to the step history."""
        if not ended:
            return
        failed = sum(1 for _token, r in ended if r is not None and r.outcome == "failed")
        with self._lock:
            for key in {id(token[0]) for token, _result in ended}:
                self._busy.pop(key, None)
            self.handled += len(ended)
            self.failed += failed
            drained = self._draining.is_set() and not self._busy
        if self.recorder is not None:
            rows = []
            for token, result in ended:
                daemon, ident, kind, state, waited, nbytes, wall, mono = token
                if result is not None:
                    outcome, duration, detail = result.outcome, result.duration, result.detail
                else:
                    outcome, duration, detail = "error", time.monotonic() - mono, "raised"
                step = daemon.step
                rows.append(
                    (kind, ident, step, state, outcome, wall, duration, waited, nbytes, detail)
                )
            self.recorder.add_many(rows)
        if drained:
            self._wake.set()  # say "drained" now, not at the next tick

    # Registration ----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            busy = dict(self._busy)
            handled, failed = self.handled, self.failed
        threads = []
        for n, daemon in enumerate(self.daemons):
            entry = {"thread": f"{daemon.name}-{n}", "step": daemon.step}
            held = busy.get(id(daemon))
            if held:
                ident, kind, state, since = held
                entry.update(item=ident, kind=kind, state=state, since=_iso(since))
            threads.append(entry)
        steps = list(dict.fromkeys(d.name for d in self.daemons))
        locks = sorted(self.ledger())
        return {
            "host": self.host,
            "pid": self.pid,
            "version": version(),
            "steps": steps,
            # The steps a drain stops (those that claim items); a periodic daemon (alerts,
            # maintenance, retention...) goes on while its process is drained.
            "claiming": [s for s in steps if any(d.name == s and d.claims for d in self.daemons)],
            "started": _iso(self.started),
            "updated": _iso(time.time()),
            "publish_seconds": self.publish_seconds,
            "handled": handled,
            "failed": failed,
            "draining": self.draining,
            "drained": self.draining and not busy,
            "drain": self._drain_info,
            "threads": threads,
            "locks": locks[: zconsumers.LOCKS_PUBLISHED],
            "locks_count": len(locks),
            "orphans": self.orphans[: zconsumers.LOCKS_PUBLISHED],
            "orphans_count": len(self.orphans),
            # Jobs its downloading loops pass over: their depositor's server is at its cap.
            "slot_waits": HOST_SLOTS.passed_over() if "downloading" in steps else {},
        }

    def _on_drain_event(self, _event: Any) -> None:
        self._wake.set()

    def _read_drain(self) -> None:
        info = zconsumers.drain_read(self.zk, self.name, watch=self._on_drain_event)
        if info is not None and not self._draining.is_set():
            log.info(
                "%s: drain asked by %s: claiming nothing more, finishing the items in hand",
                self.name,
                info.get("by", "?"),
            )
            self._drained_logged = False
            self._draining.set()
        elif info is None and self._draining.is_set():
            log.info("%s: drain withdrawn: claiming again", self.name)
            self._draining.clear()
        self._drain_info = info

    def check_unclaimed(self) -> list[str]:
        """Ask the server which locks it holds for this session that no thread claims.

        A lock met in two checks at least a second apart (so not one taken or given up while
        the answer travelled) is an orphan: a create or delete the server applied while its
        answer was lost, which the reconciler did not hear of. It is published, so /consumers/
        shows it without reading every lock in the tree; still there after
        ``ORPHAN_HEAL_SECONDS`` it is handed to the lock reconciler, which deletes it unless
        a thread has taken it by then. Returns the orphans.
        """
        try:
            found = unclaimed_locks(self.zk)
        except Exception as exc:
            if not is_connection_error(exc):
                log.warning("%s: lock self-check failed: %s", self.name, exc)
            return self.orphans
        now = time.monotonic()
        self._unclaimed = {p: self._unclaimed.get(p, now) for p in found}
        met_twice = sorted(p for p, first in self._unclaimed.items() if first <= now - 1.0)
        overdue = [
            p for p in met_twice if self._unclaimed[p] <= now - zconsumers.ORPHAN_HEAL_SECONDS
        ]
        if overdue:
            doubted = ledger_of(self.zk).doubt_unclaimed(overdue)
            if doubted:
                log.warning(
                    "%s: %d lock(s) of this session that no thread claims, given to the "
                    "reconciler: %s",
                    self.name,
                    len(doubted),
                    ", ".join(doubted[:5]),
                )
        self.orphans = met_twice
        return met_twice

    def publish(self) -> None:
        """Read the drain request, check this session's locks, write the registration node."""
        self._read_drain()
        self.check_unclaimed()
        data = self.snapshot()
        zconsumers.consumer_publish(self.zk, self.name, data)
        self.published += 1
        if data["drained"] and not self._drained_logged:
            self._drained_logged = True
            log.info("%s: drained: no item in hand, claiming nothing", self.name)

    def start(self, *, background: bool = True) -> None:
        """Register (a drain request left by an earlier process of this name is removed first)
        and, with ``background``, start the threads that keep the node current and write the
        step history. Without (``runconsumer --once``), the records are written by ``stop``.
        Starting twice does nothing; ZooKeeper being away now only delays the node."""
        if self._started:
            return
        self._started = True
        try:
            self.name = zconsumers.consumer_register(self.zk, self.name, self.snapshot())
            if self.recorder is not None:
                self.recorder.consumer = self.name
            zconsumers.drain_cancel(self.zk, self.name)
            zconsumers.drains_prune(self.zk, keep=self.name)
            self.publish()
        except TooLarge as exc:
            # Not an outage to wait out: the process says more of itself than one node holds.
            # Named with its largest parts, for the operator to see which (MRT_VERSION, the
            # threads of --threads, the locks held).
            self._started = False
            parts = largest_parts(self.snapshot())
            raise TooLarge(f"{exc}; its largest parts: {parts}") from None
        except Exception as exc:
            log.warning("%s: not registered yet: %s", self.name, exc)
        if not background:
            return
        if self.recorder is not None:
            self.recorder.start()
        self._thread = threading.Thread(target=self._run, name="registration", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.publish_seconds)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.publish()
            except Exception as exc:
                if is_connection_error(exc):
                    log.debug("%s: registration not written: %s", self.name, exc)
                else:
                    log.warning("%s: registration not written: %s", self.name, exc)

    def stop(self) -> None:
        """Stop writing, remove the registration node, write the last step records."""
        if not self._started:
            return
        self._started = False
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        try:
            zconsumers.consumer_remove(self.zk, self.name)
        except Exception as exc:
            log.debug("%s: registration not removed (it goes with the session): %s", self.name, exc)
        if self.recorder is not None:
            self.recorder.stop()
