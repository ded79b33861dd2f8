"""The command lines tests/markers.py counts as starting a server (a missing marker fails the
test that starts one), and those it lets pass."""

from __future__ import annotations

import sys

import pytest

from tests.markers import servers_started

PY = sys.executable


@pytest.mark.parametrize(
    ("argv", "servers"),
    [
        (
            [
                "java",
                "-cp",
                "/usr/share/java/zookeeper.jar",
                "org.apache.zookeeper.server.ZooKeeperServerMain",
                "zoo.cfg",
            ],
            {"zookeeper"},
        ),
        (["/usr/lib/postgresql/15/bin/initdb", "-D", "data"], {"postgres"}),
        (
            ["runuser", "-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "start"],
            {"postgres"},
        ),
        (["/usr/bin/redis-server", "--port", "6390"], {"redis"}),
        (
            [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", "8001", "mrtadmin.asgi:application"],
            {"live_server"},
        ),
        (["bash", "/repo/bin/run-console"], {"live_server", "zookeeper"}),
        ([PY, "manage.py", "zkserver"], {"zookeeper"}),
        ([PY, "manage.py", "chaosrun", "--jobs", "30"], {"zookeeper"}),
        (
            ["/venv/lib/python3.11/site-packages/playwright/driver/node", "cli.js", "run-driver"],
            {"browser"},
        ),
        ("/usr/bin/chromium --headless", {"browser"}),
        # What a test may start without a marker: the console's own commands, tools, consumers.
        ([PY, "manage.py", "runconsumer", "estimating", "--once"], set()),
        ([PY, "manage.py", "migrate", "--noinput"], set()),
        (["redis-cli", "-p", "6390", "ping"], set()),
        (["git", "status"], set()),
        ([PY, "-c", "import mrtadmin.settings"], set()),
    ],
)
def test_what_counts_as_starting_a_server(argv: list[str] | str, servers: set[str]) -> None:
    assert servers_started(argv) == servers
