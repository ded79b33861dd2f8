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
