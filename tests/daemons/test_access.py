"""Access small / large: a stored object becomes a zip; its URL and size go in the token."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from queues.steps.erc import write_storage_manifest
from queues.steps.storage import LocalStorage
from queues.zk.access import access_create, access_load
from queues.zk.locks import queue_hold_set

from .conftest import daemon

ARK = "ark:/99999/fk4zz"


def _stored(root: Path, tmp_path: Path) -> None:
    src = tmp_path / "obj"
    (src / "producer").mkdir(parents=True)
    (src / "producer" / "a.txt").write_text("A")
    (src / "system").mkdir()
    (src / "system" / "mrt-erc.txt").write_text("erc:")
    manifest = tmp_path / "manifest.txt"
    write_storage_manifest(src, manifest)
    LocalStorage(root).store(ark=ARK, manifest_url=manifest.as_uri())


@pytest.mark.parametrize(("name", "queue"), [("access-small", "small"), ("access-large", "large")])
def test_object_is_assembled_and_the_token_says_where(zk, settings, tmp_path, name, queue) -> None:
    _stored(Path(settings.MRT_STORAGE_ROOT), tmp_path)
    item = access_create(zk, queue=queue, token={"ark": ARK, "content": "producer"})
    assert daemon(zk, name).run_once()
    done = access_load(zk, queue, item.qid)
    assert done.state == "Completed", done.status.message
    path = Path(done.token["path"])
    assert done.token["size"] == path.stat().st_size
    assert done.token["url"].endswith(path.name)
    with zipfile.ZipFile(path) as zf:
        assert zf.namelist() == ["ark+=99999=fk4zz/producer/a.txt"]


def test_unknown_object_fails_the_request(zk) -> None:
    item = access_create(zk, queue="small", token={"ark": ARK})
    daemon(zk, "access-small").run_once()
    failed = access_load(zk, "small", item.qid)
    assert failed.state == "Failed"
    assert "not in storage" in failed.status.message


def test_held_access_queue_is_not_claimed(zk) -> None:
    queue_hold_set(zk, "access-small")
    item = access_create(zk, queue="small", token={"ark": ARK})
    assert not daemon(zk, "access-small").run_once()
    assert access_load(zk, "small", item.qid).state == "Pending"
