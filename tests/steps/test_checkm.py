from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queues.steps.checkm import (
    BATCH_FIELDS,
    BATCH_MANIFEST,
    HASH_LENGTHS,
    MANIFEST_KINDS,
    OBJECT_MANIFEST,
    CheckmReader,
    ManifestError,
    ManifestRow,
    TooManyRows,
    filename_problem,
    parse_checkm,
    write_checkm,
)

EXAMPLE = """#%checkm_0.7
#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest
#%prefix | mrt: | http://merritt.cdlib.org/terms#
#%prefix | nfo: | http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#
#%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | \
nfo:fileLastModified | nfo:fileName | mrt:mimeType
http://127.0.0.1:8001/objects/a/page1.tif | md5 | {md5} | 10240 |  | page1.tif
# a comment between rows

http://127.0.0.1:8001/objects/a/page1.txt | SHA256 | {sha} |  |  | text/page1.txt
#%eof
http://ignored.example/after-eof | | | | | ignored
"""
SHA = "ab" * 32


def header(kind: str = OBJECT_MANIFEST, fields: str = "") -> str:
    fields = fields or (
        "nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | "
        "nfo:fileLastModified | nfo:fileName | mrt:mimeType"
    )
    return (
        "#%checkm_0.7\n"
        f"#%profile | http://uc3.cdlib.org/registry/ingest/manifest/{kind}\n"
        f"#%fields | {fields}\n"
    )


def test_parses_the_documented_example_up_to_eof() -> None:
    manifest = parse_checkm(EXAMPLE.format(sha=SHA, md5="9e107d9d372bb6826bd81d3542a419d6"))

    assert manifest.kind == OBJECT_MANIFEST
    assert [r.filename for r in manifest.rows] == ["page1.tif", "text/page1.txt"]
    first, second = manifest.rows
    assert first.url == "http://127.0.0.1:8001/objects/a/page1.tif"
    assert (first.hash_alg, first.size, first.line) == ("md5", 10240, 6)
    assert first.mime_type == ""
    assert (second.hash_alg, second.hash_value, second.size) == ("sha256", SHA, None)
    assert second.line == 9
    assert dict(manifest.prefixes)["nfo:"].endswith("nfo#")


def test_missing_trailing_fields_are_empty() -> None:
    manifest = parse_checkm(header() + "http://h/x\n")

    row = manifest.rows[0]
    assert (row.hash_alg, row.hash_value, row.size, row.filename) == ("", "", None, "")


def test_trailing_empty_cells_beyond_the_fields_are_tolerated() -> None:
    manifest = parse_checkm(header(fields="nfo:fileUrl | nfo:fileName") + "http://h/x | x | |\n")

    assert manifest.rows[0].filename == "x"


def test_extra_data_beyond_the_fields_names_the_line() -> None:
    with pytest.raises(ManifestError, match=r"^line 4: 3 fields but #%fields declares 2$"):
        parse_checkm(header(fields="nfo:fileUrl | nfo:fileName") + "http://h/x | x | oops\n")


def test_a_fields_line_wider_than_any_merritt_manifest_is_refused() -> None:
    """Every row is padded to the declared columns: 20,000 of them over 2,000 one-URL rows
    (a 0.2 MB manifest) took 2.7 GB and 13 s to parse."""
    wide = " | ".join(["nfo:fileUrl", *(f"x:c{i}" for i in range(20_000))])
    with pytest.raises(ManifestError, match=r"^line 3: #%fields names 20,001 columns; at most"):
        parse_checkm(header(fields=wide) + "http://h/x\n" * 2_000)


def test_a_reader_with_a_limit_stops_at_the_first_row_past_it() -> None:
    """Counted while reading: the rows after the limit are not read at all (a malformed one
    there goes unnoticed), and a million rows are not parsed whole before being counted."""
    text = header() + "http://h/a\nhttp://h/b\nhttp://h/c\nnot a url at all\n"
    with pytest.raises(TooManyRows, match=r"^line 6: more than 2 rows$") as raised:
        parse_checkm(text, most_rows=2)
    assert raised.value.most == 2
    with pytest.raises(ManifestError, match=r"^line 7: "):
        parse_checkm(text, most_rows=3)  # within the limit, the bad row is found as ever


def test_batch_fields_map_to_object_metadata() -> None:
    text = header(BATCH_MANIFEST, " | ".join(BATCH_FIELDS)) + (
        "http://h/o.checkm | | | | | o.checkm | ark:/99999/fk4abc | loc001 | Doe, J. "
        "| A title | 2020\n"
    )

    row = parse_checkm(text).rows[0]

    assert (row.primary_id, row.local_id, row.creator, row.title, row.date) == (
        "ark:/99999/fk4abc",
        "loc001",
        "Doe, J.",
        "A title",
        "2020",
    )


def test_field_names_match_case_insensitively_and_unknown_fields_are_kept() -> None:
    text = header(fields="NFO:FILEURL | nfo:filename | x:colour") + "http://h/a | a.txt | red\n"

    row = parse_checkm(text).rows[0]

    assert (row.url, row.filename, row.extra) == ("http://h/a", "a.txt", (("x:colour", "red"),))


def test_unsupported_hash_algorithm_names_the_line() -> None:
    text = header() + "http://h/a | md5 | " + "0" * 32 + "\n" + "http://h/b | crc32 | 1234\n"

    with pytest.raises(ManifestError) as raised:
        parse_checkm(text)

    assert str(raised.value) == "line 5: unsupported hash algorithm 'crc32'"
    assert raised.value.line == 5


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (" | md5 | abc", "missing file URL"),
        ("ftp://h/a", "unsupported URL scheme in 'ftp://h/a'"),
        ("http:///a", "URL without a host"),
        ("http://127.0.0.1\x00.example/a", "contains a control character or a space"),
        ("http://h\x1bx/a", "contains a control character or a space"),
        ("http://a b/c", "contains a control character or a space"),
        ("http://h/a | md5 | xyz", "md5 value must be 32 hex digits, got 'xyz'"),
        ("http://h/a |  | " + "0" * 32, "hash value without a hash algorithm"),
        ("http://h/a | | | 12kB", "file size '12kB' is not a whole number"),
        ("http://h/a | | | -5", "file size '-5' is not a whole number"),
        ("http://h/a | | | ²", "file size '²' is not a whole number"),
        ("http://h/a | | | 9223372036854775808", "is larger than 9,223,372,036,854,775,807"),
        ("http://h/a | | | | | /etc/passwd", "file name '/etc/passwd' is absolute"),
        ("http://h/a | | | | | a/../../b", "file name 'a/../../b' contains '..'"),
        ("http://h/a | | | | | ..\\b", "contains '..'"),
        ("http://h/a | | | | | C:\\x", "is absolute"),
    ],
)
def test_invalid_rows_are_reported_with_their_line(row: str, problem: str) -> None:
    with pytest.raises(ManifestError, match=r"^line 4: ") as raised:
        parse_checkm(header() + row + "\n")

    assert problem in str(raised.value)


def test_invalid_utf8_names_the_line() -> None:
    data = (header() + "http://h/a | | | | | a.txt\n").encode() + b"http://h/\xff | | | | | b\n"

    with pytest.raises(ManifestError, match=r"^line 5: not valid UTF-8 \(byte 0xff\)$"):
        parse_checkm(data)


def test_a_reader_gives_each_row_before_it_reads_the_next() -> None:
    """Row by row, bytes decoded a line at a time: what a caller keeps of a row is all that
    stays of it (a manifest may list a million files)."""
    data = (header() + "http://h/a | | | | | a.txt\n").encode() + b"http://h/\xff | | | | | b\n"
    reader = CheckmReader(data)
    rows = iter(reader)

    first = next(rows)
    assert (first.url, first.filename, first.line) == ("http://h/a", "a.txt", 4)
    assert reader.kind == OBJECT_MANIFEST and reader.count == 1
    with pytest.raises(ManifestError, match=r"^line 5: not valid UTF-8 \(byte 0xff\)$"):
        next(rows)


def test_unknown_profile_is_rejected() -> None:
    with pytest.raises(ManifestError, match=r"^line 2: unknown manifest profile 'mrt-other'$"):
        parse_checkm(header("mrt-other"))


def test_fields_header_without_url_column_is_rejected() -> None:
    with pytest.raises(ManifestError, match="no nfo:fileUrl column"):
        parse_checkm(header(fields="nfo:fileName | nfo:fileSize"))


def test_manifest_without_profile_has_no_kind_and_uses_object_fields() -> None:
    manifest = parse_checkm("\ufeffhttp://h/a | sha1 | " + "a" * 40 + " | 3 | | a\n")

    assert manifest.kind is None
    assert manifest.rows[0].size == 3


def test_writer_refuses_values_checkm_cannot_carry() -> None:
    with pytest.raises(ValueError, match="cannot be written"):
        write_checkm([{"url": "http://h/a", "filename": "a|b"}])
    with pytest.raises(ValueError, match="missing file URL"):
        write_checkm([{"url": "", "filename": "a"}])


# Text a checkm cell can hold: no separators or line breaks, no surrounding blanks.
cell = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="|\n"),
    max_size=12,
).map(str.strip)
path_part = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=8)
filenames = st.lists(path_part.filter(lambda p: p not in (".", "..")), min_size=1, max_size=3).map(
    "/".join
)


@st.composite
def rows(draw: st.DrawFn) -> ManifestRow:
    alg = draw(st.sampled_from(["", *HASH_LENGTHS]))
    value = (
        draw(st.text("0123456789abcdef", min_size=HASH_LENGTHS[alg], max_size=HASH_LENGTHS[alg]))
        if alg
        else ""
    )
    return ManifestRow(
        url=draw(st.sampled_from(["http://h.example", "https://h.example:8443", "file://"]))
        + "/"
        + draw(filenames),
        hash_alg=alg,
        hash_value=value,
        size=draw(st.none() | st.integers(min_value=0, max_value=2**63 - 1)),
        last_modified=draw(cell),
        filename=draw(st.just("") | filenames),
        mime_type=draw(cell),
        primary_id=draw(cell),
        local_id=draw(cell),
        creator=draw(cell),
        title=draw(cell),
        date=draw(cell),
    )


@given(st.lists(rows(), max_size=5), st.sampled_from(sorted(MANIFEST_KINDS)))
def test_written_manifests_parse_back_to_the_same_rows(
    written: list[ManifestRow], kind: str
) -> None:
    columns = (*BATCH_FIELDS, "mrt:mimeType")

    manifest = parse_checkm(write_checkm(written, kind=kind, columns=columns))

    assert manifest.kind == kind
    assert list(manifest.rows) == written


@given(st.binary(max_size=300))
def test_parser_never_fails_with_anything_but_manifest_error(data: bytes) -> None:
    try:
        parse_checkm(data)
    except ManifestError as exc:
        assert str(exc).startswith("line ")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        (".", "names no file"),
        ("./", "names no file"),
        ("a/" * 2000, "is longer than 1,024 characters"),  # RecursionError making its folders
        ("x" * 256, "has a part longer than 255 bytes"),
        ("d/" + "é" * 128, "has a part longer than 255 bytes"),
    ],
)
def test_a_name_no_file_system_can_hold_is_refused(name: str, why: str) -> None:
    problem = filename_problem(name)
    assert problem is not None and problem.startswith(why), problem


def test_every_ascii_character_is_judged_as_before_the_fast_path() -> None:
    """Names of printable ASCII skip the character loop; every ASCII control is still refused
    as one, and a name with one character outside ASCII still goes through the loop."""
    for code in range(128):
        char = chr(code)
        problem = filename_problem(f"ab{char}c")
        if code < 0x20 or code == 0x7F:
            assert problem is not None and "control character" in problem, (code, problem)
        else:
            assert problem is None, (code, problem)
    for char, said in [
        ("\u0085", "control character"),  # NEL: a line break to splitlines
        ("\u2028", "splits a log or manifest line"),
        ("\ud800", "half of a surrogate pair"),
        ("\u202e", "bidirectional-text control"),
    ]:
        problem = filename_problem(f"plain/ascii{char}.txt")
        assert problem is not None and said in problem, (char, problem)
    assert filename_problem("données/été.txt") is None


def test_a_large_manifest_is_held_in_less_memory_than_one_row_object_each() -> None:
    """A million-row object manifest held 634 bytes a row and peaked at 1.55 times that while
    parsing (a list of its lines beside the rows): repeated values are one string, the rows
    have slots, the lines are read one at a time."""
    import tracemalloc

    rows = 20_000
    data = (
        "#%checkm_0.7\n#%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | "
        "nfo:fileSize | nfo:fileLastModified | nfo:fileName | mrt:mimeType\n"
        + "".join(
            f"http://example.org/d{i // 1000}/file{i}.dat | md5 | {i:032x} | {i * 7} | | "
            f"d{i // 1000}/file{i}.dat | application/octet-stream\n"
            for i in range(rows)
        )
    )
    tracemalloc.start()
    try:
        manifest = parse_checkm(data)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(manifest.rows) == rows
    assert manifest.rows[5].mime_type is manifest.rows[6].mime_type
    assert kept / rows < 500, kept / rows
    assert peak < kept * 1.4, (peak, kept)


def test_a_names_parts_are_those_pathlib_gives() -> None:
    """filename_problem splits a name itself (pathlib interns every part it sees)."""
    import itertools
    from pathlib import PurePosixPath

    for pieces in itertools.product(["a", "/", "\\", ".", "..", "b c"], repeat=4):
        name = "".join(pieces)
        problem = filename_problem(name)
        if name.startswith(("/", "\\")):
            assert problem == "is absolute"
            continue
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if ".." in parts:
            assert problem == "contains '..'", name
        elif name and not parts:
            assert problem is not None and problem.startswith("names no file"), name
        else:
            assert problem is None, (name, problem)
