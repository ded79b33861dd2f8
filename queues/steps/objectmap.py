"""Merritt storage's object manifest: the XML document ``GET manifest/{node}/{ark}`` answers.

Merritt's storage keeps one manifest per object listing every version and each version's files
(mrt-store ``JerseyStorage.getCloudManifest`` streams it; Merritt's inventory fetches it from the
URL in a job's ``inventory`` node and reads it with the cloud library's ``ManifestSAX``).
``docs/merritt-services.md`` gives the sources. Its shape, as that reader takes it::

    <objectInfo>
      <object id="ark:/13030/m5x">            object-level leaves: current, fileCount,
        <current>2</current> ...               totalSize, lastAddVersion, lastDeleteVersion
      </object>
      <versions>
        <version id="1">
          <manifest count="2" size="1234" created="2026-11-21T10:02:03-08:00">
            <file id="producer/a.txt">         leaves: size, digestType, digest,
              <size>12</size> ...               creationDate, key, mimeType
            </file>

The reader matches elements by local name wherever they sit (a namespace or a wrapper element
changes nothing); the writer writes the layout above, whose object-level leaves come before any
``version`` so that a SAX reader keeping one "current element's properties" reads them intact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.etree import ElementTree
from xml.sax.saxutils import escape, quoteattr

from queues.core.words import digits
from queues.steps.checkm import filename_problem
from queues.steps.merritt_wire import local_name, parse_xml


class ObjectMapError(ValueError):
    pass


class VersionMissing(ObjectMapError):
    """The object is there, the version asked for is not."""


@dataclass(frozen=True)
class MapFile:
    name: str  # path inside the version: producer/..., system/...
    size: int | None = None
    digest_type: str | None = None
    digest: str | None = None
    created: str | None = None
    mime_type: str | None = None


@dataclass(frozen=True)
class MapVersion:
    number: int
    files: tuple[MapFile, ...]
    created: str | None = None


@dataclass(frozen=True)
class ObjectMap:
    ark: str
    current: int
    versions: dict[int, MapVersion] = field(default_factory=dict)

    def version(self, number: int | None = None) -> MapVersion:
        """The version asked for, else the current one; ObjectMapError when it is not there."""
        wanted = self.current if number is None else number
        found = self.versions.get(wanted)
        if found is None:
            raise VersionMissing(f"{self.ark} has no version {wanted}")
        return found


def _int(text: str | None) -> int | None:
    return digits((text or "").strip())


def _leaves(element: ElementTree.Element) -> dict[str, str]:
    """The text of an element's childless children, by local name."""
    return {
        local_name(child.tag): (child.text or "").strip() for child in element if len(child) == 0
    }


def parse_object_map(data: bytes) -> ObjectMap:
    """Read the object manifest; ObjectMapError when it is not one."""
    root = parse_xml(data)
    if root is None or local_name(root.tag) != "objectInfo":
        raise ObjectMapError("not Merritt's object manifest (no <objectInfo> document)")
    objects = [e for e in root.iter() if local_name(e.tag) == "object"]
    if not objects or not (objects[0].get("id") or "").strip():
        raise ObjectMapError("the object manifest names no object (<object id=...>)")
    ark = (objects[0].get("id") or "").strip()
    versions: dict[int, MapVersion] = {}
    for element in root.iter():
        if local_name(element.tag) != "version":
            continue
        number = _int(element.get("id"))
        if number is None:
            raise ObjectMapError(f"a version of {ark} has no number: {element.get('id')!r}")
        manifest = next((m for m in element.iter() if local_name(m.tag) == "manifest"), None)
        files = []
        for item in element.iter():
            if local_name(item.tag) != "file":
                continue
            name = (item.get("id") or "").strip()
            if not name:
                raise ObjectMapError(f"version {number} of {ark} lists a file without a name")
            problem = filename_problem(name)
            if problem:  # "../../../etc/passwd" went into an archive's paths as it came
                raise ObjectMapError(f"version {number} of {ark} lists a file whose name {problem}")
            leaves = _leaves(item)
            files.append(
                MapFile(
                    name=name,
                    size=_int(leaves.get("size")),
                    digest_type=leaves.get("digestType") or None,
                    digest=leaves.get("digest") or None,
                    created=leaves.get("creationDate") or None,
                    mime_type=leaves.get("mimeType") or None,
                )
            )
        created = manifest.get("created") if manifest is not None else None
        versions[number] = MapVersion(number, tuple(files), created)
    current = _int(_leaves(objects[0]).get("current"))
    if current is None:
        current = max(versions, default=0)
    if not versions:
        raise ObjectMapError(f"the object manifest of {ark} lists no version")
    return ObjectMap(ark=ark, current=current, versions=versions)


def object_map_xml(ark: str, versions: Sequence[MapVersion]) -> str:
    """The object manifest of ``ark`` with ``versions`` (each listing all its files)."""
    ordered = sorted(versions, key=lambda v: v.number)
    current = ordered[-1] if ordered else None
    count = len(current.files) if current else 0
    total = sum(f.size or 0 for f in current.files) if current else 0
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        "<objectInfo>",
        f"  <object id={quoteattr(ark)}>",
        f"    <current>{current.number if current else 0}</current>",
        f"    <fileCount>{count}</fileCount>",
        f"    <totalSize>{total}</totalSize>",
    ]
    if current and current.created:
        lines.append(f"    <lastAddVersion>{escape(current.created)}</lastAddVersion>")
    lines += ["  </object>", "  <versions>"]
    for version in ordered:
        size = sum(f.size or 0 for f in version.files)
        created = f" created={quoteattr(version.created)}" if version.created else ""
        lines += [
            f'    <version id="{version.number}">',
            f'      <manifest count="{len(version.files)}" size="{size}"{created}>',
        ]
        for item in version.files:
            lines.append(f"        <file id={quoteattr(item.name)}>")
            leaves = (
                ("size", None if item.size is None else str(item.size)),
                ("digestType", item.digest_type),
                ("digest", item.digest),
                ("creationDate", item.created),
                ("key", f"{ark}|{version.number}|{item.name}"),
                ("mimeType", item.mime_type),
            )
            lines += [f"          <{k}>{escape(v)}</{k}>" for k, v in leaves if v]
            lines.append("        </file>")
        lines += ["      </manifest>", "    </version>"]
    lines += ["  </versions>", "</objectInfo>", ""]
    return "\n".join(lines)
