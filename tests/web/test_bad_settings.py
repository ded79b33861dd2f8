"""A bad setting stops the real commands at their start, in one line naming it.

``manage.py`` (every command: ``check``, ``migrate``, ``runconsumer all``, which
``bin/run-console`` runs) and daphne (``mrtadmin.asgi``) exit with status 2 and one line:
the variable, what it must be, and the value as given, escaped. Not a traceback, not a
silent default, not a failure an hour later at the first step that uses it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from queues.core.deployment import STEPS

ROOT = Path(settings.BASE_DIR)
URL = "a URL such as http://host:port/path (http:// or https://), or empty"
ENSEMBLE = "the ensemble as host:port,host:port[/chroot], or local, or empty"
REDIS = "a URL such as redis://host:port/path (redis:// or rediss://), or empty"
NETWORKS = "IP addresses or networks such as 10.1.0.0/16, comma-separated"
OWN_STEPS = f"daemon names, comma-separated ({', '.join(STEPS)}), or all, or empty"


def _environment(tmp_path: Path, **variables: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "MRT_", "ZK_", "EMAIL_", "REDIS_", "DATABASE_", "TZ"))
    }
    env.update(MRT_VAR_DIR=str(tmp_path / "var"), ZK_HOSTS="127.0.0.1:9")
    env.update(variables)
    return env


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


# Each bad or good value read by the settings module itself, all in one child process (a
# process a value costs a second or more of start-up): the message each refusal gives, or None.
# The commands' own refusal (one line, exit status 2) is checked through them below.
_READ_EACH = """
import json, os, runpy, sys
from django.core.exceptions import ImproperlyConfigured
base = dict(os.environ)
for name, value in json.loads(sys.stdin.read()):
    os.environ.clear()
    os.environ.update(base, **{name: value})
    try:
        runpy.run_path("mrtadmin/settings.py")
        said = None
    except ImproperlyConfigured as exc:
        said = str(exc)
    print(json.dumps(said), flush=True)
"""


def _read_by_the_settings(
    tmp_path: Path, cases: list[tuple[str, str]], **around: str
) -> list[str | None]:
    """What the settings say of each case, read with the variables ``around`` set too."""
    done = subprocess.run(
        [sys.executable, "-c", _READ_EACH],
        input=json.dumps(cases),
        cwd=ROOT,
        env=_environment(tmp_path, **around),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def _refused_in_one_line(done: subprocess.CompletedProcess[str], program: str, line: str) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [f"{program}: {line}"], done.stderr
    assert done.returncode == 2


# (variable, bad value, what it must be[, the value as the refusal shows it])
BAD: list[tuple[str, ...]] = [
    # A traceback before: Django's own check, or the file read as it came.
    ("TZ", "Mars/Base", "a time zone name such as America/Los_Angeles or UTC"),
    (
        "DJANGO_SECRET_KEY_FILE",
        "/nonexistent/key",
        "a readable file (No such file or directory)",
    ),
    ("MRT_CLAIM_BATCH", "0", "a whole number from 1 to 1,000"),
    ("MRT_DOWNLOADS_PER_HOST", "two", "a whole number from 1 to 1,000"),
    ("ZK_TIMEOUT", "", "a number above 0 and at most 3,600"),
    ("DJANGO_SECURE", "ture", "one of 1/0, true/false, yes/no, on/off"),
    (
        "MRT_LOGIN_LOCKOUT_BY",
        "user",
        "username, ip_address or username,ip_address",
    ),
    ("MRT_SSO_PROXIES", "10.0.0.0/33", NETWORKS),
    (
        "MRT_ENVIRONMENT",
        "prod\nuction",
        "a short name such as production, stage or development (letters, digits, '-')",
    ),
    # Taken before, and failing later, at a step, a page or a connection.
    ("ZK_HOSTS", "zk1:abc", ENSEMBLE),
    ("ZK_HOSTS", "zk1:2181,,zk2:2181", ENSEMBLE),
    ("ZK_HOSTS", "zk1:70000", ENSEMBLE),
    ("MRT_STORAGE_URL", "storage:8080", URL),
    ("MRT_INVENTORY_URL", "ftp://inventory.example.org/", URL),
    ("MRT_EZID_URL", "https://", URL),
    ("MRT_INGEST_URL", "http://ingest:port/ingest", URL),
    ("MRT_WORK_URL", "work.example.org/work", URL),
    ("MRT_DOWNLOADS_URL", "/downloads/", URL),
    ("MRT_CONSOLE_URL", "queue.example.org", URL),
    ("MRT_EZID_TARGET_URL", "merritt.cdlib.org", URL),
    ("MRT_STORAGE_URL", "http://[::1", URL),  # urlsplit's own ValueError before
    # A Slack webhook's path is its credential: shown up to the host.
    ("MRT_ALERT_WEBHOOK_URL", "hooks.slack.com/services/x", URL, "hooks.slack.com/…"),
    ("MRT_ALERT_WEBHOOK_URL", "https://hooks.slack.com/a b", URL, "https://hooks.slack.com/…"),
    # A webhook's credential in its query, or its fragment, with no path before it: cut too.
    (
        "MRT_ALERT_WEBHOOK_URL",
        "https://hooks.example.org:0?token=s3cret",
        URL,
        "https://hooks.example.org:0/…",
    ),
    ("MRT_ALERT_WEBHOOK_URL", "hooks.example.org#s3cret", URL, "hooks.example.org/…"),
    ("REDIS_URL", "redis:6379", REDIS),
    ("REDIS_URL", "redis://:s3cret@redis:port/0", REDIS, "redis://:***@redis:port/0"),
    ("MRT_FETCH_ALLOW", "10.1.0.0/16;intranet", NETWORKS),
    ("MRT_STORAGE_NODE", "node-1", "a storage node number such as 9501"),
    (
        "MRT_RETRY_STORAGE",
        "attempts=0",
        "a retry policy such as 'attempts=12 first=30s most=30m within=12h' "
        "(attempts='0': a whole number, at least 1)",
    ),
    ("DJANGO_ALLOWED_HOSTS", " , ", "the host names the console answers to"),
    # Checked only by runconsumer before: daphne started on them, and acts on them (which steps
    # the console owns decides what a resume may do; intake where a submission goes).
    ("MRT_DEPLOYMENT", "beside merritt", "standalone or beside-merritt"),
    ("MRT_BATCH_INTAKE", "both", "merritt or console, or empty"),
    (
        "MRT_BATCH_INTAKE",
        "merritt",
        "console or empty with MRT_DEPLOYMENT=standalone "
        "(merritt needs MRT_DEPLOYMENT=beside-merritt)",
    ),
    ("MRT_OWN_STEPS", "pending,nonsense", OWN_STEPS),
    ("MRT_OWN_STEPS", "pending;notify", OWN_STEPS),
    ("MRT_SSO_HEADER", "X-Remote User", "a header name (letters, digits and -), or empty"),
    (
        "DJANGO_SECURE_PROXY_SSL_HEADER",
        "X-Forwarded-Proto: https",
        "a header name such as X-Forwarded-Proto, or empty",
    ),
]


def test_every_bad_setting_is_refused_naming_it_and_its_value(tmp_path: Path) -> None:
    said = _read_by_the_settings(tmp_path, [(name, value) for name, value, *_ in BAD])
    wrong = []
    for (name, value, expected, *given), message in zip(BAD, said, strict=True):
        keep = name in ("DJANGO_ALLOWED_HOSTS", "MRT_ENVIRONMENT")
        shown = given[0] if given else value if keep else value.strip()
        wanted = f"environment variable {name} must be {expected}, got {shown!r}"
        if message != wanted:
            wrong.append(f"{name}={value!r}: {message!r}")
    assert not wrong


def test_manage_py_refuses_a_bad_setting_in_one_line(tmp_path: Path) -> None:
    # Django's own check of the zone ended it with a traceback before.
    done = _run([sys.executable, "manage.py", "check"], _environment(tmp_path, TZ="Mars/Base"))
    _refused_in_one_line(
        done,
        "manage.py",
        "environment variable TZ must be a time zone name such as America/Los_Angeles or UTC, "
        "got 'Mars/Base'",
    )


def test_a_database_url_is_refused_without_its_password(tmp_path: Path) -> None:
    done = _run(
        [sys.executable, "manage.py", "check"],
        _environment(tmp_path, DATABASE_URL="mysql://merritt:s3cret@db/console"),
    )
    _refused_in_one_line(
        done,
        "manage.py",
        "environment variable DATABASE_URL must be a postgres:// URL such as "
        "postgres://user:password@host:port/name (empty: the SQLite file), got 'mysql:...'",
    )
    assert "s3cret" not in done.stderr


def test_a_var_dir_that_cannot_be_written_is_refused_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    done = _run(
        [sys.executable, "manage.py", "check"],
        _environment(tmp_path, MRT_VAR_DIR=str(blocker / "var")),
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        "manage.py: environment variable MRT_VAR_DIR must be a folder this user can create"
    )
    assert line.endswith(f"got {str(blocker / 'var')!r}")


def test_runconsumer_refuses_before_it_connects(tmp_path: Path) -> None:
    # bin/run-console's daemons: gone at once, not waiting for a ZooKeeper at a bad address.
    done = _run(
        [sys.executable, "manage.py", "runconsumer", "all"],
        _environment(tmp_path, ZK_HOSTS="zk1:2181:2182"),
    )
    _refused_in_one_line(
        done, "manage.py", f"environment variable ZK_HOSTS must be {ENSEMBLE}, got 'zk1:2181:2182'"
    )


@pytest.mark.live_server
def test_daphne_refuses_a_bad_setting_in_one_line(tmp_path: Path) -> None:
    daphne = str(Path(sys.executable).with_name("daphne"))
    done = _run(
        [daphne, "-b", "127.0.0.1", "-p", "0", "mrtadmin.asgi:application"],
        _environment(tmp_path, MRT_INVENTORY_URL="inventory:8080"),
    )
    _refused_in_one_line(
        done,
        "mrtadmin.asgi",
        f"environment variable MRT_INVENTORY_URL must be {URL}, got 'inventory:8080'",
    )


GOOD = [
    ("ZK_HOSTS", "local"),
    ("ZK_HOSTS", "zk1.example.org:2181,zk2:2181,[::1]:2181/merritt"),
    ("ZK_HOSTS", "zk1"),
    ("MRT_STORAGE_URL", "http://storage.example.org:35121/"),
    ("REDIS_URL", "rediss://:secret@redis.example.org:6380/0"),
    ("MRT_FETCH_ALLOW", "10.1.0.0/16; 127.0.0.1,::1"),
    ("MRT_RETRY_EZID", "within=1h"),
    ("TZ", "America/Los_Angeles"),
    ("MRT_EZID_TARGET_URL", ""),
    ("MRT_DEPLOYMENT", "Beside_Merritt"),
    ("MRT_DEPLOYMENT", ""),
    ("MRT_BATCH_INTAKE", " Console "),
    ("MRT_OWN_STEPS", "pending, notify,"),
    ("MRT_OWN_STEPS", "all"),
]


def test_good_values_are_taken(tmp_path: Path) -> None:
    said = _read_by_the_settings(tmp_path, GOOD)
    assert dict(zip(GOOD, said, strict=True)) == dict.fromkeys(GOOD)


def test_merritt_intake_is_taken_beside_merritt(tmp_path: Path) -> None:
    # The combination refused standalone (BAD) is the default beside Merritt.
    cases = [("MRT_BATCH_INTAKE", "merritt"), ("MRT_BATCH_INTAKE", "")]
    said = _read_by_the_settings(tmp_path, cases, MRT_DEPLOYMENT="beside-merritt")
    assert said == [None, None]
