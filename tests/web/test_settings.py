"""Settings: pure on import; the generated secret key on a fresh MRT_VAR_DIR; strict parsing."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

PRINT_KEY = "from django.conf import settings; print(settings.SECRET_KEY)"
IMPORT_ONLY = """
import os, threading
os.environ["DJANGO_SETTINGS_MODULE"] = "mrtadmin.settings"
import mrtadmin.settings
import mrtadmin.asgi
print(sorted(t.name for t in threading.enumerate()))
"""


def test_importing_the_settings_and_the_web_application_creates_and_starts_nothing(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "MRT_"))}
    var = tmp_path / "var"
    env.update(MRT_VAR_DIR=str(var), ZK_HOSTS="127.0.0.1:9")
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ONLY],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert not var.exists()  # no folder, no secret key
    assert "warm-read-index" not in done.stdout  # the warm-up waits for a first connection
    # A command is the deliberate moment: manage.py makes the folder and the key first.
    subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        check=True,
        timeout=120,
    )
    key_file = var / "secret_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    # A web process started on its own reads that key when it first signs something.
    env["DJANGO_SETTINGS_MODULE"] = "mrtadmin.settings"
    used = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {PRINT_KEY}"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert used.stdout.strip() == key_file.read_text().strip()


def test_without_manage_py_the_key_is_made_when_first_used(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "MRT_"))}
    env.update(MRT_VAR_DIR=str(tmp_path / "var"), DJANGO_SETTINGS_MODULE="mrtadmin.settings")
    used = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {PRINT_KEY}"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    key_file = tmp_path / "var" / "secret_key"
    assert used.stdout.strip() == key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


@pytest.mark.slow
def test_processes_starting_together_share_one_owner_only_secret_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_SECRET_KEY")}
    env["MRT_VAR_DIR"] = str(tmp_path)
    # The commands of bin/run-console (or of a compose project sharing one volume) may start at
    # the same moment; they must not each keep a different key.
    started = [
        subprocess.Popen(
            [sys.executable, "manage.py", "shell", "-c", PRINT_KEY],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    keys = {process.communicate(timeout=120)[0].split()[-1] for process in started}
    assert all(process.returncode == 0 for process in started)
    key_file = tmp_path / "secret_key"
    assert keys == {key_file.read_text().strip()}
    assert len(keys.pop()) >= 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def _settings_with(
    tmp_path: Path, code: str = "import mrtadmin.settings", **variables: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "MRT_"))}
    env.update(MRT_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="mrtadmin.settings", **variables)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_misspelt_yes_or_no_stops_start_up_and_names_the_variable(tmp_path: Path) -> None:
    # "ture" used to read as False, silently turning a security setting off.
    result = _settings_with(tmp_path, DJANGO_SECURE="ture")
    assert result.returncode != 0
    assert "environment variable DJANGO_SECURE must be one of" in result.stderr
    assert "'ture'" in result.stderr
    for word in ("1", "true", "Yes", "off", ""):
        assert _settings_with(tmp_path, DJANGO_SECURE=word).returncode == 0, word


def test_a_yes_or_no_set_empty_is_its_default(tmp_path: Path) -> None:
    # As compose's ${VAR:-} and systemd's Environment=VAR= leave a variable no one gave: read
    # as "no" before, it turned the settings that are on by default off in silence.
    code = (
        "from django.conf import settings as s; "
        "print(s.MRT_KEEP_LOCKS, s.MRT_BATCH_LONG_STEPS, s.SESSION_COOKIE_SECURE, s.DEBUG)"
    )
    answer = _settings_with(
        tmp_path,
        code=code,
        MRT_KEEP_LOCKS="",
        MRT_BATCH_LONG_STEPS=" ",
        DJANGO_SECURE="1",
        DJANGO_SECURE_COOKIES="",
        DJANGO_DEBUG="",
    )
    assert answer.stdout.split() == ["True", "True", "True", "False"], answer.stderr


def test_a_misspelt_shared_loops_setting_stops_start_up(tmp_path: Path) -> None:
    result = _settings_with(tmp_path, MRT_SHARED_LOOPS="shared")
    assert result.returncode != 0
    assert "environment variable MRT_SHARED_LOOPS must be one of" in result.stderr
    code = "from django.conf import settings; print(settings.MRT_SHARED_LOOPS)"
    for word, value in (("0", "False"), ("off", "False"), ("on", "True")):
        answer = _settings_with(tmp_path, code=code, MRT_SHARED_LOOPS=word)
        assert answer.stdout.strip() == value, (word, answer.stderr)


def test_a_number_that_is_not_one_names_the_variable(tmp_path: Path) -> None:
    result = _settings_with(tmp_path, MRT_MAX_OBJECT_BYTES="10GB")
    assert result.returncode != 0
    assert "MRT_MAX_OBJECT_BYTES must be a whole number of at least 1, got '10GB'" in result.stderr
    for name, value in (("ZK_TIMEOUT", "nan"), ("LIVE_COALESCE_SECONDS", "0,25")):
        result = _settings_with(tmp_path, **{name: value})
        assert result.returncode != 0
        assert f"{name} must be a number" in result.stderr and f"got {value!r}" in result.stderr


@pytest.mark.parametrize(
    "name, value, said",
    [
        # Each would have been taken: a loop claiming nothing, downloading stalled for good, a
        # session that expires at once, a step history pruned whole, a port no socket has, an
        # hour no clock shows, an interval of no time.
        ("MRT_CLAIM_BATCH", "0", "a whole number from 1 to 1,000"),
        ("MRT_DOWNLOADS_PER_HOST", "0", "a whole number from 1 to 1,000"),
        ("ZK_TIMEOUT", "0", "a number above 0 and at most 3,600"),
        ("MRT_STEP_HISTORY_DAYS", "-1", "a number above 0 and at most 36,500"),
        ("MRT_RETENTION_DAYS", "-1", "a number from 0 to 36,500"),
        ("ZK_LOCAL_PORT", "70000", "a whole number from 1 to 65,535"),
        ("MRT_ALERT_DIGEST_HOUR", "24", "a whole number from -1 to 23"),
        ("MRT_ALERT_DIGEST_HOUR", "-2", "a whole number from -1 to 23"),
        ("MRT_ALERT_EVERY", "0", "a number above 0 and at most 86,400"),
        ("MRT_PROVISION_HIGH_WATER", "1.5", "a number above 0 and at most 1"),
        ("MRT_HTTP_TIMEOUT", "inf", "a number above 0 and at most 86,400"),
    ],
)
def test_a_number_out_of_its_range_stops_start_up_and_says_the_range(
    tmp_path: Path, name: str, value: str, said: str
) -> None:
    result = _settings_with(tmp_path, **{name: value})
    assert result.returncode != 0
    assert f"environment variable {name} must be {said}, got {value!r}" in result.stderr


def test_a_loading_wait_out_of_range_names_the_variable(tmp_path: Path) -> None:
    for value in ("-1", "600", "soon"):
        result = _settings_with(tmp_path, MRT_LOADING_WAIT=value)
        assert result.returncode != 0, value
        assert "MRT_LOADING_WAIT must be" in result.stderr, value
    code = "from django.conf import settings; print(settings.MRT_LOADING_WAIT)"
    assert _settings_with(tmp_path, code=code, MRT_LOADING_WAIT="0").stdout.strip() == "0.0"


def test_an_unknown_log_level_names_the_variable(tmp_path: Path) -> None:
    result = _settings_with(tmp_path, LOG_LEVEL="verbose")
    assert result.returncode != 0
    assert "environment variable LOG_LEVEL must be" in result.stderr
    assert _settings_with(tmp_path, LOG_LEVEL="warning").returncode == 0


def test_an_environment_name_that_is_not_a_short_name_is_refused(tmp_path: Path) -> None:
    result = _settings_with(tmp_path, MRT_ENVIRONMENT="<b>prod</b>")
    assert result.returncode != 0
    assert "MRT_ENVIRONMENT must be a short name" in result.stderr
    assert _settings_with(tmp_path, MRT_ENVIRONMENT="Stage").returncode == 0


def test_mail_links_follow_where_the_console_is_served(tmp_path: Path) -> None:
    show = "from django.conf import settings; print(settings.MRT_CONSOLE_URL)"
    for env_extra, expected in (
        ({"MRT_PORT": "8443"}, "http://127.0.0.1:8443"),
        ({"MRT_BIND": "10.1.2.3", "MRT_PORT": "9000"}, "http://10.1.2.3:9000"),
        (
            {"MRT_CONSOLE_URL": "https://queue.example.org", "MRT_PORT": "9000"},
            "https://queue.example.org",
        ),
        # Served under a prefix (bin/run-console's --root-path): the links are under it too.
        ({"MRT_PORT": "9000", "MRT_ROOT_PATH": "/ops/queue"}, "http://127.0.0.1:9000/ops/queue"),
    ):
        result = _settings_with(tmp_path, code=show, **env_extra)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == expected


def test_a_url_prefix_that_is_not_one_stops_start_up_and_names_the_variable(
    tmp_path: Path,
) -> None:
    # Each would serve somewhere else than the operator meant, or links no proxy path matches.
    for value in ("queue", "/queue/", "/", "/a//b", "/a/../b", "/q ue", "/q?x"):
        result = _settings_with(tmp_path, MRT_ROOT_PATH=value)
        assert result.returncode != 0, value
        assert "environment variable MRT_ROOT_PATH must be a URL prefix" in result.stderr, value
        assert repr(value) in result.stderr, value
    assert _settings_with(tmp_path, MRT_ROOT_PATH="").returncode == 0


def test_the_error_report_hides_every_setting_that_may_hold_a_secret(settings: Any) -> None:
    from django.views.debug import get_default_exception_reporter_filter

    settings.DATABASE_URL = "postgres://console:s3cret@db/console"
    settings.REDIS_URL = "redis://:s3cret@redis:6379/0"
    settings.MRT_STORAGE_URL = "http://merritt:s3cret@storage:35121/"
    settings.MRT_ALERT_WEBHOOK_URL = "https://hooks.slack.com/services/T0/B0/s3cret"
    settings.CHANNEL_LAYERS = {"default": {"CONFIG": {"hosts": ["redis://:s3cret@redis:6379/0"]}}}
    shown = get_default_exception_reporter_filter().get_safe_settings()
    assert "s3cret" not in repr(shown)
    assert shown["TIME_ZONE"] == settings.TIME_ZONE  # the others as they are
