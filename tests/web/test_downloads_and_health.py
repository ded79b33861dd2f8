import pytest
from django.conf import settings
from django.contrib.auth.models import User


@pytest.fixture
def archive(tmp_path):
    settings.MRT_DOWNLOADS_DIR = tmp_path
    path = tmp_path / "qid0000000001-ark+=99999=fk4x_v1.zip"
    path.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    return path


@pytest.mark.django_db
def test_an_operator_downloads_an_assembled_archive(client, archive):
    from queues.operator.auth import ensure_groups

    user = User.objects.create_user("operator", password="pw-123456789")
    user.groups.add(ensure_groups()["operator"])
    client.force_login(user)
    response = client.get(f"/downloads/{archive.name}")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == archive.read_bytes()
    assert "attachment" in response["Content-Disposition"]


@pytest.mark.django_db
def test_download_requires_login(client, archive):
    response = client.get(f"/downloads/{archive.name}")
    assert response.status_code == 302
    assert "/login" in response["Location"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name", ["..%2Fsecret_key", ".hidden.zip", "x.txt", "a%00.zip", "missing.zip"]
)
def test_download_refuses_names_outside_the_archive_pattern(client, archive, name):
    from queues.operator.auth import ensure_groups

    user = User.objects.create_user("operator", password="pw-123456789")
    user.groups.add(ensure_groups()["operator"])
    client.force_login(user)
    assert client.get(f"/downloads/{name}").status_code == 404


def test_health_reports_a_reachable_zookeeper(client, zk, db):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["zookeeper"] == "connected"


def test_health_reports_an_unreachable_zookeeper(client, zk_hosts):
    from queues.services.zkserver import free_port
    from queues.zk import client as zkmod

    zkmod.close()
    settings.ZK_HOSTS = f"127.0.0.1:{free_port()}"
    settings.ZK_TIMEOUT = 1.0
    try:
        response = client.get("/healthz")
    finally:
        settings.ZK_TIMEOUT = 10.0
        zkmod.close()
    assert response.status_code == 503
    assert response.json()["zookeeper"] == "unreachable"
