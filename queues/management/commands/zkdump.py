from __future__ import annotations

import json
import re
from typing import Any

from django.core.management.base import CommandError

from queues.zk.client import client
from queues.zk.tree import walk

from ._base import QueueCommand

# What json.dumps leaves raw with ensure_ascii=False and a terminal may act on: DEL, the C1
# controls (CSI among them) and the line and paragraph separators; written as JSON's own
# escapes, the line stays JSON a reader can parse.
_RAW_IN_JSON = re.compile(r"[\x7f-\x9f\u2028\u2029]")


def _shown(data: object) -> str:
    text = json.dumps(data, ensure_ascii=False)
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class Command(QueueCommand):
    help = "Print the ZooKeeper tree below PATH (default /) with decoded data."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("path", nargs="?", default="/")

    def handle(self, *args: Any, **opts: Any) -> None:
        path = opts["path"]
        parts = [] if path == "/" else path.split("/")[1:]
        if not path.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise CommandError(f"not a ZooKeeper path: {path!r}", returncode=2)
        zk = self.run_safely(client)
        count = 0
        for node, data, ephemeral in walk(zk, path):
            count += 1
            shown = "" if data is None else _shown(data)
            flag = " (ephemeral)" if ephemeral else ""
            self.stdout.write(f"{node}{flag}" + (f"  {shown}" if shown else ""))
        if count == 0:
            raise CommandError(f"{path} does not exist")
