"""Open the live console's websocket like a browser and wait for one change of a topic.

Used by bin/compose-check from outside the containers; only the standard library, so the host's
python3 runs it. Prints every JSON message it receives, one per line; exits 0 at the first
"changed" message of the topic, non-zero when refused, closed or out of time.

    python3 docker/live_probe.py HOST PORT COOKIE TOPIC SECONDS
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import sys
import time
from typing import Any


class Socket:
    def __init__(self, host: str, port: int, cookie: str, timeout: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buffer = b""
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET /ws/live/ HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Key: {key}\r\nOrigin: http://{host}:{port}\r\n"
                f"Cookie: {cookie}\r\n\r\n"
            ).encode()
        )
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].decode(errors="replace")
        if not status.startswith("HTTP/1.1 101"):
            sys.exit(f"the console refused the websocket: {status}")

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            sys.exit("the console closed the connection")
        self.buffer += chunk

    def _read(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._fill()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def send(self, message: Any) -> None:
        """One masked text frame, as every client frame must be."""
        payload, mask = json.dumps(message).encode(), os.urandom(4)
        size = len(payload)
        if size < 126:
            header = bytes([0x81, 0x80 | size])
        else:
            header = bytes([0x81, 0x80 | 126]) + struct.pack("!H", size)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def receive(self) -> Any:
        """The next text frame's JSON; None for other frames."""
        first, second = self._read(2)
        size = second & 0x7F
        if size == 126:
            size = struct.unpack("!H", self._read(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", self._read(8))[0]
        data = self._read(size)
        opcode = first & 0x0F
        if opcode == 0x8:
            code = struct.unpack("!H", data[:2])[0] if len(data) >= 2 else None
            sys.exit(f"the console closed the websocket (code {code})")
        return json.loads(data) if opcode == 0x1 else None


def main() -> None:
    host, port, cookie, topic, seconds = sys.argv[1:6]
    deadline = time.monotonic() + float(seconds)
    ws = Socket(host, int(port), cookie, float(seconds))
    while time.monotonic() < deadline:
        message = ws.receive()
        if message is None:
            continue
        print(json.dumps(message, sort_keys=True), flush=True)
        if message.get("kind") == "hello":
            ws.send({"subscribe": [topic]})
        elif message.get("kind") == "changed" and message.get("topic") == topic:
            return
    sys.exit(f"no change of {topic} within {seconds} s")


if __name__ == "__main__":
    main()
