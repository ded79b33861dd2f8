from __future__ import annotations

import hashlib
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from queues.steps.checkm import ADD_MANIFEST, ADD_PROFILE, parse_checkm
from queues.steps.erc import (
    DC_NS,
    Erc,
    dublin_core_elements,
    dublin_core_xml,
    erc_text,
    http_url_for,
    storage_manifest,
    write_dublin_core,
    write_erc,
    write_storage_manifest,
)


def test_erc_lists_who_what_when_and_both_wheres() -> None:
    text = erc_text(erc=Erc("Doe, Jane", "A title", "2024"), ark="ark:/99999/fk4x", local_id="L1")

    # "erc: " with its space: every ANVL line is "key: value", the erc value empty.
    assert text == (
        "erc: \nwho: Doe, Jane\nwhat: A title\nwhen: 2024\nwhere: ark:/99999/fk4x\nwhere: L1\n"
    )


def test_unknown_erc_values_are_unas_and_line_breaks_cannot_forge_elements() -> None:
    text = erc_text(erc=Erc(what="two\nwhere: forged"), ark=None, local_id="  ")

    assert text.splitlines() == [
        "erc: ",
        "who: (:unas)",
        "what: two where: forged",
        "when: (:unas)",
        "where: (:unas)",
        "where: (:unas)",
    ]


def test_dublin_core_is_escaped_well_formed_xml_rooted_as_merritt_writes_it() -> None:
    xml = dublin_core_xml([("creator", "Smith & <Jones>"), ("title", 'The "best"\x01 title')])

    assert xml.startswith(
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?><DublinCore '
        'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        'xmlns:dc="http://purl.org/dc/elements/1.1/">'
    )
    root = ET.fromstring(xml.encode())  # noqa: S314 - our own output
    assert root.tag == "DublinCore"  # no namespace on the root: not dc:dc
    values = [(child.tag.removeprefix(f"{{{DC_NS}}}"), child.text) for child in root]
    assert values == [("creator", "Smith & <Jones>"), ("title", 'The "best" title')]
    assert "&amp;" in xml and "&lt;Jones&gt;" in xml


def test_dublin_core_holds_the_submission_dc_keys_in_merritt_order() -> None:
    config = {
        "DCtitle": "A title",
        "DCcreator": "Doe, Jane; Roe, Rick",
        "DCsubject": "maps;charts",
        "DCdescription": "one; not split",
        "DCrights": "CC0",  # Merritt's ingest does not write it
        "title": "the ERC title is not Dublin Core",
    }

    pairs = dublin_core_elements(config)

    assert pairs == [
        ("creator", "Doe, Jane"),
        ("creator", "Roe, Rick"),
        ("description", "one; not split"),
        ("subject", "maps"),
        ("subject", "charts"),
        ("title", "A title"),
    ]
    assert dublin_core_xml([]).endswith('xmlns:dc="http://purl.org/dc/elements/1.1/"/>')


def test_system_files_land_in_the_system_folder(tmp_path: Path) -> None:
    erc = Erc("W", "T", "D")

    write_erc(tmp_path, erc=erc, ark="ark:/9/x", local_id=None)
    write_dublin_core(tmp_path, [("title", "T")])

    assert sorted(p.name for p in (tmp_path / "system").iterdir()) == ["mrt-dc.xml", "mrt-erc.txt"]


def test_storage_manifest_lists_every_file_with_sha256_and_size(tmp_path: Path) -> None:
    obj = tmp_path / "obj"
    (obj / "producer" / "sub dir").mkdir(parents=True)
    (obj / "producer" / "sub dir" / "a b.txt").write_bytes(b"hello")
    write_erc(obj, erc=Erc(), ark="ark:/9/x", local_id=None)

    manifest = parse_checkm(storage_manifest(obj))

    # The profile Merritt's storage takes an add from (mrt-core2 ManifestRowAdd).
    assert manifest.kind == ADD_MANIFEST and manifest.profile == ADD_PROFILE
    rows = {r.filename: r for r in manifest.rows}
    assert sorted(rows) == ["producer/sub dir/a b.txt", "system/mrt-erc.txt"]
    row = rows["producer/sub dir/a b.txt"]
    assert (row.hash_alg, row.size) == ("sha256", 5)
    assert row.hash_value == hashlib.sha256(b"hello").hexdigest()
    assert row.url == (obj / "producer" / "sub dir" / "a b.txt").resolve().as_uri()


def test_storage_manifest_can_point_at_an_http_server(tmp_path: Path) -> None:
    (tmp_path / "producer").mkdir()
    (tmp_path / "producer" / "a b").write_bytes(b"x")

    manifest = parse_checkm(storage_manifest(tmp_path, url_for=http_url_for("http://h/job1/")))

    assert manifest.rows[0].url == "http://h/job1/producer/a%20b"


def test_storage_manifest_may_not_be_written_into_the_object(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must not be written inside"):
        write_storage_manifest(tmp_path, tmp_path / "system" / "manifest.txt")
