"""ZooKeeper outages, single sign-on, the setup command, consistency, submit and audit pages."""

from __future__ import annotations

from io import StringIO

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import reverse

from queues.operator.audit import AuditEntry
from queues.zk import batches
from queues.zk import client as zkmod

pytestmark = pytest.mark.django_db


def test_when_zookeeper_is_unreachable_pages_say_so_and_recover(viewer, zk_hosts, make_job):
    job = make_job("Failed")
    old_timeout = settings.ZK_TIMEOUT
    settings.ZK_HOSTS, settings.ZK_TIMEOUT = "127.0.0.1:9", 1.0
    zkmod.close()
    try:
        response = viewer.get(reverse("jobs"))
        assert response.status_code == 503
        html = response.content.decode()
        assert "ZooKeeper is unreachable" in html and 'http-equiv="refresh"' in html
        assert response["Retry-After"]
        assert viewer.get(reverse("job", args=[job.jid])).status_code == 503
        action = viewer.post(reverse("job-action", args=[job.jid, "resume"]), {})
        assert action.status_code in (403, 503)
        banner = viewer.get(reverse("zk-health")).content.decode()
        assert "ZooKeeper is unreachable" in banner
    finally:
        settings.ZK_HOSTS, settings.ZK_TIMEOUT = zk_hosts, old_timeout
        zkmod.close()
    assert viewer.get(reverse("jobs")).status_code == 200
    assert "unreachable" not in viewer.get(reverse("zk-health")).content.decode()


@override_settings(
    MRT_SSO_HEADER="X-Remote-User",
    MIDDLEWARE=[
        *settings.MIDDLEWARE[
            : settings.MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware")
            + 1
        ],
        "queues.operator.auth.TrustedHeaderMiddleware",
        *settings.MIDDLEWARE[
            settings.MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware")
            + 1 :
        ],
    ],
    AUTHENTICATION_BACKENDS=[
        "queues.operator.auth.TrustedHeaderBackend",
        "django.contrib.auth.backends.ModelBackend",
    ],
)
def test_single_sign_on_header_logs_in_a_new_user_as_viewer(zk, make_user):
    make_user("viewer", "someone-else")  # creates the groups
    client = Client()
    response = client.get(reverse("overview"), HTTP_X_REMOTE_USER="grace")
    assert response.status_code == 200
    user = get_user_model().objects.get(username="grace")
    assert list(user.groups.values_list("name", flat=True)) == ["viewer"]
    assert client.get(reverse("overview")).status_code == 200  # the session persists


def test_setupconsole_creates_groups_and_a_first_admin_once(db, tmp_path, capsys, settings):
    settings.MRT_VAR_DIR = tmp_path  # pytest-django's settings: put back after the test
    call_command("setupconsole")
    out = capsys.readouterr().out
    admin = get_user_model().objects.get(username="admin")
    password = (tmp_path / "admin-password").read_text().strip()
    assert admin.is_superuser and admin.check_password(password) and password in out
    from django.contrib.auth.models import Group

    assert set(Group.objects.values_list("name", flat=True)) == {"viewer", "operator", "admin"}
    operator = Group.objects.get(name="operator")
    assert operator.permissions.filter(codename="operate_queues").exists()
    assert not operator.permissions.filter(codename="administer_queues").exists()
    call_command("setupconsole")
    assert get_user_model().objects.count() == 1


def test_setupconsole_refuses_to_make_a_superuser_of_a_name_already_taken(db, tmp_path, settings):
    # A viewer named "admin" (made at a first single sign-on, say) and no superuser: the
    # command says so in one line rather than failing on the unique name with a traceback,
    # and neither promotes that user nor writes a password.
    settings.MRT_VAR_DIR = tmp_path
    get_user_model().objects.create_user(username="admin", password="theirs")
    with pytest.raises(CommandError, match="user 'admin' exists without being one"):
        call_command("setupconsole", stdout=StringIO())
    user = get_user_model().objects.get(username="admin")
    assert not user.is_superuser and user.check_password("theirs")
    assert not (tmp_path / "admin-password").exists()


def test_setupconsole_reads_the_admin_password_from_a_file(
    db, tmp_path, capsys, settings, monkeypatch
):
    settings.MRT_VAR_DIR = tmp_path
    secret = tmp_path / "admin-secret"
    secret.write_text("from-a-file-0123\n", encoding="utf-8")
    monkeypatch.setenv("MRT_ADMIN_USER", "keeper")
    monkeypatch.setenv("MRT_ADMIN_PASSWORD_FILE", str(secret))
    call_command("setupconsole")
    assert "from-a-file" not in capsys.readouterr().out
    assert get_user_model().objects.get(username="keeper").check_password("from-a-file-0123")
    assert not (tmp_path / "admin-password").exists()


def test_consistency_page_reports_and_an_admin_repairs(viewer, operator, admin, zk, make_job):
    from queues.daemons.consistency import ConsistencyCheck

    job = make_job("Failed")
    zk.delete(f"/jobs/states/failed/05-{job.jid}")
    # Started by an admin, walked by the consistency daemon (queues/operator/consistency.py).
    assert admin.post(reverse("consistency")).status_code == 303
    assert ConsistencyCheck(zk=zk).run_once()
    html = viewer.get(reverse("consistency")).content.decode()
    assert "job-unindexed" in html
    assert operator.post(reverse("consistency-repair"), {"reason": "x"}).status_code == 403
    assert admin.post(reverse("consistency-repair"), {}).status_code == 400
    response = admin.post(reverse("consistency-repair"), {"reason": "index lost in crash"})
    assert response.status_code == 200
    assert zk.exists(f"/jobs/states/failed/05-{job.jid}") is not None
    assert f"created /jobs/states/failed/05-{job.jid}" in response.content.decode()
    assert AuditEntry.objects.filter(action="repair", ok=True).exists()


def test_submit_form_creates_a_batch_like_submitbatch(operator, viewer, zk):
    data = {
        "profile": "merritt_demo_content",
        "submitter": "dpr/Ada",
        "payload_url": "https://example.org/a.zip",
        "submission_type": "container",
        "title": "Notes",
    }
    assert viewer.post(reverse("submit"), data).status_code == 403
    response = operator.post(reverse("submit"), data)
    assert response.status_code == 303
    bid = response["Location"].rstrip("/").rsplit("/", 1)[-1]
    batch = batches.batch_load(zk, bid)
    assert batch.state == "Pending" and batch.title == "Notes"
    bad = operator.post(reverse("submit"), {**data, "payload_url": "ftp://x"})
    assert bad.status_code == 400
    secret = operator.post(reverse("submit"), {**data, "payload_url": "file:///etc/passwd"})
    assert secret.status_code == 400
    assert "outside the allowed folders" in secret.content.decode()
    assert operator.post(reverse("submit"), {**data, "profile": "a/b"}).status_code == 400
    # A profile this installation does not have: refused, saying so, and no batch made (its
    # first step would fail it a moment after the submitter was told it was taken).
    unknown = operator.post(reverse("submit"), {**data, "profile": "no_such_collection"})
    assert unknown.status_code == 400
    assert "no profile named &#x27;no_such_collection&#x27; here" in unknown.content.decode()
    assert batches.batch_ids(zk) == [bid]


def test_audit_page_shows_who_did_what_and_filters(operator, make_job):
    job = make_job("Failed")
    operator.post(reverse("job-action", args=[job.jid, "resume"]), {})
    operator.post(reverse("job-action", args=[job.jid, "resume"]), {})  # refused: not Failed
    html = operator.get(reverse("audit")).content.decode()
    assert "operator-user" in html and "Failed → Downloading" in html and "✖ refused" in html
    only_refused = operator.get(reverse("audit"), {"ok": "0"}).content.decode()
    assert "✔ done" not in only_refused


def test_setupconsole_makes_no_admin_whose_generated_password_it_could_not_keep(
    db, tmp_path, settings
):
    # The password file cannot be written (a folder stands at its name): before, the superuser
    # was made first and the write failed after it, so the console had an admin nobody knew
    # the password of, and every later start found a superuser and made none.
    settings.MRT_VAR_DIR = tmp_path
    (tmp_path / "admin-password").mkdir()
    with pytest.raises(OSError):
        call_command("setupconsole", stdout=StringIO())
    assert not get_user_model().objects.filter(is_superuser=True).exists()
    (tmp_path / "admin-password").rmdir()
    call_command("setupconsole", stdout=StringIO())
    admin = get_user_model().objects.get(username="admin")
    assert admin.check_password((tmp_path / "admin-password").read_text().strip())


def test_setupconsole_password_file_is_private_even_over_an_open_one(db, tmp_path, settings):
    settings.MRT_VAR_DIR = tmp_path
    left = tmp_path / "admin-password"
    left.write_text("old\n")
    left.chmod(0o644)
    call_command("setupconsole", stdout=StringIO())
    assert left.stat().st_mode & 0o777 == 0o600
    assert get_user_model().objects.get(username="admin").check_password(left.read_text().strip())
