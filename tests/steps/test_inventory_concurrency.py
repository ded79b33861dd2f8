"""Several daemon processes record into one file-backed SQLite inventory at the same time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from queues.steps.checkm import ManifestRow, write_checkm

REPO = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent(
    """
    import os, sys
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mrtadmin.settings")
    import django
    django.setup()
    from queues.daemons.inventory_db import LocalInventory
    worker, count, manifest = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    inventory = LocalInventory()
    for n in range(count):
        inventory.record(ark=f"ark:/99999/fk4w{worker}n{n}", version=1, manifest_url=manifest)
        # The same object again, as a re-run Recording step would do.
        inventory.record(ark=f"ark:/99999/fk4w{worker}n{n}", version=1, manifest_url=manifest)
    """
)


@pytest.mark.slow
def test_concurrent_processes_record_without_database_is_locked(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.checkm"
    payload = tmp_path / "a.txt"
    payload.write_text("a")
    manifest.write_text(write_checkm([ManifestRow(url=payload.as_uri(), filename="a.txt")]))
    env = {
        **os.environ,
        "MRT_VAR_DIR": str(tmp_path / "var"),
        "MRT_DATABASE_PATH": str(tmp_path / "inventory.sqlite3"),
        "DJANGO_SETTINGS_MODULE": "mrtadmin.settings",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(worker), "15", manifest.as_uri()],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for worker in range(4)
    ]
    errors = [w.communicate(timeout=240)[1] for w in writers]
    assert [w.returncode for w in writers] == [0, 0, 0, 0], "\n".join(errors)
    count = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "--verbosity",
            "0",
            "-c",
            "from queues.models import InventoryVersion as V, InventoryFile as F;"
            "print(V.objects.count(), F.objects.count())",
        ],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert count.stdout.split() == ["60", "60"]
