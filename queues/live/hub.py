"""The web process's one watcher of ZooKeeper, turned into channel-layer messages.

One hub per web process, started on the first websocket connect. It owns a ``QueueWatcher`` on a
ZooKeeper session of its own (see ``_connect``), coalesces its reports per topic and sends them to
the channel-layer group of the topic, which every socket showing that topic has joined.

Coalescing is leading + trailing edge over ``LIVE_COALESCE_SECONDS`` (default 0.25 s): the first
change of a quiet topic goes out at once; changes arriving during the window are folded into one
message sent when the window closes, and the window stays open while changes keep coming. A
thousand moves in a second therefore become about five messages per topic, and a single move
arrives without waiting for a window.

Several web processes (daphne workers behind one address, with ``channels-redis`` when
``REDIS_URL`` is set): every worker runs its own hub with its own watches, because ZooKeeper
already tells every watcher about every change. The hub's group names carry the hub's own
identity, so a socket joins the groups of the hub in its own process and receives each change
once, through whichever layer is configured, rather than once per worker through Redis. A socket
that reconnects to another worker subscribes again and refreshes what it shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import threading
from dataclasses import dataclass
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from queues.zk import client as zkmod
from queues.zk.watch import ZK_DOWN, ZK_UP, QueueWatcher, is_on_demand, validate_topic

from .layer import health, unreachable

log = logging.getLogger(__name__)

ZK_GROUP_TOPIC = "zk"
RETRY_CONNECT_SECONDS = 3.0
_GROUP_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass
class _Window:
    """A topic's open coalescing window: what arrived since the last message."""

    handle: asyncio.TimerHandle | None = None
    pending: dict[str, Any] | None = None
    events: int = 0


class Hub:
    def __init__(self, loop: asyncio.AbstractEventLoop, *, window: float | None = None) -> None:
        self.loop = loop
        self.window = window if window is not None else settings.LIVE_COALESCE_SECONDS
        self.ident = f"{os.getpid()}x{secrets.token_hex(3)}"
        self.layer = get_channel_layer()
        self.watcher: QueueWatcher | None = None
        self.zk_up = False
        self.sent = 0  # messages sent to the layer (for tests and the benchmark)
        self._windows: dict[str, _Window] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waiting: dict[str, int] = {}  # subscriptions made before ZooKeeper was reachable
        self._started: asyncio.Task[None] | None = None
        self._stopped = False
        self._lock = threading.Lock()

    # Lifecycle

    async def ready(self) -> None:
        if self._started is None:
            self._started = self.loop.create_task(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        if not await self._connect():
            self._spawn(self._keep_connecting())

    async def _connect(self) -> bool:
        """Create the watcher on a session of its own; False while ZooKeeper is unreachable.

        Its own session, not the process's shared client: the watcher keeps persistent watches
        on the state folders, and ZooKeeper before 3.9 (ZOOKEEPER-4466) turns a session's
        persistent watch on a path into a one-shot one when the same session sets a one-shot
        watch there, as the read index does on every listing.
        """
        try:
            zk = await self.loop.run_in_executor(None, zkmod.connect)
        # Whatever keeps us from ZooKeeper (no server, no route, not installed): retry later.
        except Exception as exc:
            log.warning("live console cannot reach ZooKeeper: %s", exc)
            self.zk_up = False
            return False
        watcher = QueueWatcher(zk, self._from_zk)
        await self.loop.run_in_executor(None, watcher.start)
        with self._lock:
            if self._stopped:
                watcher.stop()
                _close(zk)
                return True
            self.watcher = watcher
            waiting, self._waiting = self._waiting, {}
        self.zk_up = watcher.connected
        for topic, count in waiting.items():
            for _ in range(count):
                await self.loop.run_in_executor(None, watcher.subscribe, topic)
        return True

    async def _keep_connecting(self) -> None:
        while not self._stopped:
            await asyncio.sleep(RETRY_CONNECT_SECONDS)
            if await self._connect():
                await self._publish_zk("up")
                return

    def stop(self) -> None:
        """Stop watching and cancel pending messages (process exit, tests)."""
        with self._lock:
            self._stopped = True
            watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.stop()
            _close(watcher.zk)
        for window in self._windows.values():
            if window.handle is not None:
                window.handle.cancel()
        self._windows.clear()
        if not self.loop.is_closed():
            for task in self._tasks:
                self.loop.call_soon_threadsafe(task.cancel)

    # Subscriptions

    def group(self, topic: str) -> str:
        """The channel-layer group of a topic on this hub (names allow only [A-Za-z0-9_.-])."""
        return _GROUP_UNSAFE.sub(".", f"live.{self.ident}.{topic}")[:99]

    @property
    def zk_group(self) -> str:
        return self.group(ZK_GROUP_TOPIC)

    async def subscribe(self, topic: str) -> None:
        await self._count(topic, +1)

    async def unsubscribe(self, topic: str) -> None:
        await self._count(topic, -1)

    async def _count(self, topic: str, change: int) -> None:
        """One more (+1) or one fewer (-1) browser on an on-demand topic: the watcher is told,
        or, before it exists, the count waits for it."""
        topic = validate_topic(topic)
        if not is_on_demand(topic):
            return
        with self._lock:
            watcher = self.watcher
            if watcher is None:
                left = self._waiting.get(topic, 0) + change
                if left > 0:
                    self._waiting[topic] = left
                else:
                    self._waiting.pop(topic, None)
                return
        call = watcher.subscribe if change > 0 else watcher.unsubscribe
        await self.loop.run_in_executor(None, call, topic)

    # From ZooKeeper to the channel layer

    def _from_zk(self, topic: str, detail: dict[str, Any]) -> None:
        """The watcher's callback, on a kazoo thread: continue on the event loop."""
        if self._stopped or self.loop.is_closed():
            return
        # The loop may close between the check and the call (shutdown).
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._note, topic, detail)

    def _note(self, topic: str, detail: dict[str, Any]) -> None:
        if self._stopped:
            return
        if topic in (ZK_DOWN, ZK_UP):
            # Rare and urgent: the banner must not wait for a window.
            self.zk_up = topic == ZK_UP
            self._spawn(self._publish_zk("up" if self.zk_up else "down"))
            return
        window = self._windows.get(topic)
        if window is None:
            self._windows[topic] = window = _Window()
            self._send(topic, detail, 1)
            window.handle = self.loop.call_later(self.window, self._close, topic)
        else:
            window.pending = detail
            window.events += 1

    def _close(self, topic: str) -> None:
        window = self._windows.get(topic)
        if window is None:
            return
        if window.pending is None:
            del self._windows[topic]
            return
        self._send(topic, window.pending, window.events)
        window.pending, window.events = None, 0
        window.handle = self.loop.call_later(self.window, self._close, topic)

    def _send(self, topic: str, detail: dict[str, Any], events: int) -> None:
        message = {"type": "live.changed", "topic": topic, "events": events, "detail": detail}
        self.sent += 1
        self._spawn(self._to_layer(self.group(topic), message))

    async def _publish_zk(self, state: str) -> None:
        await self._to_layer(self.zk_group, {"type": "live.zk", "state": state})

    async def _to_layer(self, group: str, message: dict[str, Any]) -> None:
        """Send to a group; a layer outage is noted once (its pages are closed meanwhile and
        refresh when they reconnect), not raised once per message."""
        try:
            await self.layer.group_send(group, message)
        except Exception as exc:
            if not unreachable(exc):
                raise
            health.failed(exc)
        else:
            health.worked()

    def _spawn(self, coro: Any) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("live message not sent", exc_info=task.exception())


def _close(zk: Any) -> None:
    """Stop a watcher's own client (a failure to say goodbye to ZooKeeper changes nothing)."""
    try:
        zk.stop()
        zk.close()
    except Exception:
        log.debug("closing the live watcher's ZooKeeper client failed", exc_info=True)


_hub: Hub | None = None
_hub_lock = threading.Lock()


async def get_hub() -> Hub:
    """The process's hub, created and started on first use.

    A hub belongs to one event loop; daphne runs one per process, tests a new one per test, so
    a hub found on another loop is replaced.
    """
    global _hub
    loop = asyncio.get_running_loop()
    with _hub_lock:
        hub = _hub
        if hub is None or hub.loop is not loop:
            if hub is not None:
                hub.stop()
            hub = _hub = Hub(loop)
    await hub.ready()
    return hub


def current_hub() -> Hub | None:
    return _hub


def reset_hub() -> None:
    """Stop and forget the process's hub (tests, before their ZooKeeper client goes away)."""
    global _hub
    with _hub_lock:
        hub, _hub = _hub, None
    if hub is not None:
        hub.stop()
