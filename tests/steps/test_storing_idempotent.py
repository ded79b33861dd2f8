"""Storage clients that can tell whether a manifest's content is already the object's latest
version, and local storage that never numbers two versions of one content, even when a writer
is paused in the middle of it (issue 23, item 3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from queues.chaos.standins import StorageStandIn, running
from queues.steps.erc import Erc, write_erc, write_storage_manifest
from queues.steps.merritt_wire import state_fields
from queues.steps.storage import HttpStorage, LocalStorage, StorageBusy, StoredVersion
from tests.daemons.conftest import wait_for

ARK = "ark:/99999/fk4idem"
ROOT = Path(__file__).resolve().parents[2]


class _QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """``tmp_path`` over HTTP on loopback, as MRT_WORK_URL serves the working folders."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietFiles, directory=str(tmp_path)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def object_manifest(tmp_path: Path, files: dict[str, bytes], name: str, base_url: str) -> str:
    """An object folder and its storage manifest, as Processing leaves them; the files are
    listed at ``base_url`` (where the test serves ``tmp_path``)."""
    obj = tmp_path / name / "object"
    for rel, data in files.items():
        (obj / rel).parent.mkdir(parents=True, exist_ok=True)
        (obj / rel).write_bytes(data)
    write_erc(obj, erc=Erc("W", "T", "D"), ark=ARK, local_id=None)
    dest = tmp_path / name / "storage-manifest.txt"
    write_storage_manifest(obj, dest, url_for=lambda rel: f"{base_url}/{name}/object/{rel}")
    return f"{base_url}/{name}/storage-manifest.txt"


def test_http_storage_finds_the_version_an_earlier_add_of_the_same_content_made(
    tmp_path: Path, served: str
) -> None:
    with running(StorageStandIn(nodes=(9501,))) as storage:
        client = HttpStorage(storage.url, 9501)
        url = object_manifest(tmp_path, {"producer/a b.txt": b"A" * 10}, "first", served)
        manifest = client.read_manifest(url)
        assert client.stored_as(ark=ARK, manifest=manifest) is None  # nothing stored yet

        added = client.store(ark=ARK, manifest_url=url)

        assert client.stored_as(ark=ARK, manifest=manifest) == added
        assert added == StoredVersion(ARK, 1, client.manifest_url(ARK))
        again = object_manifest(tmp_path, {"producer/a b.txt": b"A" * 10}, "again", served)
        assert client.stored_as(ark=ARK, manifest=client.read_manifest(again)) == added


def test_http_storage_does_not_take_other_content_for_the_latest_version(
    tmp_path: Path, served: str
) -> None:
    with running(StorageStandIn(nodes=(9501,))) as storage:
        client = HttpStorage(storage.url, 9501)
        client.store(
            ark=ARK,
            manifest_url=object_manifest(tmp_path, {"producer/a": b"A"}, "v1", served),
        )
        # Same names and sizes, other bytes: only the digests tell them apart.
        same_size = object_manifest(tmp_path, {"producer/a": b"B"}, "same-size", served)
        one_more = object_manifest(
            tmp_path, {"producer/a": b"A", "producer/b": b"B"}, "one-more", served
        )
        fewer = object_manifest(tmp_path, {}, "fewer", served)
        for url in (same_size, one_more, fewer):
            assert client.stored_as(ark=ARK, manifest=client.read_manifest(url)) is None


def test_merritt_state_documents_read_the_same_in_xml_and_json(tmp_path: Path, served: str) -> None:
    with running(StorageStandIn(nodes=(9501,))) as storage:
        client = HttpStorage(storage.url, 9501)
        client.store(
            ark=ARK, manifest_url=object_manifest(tmp_path, {"producer/a": b"AB"}, "v", served)
        )
        base = f"{storage.url}/state/9501/ark%3A%2F99999%2Ffk4idem"
        for suffix, root, key, value in (
            ("", "objectState", "numVersions", "1"),
            ("/1", "versionState", "numFiles", "2"),
            ("/0", "versionState", "current", "true"),
            ("/1/producer%2Fa", "fileState", "size", "2"),
        ):
            read = [
                state_fields(client.session.get(base + suffix, params={"t": t}).content)
                for t in ("xml", "json")
            ]
            for document in read:
                assert document is not None and document[0] == root
                assert document[1][key] == value
        [file_state] = [state_fields(client.session.get(base + "/1/producer%2Fa").content)]
        assert file_state is not None
        assert file_state[1]["messageDigest"].startswith("sha256=")


# A writer that stops itself where the old code was open to a second version: after it found the
# content is not stored yet and before it numbered its version (the second ``versions`` call of
# one ``store``). SIGSTOP is what a paused consumer gets; only its moment is chosen here.
PAUSED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from queues.steps.storage import LocalStorage

    calls = []
    versions = LocalStorage.versions

    def pausing(self, ark):
        calls.append(ark)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGSTOP)
        return versions(self, ark)

    LocalStorage.versions = pausing
    root, ark, url = sys.argv[1:4]
    storage = LocalStorage(Path(root), file_roots=[Path(root).parent])
    print(storage.store(ark=ark, manifest_url=url).version)
    """
)


def _stopped(pid: int) -> bool:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0] == "T"


def test_a_writer_paused_while_numbering_its_version_keeps_others_from_doubling_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    root.mkdir()
    first = write_storage_manifest(_object(tmp_path, "one"), tmp_path / "one.txt").as_uri()
    second = write_storage_manifest(_object(tmp_path, "two"), tmp_path / "two.txt").as_uri()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    paused = subprocess.Popen(
        [sys.executable, "-c", PAUSED_WRITER, str(root), ARK, first],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: paused.poll() is not None or _stopped(paused.pid), timeout=60)
        assert paused.poll() is None, "the writer ended before its pause"
        other = LocalStorage(root, file_roots=[tmp_path], lock_wait=0.5)

        with pytest.raises(StorageBusy):
            other.store(ark=ARK, manifest_url=second)
        assert other.versions(ARK) == []

        os.kill(paused.pid, signal.SIGCONT)
        out, _ = paused.communicate(timeout=60)
        assert paused.returncode == 0 and out.strip() == "1"
        assert other.store(ark=ARK, manifest_url=second).version == 1
        assert other.versions(ARK) == [1]
    finally:
        if paused.poll() is None:
            os.kill(paused.pid, signal.SIGCONT)
            paused.kill()
            paused.wait(timeout=30)


def _object(tmp_path: Path, name: str) -> Path:
    """The same content in a folder of its own (two jobs of one object, or two claims)."""
    obj = tmp_path / name
    (obj / "producer").mkdir(parents=True)
    (obj / "producer" / "a.txt").write_bytes(b"same bytes")
    write_erc(obj, erc=Erc("W", "T", "D"), ark=ARK, local_id=None)
    return obj
