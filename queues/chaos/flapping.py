"""``Flapping``: the services outside of a chaos run answering badly for a spell (503, a reset
connection, a slow answer), and the helpers a loopback server answers through while it flaps
(``answer_flapping``, ``reset``). The stand-ins (``standins``) and the depositors' servers
(``servers``) flap with it.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from random import Random

# How a flapping service answers, one kind a phase of a spell: every request of the phase.
UNAVAILABLE = "503"
UNAVAILABLE_RETRY_AFTER = "503 with Retry-After"
RESET = "reset"  # half of them before anything is done, half after, in the middle of the answer
SLOW = "slow"
FLAP_KINDS = (UNAVAILABLE, UNAVAILABLE_RETRY_AFTER, RESET, SLOW)
# A slow answer waits this long (seconds) before it is made: well inside every deadline of the
# run (MRT_HTTP_TIMEOUT 30 s, MRT_DOWNLOAD_DEADLINE 20 s).
SLOW_SECONDS = (0.5, 3.0)
# What a 503 asks for with Retry-After (seconds).
RETRY_AFTER_SECONDS = (1, 2)
# The services that flap, by the names ``Flapping`` is asked with.
FLAPPING_SERVICES = ("storage", "inventory", "EZID", "depositor", "callback")


class Flapping:
    """The services outside of a chaos run answering badly for a spell, then well again.

    While a spell is on (``set`` by the flap fault, for every service at once or each its own),
    every request to a flapping server (storage, inventory, EZID, the depositors' good files and
    the callback receiver) is answered by its service's kind: 503 without or with
    ``Retry-After``; the connection reset (RST), either before anything is done or after the
    request was carried out, halfway through the answer (a storage version made, an ARK minted,
    a callback counted, the client never told); or the right answer after a pause. ``spoiled``
    counts what was done, per service and kind."""

    def __init__(self, seed: int) -> None:
        self.lock = threading.Lock()
        self.rng = Random(seed)
        self.kind: str | None = None
        self.kinds: dict[str, str | None] = {}
        self.spoiled: Counter[tuple[str, str]] = Counter()

    def set(self, kind: str | None, **kinds: str | None) -> None:
        """Every service answers as ``kind`` (None: well), but those named in ``kinds``."""
        with self.lock:
            self.kind = kind
            self.kinds = dict(kinds)

    def misbehave(self, service: str) -> tuple[str, float] | None:
        """What this request meets: (kind, a number for it), counted; None: a good answer.
        The number is the Retry-After, the pause of a slow answer, or for a reset 0 (before
        anything is done) or 1 (halfway through the answer)."""
        with self.lock:
            kind = self.kinds.get(service, self.kind)
            if kind is None:
                return None
            if kind == UNAVAILABLE_RETRY_AFTER:
                number = float(self.rng.choice(RETRY_AFTER_SECONDS))
            elif kind == SLOW:
                number = self.rng.uniform(*SLOW_SECONDS)
            elif kind == RESET:
                number = float(self.rng.random() < 0.5)
            else:
                number = 0.0
            shown = kind if kind != RESET else ("reset mid-answer" if number else "reset at once")
            self.spoiled[(service, shown)] += 1
            return kind, number

    def figures(self) -> dict[str, Counter[str]]:
        """Service -> spoiled answers per kind."""
        found: dict[str, Counter[str]] = {}
        with self.lock:
            for (service, kind), count in self.spoiled.items():
                found.setdefault(service, Counter())[kind] += count
        return found


def reset(handler: BaseHTTPRequestHandler) -> None:
    """Reset the handler's connection (RST, not FIN), as a crashing server or a balancer does."""
    with contextlib.suppress(OSError):
        handler.wfile.flush()
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.connection.close()
    handler.close_connection = True


def answer_flapping(
    handler: BaseHTTPRequestHandler,
    flapping: Flapping | None,
    service: str,
    make: Callable[[], tuple[int, bytes, str]],
    unavailable: tuple[bytes, str],
) -> None:
    """Answer with ``make()`` (status, body, content type), or as the spell of ``flapping``
    says; ``unavailable``: the service's body and content type of a 503."""
    bad = flapping.misbehave(service) if flapping is not None else None
    kind, number = bad or ("", 0.0)
    if kind in (UNAVAILABLE, UNAVAILABLE_RETRY_AFTER):
        body, content_type = unavailable
        handler.send_response(503)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        if kind == UNAVAILABLE_RETRY_AFTER:
            handler.send_header("Retry-After", f"{number:g}")
        handler.end_headers()
        handler.wfile.write(body)
        return
    if kind == RESET and not number:
        reset(handler)
        return
    if kind == SLOW:
        time.sleep(number)
    status, body, content_type = make()
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if kind == RESET:
        with contextlib.suppress(OSError):
            handler.wfile.write(body[: len(body) // 2])
        reset(handler)
        return
    handler.wfile.write(body)
