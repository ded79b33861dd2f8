"""Prepare the console: the three role groups and, on a fresh install, an admin user.

Safe to run on every start (after ``migrate``): groups are brought up to date, and a user is
only created when there is no superuser at all.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

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
        user = users.objects.create_superuser(username=username, email="", password=password)
        user.groups.add(groups[ADMIN])
        if generated:
            path = settings.MRT_VAR_DIR / "admin-password"
            path.write_text(password + "\n", encoding="utf-8")
            path.chmod(0o600)
            self.stdout.write(f"created admin user {username!r} with password {password}")
            self.stdout.write(f"(also written to {path})")
        else:
            self.stdout.write(f"created admin user {username!r} (password from MRT_ADMIN_PASSWORD)")
