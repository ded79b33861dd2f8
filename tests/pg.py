"""A throwaway PostgreSQL cluster for the tests that need a shared database, started like the
tests' ZooKeeper: Debian's ``postgresql`` binaries (``initdb``, ``pg_ctl``) on a free loopback
port, its data in a temporary folder, stopped at the end of the session.

PostgreSQL refuses to run as root: a root test run starts it as Debian's ``postgres`` system
user (``runuser``), with the data folder owned by that user. Password authentication over TCP
only (scram-sha-256), so the URL the tests get is the one an operator would set as
``DATABASE_URL``.

Fixtures (import them into a test module or a conftest):

- ``pg_cluster`` (session): the running cluster;
- ``pg_url`` (session): ``postgres://...`` of a database of its own, migrated;
- ``pg_db`` (function, needs pytest-django's ``db``): the default database connection points
  at ``pg_url`` for the test (the ORM, the test client, the management commands all use it),
  and every table is emptied afterwards.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from queues.zkserver import free_port

SYSTEM_USER = "postgres"  # Debian's postgresql package creates it
ROLE = "mrt"


class PostgresUnavailable(RuntimeError):
    pass


def pg_bin_dir() -> Path | None:
    """The newest of Debian's /usr/lib/postgresql/<version>/bin holding initdb."""
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if not found:
        return None
    return Path(max(found, key=lambda p: int(Path(p).parts[-3]))).parent


@dataclass
class PostgresCluster:
    directory: Path
    port: int
    bin_dir: Path
    password: str = field(default_factory=lambda: secrets.token_hex(12))
    owner: str | None = None  # the system user the server runs as (None: ourselves)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log_file(self) -> Path:
        return self.directory / "postgres.log"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self.owner:
            command = ["runuser", "-u", self.owner, "--", *command]
        return subprocess.run(
            command, check=check, capture_output=True, text=True, cwd=self.directory
        )

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        pwfile = self.directory / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.owner:
            entry = pwd.getpwnam(self.owner)
            for path in (self.directory, pwfile):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            ROLE,
            "--pwfile",
            str(pwfile),
            "--auth-host=scram-sha-256",
            "--auth-local=reject",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        pwfile.unlink()
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        done = self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log_file), "-o", options, "-w", "start",
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            tail = (
                self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            )
            raise PostgresUnavailable(f"pg_ctl start failed: {done.stderr}\n{tail}")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def url(self, name: str = "postgres") -> str:
        return f"postgres://{ROLE}:{self.password}@127.0.0.1:{self.port}/{name}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` (owned by the test role) and return its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def start_cluster() -> PostgresCluster:
    bin_dir = pg_bin_dir()
    if bin_dir is None:
        raise PostgresUnavailable(
            "PostgreSQL is not installed (/usr/lib/postgresql/*/bin/initdb): bin/install --tests "
            "installs Debian's postgresql package"
        )
    owner = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            raise PostgresUnavailable(
                f"running as root and there is no {SYSTEM_USER!r} user to run PostgreSQL as"
            ) from None
        owner = SYSTEM_USER
    # Not under pytest's tmp folder: as root that is readable by root only.
    directory = Path(tempfile.mkdtemp(prefix="mrt-pg-"))
    cluster = PostgresCluster(directory, free_port(), bin_dir, owner=owner)
    try:
        cluster.start()
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    try:
        cluster = start_cluster()
    except PostgresUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.directory, ignore_errors=True)


def database_settings(url: str) -> dict:
    """The complete settings dict Django would make of ``DATABASE_URL=url``."""
    import dj_database_url
    from django.db import connections

    configured = connections.configure_settings({"default": dj_database_url.parse(url)})
    return configured["default"]


@contextlib.contextmanager
def default_database(url: str) -> Iterator[None]:
    """Point Django's default database at ``url`` (this thread and any thread started meanwhile)."""
    from django.db import connections
    from django.db.utils import load_backend

    settings_dict = database_settings(url)
    old_connection = connections["default"]
    old_settings = connections.settings["default"]
    backend = load_backend(settings_dict["ENGINE"])
    connections.settings["default"] = settings_dict
    connections["default"] = backend.DatabaseWrapper(settings_dict, "default")
    try:
        yield
    finally:
        connections["default"].close()
        connections.settings["default"] = old_settings
        connections["default"] = old_connection


@pytest.fixture(scope="session")
def pg_url(pg_cluster: PostgresCluster, django_db_blocker) -> str:
    """A migrated database of its own in the session's cluster."""
    from django.core.management import call_command

    url = pg_cluster.create_database(f"mrt_test_{int(time.time())}")
    with django_db_blocker.unblock(), default_database(url):
        call_command("migrate", verbosity=0, interactive=False)
    return url


@pytest.fixture
def pg_db(db, pg_url: str, django_db_blocker) -> Iterator[str]:
    """The test's ORM work goes to PostgreSQL; every table is emptied afterwards."""
    from django.core.management import call_command

    with django_db_blocker.unblock(), default_database(pg_url):
        try:
            yield pg_url
        finally:
            call_command("flush", verbosity=0, interactive=False)
