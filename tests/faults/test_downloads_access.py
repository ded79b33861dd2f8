"""/downloads/NAME: an access archive goes to its request's token holder or an operator only."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from kazoo.client import KazooClient

from queues.zk import paths as zpaths
from queues.zk.access import access_create, access_set_token
from queues.zk.locks import lock_create, lock_release
from queues.zk.records import AccessRequest

ARK_FOLDER = "ark+=99999=fk4abc"


def assembled(
    zk: KazooClient, downloads: Path, queue: str, suffix: str = ".zip", **token: Any
) -> tuple[str, str]:
    """An access request as the access consumer leaves it: its archive on disk, named in its
    token. Returns (archive name, the requester's token string)."""
    secret = token.pop("token", str(uuid.uuid4()))
    item: AccessRequest = access_create(
        zk, queue=queue, token={"token": secret, "ark": "ark:/99999/fk4abc", **token}
    )
    name = f"{queue}-{item.qid}-{ARK_FOLDER}{suffix}"
    (downloads / name).write_bytes(b"PK\x05\x06" + queue.encode() + b"\0" * 14)
    lock = zpaths.access_node(queue, item.qid, "lock")
    assert lock_create(zk, lock)  # only the lock's holder writes the token
    access_set_token(zk, item, {**item.token, "archive": name, "url": f"/downloads/{name}"})
    lock_release(zk, lock)
    return name, secret


@pytest.fixture
def downloads(settings: Any, tmp_path: Path) -> Path:
    settings.MRT_DOWNLOADS_DIR = tmp_path
    return tmp_path


def body(response: Any) -> bytes:
    return b"".join(response.streaming_content)


@pytest.mark.django_db
def test_the_token_holder_downloads_without_a_login(zk: KazooClient, downloads: Path) -> None:
    name, token = assembled(zk, downloads, "small")
    by_query = Client().get(f"/downloads/{name}", {"token": token})
    assert by_query.status_code == 200
    assert body(by_query) == (downloads / name).read_bytes()
    by_header = Client().get(f"/downloads/{name}", HTTP_X_ACCESS_TOKEN=token)
    assert by_header.status_code == 200


@pytest.mark.django_db
def test_a_wrong_or_foreign_token_is_refused(zk: KazooClient, downloads: Path) -> None:
    name, _token = assembled(zk, downloads, "small")
    _other, other_token = assembled(zk, downloads, "small")
    assert Client().get(f"/downloads/{name}", {"token": str(uuid.uuid4())}).status_code == 404
    # The token of another request opens that request's archive, not this one.
    assert Client().get(f"/downloads/{name}", {"token": other_token}).status_code == 404


@pytest.mark.django_db
def test_small_and_large_requests_with_one_qid_each_keep_their_archive(
    zk: KazooClient, downloads: Path
) -> None:
    small, small_token = assembled(zk, downloads, "small")
    large, large_token = assembled(zk, downloads, "large")
    # Both queues count from 0; the queue in the archive's name keeps the two files apart.
    assert small.split("-")[1] == large.split("-")[1]
    assert small != large
    assert Client().get(f"/downloads/{large}", {"token": large_token}).status_code == 200
    assert Client().get(f"/downloads/{large}", {"token": small_token}).status_code == 404
    assert Client().get(f"/downloads/{small}", {"token": small_token}).status_code == 200


@pytest.mark.django_db
def test_a_guessable_token_is_no_credential(zk: KazooClient, downloads: Path) -> None:
    name, token = assembled(zk, downloads, "small", token="abc")
    assert Client().get(f"/downloads/{name}", {"token": token}).status_code == 404


def test_without_token_only_operators_and_admins_may_download(
    zk: KazooClient, downloads: Path, viewer: Client, operator: Client, admin: Client
) -> None:
    name, token = assembled(zk, downloads, "small")
    anonymous = Client().get(f"/downloads/{name}")
    assert anonymous.status_code == 302
    assert "/login/" in anonymous["Location"]
    assert viewer.get(f"/downloads/{name}").status_code == 403
    assert viewer.get(f"/downloads/{name}", {"token": token}).status_code == 200
    assert operator.get(f"/downloads/{name}").status_code == 200
    assert admin.get(f"/downloads/{name}").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_tar_archives_are_served_the_same_way(
    zk: KazooClient, downloads: Path, suffix: str
) -> None:
    name, token = assembled(zk, downloads, "small", suffix=suffix)
    assert Client().get(f"/downloads/{name}").status_code == 302
    response = Client().get(f"/downloads/{name}", {"token": token})
    assert response.status_code == 200
    assert body(response) == (downloads / name).read_bytes()
