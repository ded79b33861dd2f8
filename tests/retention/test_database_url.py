"""DATABASE_URL: SQLite when it is empty, PostgreSQL (psycopg 3) when it names a server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.db import connection

from queues.operator.audit import AuditEntry

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


VENDOR = (
    "from django.db import connection; print(connection.vendor, connection.settings_dict['NAME'])"
)


def test_database_url_selects_postgresql(pg_cluster, tmp_path: Path) -> None:
    """A process started with DATABASE_URL migrates and uses that PostgreSQL database."""
    url = pg_cluster.create_database("mrt_settings_check")
    env = {"DATABASE_URL": url, "MRT_VAR_DIR": str(tmp_path)}
    migrated = manage("migrate", "--no-input", env=env)
    assert migrated.returncode == 0, migrated.stderr
    shown = manage("shell", "-c", VENDOR, env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip().splitlines()[-1].split() == ["postgresql", "mrt_settings_check"]


def test_without_database_url_sqlite(tmp_path: Path) -> None:
    env = {"DATABASE_URL": "", "MRT_VAR_DIR": str(tmp_path)}
    shown = manage("shell", "-c", VENDOR, env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip().splitlines()[-1].split() == [
        "sqlite",
        str(tmp_path / "console.sqlite3"),
    ]


def test_database_url_not_postgres_refused(tmp_path: Path) -> None:
    env = {"DATABASE_URL": "mysql://u:p@127.0.0.1/x", "MRT_VAR_DIR": str(tmp_path)}
    shown = manage("check", env=env)
    assert shown.returncode != 0
    assert "DATABASE_URL must be a postgres:// URL" in shown.stderr


def test_fixture_points_the_orm(database: str) -> None:
    assert connection.vendor == database
    AuditEntry.objects.create(action="probe", kind="job", item_id="jid0000000001")
    assert AuditEntry.objects.filter(item_id="jid0000000001").count() == 1
