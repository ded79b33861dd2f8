"""API tokens without a browser: ``apitoken create|list|revoke``.

For deployments where a monitoring system or a depositor tool needs a token and nobody has a
browser at hand. The key is shown once (or written to an owner-only file) and only its SHA-256
is kept, exactly as for a token made at ``/tokens/``; creating and revoking are audited.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.db.models import Q

from queues.core.clock import clock_text
from queues.core.outside_text import for_log
from queues.core.words import digits
from queues.operator import audit
from queues.operator.audit import ApiToken

from ._base import QueueCommand, require_database

VIA = "command"

# What each action uses of the arguments, by their names on the command line: one given to an
# action that would drop it is refused, before the database is asked.
ARGUMENTS = {
    "token": "token ID or prefix",
    "user": "--user",
    "name": "--name",
    "key_file": "--key-file",
}
TAKES = {"create": ("user", "name", "key_file"), "list": ("user",), "revoke": ("token",)}


def _operator() -> str:
    """Who ran the command, for the audit log (the machine account, not a console user)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


class Command(QueueCommand):
    help = (
        "API tokens: create --user NAME --name LABEL [--key-file PATH] (the key is printed once, "
        "or written to PATH readable by its owner only), list [--user NAME], revoke ID|PREFIX."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("action", choices=["create", "list", "revoke"])
        parser.add_argument(
            "token",
            nargs="?",
            default="",
            help="revoke: its id or key prefix (after -- if it begins with -)",
        )
        parser.add_argument("--user", default="", help="the console user the token acts as")
        parser.add_argument("--name", default="", help="create: a label to tell tokens apart")
        parser.add_argument("--key-file", default="", help="create: write the key here (0600)")

    def handle(self, *args: Any, **opts: Any) -> None:
        action = opts["action"]
        taken = TAKES[action]
        dropped = [said for key, said in ARGUMENTS.items() if opts[key] and key not in taken]
        if dropped:
            raise CommandError(f"{action} takes no {', '.join(dropped)}")
        require_database()
        if action == "create":
            self.create(opts["user"], opts["name"], opts["key_file"])
        elif action == "list":
            self.list(opts["user"])
        else:
            self.revoke(opts["token"])

    def create(self, username: str, name: str, key_file: str) -> None:
        if not username or not name.strip():
            raise CommandError("create needs --user NAME and --name LABEL")
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no console user {username!r}; create it first")
        if not user.is_active:
            raise CommandError(f"user {username!r} is inactive; a token would not work")
        target = Path(key_file) if key_file else None
        if target is not None and target.exists():
            raise CommandError(f"{target} exists; a key is never written over another file")
        token, key = ApiToken.issue(user=user, name=name.strip()[:100])
        if target is not None:
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(key + "\n")
            except OSError as exc:
                token.delete()
                raise CommandError(f"cannot write the key to {target}: {exc}") from exc
        audit.record(
            user=None,
            action="create",
            kind="token",
            item_id=str(token.pk),
            after=token.prefix,
            detail=f"for {username}, named {token.name!r}, by {_operator()} on the command line",
            via=VIA,
        )
        self.stdout.write(f"token {token.pk} ({token.prefix}…) for {username}, named {token.name}")
        if target is not None:
            self.stdout.write(f"key written to {target} (readable by its owner only)")
        else:
            self.stdout.write(f"key (shown once, keep it): {key}")

    def list(self, username: str) -> None:
        tokens = ApiToken.objects.select_related("user").order_by("pk")
        if username:
            tokens = tokens.filter(user__username=username)
        for token in tokens:
            used = clock_text(token.last_used) if token.last_used else "never"
            # Tab-separated: a tab in a name typed into /tokens/ is shown, not a column.
            self.stdout.write(
                f"{token.pk}\t{token.prefix}…\t{for_log(token.user.get_username())}\t"
                f"{for_log(token.name)}\t"
                f"created {clock_text(token.created)}\tlast used {used}"
            )

    def revoke(self, ident: str) -> None:
        if not ident:
            raise CommandError("revoke needs the token's id or key prefix (see apitoken list)")
        by_id = digits(ident)
        match = Q(prefix=ident) | (Q(pk=by_id) if by_id is not None else Q())
        found = list(ApiToken.objects.select_related("user").filter(match))
        if not found:
            raise CommandError(f"no token has id or prefix {ident!r}")
        if len(found) > 1:
            ids = ", ".join(str(t.pk) for t in found)
            raise CommandError(f"{ident!r} matches tokens {ids}; give the id")
        token = found[0]
        pk = token.pk
        token.delete()
        audit.record(
            user=None,
            action="revoke",
            kind="token",
            item_id=str(pk),
            before=token.prefix,
            detail=f"of {token.user.get_username()}, named {token.name!r}, by {_operator()}",
            via=VIA,
        )
        self.stdout.write(f"token {pk} ({token.prefix}…) of {token.user.get_username()} revoked")
