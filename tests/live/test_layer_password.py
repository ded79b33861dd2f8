"""REDIS_URL may carry a password (``redis://:password@host:6379/0``): the warning the web
process logs when its channel layer is unreachable names Redis by host and port only. A guard,
against a real closed port: redis-py's connection error never named the URL, and this keeps it
so should the layer's words change."""

from __future__ import annotations

import asyncio
import logging

import pytest
from channels_redis.core import RedisChannelLayer

from queues.live.layer import LayerHealth, unreachable
from tests.steps.slow_servers import refused_port


def test_an_unreachable_layer_is_logged_without_the_redis_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with refused_port() as port:
        layer = RedisChannelLayer(hosts=[{"address": f"redis://:s3cret@127.0.0.1:{port}/0"}])

        async def send() -> BaseException:
            try:
                await layer.group_send("topic", {"type": "live.update"})
            except Exception as exc:
                return exc
            raise AssertionError("a closed port took the message")

        failure = asyncio.run(send())
    assert unreachable(failure)
    with caplog.at_level(logging.WARNING, logger="queues.live"):
        LayerHealth().failed(failure)
    assert f"127.0.0.1:{port}" in caplog.text
    assert "s3cret" not in caplog.text
