"""One ``MRT_VAR_DIR`` for every daemon process of a queue.

A job's working folder, local storage, the downloads and the file mail live in ``MRT_VAR_DIR``,
and any daemon on any host may take a job's next step: a host with a folder of its own fails
every job another host started. So the first daemon process writes a marker file with a random
token into its folder and names the token (and the folder) in ZooKeeper,
``/mrt-console/var-dir``; every later process must find that token in its own folder's marker
file, or it refuses to start and says what to share. The marker is written once and never
changes, so a folder that really moved takes its marker with it; otherwise an operator removes
the node and the next daemon names its own folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from queues.zk import consumers as zconsumers
from queues.zk.errors import MalformedNode

MARKER = ".mrt-shared-var-dir"


class VarDirNotShared(CommandError):
    """This process's MRT_VAR_DIR is not the folder the queue's daemons share (a
    CommandError, so ``runconsumer`` stops with the message instead of a traceback)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, returncode=2)


def marker_token(folder: Path) -> str | None:
    """The token of ``folder``'s marker file; None when there is none."""
    try:
        text = (folder / MARKER).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    token = text.strip()
    return token or None


def marker_write(folder: Path) -> str:
    """The folder's token, writing a new marker file unless one is there. Linked into place
    from a file of its own, so two processes starting together on one folder read one token."""
    folder.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    scratch = folder / f"{MARKER}.{os.getpid()}.{secrets.token_hex(4)}"
    scratch.write_text(f"{token}\n", encoding="utf-8")
    try:
        os.link(scratch, folder / MARKER)
    except FileExistsError:
        token = marker_token(folder) or token
    finally:
        with contextlib.suppress(FileNotFoundError):
            scratch.unlink()
    return token


def ensure_shared_var_dir(zk: Any, folder: Path, *, host: str) -> None:
    """Return when ``folder`` is the queue's shared folder (naming it when no process has);
    raise VarDirNotShared otherwise. ZooKeeper errors pass through (a connection error is
    waited out by the caller, as for any other first read)."""
    folder = folder.resolve()
    try:
        standing = zconsumers.var_dir_read(zk)
    except MalformedNode as exc:
        raise VarDirNotShared(f"{exc}; {_reset_advice()}") from exc
    token = marker_token(folder)
    if standing is None:
        token = token or marker_write(folder)
        standing = zconsumers.var_dir_claim(
            zk,
            {
                "token": token,
                "path": str(folder),
                "host": host,
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        )
    if token is not None and standing.get("token") == token:
        return
    named = standing.get("path", "?")
    by = standing.get("host", "?")
    found = "holds another token" if token is not None else "is missing"
    raise VarDirNotShared(
        f"MRT_VAR_DIR {folder} is not the folder the other consumer daemons share: "
        f"ZooKeeper's {zconsumers.VAR_DIR} names {json.dumps(named)} on {json.dumps(by)}, and "
        f"the marker file {folder / MARKER} {found}. Mount that one shared folder at "
        "MRT_VAR_DIR on every daemon host (job working folders, local storage, downloads and "
        "mail live there) and give every host the same DJANGO_SECRET_KEY. "
        f"If the shared folder really moved, copy {MARKER} from the old folder into the new "
        f"one; {_reset_advice()}"
    )


def _reset_advice() -> str:
    return (
        f"to name a new shared folder, remove the ZooKeeper node {zconsumers.VAR_DIR} (below "
        "ZK_HOSTS's chroot, e.g. zkCli.sh: delete /<chroot>/mrt-console/var-dir) while no "
        "daemon runs: the next daemon to start names its own folder"
    )
