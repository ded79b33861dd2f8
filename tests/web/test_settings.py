"""Settings: the generated secret key on a fresh MRT_VAR_DIR."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from django.conf import settings

PRINT_KEY = "import mrtadmin.settings as s; print(s.SECRET_KEY)"


def test_processes_starting_together_share_one_owner_only_secret_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_SECRET_KEY")}
    env["MRT_VAR_DIR"] = str(tmp_path)
    # The web process and the daemons of bin/run-console (or of a compose project sharing one
    # volume) start at the same moment; they must not each keep a different key.
    started = [
        subprocess.Popen(
            [sys.executable, "-c", PRINT_KEY],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    keys = {process.communicate(timeout=120)[0].strip() for process in started}
    assert all(process.returncode == 0 for process in started)
    key_file = tmp_path / "secret_key"
    assert keys == {key_file.read_text().strip()}
    assert len(keys.pop()) >= 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def _settings_with(tmp_path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "MRT_"))}
    env.update(MRT_VAR_DIR=str(tmp_path), **variables)
    return subprocess.run(
        [sys.executable, "-c", "import mrtadmin.settings"],
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


def test_a_number_that_is_not_one_names_the_variable(tmp_path: Path) -> None:
    result = _settings_with(tmp_path, MRT_MAX_OBJECT_BYTES="10GB")
    assert result.returncode != 0
    assert "MRT_MAX_OBJECT_BYTES must be an integer, got '10GB'" in result.stderr
