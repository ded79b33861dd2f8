"""The live console's websocket: a page subscribes to the topics it shows and hears of changes.

Protocol (JSON text frames):

    client -> {"subscribe": ["jobs:state:Failed", "batch:bid0000000001", ...]}
              {"unsubscribe": [...]}
    server -> {"kind": "hello", "zk": "up"|"down"}                  once, after the handshake
              {"kind": "subscribed", "topics": [...]}                after every (un)subscribe
              {"kind": "changed", "topic": T, "events": n, ...}     T changed (n events folded)
              {"kind": "zk-down"|"zk-up", "topic": "zk"}             ZooKeeper went away / is back
              {"kind": "error", "error": "...", "topic": T?}        a bad request; socket stays

A "changed" message says which topic to refresh, nothing about the new state: the always-watched
topics (job states, batches, holds, access queues) carry only ``events`` (at least one; a message
may stand for more changes than it counts) and, for ``holds``, the ``folder``; the item topics
(``batch:``, ``job:``) also carry what their watch read as it was set again (``count``,
``version``, ``zxid``, ``exists``, ``item``). Pages refresh what shows the topic.

Anonymous sockets are closed with 4401 and users without the viewer role with 4403 (after the
handshake, so the browser sees the code and stops reconnecting). An open socket is no licence:
its session and role are read again every ``RECHECK_SECONDS`` and before each message from the
page, and a socket whose session ended (logged out in another tab, expired, the user
deactivated or their password changed) is closed with 4401, one whose user lost the viewer
role with 4403, its topics left at once. A database that does not answer the check keeps the
socket as it is until the next one. While the channel layer (Redis)
is unreachable a socket is closed with 4503 (or refused, when that is known before the
handshake) and the browser tries again with growing back-off; the process logs the outage once
(``queues.live.layer``), not a traceback per socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from queues.core import transient
from queues.core.words import DuplicateKey, TooDeep, json_within
from queues.operator.auth import VIEWER, has_role, session_access
from queues.zk.errors import InvalidID
from queues.zk.watch import validate_topic

from .hub import Hub, get_hub
from .layer import health, unreachable

log = logging.getLogger("queues.live")

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_LAYER_DOWN = 4503
CLOSE_INTERNAL = 1011  # RFC 6455: the server met an unexpected condition
MAX_TOPICS = 200
# Channel layers drop a group member after group_expiry (a day by default); operators keep the
# console open all day and longer, so the socket joins its groups again well before that.
REJOIN_SECONDS = 3600.0
# How long a socket may go on after its user logged out or lost the viewer role, at most (a
# message from the page is checked at once).
RECHECK_SECONDS = 60.0
CLOSE_FOR = {"login": CLOSE_UNAUTHENTICATED, "role": CLOSE_FORBIDDEN}
USAGE = "expected {'subscribe': [topics]} or {'unsubscribe': [topics]}"


class LiveConsumer(AsyncJsonWebsocketConsumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.topics: set[str] = set()
        self.hub: Hub | None = None
        self._rejoin: asyncio.Task[None] | None = None
        self._recheck: asyncio.Task[None] | None = None
        # A page's message and the periodic check take turns: a check that closes the socket
        # while a subscribe waits for its watch would leave that watch with nobody to give it back.
        self._turn = asyncio.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except Exception as exc:
            if not unreachable(exc):
                raise
            # The layer failed under this socket (joining a group, or the wait for its next
            # message): the socket cannot be live, the browser retries later.
            health.failed(exc)
            await self._forget()
            with contextlib.suppress(Exception):
                await send({"type": "websocket.close", "code": CLOSE_LAYER_DOWN})

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if not await database_sync_to_async(has_role)(user, VIEWER):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.hub = await get_hub()
        try:
            await self.channel_layer.group_add(self.hub.zk_group, self.channel_name)
        except Exception as exc:
            if not unreachable(exc):
                raise
            # A connection pooled before the layer went away fails once when it is next used;
            # a fresh one answers if the layer is back. Without this second try each stale
            # connection cost the browser a whole back-off wait after Redis returned.
            await self.channel_layer.group_add(self.hub.zk_group, self.channel_name)
        health.worked()
        await self.send_json({"kind": "hello", "zk": "up" if self.hub.zk_up else "down"})
        loop = asyncio.get_running_loop()
        self._rejoin = loop.create_task(self._keep_joined())
        self._recheck = loop.create_task(self._keep_checking(user.pk))

    async def disconnect(self, code: int) -> None:
        hub, topics = self.hub, sorted(self.topics)
        await self._forget()
        if hub is None:
            return
        await self.channel_layer.group_discard(hub.zk_group, self.channel_name)
        for topic in topics:
            await self.channel_layer.group_discard(hub.group(topic), self.channel_name)

    async def _forget(self) -> None:
        """Give back this socket's watches, whether or not the layer can still be told."""
        for task in (self._rejoin, self._recheck):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        hub, topics = self.hub, list(self.topics)
        self.hub, self.topics = None, set()
        if hub is not None:
            for topic in topics:
                await hub.unsubscribe(topic)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        async with self._turn:
            if self.hub is None:
                return  # refused or closed socket: ignore what arrives before the close completes
            if not await self._still_allowed(self.scope["user"].pk):
                return
            try:
                content = json_within(text_data or "")
            except (TooDeep, DuplicateKey) as exc:
                await self.send_json({"kind": "error", "error": f"{exc}: {USAGE}"})
                return
            except ValueError:
                await self.send_json({"kind": "error", "error": "expected a JSON object"})
                return
            await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict) or not set(content) <= {"subscribe", "unsubscribe"}:
            await self.send_json({"kind": "error", "error": USAGE})
            return
        for key in ("subscribe", "unsubscribe"):
            topics = content.get(key, [])
            if not isinstance(topics, list):
                await self.send_json({"kind": "error", "error": f"{key} takes a list of topics"})
                return
            for raw in topics:
                try:
                    topic = validate_topic(raw)
                except InvalidID as exc:
                    await self.send_json({"kind": "error", "error": str(exc), "topic": str(raw)})
                    continue
                if key == "unsubscribe":
                    await self._leave(topic)
                elif len(self.topics) >= MAX_TOPICS:
                    await self.send_json(
                        {"kind": "error", "error": f"at most {MAX_TOPICS} topics", "topic": topic}
                    )
                else:
                    await self._join(topic)
        await self.send_json({"kind": "subscribed", "topics": sorted(self.topics)})

    async def _join(self, topic: str) -> None:
        assert self.hub is not None
        if topic in self.topics:
            return
        # Watch first, then join: a change after the "subscribed" reply is never missed. The
        # topic is noted before the join, which may fail, so that the watch is always given back.
        await self.hub.subscribe(topic)
        self.topics.add(topic)
        await self.channel_layer.group_add(self.hub.group(topic), self.channel_name)

    async def _leave(self, topic: str) -> None:
        assert self.hub is not None
        if topic not in self.topics:
            return
        self.topics.discard(topic)
        await self.channel_layer.group_discard(self.hub.group(topic), self.channel_name)
        await self.hub.unsubscribe(topic)

    async def _keep_joined(self) -> None:
        while True:
            await asyncio.sleep(REJOIN_SECONDS)
            if self.hub is None:
                return
            with contextlib.suppress(Exception):
                await self.channel_layer.group_add(self.hub.zk_group, self.channel_name)
                for topic in list(self.topics):
                    await self.channel_layer.group_add(self.hub.group(topic), self.channel_name)

    async def _keep_checking(self, user_id: Any) -> None:
        while True:
            await asyncio.sleep(RECHECK_SECONDS)
            async with self._turn:
                if self.hub is None or not await self._still_allowed(user_id):
                    return

    async def _still_allowed(self, user_id: Any) -> bool:
        """Whether the socket's user still may see the console; if not, the socket leaves its
        topics and is closed with the code that says why (4401, 4403)."""
        session = self.scope.get("session")
        try:
            wrong = await database_sync_to_async(session_access)(
                getattr(session, "session_key", None), user_id
            )
        except Exception as exc:
            if transient.is_transient(exc):
                return True  # the database is away: checked again at the next interval
            # Not known to be allowed: closed (the browser connects again, and is asked then),
            # never left open without its checks.
            log.exception("the live socket's check of its user failed; closing it")
            await self.disconnect(CLOSE_INTERNAL)
            await self.close(code=CLOSE_INTERNAL)
            return False
        if wrong is None:
            return True
        await self.disconnect(CLOSE_FOR[wrong])
        await self.close(code=CLOSE_FOR[wrong])
        return False

    # Channel-layer handlers (message "type" live.changed -> live_changed)

    async def live_changed(self, event: dict[str, Any]) -> None:
        topic = event["topic"]
        if topic not in self.topics:
            return  # left the group while this message was on its way
        message = {**event.get("detail", {}), "topic": topic, "kind": "changed"}
        await self.send_json({**message, "events": event["events"]})

    async def live_zk(self, event: dict[str, Any]) -> None:
        await self.send_json({"topic": "zk", "kind": f"zk-{event['state']}"})
