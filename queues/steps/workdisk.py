"""The working disk's room for what provisioning hands out: one rule, for the provisioning
step that applies it and the overview that shows it."""

from __future__ import annotations

from typing import Any


def provision_room(usage: Any, high_water: float) -> int:
    """Bytes the working disk can still take below its high-water mark (a fraction of the
    disk), and no more than it has free; negative once it is past the mark.

    ``usage`` is ``shutil.disk_usage``'s answer. Its ``used`` is the blocks in use; ``total -
    free`` is more than that by the blocks the file system keeps for root (5% of an ext4 disk by
    default), which nobody here writes: measured that way, a disk at 66% looked past a 70% mark,
    and the overview said nothing fitted while provisioning let jobs through."""
    return min(int(usage.total * high_water) - usage.used, usage.free)
