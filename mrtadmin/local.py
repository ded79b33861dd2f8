"""What this installation keeps on its own disk, created when a process starts, not on import.

Importing the settings only computes paths. The folder ``MRT_VAR_DIR`` and the generated secret
key (``$MRT_VAR_DIR/secret_key``, when ``DJANGO_SECRET_KEY`` is not set) are created:

- by ``manage.py`` before any command runs (:func:`prepare`): ``bin/run-console`` and the
  compose project's ``setup`` service run ``migrate`` first, so the folder and the key exist
  before the web process and the daemons start, and a key that cannot be written stops that
  first command, not a request later;
- otherwise the first time the key is needed (``settings.SECRET_KEY`` is a lazy string that
  reads the file, creating it if it is missing): a web process started on its own (daphne
  straight from the image) signs its first session or CSRF token with the same key every other
  process reads.

The settings import this module, so it imports nothing of Django that needs them.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured


def read_or_create_secret_key(key_file: Path) -> str:
    """The key in ``key_file``, created first (owner-only, random) when it does not exist.

    Of processes starting together on a fresh folder exactly one creates the file (O_EXCL);
    the others read what it wrote.
    """
    key_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(secrets.token_urlsafe(50))
    for _ in range(50):
        key = key_file.read_text(encoding="utf-8").strip()
        if key:
            return key
        time.sleep(0.1)  # created a moment ago by another process, not yet written
    raise ImproperlyConfigured(f"{key_file} is empty: delete it or set DJANGO_SECRET_KEY")


def lazy_secret_key(key_file: Path) -> Any:
    """A string that is read (or created) from ``key_file`` the first time it is used."""
    from django.utils.functional import SimpleLazyObject

    return SimpleLazyObject(lambda: read_or_create_secret_key(key_file))


def settings_or_exit(program: str, *, create: bool = False) -> None:
    """Load the settings now (and with ``create``, :func:`prepare`), or stop the process with
    one line naming the bad setting.

    A bad value (``environment variable MRT_CLAIM_BATCH must be a whole number from 1 to
    1,000, got '0'``) raises ImproperlyConfigured while the settings are read; met later by
    Django, it would end ``manage.py`` or daphne with a traceback around the line. Exit status 2,
    as for a wrong command line.
    """
    import sys

    from django.conf import settings

    try:
        settings.INSTALLED_APPS  # noqa: B018 - reading one loads them all
        if create:
            prepare()
    except ImproperlyConfigured as exc:
        sys.stderr.write(f"{program}: {exc}\n")
        raise SystemExit(2) from None


def prepare() -> None:
    """Create ``MRT_VAR_DIR`` and, unless one is configured, the secret key file.

    Called by ``manage.py`` before it runs a command. Idempotent, and safe for several
    processes starting at once. A folder that cannot be made or written stops the command in
    one line (ImproperlyConfigured), not at the first step that writes there.
    """
    from django.conf import settings

    var_dir = Path(settings.MRT_VAR_DIR)
    try:
        var_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(var_dir, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable")
        str(settings.SECRET_KEY)  # the generated key's file, if that is where it comes from
    except OSError as exc:
        where = exc.filename or var_dir
        raise ImproperlyConfigured(
            f"environment variable MRT_VAR_DIR must be a folder this user can create and "
            f"write ({exc.strerror}: {str(where)!r}), got {str(settings.MRT_VAR_DIR)!r}"
        ) from None
