"""``manage.py apitoken``: tokens for deployments with no browser at hand."""

from __future__ import annotations

import stat
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from queues.operator.audit import ApiToken, AuditEntry

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = StringIO()
    call_command("apitoken", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.fixture
def monitor(make_user):
    return make_user("viewer", "monitor")


def test_a_token_made_on_the_command_line_works_for_the_api_and_is_audited(monitor, zk):
    out = _run("create", "--user", "monitor", "--name", "prometheus")
    key = out.rsplit("keep it): ", 1)[1].strip()
    token = ApiToken.objects.get(user=monitor)
    assert token.name == "prometheus" and key.startswith(token.prefix)
    assert key not in token.key_hash  # only the digest is kept
    answer = Client().get("/api/overview", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert answer.status_code == 200
    entry = AuditEntry.objects.get(kind="token", action="create")
    assert entry.item_id == str(token.pk) and entry.via == "command"
    assert "monitor" in entry.detail and key not in entry.detail
    listed = _run("list")
    assert f"{token.prefix}…\tmonitor\tprometheus" in listed and key not in listed


def test_a_revoked_token_stops_working(monitor, zk):
    key = _run("create", "--user", "monitor", "--name", "x").rsplit("keep it): ", 1)[1].strip()
    token = ApiToken.objects.get(user=monitor)
    out = _run("revoke", token.prefix)
    assert "revoked" in out
    assert not ApiToken.objects.exists()
    answer = Client().get("/api/overview", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert answer.status_code == 401
    assert AuditEntry.objects.filter(kind="token", action="revoke", item_id=str(token.pk)).exists()


def test_a_key_never_begins_with_a_dash_so_its_prefix_can_be_typed(monitor, monkeypatch):
    # CI once drew a key beginning with "-": `apitoken revoke -t1LpUCH` was an unknown option.
    # The random draw is replaced so that the first key drawn begins with "-".
    draws = iter(["-t1LpUCH" + "a" * 35, "Zt1LpUCH" + "b" * 35])
    monkeypatch.setattr("queues.models.secrets.token_urlsafe", lambda n: next(draws))
    _run("create", "--user", "monitor", "--name", "x")
    token = ApiToken.objects.get(user=monitor)
    assert token.prefix == "Zt1LpUCH"
    assert "revoked" in _run("revoke", token.prefix)


def test_a_token_made_before_that_is_revoked_by_its_prefix_after_two_dashes(monitor):
    ApiToken.objects.create(user=monitor, name="old", key_hash="0" * 64, prefix="-t1LpUCH")
    assert "revoked" in _run("revoke", "--", "-t1LpUCH")
    assert not ApiToken.objects.exists()


def test_the_key_can_go_to_an_owner_only_file_never_over_another(monitor, tmp_path):
    target = tmp_path / "key"
    out = _run("create", "--user", "monitor", "--name", "ci", "--key-file", str(target))
    key = target.read_text().strip()
    assert key not in out and "written to" in out
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert ApiToken.objects.get().prefix == key[:8]
    with pytest.raises(CommandError, match="exists"):
        _run("create", "--user", "monitor", "--name", "again", "--key-file", str(target))
    assert ApiToken.objects.count() == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create", "--name", "x"), "needs --user"),
        (("create", "--user", "nobody", "--name", "x"), "no console user"),
        (("create", "--user", "monitor", "--name", "  "), "needs --user"),
        (("revoke",), "needs the token's id"),
        (("revoke", "zzzzzzzz"), "no token has"),
        (("revoke", "²"), "no token has"),  # a ValueError traceback before
        (("revoke", "9" * 30), "no token has"),
    ],
)
def test_bad_input_is_one_clear_line(monitor, args, message):
    with pytest.raises(CommandError, match=message):
        _run(*args)
    assert not ApiToken.objects.exists()


def test_list_shows_control_characters_in_a_name_as_escapes(monitor):
    # A name typed into /tokens/ is the web user's text: on the operator's terminal an escape
    # sequence in it (here one that retitles the window) or a tab (a forged column) is shown.
    ApiToken.objects.create(
        user=monitor, name="ci\x1b]0;owned\x07\tx\u009b", key_hash="1" * 64, prefix="Abcdefgh"
    )
    [line] = _run("list").splitlines()
    assert "\tci\\x1b]0;owned\\x07\\tx\\x9b\t" in line
    assert line.count("\t") == 5


@pytest.mark.parametrize(
    ("args", "dropped"),
    [
        (["create", "7", "--user", "monitor", "--name", "x"], "create takes no token ID or prefix"),
        (["list", "--name", "x", "--key-file", "k"], "list takes no --name, --key-file"),
        (["revoke", "Abcdefgh", "--user", "someone-else"], "revoke takes no --user"),
    ],
)
def test_an_argument_the_action_would_drop_is_refused_and_nothing_changes(
    monitor, tmp_path, args, dropped
):
    ApiToken.objects.create(user=monitor, name="kept", key_hash="2" * 64, prefix="Abcdefgh")
    with pytest.raises(CommandError, match=dropped):
        _run(*[str(tmp_path / a) if a == "k" else a for a in args])
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["kept"]
    assert not AuditEntry.objects.exists()
    assert not (tmp_path / "k").exists()
