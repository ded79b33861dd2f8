"""The system files of an object version (ERC, Dublin Core) and its storage manifest.

An object folder prepared for storage looks like::

    <object_dir>/producer/...          the depositor's files
    <object_dir>/system/mrt-erc.txt    written by write_erc
    <object_dir>/system/mrt-dc.xml     written by write_dublin_core
    <object_dir>/system/mrt-*.txt      the other version files (queues.steps.objectfiles)

Both files are written as Merritt's ingest writes them (docs/merritt-ingest-formats.md): the ERC
is ANVL opening with ``erc: `` (a space after the colon, an empty value), the Dublin Core a
``DublinCore`` root element declaring the ``dc`` namespace, holding the submission's ``DC*``
values.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from queues.steps.checkm import ADD_MANIFEST, write_checkm

UNAS = "(:unas)"
ERC_FILE = "mrt-erc.txt"
DC_FILE = "mrt-dc.xml"
SYSTEM_DIR = "system"
PRODUCER_DIR = "producer"
DC_NS = "http://purl.org/dc/elements/1.1/"

# Characters XML 1.0 cannot carry at all, even as references (a lone surrogate is no character
# either); a title pasted from a PDF may have them. Dropped from every XML document written.
XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


@dataclass(frozen=True)
class Erc:
    who: str | None = None
    what: str | None = None
    when: str | None = None


def _anvl_value(value: str | None) -> str:
    # An ERC value is one line; folding keeps a multi-line title from forging extra elements.
    text = " ".join((value or "").split())
    return text or UNAS


def erc_text(*, erc: Erc, ark: str | None, local_id: str | None) -> str:
    # "erc" is written like every other ANVL key, "key: value", with an empty value.
    lines = [
        "erc: ",
        f"who: {_anvl_value(erc.who)}",
        f"what: {_anvl_value(erc.what)}",
        f"when: {_anvl_value(erc.when)}",
        f"where: {_anvl_value(ark)}",
        f"where: {_anvl_value(local_id)}",
    ]
    return "\n".join(lines) + "\n"


# The fifteen Dublin Core elements a submission may carry: ``DC<element>`` in a job's
# configuration, ``DC.<element>`` as a field of Merritt's poster.
DC_NAMES = (
    "contributor",
    "coverage",
    "creator",
    "date",
    "description",
    "format",
    "identifier",
    "language",
    "publisher",
    "relation",
    "rights",
    "source",
    "subject",
    "title",
    "type",
)
# Merritt's Dublin Core elements, in the order its ingest adds a submission's ``DC*`` values
# (``DCrights`` is accepted in a submission but not written by it), and the ones split on ";".
DC_ELEMENTS = tuple(name for name in DC_NAMES if name != "rights")
DC_REPEATABLE = frozenset({"creator", "subject", "relation", "identifier"})
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"


def dublin_core_elements(configuration: dict[str, object]) -> list[tuple[str, str]]:
    """The (element, value) pairs of a job's ``DC*`` configuration keys (``DCtitle`` ...), in
    Merritt's order; a repeatable element's value is split on ";" into several elements."""
    pairs: list[tuple[str, str]] = []
    for name in DC_ELEMENTS:
        value = configuration.get(f"DC{name}")
        if not isinstance(value, str) or not value.strip():
            continue
        parts = value.split(";") if name in DC_REPEATABLE else [value]
        pairs.extend((name, part.strip()) for part in parts if part.strip())
    return pairs


def _xml_text(value: str) -> str:
    text = XML_ILLEGAL.sub("", value)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def dublin_core_xml(elements: list[tuple[str, str]] | None = None) -> str:
    """``mrt-dc.xml`` as Merritt's ingest writes it: one line, a ``DublinCore`` root declaring
    the ``xsi`` and ``dc`` namespaces, a ``dc:<name>`` child per element (none is fine)."""
    head = (
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>'
        f'<DublinCore xmlns:xsi="{XSI_NS}" xmlns:dc="{DC_NS}"'
    )
    children = [
        f"<dc:{name}>{_xml_text(value)}</dc:{name}>"
        for name, value in elements or []
        if name in DC_ELEMENTS
    ]
    if not children:
        return head + "/>"
    return head + ">" + "".join(children) + "</DublinCore>"


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` so that readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
    ) as handle:
        handle.write(text)
    os.replace(handle.name, path)
    return path


def write_erc(object_dir: Path, *, erc: Erc, ark: str | None, local_id: str | None) -> Path:
    text = erc_text(erc=erc, ark=ark, local_id=local_id)
    return write_atomic(object_dir / SYSTEM_DIR / ERC_FILE, text)


def write_dublin_core(object_dir: Path, elements: list[tuple[str, str]] | None = None) -> Path:
    return write_atomic(object_dir / SYSTEM_DIR / DC_FILE, dublin_core_xml(elements))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def object_files(object_dir: Path) -> list[str]:
    """Every regular file under ``object_dir`` as a sorted posix path relative to it.

    Links are never followed: a link anywhere in the object (which no container can put there
    any more, but a folder can be written by anything) raises ValueError, so nothing outside
    the object is ever hashed into a storage manifest.
    """
    found = []
    for dirpath, dirnames, filenames in os.walk(object_dir):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                rel = path.relative_to(object_dir).as_posix()
                raise ValueError(f"the object holds a link, {rel}: links are not stored")
        for name in filenames:
            path = Path(dirpath) / name
            if stat.S_ISREG(path.lstat().st_mode):
                found.append(path.relative_to(object_dir).as_posix())
    return sorted(found)


def file_url_for(object_dir: Path) -> Callable[[str], str]:
    root = object_dir.resolve()
    return lambda name: (root / name).as_uri()


def http_url_for(base_url: str) -> Callable[[str], str]:
    """URLs for a web server that serves the object folder at ``base_url``."""
    base = base_url.rstrip("/")
    return lambda name: f"{base}/{quote(name)}"


def storage_manifest(object_dir: Path, *, url_for: Callable[[str], str] | None = None) -> str:
    """A checkm add manifest (``mrt-add-manifest``, the profile Merritt's storage takes for an
    add) of every file in ``object_dir`` with its sha256 and size.

    ``url_for`` maps a relative name to the URL storage will fetch it from; the default is the
    file's file:// URL, which works when storage runs on the same machine.
    """
    url_for = url_for or file_url_for(object_dir)
    rows = []
    for name in object_files(object_dir):
        path = object_dir / name
        rows.append(
            {
                "url": url_for(name),
                "hash_alg": "sha256",
                "hash_value": file_sha256(path),
                "size": path.stat().st_size,
                "filename": name,
            }
        )
    return write_checkm(rows, kind=ADD_MANIFEST)


def write_storage_manifest(
    object_dir: Path, dest: Path, *, url_for: Callable[[str], str] | None = None
) -> Path:
    """Write the storage manifest to ``dest``, which must lie outside ``object_dir``."""
    if dest.resolve().is_relative_to(object_dir.resolve()):
        raise ValueError("the storage manifest must not be written inside the object folder")
    return write_atomic(dest, storage_manifest(object_dir, url_for=url_for))
