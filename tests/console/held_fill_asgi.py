"""The console's ASGI application with its read index's background fill held at its first
step while a file named ``hold-fill`` exists in ``MRT_VAR_DIR``, or in the middle of its first
listing (holding that folder, as a fill reading a folder of 600,000 jobs does) while a file
named ``hold-listing`` exists (a test served by daphne removes it to let the fill go on).
Everything else is the real application: the fill starts on the first connection as in
production, its listings are read, and pages answer meanwhile.

Served as ``tests.console.held_fill_asgi:application`` (the way in-process tests hold a fill:
``ReadIndex.start_fill(first=lambda: release.wait(...))``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mrtadmin.asgi import application as real_application
from queues.zk import index as zindex

HOLD_SECONDS = 120.0  # never held longer, whatever the test does
_fill = zindex.ReadIndex.fill
_list_raw = zindex.ReadIndex._list_raw


def _held_fill(self: zindex.ReadIndex, first: Callable[[], Any] | None = None) -> None:
    from django.conf import settings

    gate = Path(settings.MRT_VAR_DIR) / "hold-fill"

    def held() -> None:
        deadline = time.monotonic() + HOLD_SECONDS
        while gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if first is not None:
            first()

    _fill(self, held)


def _held_list_raw(self: zindex.ReadIndex, path: str) -> bytes:
    import threading

    from django.conf import settings

    gate = Path(settings.MRT_VAR_DIR) / "hold-listing"
    if threading.current_thread().name in zindex.FILL_THREADS:
        deadline = time.monotonic() + HOLD_SECONDS
        while gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return _list_raw(self, path)


zindex.ReadIndex.fill = _held_fill  # type: ignore[method-assign]
zindex.ReadIndex._list_raw = _held_list_raw  # type: ignore[method-assign]
application = real_application
