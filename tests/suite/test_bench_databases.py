"""``bench/http_pages.py`` gives the consoles of each ZooKeeper a database of their own: two
queues' consoles on one database took each other's text-index rows for their own jobs' (the
rows are keyed by job number) and deleted them, and searches at 1,000,000 jobs waited out the
request deadline on the other console's write lock."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from bench.http_pages import own_database


def _rows(path: Path) -> list[tuple[str]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT name FROM users ORDER BY name").fetchall()


def test_each_zookeeper_gets_a_copy_of_the_prepared_database_and_keeps_it(tmp_path: Path) -> None:
    prepared = tmp_path / "bench.sqlite3"
    with contextlib.closing(sqlite3.connect(prepared)) as db:
        db.execute("PRAGMA journal_mode=WAL")  # the console's mode: rows may sit in the WAL
        db.execute("CREATE TABLE users (name TEXT)")
        db.execute("INSERT INTO users VALUES ('bench')")
        db.commit()
        env = {"MRT_DATABASE_PATH": str(prepared)}
        small = own_database(env, "127.0.0.1:2181/chroot")
        large = own_database(env, "127.0.0.1:2182")
    assert len({prepared, small, large}) == 3
    assert _rows(small) == _rows(large) == [("bench",)]

    with contextlib.closing(sqlite3.connect(small)) as db:
        db.execute("INSERT INTO users VALUES ('written by the small queue''s console')")
        db.commit()
    assert own_database(env, "127.0.0.1:2181/chroot") == small  # the same file, as it was
    assert len(_rows(small)) == 2
    assert _rows(large) == _rows(prepared) == [("bench",)]
