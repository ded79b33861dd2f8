"""The search finds every live job by every field it offers, however old (issue 51, item 5):
the console's database text index (``queues/console/jobtext.py``), fed from what the read index
reads.

- through daphne: the oldest job, behind more newer jobs than the 5,000 the search used to
  look at, found by its title, file name, submitter, error text and with no field;
- PostgreSQL stopped while the queue moves: the read index and its watches go on, the texts
  wait in memory and are written once the server is back (and found through ``pg_trgm``);
- a restart of daphne: the jobs made and failed while no console ran are written, and only
  they (the log's "caught up" line), and the old ones are found before the fill has ended.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from bench.loader import bulk_load
from queues.chaos.infra import InfraError, Postgres
from queues.console import jobtext
from queues.models import JobText
from queues.zk import batches, jobs
from queues.zk import index as zindex
from queues.zk.records import Job
from tests.live.conftest import console_env, daphne, log_in
from tests.pg import default_database

# One worker runs this module's tests (tests/workers.py's TOGETHER): its module fixture is made
# once, not once on each worker that is given one of them.

PROFILE = "demo_collection"
USER, PASSWORD = "searcher", "pw-" + "s" * 20
ROW = re.compile(r'id="search-row-(jid[0-9]{10})"')
# The search used to look at the 5,000 newest live jobs' titles and file names and the 1,000
# newest Failed jobs' messages: more newer jobs than that stand in front of the one searched.
NEWER = 5_100


def wait_for(check: Callable[[], Any], *, timeout: float = 120.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up waiting after {timeout} s"
        time.sleep(every)


def deposit(
    zk: Any, *, title: str, filename: str, submitter: str, failed: str = "", local_id: str = ""
) -> Job:
    batch = batches.batch_create(
        zk,
        submission={
            "profile": PROFILE,
            "submitter": submitter,
            "payload_url": "https://example.org/p.zip",
            "type": "file",
        },
    )
    configuration = {
        "profile": PROFILE,
        "submitter": submitter,
        "payload_url": "https://example.org/a.pdf",
        "type": "file",
        "title": title,
        "filename": filename,
    }
    if local_id:
        configuration["localID"] = local_id
    job = jobs.job_create(zk, bid=batch.bid, configuration=configuration)
    if failed:
        job = jobs.job_transition(zk, job, "Estimating")
        job = jobs.job_transition(zk, job, "Failed", message=failed)
    return job


def found(session: requests.Session, url: str, q: str, field: str = "") -> list[str]:
    """The live jobs a search lists (the one it opens, for a single exact match)."""
    answer = session.get(
        f"{url}/search/", params={"q": q, "field": field}, allow_redirects=False, timeout=60
    )
    if answer.status_code == 302:
        return [answer.headers["Location"].rstrip("/").rsplit("/", 1)[-1]]
    assert answer.status_code == 200, answer.text[:500]
    html = answer.text
    start = html.index('id="search-jobs"')
    return ROW.findall(html[start : html.index("</section>", start)])


@pytest.mark.live_server
@pytest.mark.slow
def test_the_oldest_job_is_found_by_every_field_behind_thousands_of_newer_ones(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    old = deposit(
        zk,
        title="Herbarium sheets of Ynes Mexia",
        filename="mexia-herbarium-0001.tif",
        submitter="ucb/Ynes Mexia",
        failed="Checksum disagreed on sheet-77 of the Mexia set",
        local_id="MEXIA-1926-77",
    )
    newer = bulk_load(
        zk, batches=NEWER // 50, jobs=NEWER, distribution={"Failed": 0.3, "Completed": 0.7}
    )
    assert newer.jobs == NEWER and all(j > old.jid for s in newer.jobs_by_state.values() for j in s)
    env = console_env(zk_hosts, tmp_path, user=USER, password=PASSWORD)
    with daphne(env, tmp_path / "daphne.log") as url:
        session = log_in(url, USER, PASSWORD)
        # While the read index fills, a job whose texts are not read yet is not found: asked
        # again until it is (the database is empty at this first start).
        wait_for(lambda: found(session, url, "ynes mexia", "title") == [old.jid])
        assert found(session, url, "HERBARIUM-0001.TIF", "filename") == [old.jid]
        assert found(session, url, "UCB/ynes", "submitter") == [old.jid]
        assert found(session, url, "disagreed on SHEET-77", "error") == [old.jid]
        assert found(session, url, "mexia-1926", "id") == [old.jid]  # a part of a local ID
        assert found(session, url, "sheets of ynes") == [old.jid]  # every field at once
        # A newer job the loader made, by its title, file name and error text.
        some = newer.jobs_by_state["Failed"][0]
        assert found(session, url, f"{some}.bin", "filename") == [some]
        assert found(session, url, f"benchmark of {some}", "error") == [some]
    # Every job's texts reached the database (its own file, read as it is).
    with contextlib.closing(sqlite3.connect(tmp_path / "console.sqlite3")) as db:
        (rows,) = db.execute("SELECT count(*) FROM queues_jobtext").fetchone()
        (errors,) = db.execute("SELECT count(*) FROM queues_jobtext WHERE error <> ''").fetchone()
    assert rows == NEWER + 1
    assert errors == len(newer.jobs_by_state["Failed"]) + 1


# PostgreSQL stopped under the feed ------------------------------------------------------------


@pytest.fixture(scope="module")
def own_pg(django_db_blocker: Any) -> Iterator[tuple[Postgres, str]]:
    """A PostgreSQL cluster this module may stop and start, its database migrated (pg_trgm)."""
    try:
        cluster = Postgres.started()
    except InfraError as exc:
        pytest.skip(str(exc))
    try:
        url = cluster.create_database("mrt_search")
        with django_db_blocker.unblock(), default_database(url):
            call_command("migrate", verbosity=0, interactive=False)
        yield cluster, url
    finally:
        cluster.stop()
        cluster.remove()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_texts_read_while_postgresql_is_down_wait_and_are_written_when_it_is_back(
    zk: Any, own_pg: tuple[Postgres, str], django_db_blocker: Any
) -> None:
    cluster, url = own_pg
    zindex.reset()
    jobtext.reset()
    with (
        django_db_blocker.unblock(),
        default_database(url),
        override_settings(MRT_SEARCH_FEED_SECONDS=0.2),
    ):
        try:
            first = deposit(zk, title="Before the outage", filename="a.txt", submitter="u/one")
            idx = zindex.for_client(zk)
            feed = jobtext.feed_for(idx, start=True)
            idx.sync()  # what a start's fill does: every job read, every folder watched
            assert feed.flush()
            assert JobText.objects.get(number=int(first.jid[3:])).title == "Before the outage"
            connection.close()
            cluster.stop()
            made = [
                deposit(
                    zk, title=f"Made in the outage {n}", filename=f"o{n}.txt", submitter="u/two"
                )
                for n in range(3)
            ]
            broken = deposit(
                zk,
                title="Failed in the outage",
                filename="f.txt",
                submitter="u/two",
                failed="Storage said 507 for f.txt",
            )
            # Nothing here reads the queue: the watches wake the feeder, which reads the new
            # jobs into the read index and hands their texts on; the writer meets the outage.
            wait_for(lambda: len(feed.pending) >= 4)
            wait_for(lambda: feed.progress.reason)
            assert "cannot be written now" in feed.status()
            assert idx.job_states_of([broken.jid]) == {broken.jid: "Failed"}  # the index goes on
            cluster.start()
            assert feed.flush(timeout=120)
            connection.close()
            rows = {r.number: r for r in JobText.objects.all()}
            for job in [*made, broken]:
                assert (
                    rows[int(job.jid[3:])].title
                    == jobs.job_load(zk, job.jid).configuration["title"]
                )
            assert rows[int(broken.jid[3:])].error == "Storage said 507 for f.txt"
            # Found through pg_trgm, newest first, in any case.
            hits = [n for n, _v in jobtext.matching(["title"], "MADE IN THE OUTAGE")]
            assert hits == sorted((int(j.jid[3:]) for j in made), reverse=True)
            assert [n for n, _v in jobtext.matching(["error"], "said 507")] == [int(broken.jid[3:])]
            assert jobtext.count(["title", "error"], "outage") == 5
            _known_keys_match_the_rows()
        finally:
            jobtext.reset()
            zindex.reset()
            if not cluster.data.joinpath("postmaster.pid").exists():
                cluster.start()
            connection.close()
            call_command("flush", verbosity=0, interactive=False)


def _known_keys_match_the_rows() -> None:
    """The keys the database works out for a restart's ``known`` are ``_known_key`` of each
    row, in order (the feed would otherwise write every job again, or skip a new one)."""
    with connection.cursor() as cursor:
        cursor.execute(jobtext.KNOWN_KEYS_SQL)
        made_there = [key for (key,) in cursor.fetchall()]
    rows = JobText.objects.values_list("number", "made", "ark")
    assert made_there == sorted(jobtext._known_key(n, m, bool(a)) for n, m, a in rows)


@pytest.mark.django_db
def test_the_database_works_out_the_known_keys_of_a_restart() -> None:
    """SQLite here (PostgreSQL in the outage test above): numbers of all ten digits, times
    past 24 bits, rows with and without an ARK."""
    JobText.objects.bulk_create(
        [
            JobText(number=9_999_999_999, made=1_764_000_000_123, ark="ark:/99999/fk4zz"),
            JobText(number=1, made=0),
            JobText(number=4_321, made=(1 << 24) + 5, ark=""),
            JobText(number=17_179_869_183 // 2, made=1_764_000_000_999, ark="ark:/1/x"),
        ]
    )
    _known_keys_match_the_rows()


@pytest.mark.django_db
def test_a_text_found_through_its_rare_trigrams_is_what_the_phrase_query_finds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SQLite: a long text is looked for through trigrams of it that few rows hold, then checked
    whole; every answer (rows, order, count) is the phrase query's, in the fields asked only."""
    monkeypatch.setattr(jobtext, "RARE_AT_MOST", 100)  # 2,000 rows here, not 1,000,000

    def number(n: int) -> int:  # IDs of eight digits, as a large queue's
        return 3_000_000 + n * 7_919

    rows = [
        JobText(
            number=number(n),
            made=n,
            title=f'Letter "{n:04d}" to Zoë' if n % 7 else f"Annual report {n:04d}",
            filename=f"jid{number(n):010d}.bin",
            local_ids=f"local-{number(n):08d}\nother-{n % 3}",
            ark=f"ark:/99999/fk4{number(n):08d}",
            error=f"Storage said 503 for jid{number(n):010d}.bin" if n % 50 == 0 else "",
        )
        for n in range(1, 2001)
    ]
    JobText.objects.bulk_create(rows)
    one = number(1234)
    asked = [
        (["filename"], f"jid{one:010d}.bin"),
        (["ark", "local_ids"], f"ARK:/99999/FK4{one:08d}"),
        (["title", "filename", "local_ids", "ark", "error"], "said 503 for jid00"),
        (["title"], 'letter "0123"'),
        (["title"], "to zoë"),  # in every row but the seventh: no rare trigram
        (["local_ids"], f"-{number(1999):08d}\nother"),
        (["filename"], "Annual report 0014"),  # in a title only
        (["title"], "annual report 0014"),
        (["error"], "nowhere at all"),
    ]
    found = {
        (tuple(f), t): (list(jobtext.matching(f, t)), jobtext.count(f, t, 5)) for f, t in asked
    }
    # The IDs through their rare trigrams; a text in most rows by the phrase query.
    assert jobtext._rare_rows(["filename"], f"jid{one:010d}.bin") is not None
    assert jobtext._rare_rows(["ark"], f"ARK:/99999/FK4{one:08d}") is not None
    assert jobtext._rare_rows(["title"], "to zoë") is None
    # An ID's digits are tried at once: one query, no trigram counted.
    with CaptureQueriesContext(connection) as asked_db:
        assert [n for n, _v in jobtext._rare_rows(["filename"], f"jid{one:010d}.bin")] == [one]
    assert len(asked_db.captured_queries) == 1, asked_db.captured_queries
    monkeypatch.setattr(jobtext, "RARE_FROM", 10**6)  # every text a phrase query
    for (fields, text), (rows_found, counted) in found.items():
        assert rows_found == list(jobtext.matching(list(fields), text)), text
        assert counted == jobtext.count(list(fields), text, 5), text
    assert [n for n, _v in found[("filename",), f"jid{one:010d}.bin"][0]] == [one]
    assert [n for n, _v in found[("ark", "local_ids"), f"ARK:/99999/FK4{one:08d}"][0]] == [one]
    assert found[("title",), "to zoë"][1] == 6  # counted to its cap + 1
    assert found[("filename",), "Annual report 0014"] == ([], 0)
    assert [n for n, _v in found[("title",), "annual report 0014"][0]] == [number(14)]


def test_the_trigrams_guessed_rare_are_apart_and_hold_digits() -> None:
    def guessed(text: str) -> list[str]:
        pieces = [text[i : i + 3] for i in range(len(text) - 2)]
        ranked = [(-sum(c.isdigit() for c in p), -i, p) for i, p in enumerate(pieces)]
        return jobtext._guessed(sorted(ranked))

    assert guessed("jid0012772046.bin") == ["046", "772"]
    assert guessed("jid0000123456.bin") == ["456", "123"]  # not "000" too
    assert guessed("Object 123456") == ["456", "123"]
    assert guessed("annual report 0014") == []  # one trigram of two digits or more apart
    assert guessed("to zoë") == []


def test_the_rare_trigrams_taken_do_not_overlap() -> None:
    """An ARK's last six digits hold four rare trigrams; the rarest two overlap ("278" and
    "780" share "78"): the two apart from each other are taken, and none when none are."""
    held = [(3751, 19, "780"), (3493, 18, "278"), (3827, 17, "727"), (3821, 16, "472")]
    assert jobtext._apart(held) == ["780", "472"]
    assert jobtext._apart([(5, 0, "abc"), (9, 1, "bcd"), (7, 10, "xyz"), (6, 4, "efg")]) == [
        "abc",
        "efg",
        "xyz",
    ]
    assert jobtext._apart([(1, 3, "aaa"), (2, 4, "aab")]) == []


# A restart ----------------------------------------------------------------------------------------


@pytest.mark.live_server
def test_a_restart_writes_what_was_made_while_no_console_ran_and_only_that(
    zk: Any, zk_hosts: str, tmp_path: Path
) -> None:
    before = [
        deposit(zk, title=f"Kept letter {n}", filename=f"kept-{n}.pdf", submitter="u/kept")
        for n in range(4)
    ]
    env = console_env(zk_hosts, tmp_path, user=USER, password=PASSWORD, LOG_LEVEL="INFO")
    log = tmp_path / "daphne-1.log"
    with daphne(env, log) as url:
        session = log_in(url, USER, PASSWORD)
        wait_for(lambda: len(found(session, url, "kept letter", "title")) == 4)
        wait_for(lambda: "caught up, 4 jobs written" in log.read_text())
    # While no console runs: two jobs made, one of the old ones failed.
    during = [
        deposit(zk, title=f"Unseen letter {n}", filename=f"unseen-{n}.pdf", submitter="u/new")
        for n in range(2)
    ]
    job = jobs.job_transition(zk, jobs.job_load(zk, before[0].jid), "Estimating")
    jobs.job_transition(zk, job, "Failed", message="Manifest unreadable at line 12")
    log = tmp_path / "daphne-2.log"
    with daphne(env, log) as url:
        session = log_in(url, USER, PASSWORD)
        # The old jobs answer from the database whether the fill has reached them or not.
        assert sorted(found(session, url, "kept letter", "title")) == sorted(j.jid for j in before)
        wait_for(lambda: len(found(session, url, "unseen letter", "title")) == 2)
        assert found(session, url, "manifest unreadable", "error") == [before[0].jid]
        # The backfill: the two new jobs and the new error, not the four kept ones again.
        wait_for(lambda: "caught up, 3 jobs written" in log.read_text())
    assert "caught up" in log.read_text()
    with contextlib.closing(sqlite3.connect(tmp_path / "console.sqlite3")) as db:
        rows = dict(db.execute("SELECT number, error FROM queues_jobtext").fetchall())
    assert sorted(rows) == sorted(int(j.jid[3:]) for j in [*before, *during])
    assert rows[int(before[0].jid[3:])] == "Manifest unreadable at line 12"
