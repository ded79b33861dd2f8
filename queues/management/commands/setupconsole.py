"""Prepare the console: the three role groups and, on a fresh install, an admin user.

Safe to run on every start (after ``migrate``): groups are brought up to date, and a user is
only created when there is no superuser at all.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.db import transaction

from mrtadmin.settings import env
from queues.operator.auth import ADMIN, ensure_groups

from ._base import QueueCommand, require_database


class Command(QueueCommand):
    help = "Create the viewer/operator/admin groups and a first admin user if none exists."

    def handle(self, *args: Any, **options: Any) -> None:
        require_database()
        groups = ensure_groups()
        self.stdout.write(f"groups: {', '.join(groups)}")
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            return
        # Through settings' reader, so MRT_ADMIN_PASSWORD_FILE works like every other secret.
        username = env("MRT_ADMIN_USER") or "admin"
        if users.objects.filter(username=username).exists():
            # Never made a superuser by this command: the name may be anyone's (a viewer made
            # at their first single sign-on), and creating it again fails on the unique name.
            raise CommandError(
                f"there is no superuser, and user {username!r} exists without being one: make "
                "an admin with `manage.py createsuperuser`, or set MRT_ADMIN_USER to a new name"
            )
        password = env("MRT_ADMIN_PASSWORD")
        generated = not password
        if generated:
            password = secrets.token_urlsafe(18)
        path = settings.MRT_VAR_DIR / "admin-password"
        if generated:
            # Written before the user is made: a superuser whose generated password was never
            # kept would lock the console out for good (the next start finds a superuser and
            # makes none). Private from the moment it exists, whatever the umask.
            _write_private(path, password + "\n")
        try:
            with transaction.atomic():
                user = users.objects.create_superuser(
                    username=username, email="", password=password
                )
                user.groups.add(groups[ADMIN])
        except BaseException:
            if generated:
                path.unlink(missing_ok=True)
            raise
        if generated:
            self.stdout.write(f"created admin user {username!r} with password {password}")
            self.stdout.write(f"(also written to {path})")
        else:
            self.stdout.write(f"created admin user {username!r} (password from MRT_ADMIN_PASSWORD)")


def _write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, readable by its owner only from its creation on (a file left
    from before is made so before it is written)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)
