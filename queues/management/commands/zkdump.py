from __future__ import annotations

import json
from typing import Any

from queues.zk import client
from queues.zk.tree import walk

from ._base import QueueCommand


class Command(QueueCommand):
    help = "Print the ZooKeeper tree below PATH (default /) with decoded data."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("path", nargs="?", default="/")

    def handle(self, *args: Any, **opts: Any) -> None:
        path = opts["path"]
        if not path.startswith("/") or "//" in path or (path != "/" and path.endswith("/")):
            self.stderr.write(f"not a ZooKeeper path: {path!r}")
            raise SystemExit(2)
        zk = self.run_safely(client)
        count = 0
        for node, data, ephemeral in walk(zk, path):
            count += 1
            shown = "" if data is None else json.dumps(data, ensure_ascii=False)
            flag = " (ephemeral)" if ephemeral else ""
            self.stdout.write(f"{node}{flag}" + (f"  {shown}" if shown else ""))
        if count == 0:
            self.stderr.write(f"{path} does not exist")
            raise SystemExit(1)
