"""End to end in real processes: ``runconsumer all`` takes a manifest of manifests from a
loopback HTTP server to stored, recorded objects and a summary mail; a resumed job and an update
report complete the batch. And a daemon killed mid-download loses and doubles nothing."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from queues.services import moves
from queues.steps.storage import LocalStorage
from queues.zk.batches import batch_job_ids, batch_load
from queues.zk.jobs import job_load

from .conftest import DEMO, FileServer, batch_manifest, md5, object_manifest, wait_for

pytestmark = pytest.mark.slow


class Consumers:
    """``manage.py runconsumer`` processes sharing one var folder and database."""

    def __init__(self, var: Path, zk_hosts: str) -> None:
        self.var = var
        self.db = var / "console.sqlite3"
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MRT_", "EMAIL_", "ZK_", "DJANGO_"))
        }
        self.env.update(
            DJANGO_SETTINGS_MODULE="mrtadmin.settings",
            ZK_HOSTS=zk_hosts,
            MRT_VAR_DIR=str(var),
            MRT_DATABASE_PATH=str(self.db),
            MRT_DOWNLOAD_RETRIES="1",
            # The depositors here are loopback servers.
            MRT_FETCH_ALLOW="127.0.0.0/8",
            # Provisioning must not hold the jobs back on a build machine whose disk is fuller
            # than the default mark; throttling itself is tested in test_provisioning.
            MRT_PROVISION_HIGH_WATER="0.99",
            LOG_LEVEL="INFO",
        )
        self.procs: list[tuple[subprocess.Popen, Path]] = []
        self.run("migrate", "--noinput")

    def run(self, *args: str) -> None:
        subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=settings.BASE_DIR,
            env=self.env,
            check=True,
            capture_output=True,
        )

    def start(self, *args: str, **env: str) -> subprocess.Popen:
        log = self.var / f"consumer-{len(self.procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "runconsumer", *args],
                cwd=settings.BASE_DIR,
                env={**self.env, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append((proc, log))
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()}" for _p, log in self.procs)

    def stop(self, proc: subprocess.Popen) -> int:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=60)

    def close(self) -> None:
        for proc, _log in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)

    # What the processes left behind -------------------------------------------------------

    def storage(self) -> LocalStorage:
        return LocalStorage(self.var / "storage")

    def stored_objects(self) -> int:
        root = self.var / "storage"
        return sum(1 for p in root.iterdir() if p.is_dir()) if root.exists() else 0

    def inventory(self) -> list[tuple[str, int]]:
        with sqlite3.connect(self.db) as db:
            return db.execute(
                "SELECT o.ark, v.number FROM queues_inventoryobject o "
                "JOIN queues_inventoryversion v ON v.object_id = o.id ORDER BY o.ark"
            ).fetchall()

    def mails(self) -> list[str]:
        folder = self.var / "mail"
        return sorted(p.read_text() for p in folder.iterdir()) if folder.exists() else []


@pytest.fixture
def consumers(tmp_path: Path, zk_hosts: str) -> Iterator[Consumers]:
    var = tmp_path / "consumer-var"
    var.mkdir()
    procs = Consumers(var, zk_hosts)
    yield procs
    procs.close()


def _jobs(zk: Any, bid: str):
    index = batch_job_ids(zk, bid)
    return [job_load(zk, j) for j in sorted({j for f in index.values() for j in f})]


def _state(zk: Any, bid: str) -> str:
    return batch_load(zk, bid).state


# The one-job loop for every step, and the default: the batched loop for every step but
# provisioning, with locks kept between a process's short steps.
LOOPS = [{"MRT_CLAIM_BATCH": "1", "MRT_KEEP_LOCKS": "0", "MRT_BATCH_LONG_STEPS": "0"}, {}]


@pytest.mark.parametrize("loop", LOOPS, ids=["one-job", "batched"])
def test_manifest_of_manifests_end_to_end(
    zk, files: FileServer, consumers: Consumers, loop: dict[str, str]
) -> None:
    rows = []
    for n in range(3):
        names = [f"obj{n}/page{k}.txt" for k in range(2)]
        texts = [f"object {n} page {k}\n" * 100 for k in range(2)]
        served = list(texts)
        if n == 1:
            served[1] = "a corrupted copy\n"
        for name, text in zip(names, served, strict=True):
            files.put(name, text)
        manifest = object_manifest(
            [
                {
                    "url": f"{files.url}/{name}",
                    "hash_alg": "md5",
                    "hash_value": md5(text),
                    "filename": name.split("/", 1)[1],
                }
                for name, text in zip(names, texts, strict=True)
            ]
        )
        rows.append(
            {
                "url": files.put(f"obj{n}.checkm", manifest),
                "local_id": f"e2e-{n}",
                "title": f"Object {n}",
                "creator": "Depositor",
            }
        )
    bid = moves.batch_submit(
        profile=DEMO,
        submitter="depositor@example.org",
        payload_url=files.put("batch.checkm", batch_manifest(rows)),
        submission_type="batch-manifest",
        title="End to end",
    )
    proc = consumers.start("all", "--poll", "0.2", **loop)
    try:
        wait_for(lambda: _state(zk, bid) in ("Completed", "Failed"), timeout=120)
    except AssertionError:
        raise AssertionError(consumers.logs()) from None
    assert _state(zk, bid) == "Failed", consumers.logs()
    jobs = _jobs(zk, bid)
    by_seq = {j.configuration["batch_seq"]: j for j in jobs}
    assert [by_seq[n].state for n in (1, 2, 3)] == ["Completed", "Failed", "Completed"]
    failed = by_seq[2]
    assert f"{files.url}/obj1/page1.txt" in failed.status.message
    assert "digest" in failed.status.message
    assert consumers.stored_objects() == 2
    assert [v for _ark, v in consumers.inventory()] == [1, 1]
    assert {ark for ark, _v in consumers.inventory()} == {
        by_seq[1].primary_id,
        by_seq[3].primary_id,
    }
    [mail] = consumers.mails()
    assert "depositor@example.org" in mail
    assert failed.jid in mail
    assert batch_load(zk, bid).report["failed_jobs"] == [failed.jid]

    files.put("obj1/page1.txt", "object 1 page 1\n" * 100)
    moves.job_resume(jid=failed.jid)
    moves.batch_update_reporting(bid=bid)
    wait_for(lambda: _state(zk, bid) in ("Completed", "Failed"), timeout=120)
    assert _state(zk, bid) == "Completed", consumers.logs()
    assert job_load(zk, failed.jid).state == "Completed"
    assert consumers.stored_objects() == 3
    assert len(consumers.inventory()) == 3
    mails = consumers.mails()
    assert len(mails) == 2
    assert any("Completed since the last report" in m for m in mails)
    # The working folders are gone with their completed jobs (removed by a thread of the
    # process's own, which may still be at it as the batch completes).
    work = consumers.var / "work"
    wait_for(lambda: not work.exists() or not any(work.rglob("*.txt")), timeout=60)

    assert consumers.stop(proc) == 0


def test_killed_mid_download_another_copy_finishes_without_doubling(
    zk, files: FileServer, consumers: Consumers
) -> None:
    payload = os.urandom(512 * 1024)
    url = files.put("big.bin", payload)
    files.slow_first["/big.bin"] = 60.0  # the first download crawls; the retry is quick
    bid = moves.batch_submit(
        profile=DEMO,
        submitter="depositor@example.org",
        payload_url=url,
        submission_type="file",
        digest_alg="md5",
        digest_value=md5(payload),
    )
    # A short session, so ZooKeeper notices the killed process soon.
    first = consumers.start("all", "--poll", "0.2", ZK_TIMEOUT="4")
    try:
        wait_for(lambda: files.hits("GET", "big.bin") >= 1, timeout=90)
        [job] = _jobs(zk, bid)
        assert job.state == "Downloading"
        assert job.lock is not None
    except AssertionError:
        raise AssertionError(consumers.logs()) from None
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)

    second = consumers.start("all", "--poll", "0.2")
    try:
        wait_for(lambda: _state(zk, bid) in ("Completed", "Failed"), timeout=120)
    except AssertionError:
        raise AssertionError(consumers.logs()) from None
    assert _state(zk, bid) == "Completed", consumers.logs()
    done = job_load(zk, job.jid)
    assert done.state == "Completed"
    assert files.hits("GET", "big.bin") == 2
    storage = consumers.storage()
    assert storage.versions(done.primary_id) == [1]
    [stored] = [f for f in storage.fetch_object(done.primary_id) if f.name == "producer/big.bin"]
    assert (
        hashlib.sha256(Path(stored.location).read_bytes()).digest()
        == hashlib.sha256(payload).digest()
    )
    assert consumers.inventory() == [(done.primary_id, 1)]
    assert len(consumers.mails()) == 1
    assert consumers.stop(second) == 0
