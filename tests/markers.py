"""What a test starts, said by its markers, and checked: the quick tier (``--quick``) relies on it.

A test carries ``zookeeper``, ``postgres``, ``redis``, ``live_server`` or ``browser`` when it
needs that server (or Chromium). The markers come from two places:

- **the fixtures it requests**, by name (``SERVER_FIXTURES``): a test asking for ``zk``, or for
  any fixture that asks for it, is marked ``zookeeper`` at collection, so no one writes these;
- **by hand**, for a test that starts a server itself (``LocalZooKeeper(...)`` in its body, a
  ``redis-server`` of its module's own, ``daphne(...)``) or asks for a server fixture at run time
  (``request.getfixturevalue("pg_db")``: put the marker on the fixture's param,
  ``pytest.param("postgresql", marks=pytest.mark.postgres)``).

Both are checked while the test runs, so a missing marker fails the run rather than slipping a
server into the quick tier:

- every process the test process starts is looked at (Python's ``subprocess.Popen`` audit
  event): a ZooKeeper server (java with zookeeper on its command line), ``initdb``/``pg_ctl``/
  ``postgres``, ``redis-server``, daphne or ``bin/run-console``, Playwright's driver or Chromium,
  started while a test without the matching marker sets up or runs, fails that test at once;
- a server fixture set up at run time for a test without the marker fails it likewise.

``--quick`` keeps the tests that carry none of these markers and not ``slow``, plus those marked
``quick``: a few that touch the real ZooKeeper once each way; Hypothesis tries 20 examples a
property there instead of its 100.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

SERVERS = ("zookeeper", "postgres", "redis", "live_server", "browser")

# The shared fixtures that start a server or hand out one (a function-scoped fixture over a
# session's server is listed too: it is what a test asking at run time sets up).
SERVER_FIXTURES = {
    "zk_server": "zookeeper",
    "zk_server_1mib": "zookeeper",
    "zk_own_1mib": "zookeeper",
    "zk_hosts": "zookeeper",
    "zk_1mib": "zookeeper",
    "ensemble": "zookeeper",
    "ensemble_hosts": "zookeeper",
    "pg_cluster": "postgres",
    "pg_url": "postgres",
    "pg_db": "postgres",
    "live_server": "live_server",
    "browser": "browser",
    # Fixtures of a module or two that start a server of the test's own (or daphne).
    "own_zk": "zookeeper",
    "own_server": "zookeeper",
    "own_pg": "postgres",
    "on_pg": "postgres",
    "redis": "redis",
    "redis_url": "redis",
    "console": "live_server",
    "console_url": "live_server",
    "console_behind_proxy": "live_server",
}


def servers_started(args: Any) -> set[str]:
    """Which of ``SERVERS`` a process with command line ``args`` is, or starts."""
    if isinstance(args, (str, bytes, os.PathLike)):
        args = [args]
    words = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]
    names = {os.path.basename(w.split()[0]) if w.strip() else "" for w in words}
    line = " ".join(words).lower()
    found: set[str] = set()
    if "java" in names and "zookeeper" in line:
        found.add("zookeeper")
    if names & {"initdb", "pg_ctl", "postgres", "pg_ctlcluster"}:
        found.add("postgres")
    if "redis-server" in names:
        found.add("redis")
    if "daphne" in names or " -m daphne" in f" {line}":
        found.add("live_server")
    if "run-console" in names:
        found |= {"live_server", "zookeeper"}
    if "zkserver" in words or "chaosrun" in words:  # manage.py commands that start ZooKeeper
        found.add("zookeeper")
    if "playwright" in line or names & {"chromium", "chrome", "chromium-browser"}:
        found.add("browser")
    return found


class _Running:
    """The test being set up or run, and what it started without saying so."""

    item: pytest.Item | None = None
    missing: dict[str, set[str]] = {}  # nodeid -> markers it lacked


def _lacking(item: pytest.Item, needed: set[str]) -> set[str]:
    return {name for name in needed if item.get_closest_marker(name) is None}


def _message(item: pytest.Item, lacking: set[str], how: str) -> str:
    marks = ", ".join(f"@pytest.mark.{name}" for name in sorted(lacking))
    return (
        f"{item.nodeid} {how} without {marks}: mark it (tests/markers.py), or the quick tier "
        "would start a server"
    )


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen":
        return
    item = _Running.item
    if item is None:
        return
    lacking = _lacking(item, servers_started(args[1]))
    if lacking:
        _Running.missing.setdefault(item.nodeid, set()).update(lacking)
        pytest.fail(_message(item, lacking, f"starts {args[1]!r}"), pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    from hypothesis import HealthCheck, settings

    # Hypothesis judges by the clock unless told not to (200 ms an example, 1 s to make inputs):
    # on two busy cores that failed tests that were right. The quick tier tries fewer examples.
    settings.register_profile("mrt", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("mrt-quick", parent=settings.get_profile("mrt"), max_examples=20)
    settings.load_profile("mrt-quick" if config.getoption("quick") else "mrt")
    if not getattr(sys, "_mrt_marker_audit", False):
        sys.addaudithook(_audit)  # an audit hook cannot be removed: added once per process
        sys._mrt_marker_audit = True  # type: ignore[attr-defined]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="only the quick tier: tests that need no server, and those marked quick",
    )
    parser.addoption(
        "--chaos",
        choices=("small", "full"),
        default=None,
        help="run the chaos runs (the tests marked chaos, tests/faults/test_chaos_faults.py "
        "and test_chaos_small.py) at this size: small in CI (.ci/run), full from bin/run-chaos; "
        "without it they are left out of the suite",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            server = SERVER_FIXTURES.get(fixture)
            if server and item.get_closest_marker(server) is None:
                item.add_marker(server)
    if config.getoption("chaos") is None:
        # The chaos runs are a command of their own (bin/run-chaos; CI runs them small), not
        # part of the suite: about 900 s of its workers' time at the small size.
        chaos = [item for item in items if item.get_closest_marker("chaos")]
        if chaos:
            config.hook.pytest_deselected(items=chaos)
            items[:] = [item for item in items if not item.get_closest_marker("chaos")]
    if not config.getoption("quick"):
        return
    kept, dropped = [], []
    for item in items:
        heavy = any(item.get_closest_marker(name) for name in (*SERVERS, "slow"))
        quick = item.get_closest_marker("quick") is not None
        (dropped if heavy and not quick else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> None:
    server = SERVER_FIXTURES.get(fixturedef.argname)
    item = _Running.item
    if server and item is not None and item.get_closest_marker(server) is None:
        _Running.missing.setdefault(item.nodeid, set()).add(server)
        pytest.fail(_message(item, {server}, f"sets up {fixturedef.argname!r}"), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    _Running.item = item
    try:
        return (yield)
    finally:
        _Running.item = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    _Running.item = item
    try:
        return (yield)
    finally:
        _Running.item = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A start the test swallowed (in a thread, under a broad ``except``) fails it all the same."""
    report = yield
    if report.failed:  # the start failed the test where it happened: said once is enough
        _Running.missing.pop(item.nodeid, None)
    elif call.when == "teardown" and (lacking := _Running.missing.pop(item.nodeid, None)):
        report.outcome = "failed"
        report.longrepr = _message(item, lacking, "started a server")
    return report
