"""Every environment variable the code reads is documented in docs/configuration.md.

The README keeps only the main settings, so the reference is the one place an operator can
trust to be complete; this keeps it so as settings are added.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "configuration.md"

# Python reads settings through mrtadmin.settings' helpers or os.environ; shell and compose
# files through ${NAME}. Only the project's own prefixes count: PATH, HOME, CI and the like are
# the machine's.
PY_READ = re.compile(
    r"""(?:\benv(?:_int|_bool|_float|_seconds|_url|_networks)?|getenv|environ\.get|environ\[)"""
    r"""\(?\s*["']([A-Z][A-Z0-9_]+)["']"""
)
SHELL_READ = re.compile(r"\$\{?((?:MRT|ZK|DJANGO|LIVE|REDIS|EMAIL|DATABASE)_[A-Z0-9_]+)")
# Set by the code for itself or by Django's own machinery, not read as configuration.
NOT_SETTINGS = {"DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE"}


def _read_names() -> dict[str, str]:
    names: dict[str, str] = {}
    for folder in ("queues", "mrtadmin", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            for name in PY_READ.findall(path.read_text(encoding="utf-8")):
                names.setdefault(name, str(path.relative_to(ROOT)))
    shell_files = [p for p in (ROOT / "bin").iterdir() if p.is_file()]
    shell_files += [ROOT / "docker-compose.yml", ROOT / "Dockerfile"]
    shell_files += [p for p in (ROOT / "docker").rglob("*") if p.is_file()]
    for path in shell_files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for name in SHELL_READ.findall(text):
            names.setdefault(name, str(path.relative_to(ROOT)))
    return {n: where for n, where in names.items() if n not in NOT_SETTINGS}


def test_the_scan_finds_the_settings_the_code_reads() -> None:
    # A scan that silently matched nothing would pass the test below for ever.
    names = _read_names()
    assert {"ZK_HOSTS", "DATABASE_URL", "MRT_CONSOLE_URL", "MRT_COMPOSE"} <= set(names)


def test_every_variable_the_code_reads_is_in_the_configuration_reference() -> None:
    reference = REFERENCE.read_text(encoding="utf-8")
    missing = {
        name: where for name, where in sorted(_read_names().items()) if f"`{name}`" not in reference
    }
    assert not missing, f"not in docs/configuration.md: {missing}"


# Documented, and read by name elsewhere: by the libraries (requests, urllib, OpenSSL), through a
# constant or a name made from a service's (MRT_RETRY_<SERVICE>), or by the tests' own runner.
READ_ELSEWHERE = {
    "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "SSL_CERT_FILE", "ZK_JUTE_MAXBUFFER",
    "MRT_RETRY_STORAGE", "MRT_RETRY_INVENTORY", "MRT_RETRY_EZID", "MRT_RETRY_DEPOSITOR",
    "MRT_RETRY_CALLBACK", "MRT_DOCKER_TESTS", "MRT_ALERT_WEBHOOK_URL_FILE",
}  # fmt: skip


def test_every_variable_in_the_reference_is_read_by_the_code() -> None:
    # A setting the code stopped reading, still documented, is one an operator sets in vain.
    reference = REFERENCE.read_text(encoding="utf-8")
    first_cells = re.findall(r"^\| ([^|]+) \|", reference, re.MULTILINE)
    documented = {n for cell in first_cells for n in re.findall(r"`([A-Z][A-Z0-9_]+)`", cell)}
    assert {"ZK_HOSTS", "MRT_BREAKER_WINDOW", "EMAIL_TIMEOUT"} <= documented
    unread = documented - set(_read_names()) - READ_ELSEWHERE
    assert not unread, f"documented in docs/configuration.md, read nowhere: {sorted(unread)}"


def test_the_readme_links_to_every_document_it_names() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).is_file(), target
