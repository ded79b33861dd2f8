from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandError

from queues.services.zkserver import LOCAL, LocalServerError, local_server

from ._base import QueueCommand


class Command(QueueCommand):
    help = "Start, stop or show the project's own ZooKeeper (ZK_HOSTS=local, or empty)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("action", choices=["start", "stop", "status"])

    def handle(self, *args: Any, **opts: Any) -> None:
        if settings.ZK_HOSTS.strip() not in ("", LOCAL):
            self.stdout.write(f"ZK_HOSTS is set ({settings.ZK_HOSTS}); no local server is used")
            return
        server = local_server(settings.MRT_VAR_DIR, settings.ZK_LOCAL_PORT)
        if opts["action"] == "start":
            try:
                server.start()
            except LocalServerError as exc:
                # Its first line is the error; the lines after it, the server's log's last ones,
                # come before that line, each a line of its own (one error line is escaped).
                first, *log = str(exc).splitlines() or [""]
                for line in log:
                    self.stderr.write(line)
                raise CommandError(first.rstrip(":")) from exc
            self.stdout.write(f"ZooKeeper serving on {server.hosts} (data in {server.directory})")
        elif opts["action"] == "stop":
            stopped = server.stop()
            self.stdout.write("ZooKeeper stopped" if stopped else "ZooKeeper was not running")
        else:
            server.follow_running()
            state = "serving" if server.is_serving() else "not running"
            self.stdout.write(f"ZooKeeper on {server.hosts}: {state}")
