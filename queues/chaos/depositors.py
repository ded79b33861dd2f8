"""What the chaos run submits: good single-file batch manifests, and hostile depositors among
them, each expected to fail for its own reason and never because of a fault of ours."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from queues.steps.checkm import (
    CONTAINER_BATCH_MANIFEST,
    SINGLE_FILE_BATCH_MANIFEST,
    ManifestRow,
    write_checkm,
)
from queues.zk import paths
from queues.zk.batches import batch_create, batch_id_for_uuid
from queues.zk.errors import NotFound

PROFILE = "merritt_demo_content"

# The loopback address a depositor must never make us reach, and other spellings of it that
# resolve to it (inet_aton's short, decimal and hexadecimal forms; a 6to4 address embedding it).
DISGUISES = {
    "hostile-disguise-short": "127.2",
    "hostile-disguise-decimal": "2130706434",
    "hostile-disguise-hex": "0x7f.2",
    "hostile-disguise-6to4": "[2002:7f00:2::1]",
}
REFUSED = ("which is not fetched for depositors",)


@dataclass(frozen=True)
class Hostile:
    """One hostile depositor: how it is served, and the words its failure must contain (any)."""

    local_id: str
    kind: str  # "container" or "file"
    reasons: tuple[str, ...]


HOSTILE = {
    h.local_id: h
    for h in (
        Hostile("hostile-bomb", "container", ("the compression-ratio limit",)),
        Hostile("hostile-chain-zip", "container", ("links are not accepted in containers",)),
        Hostile("hostile-chain-tar", "container", ("links are not accepted in containers",)),
        Hostile("hostile-trickle", "file", ("below the minimum of",)),
        Hostile(
            "hostile-slow-headers", "file", ("took longer than the limit of", "response headers")
        ),
        Hostile("hostile-ssrf", "file", ("a loopback address, " + REFUSED[0],)),
        Hostile("hostile-refused", "file", ("refused",)),
        *(Hostile(lid, "file", REFUSED) for lid in DISGUISES),
    )
}


def _zip(entries: dict[str, bytes], links: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        for name, target in links.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16
            zf.writestr(info, target)
    return buffer.getvalue()


def _link_tar(links: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
    return buffer.getvalue()


def call_back_to(profiles: Path, url: str) -> None:
    """Give the run's profile (in the consumers' ``profiles`` folder) the callback ``url``."""
    path = profiles / f"{PROFILE}.json"
    profile = json.loads(path.read_text())
    profile["callback_url"] = url
    path.write_text(json.dumps(profile, indent=2))


def own_profile(profiles: Path, owner: str) -> None:
    """Give the run's profile an owner ARK, under which Merritt's inventory keeps local ids."""
    path = profiles / f"{PROFILE}.json"
    profile = json.loads(path.read_text())
    profile["owner"] = owner
    path.write_text(json.dumps(profile, indent=2))


def _batch(
    zk: Any, base_url: str, manifest: str, kind: str, title: str, batch_id: str | None = None
) -> str:
    submission = {
        "profile": PROFILE,
        "submitter": "chaos@example.org",
        "payload_url": f"{base_url}/{manifest}",
        "type": kind,
        "title": title,
        "submission_mode": "add",
    }
    if batch_id is not None:
        submission["batchID"] = batch_id
    return batch_create(zk, submission=submission).bid


@dataclass(frozen=True)
class GoodBatch:
    """A good batch written out, not yet submitted: its manifest's name under the payload
    folder, its title, the local IDs its manifest lists, and its external batch ID."""

    manifest: str
    title: str
    local_ids: frozenset[str]
    batch_id: str = field(default_factory=lambda: f"bid-{uuid.uuid4()}")


def write_good(payload: Path, base_url: str, *, jobs: int, batches: int) -> list[GoodBatch]:
    """Write ``jobs`` small files and one single-file batch manifest per batch."""
    good: list[GoodBatch] = []
    sizes = [jobs // batches + (1 if i < jobs % batches else 0) for i in range(batches)]
    number = 0
    for b, size in enumerate(sizes):
        rows = []
        for _ in range(size):
            data = f"chaos file {number}\n".encode() + os.urandom(64).hex().encode()
            name = f"b{b}/f{number:05d}.txt"
            (payload / name).parent.mkdir(parents=True, exist_ok=True)
            (payload / name).write_bytes(data)
            rows.append(
                ManifestRow(
                    url=f"{base_url}/{name}",
                    hash_alg="md5",
                    hash_value=hashlib.md5(data, usedforsecurity=False).hexdigest(),
                    size=len(data),
                    filename=f"f{number:05d}.txt",
                    local_id=f"chaos-{number:05d}",
                    creator="Chaos run",
                    title=f"Chaos object {number}",
                    date="2026",
                )
            )
            number += 1
        manifest = f"batch-{b}.checkm"
        (payload / manifest).write_text(write_checkm(rows, kind=SINGLE_FILE_BATCH_MANIFEST))
        good.append(GoodBatch(manifest, f"Chaos batch {b}", frozenset(r.local_id for r in rows)))
    return good


def submit_good(zk: Any, base_url: str, batch: GoodBatch) -> str:
    """Submit a batch ``write_good`` wrote; its batch ID. Tried again after ZooKeeper's
    connection failed, it is not submitted twice: a batch made by the try whose answer was lost
    is found by its external ID."""
    try:
        return batch_id_for_uuid(zk, paths.batch_uuid(batch.batch_id))
    except NotFound:
        pass
    return _batch(
        zk, base_url, batch.manifest, "single-file-batch-manifest", batch.title, batch.batch_id
    )


def submit_hostile(
    zk: Any, payload: Path, base_url: str, sentinel_url: str, refused_url: str
) -> dict[str, set[str]]:
    """Two batches of hostile objects: containers, and single files; bid -> local IDs."""
    chain = {"l1": "l2/l2/l2/../../../../../../../etc/passwd", "l2": "."}
    (payload / "hostile").mkdir()
    served = {
        "bomb.zip": _zip({"zeros.bin": b"\0" * (50 * 1024 * 1024)}, {}),
        "chain.zip": _zip({}, chain),
        "chain.tgz": _link_tar(chain),
    }
    for name, data in served.items():
        (payload / "hostile" / name).write_bytes(data)
    sentinel_port = sentinel_url.rsplit(":", 1)[1]
    urls = {
        "hostile-bomb": f"{base_url}/hostile/bomb.zip",
        "hostile-chain-zip": f"{base_url}/hostile/chain.zip",
        "hostile-chain-tar": f"{base_url}/hostile/chain.tgz",
        "hostile-trickle": f"{base_url}/trickle",
        "hostile-slow-headers": f"{base_url}/slow-headers",
        "hostile-ssrf": f"{sentinel_url}/django-admin/",
        "hostile-refused": f"{refused_url}/nothing-listens-here",
        **{lid: f"http://{host}:{sentinel_port}/{lid}" for lid, host in DISGUISES.items()},
    }
    expected: dict[str, set[str]] = {}
    for kind, manifest_kind, batch_type in (
        ("container", CONTAINER_BATCH_MANIFEST, "container-batch-manifest"),
        ("file", SINGLE_FILE_BATCH_MANIFEST, "single-file-batch-manifest"),
    ):
        lids = [h.local_id for h in HOSTILE.values() if h.kind == kind]
        rows = [ManifestRow(url=urls[lid], filename=lid, local_id=lid, title=lid) for lid in lids]
        name = f"hostile/{manifest_kind}.checkm"
        (payload / name).write_text(write_checkm(rows, kind=manifest_kind))
        bid = _batch(zk, base_url, name, batch_type, f"Hostile depositors ({kind})")
        expected[bid] = set(lids)
    return expected
