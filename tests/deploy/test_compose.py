"""The container deployment: cheap checks always, the real end-to-end run when asked for.

``MRT_DOCKER_TESTS=1 bin/run-tests tests/deploy`` runs ``bin/compose-check``: it builds every
image, starts the compose project, drives the console from outside and removes it again
(about 3 minutes with a warm build cache, 5 from nothing; it needs root and a Docker engine).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "debian:bookworm-slim"
DOCKERFILES = [ROOT / "Dockerfile", *sorted((ROOT / "docker").glob("*/Dockerfile"))]
SCRIPTS = [
    ROOT / "bin" / "compose-check",
    ROOT / "docker" / "zookeeper" / "entrypoint",
    ROOT / "docker" / "zookeeper" / "healthy",
]


def test_every_image_starts_from_the_one_debian_base() -> None:
    assert len(DOCKERFILES) >= 3  # the app, ZooKeeper, Redis
    for dockerfile in DOCKERFILES:
        bases = [
            line.split()[1]
            for line in dockerfile.read_text().splitlines()
            if line.upper().startswith("FROM ")
        ]
        assert bases == [BASE_IMAGE], f"{dockerfile.relative_to(ROOT)} starts from {bases}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_container_scripts_are_executable_bash(script: Path) -> None:
    assert os.access(script, os.X_OK), f"{script} is not executable"
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("MRT_DOCKER_TESTS") != "1",
    reason="builds and runs the whole container deployment; set MRT_DOCKER_TESTS=1 to run it",
)
def test_compose_check_passes() -> None:
    run = subprocess.run(
        [str(ROOT / "bin" / "compose-check")],
        capture_output=True,
        text=True,
        timeout=45 * 60,
        stdin=subprocess.DEVNULL,
    )
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, tail
    assert "=== PASSED" in run.stdout, tail
