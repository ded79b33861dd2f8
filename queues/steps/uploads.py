"""The files depositors upload through the ``/poster/`` door, and their removal with their batch.

An upload is written to ``<work>/poster/<batchID>/<filename>`` (``queues.views.poster``), where
``<batchID>`` is the batch's Merritt-style ``bid-<uuid>``, kept in the batch's ``submission`` as
``batchID``. The batch's payload URL points there until its jobs have downloaded it; once the
batch itself is gone from the queue (deleted, removed, or archived), nothing reads the folder
again, so whoever removes a batch calls :func:`remove_uploads`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("queues.poster")

UPLOAD_FOLDER = "poster"


def upload_root(work_dir: str | Path) -> Path:
    return (Path(work_dir) / UPLOAD_FOLDER).resolve()


def upload_folder(work_dir: str | Path, submission: Mapping[str, Any]) -> Path | None:
    """The batch's upload folder, or None when the batch has none a removal may touch: no
    ``batchID``, or one that is not a single plain folder name directly under the upload root
    (a batch from any other door, or a batchID that would lead elsewhere)."""
    name = submission.get("batchID")
    if not isinstance(name, str) or not name or name.startswith(".") or "/" in name:
        return None
    if "\\" in name or "\0" in name:
        return None
    root = upload_root(work_dir)
    folder = root / name
    if folder.parent != root or folder.is_symlink() or not folder.is_dir():
        return None
    return folder


def remove_uploads(work_dir: str | Path, submission: Mapping[str, Any]) -> bool:
    """Remove the upload folder of a batch that has left the queue; True when one was removed.

    A folder that cannot be removed (a disk error) is logged and left: the batch is already
    gone, and a leftover folder costs space, not correctness.
    """
    folder = upload_folder(work_dir, submission)
    if folder is None:
        return False
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        log.warning("upload folder %s of a removed batch not removed: %s", folder, exc)
        return False
    log.info("removed the upload folder %s of a removed batch", folder)
    return True
