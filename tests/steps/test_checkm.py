from __future__ import annotations

import dataclasses
import errno
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queues.steps.checkm import (
    ADD_MANIFEST,
    BATCH_FIELDS,
    BATCH_MANIFEST,
    CONTAINER_BATCH_MANIFEST,
    FIELD_KEYS,
    HASH_LENGTHS,
    INGEST_KINDS,
    MANIFEST_KINDS,
    MERRITT_COLUMNS,
    MERRITT_PROFILES,
    OBJECT_FIELDS,
    OBJECT_MANIFEST,
    PROFILE_BASE,
    SINGLE_FILE_BATCH_MANIFEST,
    CheckmReader,
    ManifestError,
    ManifestRow,
    TooManyRows,
    filename_problem,
    merritt_profile_kind,
    parse_checkm,
    profile_url,
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


def test_parses_the_documented_example() -> None:
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
    manifest = parse_checkm(header() + "http://h/x\n#%eof\n")

    row = manifest.rows[0]
    assert (row.hash_alg, row.hash_value, row.size, row.filename) == ("", "", None, "")


SIX = " | ".join(OBJECT_FIELDS[:6])  # the object manifest's columns, the MIME type left out


def test_trailing_empty_cells_beyond_the_fields_are_tolerated() -> None:
    manifest = parse_checkm(header(fields=SIX) + "http://h/x | | | | | x | |\n#%eof\n")

    assert manifest.rows[0].filename == "x"


def test_extra_data_beyond_the_fields_names_the_line() -> None:
    with pytest.raises(ManifestError, match=r"^line 4: 7 fields but #%fields declares 6$"):
        parse_checkm(header(fields=SIX) + "http://h/x | | | | | x | oops\n")


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
        "| A title | 2020\n#%eof\n"
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
    """Merritt's readers name the MIME type ``nie:mimeType``; after their columns, a column
    they do not read is kept under its name."""
    fields = (
        "NFO:FILEURL | nfo:HashAlgorithm | nfo:hashvalue | nfo:filesize | nfo:filelastmodified "
        "| nfo:filename | nie:mimeType | x:colour"
    )
    text = header(fields=fields) + "http://h/a | | | | | a.txt | text/plain | red\n#%eof\n"

    manifest = parse_checkm(text)
    row = manifest.rows[0]

    assert (row.url, row.filename, row.mime_type) == ("http://h/a", "a.txt", "text/plain")
    assert row.extra == (("x:colour", "red"),)
    assert manifest.fields == (*OBJECT_FIELDS, "x:colour")


# Merritt's readers (mrt-core2 ManifestRowIngest, ManifestRowBatch) take cell i as their own
# column i and never read #%fields: a #%fields in another order would be read here by its names
# and there by position, the same manifest meaning two things.
@pytest.mark.parametrize(
    ("kind", "fields", "row", "problem"),
    [
        # An object manifest's columns with the size and the modification time left out:
        # Merritt reads the file name as the size.
        (
            OBJECT_MANIFEST,
            "nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileName",
            "http://h/a | md5 | " + "0" * 32 + " | a.txt",
            "#%fields names nfo:fileName as column 4, where Merritt reads nfo:fileSize",
        ),
        # The creator and the title swapped: Merritt would store each as the other.
        (
            SINGLE_FILE_BATCH_MANIFEST,
            " | ".join((*BATCH_FIELDS[:8], "mrt:title", "mrt:creator", "mrt:date")),
            "http://h/a | | | | | a.txt | | | A title | Doe, J. | 2020",
            "#%fields names mrt:title as column 9, where Merritt reads mrt:creator",
        ),
        # The local id first: Merritt would fetch the "URL" loc001.
        (
            BATCH_MANIFEST,
            "mrt:localIdentifier | " + " | ".join(BATCH_FIELDS[:7]),
            "loc001 | http://h/o.checkm",
            "#%fields names mrt:localIdentifier as column 1, where Merritt reads nfo:fileUrl",
        ),
        # A column Merritt reads, named after its columns: Merritt never reads it.
        (
            OBJECT_MANIFEST,
            " | ".join((*OBJECT_FIELDS, "mrt:title")),
            "http://h/a | | | | | a.txt | text/plain | A title",
            "#%fields names mrt:title as column 8, which Merritt does not read",
        ),
        (
            CONTAINER_BATCH_MANIFEST,
            " | ".join((*BATCH_FIELDS, "nfo:fileName")),
            "http://h/a.zip | | | | | a.zip | | | | | | b.zip",
            "#%fields names nfo:fileName as column 12, which Merritt does not read",
        ),
    ],
)
def test_a_fields_line_that_puts_merritts_columns_elsewhere_is_refused(
    kind: str, fields: str, row: str, problem: str
) -> None:
    with pytest.raises(ManifestError) as raised:
        parse_checkm(header(kind, fields) + row + "\n")

    message = str(raised.value)
    assert message.startswith(f"line 3: {problem}"), message
    assert " | ".join(MERRITT_COLUMNS[kind]) in message  # the order to write them in
    with pytest.raises(ManifestError, match=problem):
        CheckmReader(header(kind, fields)).columns()  # the headers alone tell


def test_merritts_columns_cut_short_at_the_end_are_read_as_merritt_reads_them() -> None:
    text = header(BATCH_MANIFEST, " | ".join(BATCH_FIELDS[:7])) + (
        "http://h/o.checkm | | | | | o.checkm | ark:/99999/fk4abc\n#%eof\n"
    )

    row = parse_checkm(text).rows[0]

    assert (row.filename, row.primary_id, row.local_id) == ("o.checkm", "ark:/99999/fk4abc", "")


def test_without_a_fields_line_the_rows_are_read_by_their_kinds_columns() -> None:
    """Merritt reads a batch manifest's seventh cell as the ARK, #%fields or none; read here by
    the object manifest's columns, it was taken as a MIME type and the ARK lost."""
    text = (
        "#%checkm_0.7\n"
        "#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-batch-manifest\n"
        "http://h/o.checkm | | | | | o.checkm | ark:/99999/fk4abc | loc001\n"
        "#%eof\n"
    )

    manifest = parse_checkm(text)

    assert manifest.fields == BATCH_FIELDS
    row = manifest.rows[0]
    assert (row.primary_id, row.local_id, row.mime_type) == ("ark:/99999/fk4abc", "loc001", "")


def test_a_manifest_without_profile_is_held_to_the_one_kind_it_must_be() -> None:
    text = "#%fields | nfo:fileUrl | nfo:fileName\nhttp://h/a | a.txt\n#%eof\n"

    assert parse_checkm(text).rows[0].filename == "a.txt"  # of no kind: read by the names
    with pytest.raises(ManifestError, match=r"^line 1: #%fields names nfo:fileName as column 2"):
        list(CheckmReader(text, only=OBJECT_MANIFEST))


def test_columns_and_kind_cannot_change_after_the_first_row() -> None:
    first = header() + "http://h/a | | | | | a.txt\n"

    with pytest.raises(ManifestError, match=r"^line 5: a #%fields line after the first row$"):
        parse_checkm(first + "#%fields | nfo:fileUrl | nfo:fileName\nhttp://h/b | b.txt\n")
    batch = "#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-batch-manifest\n"
    with pytest.raises(ManifestError, match=r"^line 5: a #%profile of mrt-batch-manifest after"):
        parse_checkm(first + batch + "http://h/b | | | | | b.txt | ark:/1/b\n")
    same = "#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest\n"
    assert len(parse_checkm(first + same + "http://h/b\n#%eof\n").rows) == 2


def test_the_headers_alone_give_the_columns_without_reading_a_row() -> None:
    text = header(BATCH_MANIFEST, " | ".join(BATCH_FIELDS[:7])) + "not a row anyone can read\n"

    assert CheckmReader(text).columns() == BATCH_FIELDS[:7]
    with pytest.raises(ManifestError, match=r"^line 4: "):
        list(CheckmReader(text))


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
        ("http://h/a | | | | | ..\\b", "contains '\\', which Merritt keeps as part of the name"),
        ("http://h/a | | | | | a\\b", "file name 'a\\\\b' contains '\\'"),
        ("http://h/a | | | | | C:\\x", "contains '\\'"),
        ("http://h/a | | | | | C:/x", "is absolute"),
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
    with pytest.raises(ManifestError, match=r"^line 2: #%profile '.*/mrt-other' is none of the"):
        parse_checkm(header("mrt-other"))


REGISTRY = "http://uc3.cdlib.org/registry/"


@pytest.mark.parametrize(
    ("profile", "kind"),
    [
        *((url, kind) for kind, urls in MERRITT_PROFILES.items() for url in urls),
        # Checkm.handleHeaders: StringUtil.squeeze(profile).matches(StringUtil.squeeze(url)). The
        # URL is the pattern: its "." matches any one character but a line terminator.
        ("http://uc3Xcdlib/org/registry/ingest/manifest/mrt-ingest-manifest", OBJECT_MANIFEST),
        ("http://uc3\u00e9cdlib.org/registry/mrt/mrt-batch-manifest", BATCH_MANIFEST),
        # White space (StringTokenizer's: space, tab, CR, LF, FF) is squeezed out first.
        ("http://uc3.cdlib.org/registry/ store/manifest/mrt-add-\tmanifest", ADD_MANIFEST),
        # The whole text must match: no scheme, host, path, case, ending but Merritt's own.
        ("https://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest", None),
        ("http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest/", None),
        ("http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest?v=1", None),
        ("http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest#x", None),
        ("HTTP://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest", None),
        ("http://uc3.cdlib.org/registry/ingest/manifest/MRT-ingest-manifest", None),
        ("http://example.org/registry/ingest/manifest/mrt-ingest-manifest", None),
        ("http://uc3.cdlib.org.example/registry/ingest/manifest/mrt-ingest-manifest", None),
        ("http://uc3.cdlib.org/registry/other/mrt-ingest-manifest", None),
        ("http://uc3.cdlib.org/registry/mrt/mrt-container-batch-manifest", None),
        ("http://uc3.cdlib.org/registry/store/manifest/mrt-object-manifest", None),
        ("mrt-ingest-manifest", None),
        # "." matches no line terminator: U+0085, U+2028, U+2029 (CR and LF are squeezed out).
        *(
            (f"http://uc3{char}cdlib.org/registry/ingest/manifest/mrt-ingest-manifest", None)
            for char in "\x85\u2028\u2029"
        ),
    ],
)
def test_a_profile_is_one_merritts_readers_take_as_java_matches_it(
    profile: str, kind: str | None
) -> None:
    """mrt-core2 ManifestRowIngest (450aab1), ManifestRowBatch and ManifestRowAdd (64d6bd2)
    list the profiles their reader takes; Checkm.handleHeaders (450aab1) takes a profile that
    String.matches one of them, white space squeezed out of both."""
    assert merritt_profile_kind(profile) == kind
    text = f"#%profile | {profile}\nhttp://h/a | | | | | a\n#%eof\n"
    if kind is None:
        with pytest.raises(ManifestError, match=r"^line 1: #%profile .* is none of the profiles"):
            parse_checkm(text)
    else:
        assert parse_checkm(text).kind == kind


def test_a_depositors_profile_merritts_ingest_refuses_is_refused_naming_those_it_takes() -> None:
    """Until this change a profile was taken here when its last path part named a kind, on any
    host and path: a manifest Merritt's ingest refuses ("manifestProfile does not match expected
    form") was read. The error names the URLs Merritt's reader of the kind takes."""
    rows = "http://h/a | | | | | a\n#%eof\n"
    for profile in (
        "https://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest",
        "http://example.org/manifests/mrt-ingest-manifest",
        "http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest/",
    ):
        with pytest.raises(ManifestError) as refused:
            list(CheckmReader(f"#%profile | {profile}\n{rows}", only=OBJECT_MANIFEST))
        message = str(refused.value)
        assert message.startswith(f"line 1: #%profile {profile!r} is none of the profiles")
        assert message.endswith(", ".join(MERRITT_PROFILES[OBJECT_MANIFEST]))
        with pytest.raises(ManifestError, match="is none of the profiles"):
            parse_checkm(f"#%profile | {profile}\n{rows}", profile_if_headed=True)
    # Merritt's ingest takes its legacy URL too.
    legacy = f"#%profile | {REGISTRY}mrt/{OBJECT_MANIFEST}\n{rows}"
    assert parse_checkm(legacy, profile_if_headed=True).kind == OBJECT_MANIFEST
    # A depositor's manifest is read as one of ingest's kinds: storage's add profile is none.
    with pytest.raises(ManifestError, match=r"^line 1: a mrt-ingest-manifest or .* got mrt-add"):
        parse_checkm(f"#%profile | {profile_url(ADD_MANIFEST)}\n{rows}", profile_if_headed=True)


def test_a_batch_profile_whose_kind_white_space_splits_is_refused_to_a_depositor() -> None:
    """Merritt's batch reader squeezes the white space out of the profile before matching it,
    but mrt-ingest HandlerDisaggregate.getObjectType (0ba8fbe) takes each job's type from the
    profile as written (``profile.contains("mrt-batch-manifest")``, ...), and fails the batch
    when it holds none. An object manifest's profile is not read again."""
    rows = "http://h/a | | | | | a\n#%eof\n"
    split = f"#%profile | {PROFILE_BASE}mrt-batch- manifest\n{rows}"
    with pytest.raises(ManifestError, match=r"^line 1: #%profile .*white space inside mrt-batch"):
        parse_checkm(split, profile_if_headed=True)
    assert parse_checkm(split).kind == BATCH_MANIFEST
    spaced = f"#%profile | {PROFILE_BASE} mrt-batch-manifest \n{rows}"
    assert parse_checkm(spaced, profile_if_headed=True).kind == BATCH_MANIFEST
    split_object = f"#%profile | {PROFILE_BASE}mrt-ingest- manifest\n{rows}"
    assert parse_checkm(split_object, profile_if_headed=True).kind == OBJECT_MANIFEST


@pytest.mark.parametrize("kind", sorted(MANIFEST_KINDS))
def test_the_profile_the_console_writes_is_the_first_merritt_takes(kind: str) -> None:
    text = write_checkm([{"url": "http://h/a", "filename": "a"}], kind=kind)
    assert profile_url(kind) == MERRITT_PROFILES[kind][0]
    assert parse_checkm(text).kind == kind
    assert CheckmReader(text, only=kind).columns() == MERRITT_COLUMNS[kind]
    if kind in INGEST_KINDS:
        assert parse_checkm(text, profile_if_headed=True).kind == kind


def test_fields_header_without_url_column_is_rejected() -> None:
    with pytest.raises(ManifestError, match="no nfo:fileUrl column"):
        parse_checkm(header(fields="nfo:fileName | nfo:fileSize"))


def test_manifest_without_profile_has_no_kind_and_uses_object_fields() -> None:
    manifest = parse_checkm("\ufeffhttp://h/a | sha1 | " + "a" * 40 + " | 3 | | a\n#%eof\n")

    assert manifest.kind is None
    assert manifest.rows[0].size == 3


def test_writer_refuses_values_checkm_cannot_carry() -> None:
    """A line break (Java's readLine ends a line at "\\r" too); a URL with a "|" (Merritt does
    not decode the URL cell); "%20" or "%7c" in any other cell, which Merritt's reader would
    decode (mrt-core2 Checkm.dec) into something else than was written."""
    for row in (
        {"url": "http://h/a", "mime_type": "text/plain\r"},
        {"url": "http://h/a|b"},
        {"url": "http://h/a", "filename": "a%20b"},
        {"url": "http://h/a", "filename": "50%7c"},
        {"url": "http://h/a", "mime_type": "\ttext/plain"},
    ):
        with pytest.raises(ValueError, match="cannot be written"):
            write_checkm([row])
    with pytest.raises(ValueError, match="missing file URL"):
        write_checkm([{"url": "", "filename": "a"}])


def _carried(text: str) -> bool:
    """Whether a cell can carry ``text``: no "%20" or "%7c" (Merritt's reader would decode
    them), no space character but a space at either end (the writer escapes a space there)."""
    if "%20" in text or "%7c" in text:
        return False
    return all(c == " " or not c.isspace() for c in text[:1] + text[-1:])


# Text a checkm cell can hold: no line breaks; a "|" and spaces at its ends are escaped.
cell = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"),
    max_size=12,
).filter(_carried)
path_part = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=8)
url_paths = st.lists(path_part.filter(lambda p: p not in (".", "..")), min_size=1, max_size=3).map(
    "/".join
)
# A file name may hold a "|", a "%" and spaces, at its ends too.
name_part = st.text(alphabet="abcz09_-.| %27c", min_size=1, max_size=8)
filenames = (
    st.lists(name_part.filter(lambda p: p.strip("/ ") not in ("", ".", "..")), max_size=3)
    .filter(bool)
    .map("/".join)
    .filter(lambda name: _carried(name) and filename_problem(name) is None)
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
        + draw(url_paths),
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
    """Each kind carries the columns Merritt reads for it, and a column of no name of ours."""
    carried = {FIELD_KEYS[column] for column in MERRITT_COLUMNS[kind]}
    blank = {
        f.name: ""
        for f in dataclasses.fields(ManifestRow)
        if f.name not in carried and f.type == "str" and f.name != "url"
    }
    written = [dataclasses.replace(row, **blank, extra=(("x:note", "n"),)) for row in written]
    columns = (*MERRITT_COLUMNS[kind], "x:note")

    manifest = parse_checkm(write_checkm(written, kind=kind, columns=columns))

    assert manifest.kind == kind
    assert list(manifest.rows) == written


def test_the_writer_refuses_columns_merritt_would_read_otherwise() -> None:
    with pytest.raises(ManifestError, match="names mrt:mimeType as column 7, where Merritt"):
        write_checkm([{"url": "http://h/a"}], kind=BATCH_MANIFEST, columns=(*OBJECT_FIELDS,))


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
        ("a/" * 2000, "is longer than 1,024 bytes"),  # RecursionError making its folders
        ("/".join(["\U0001f600" * 63] * 5), "is longer than 1,024 bytes"),  # 319 characters
        ("x" * 256, "has a part longer than 255 bytes"),
        ("d/" + "é" * 128, "has a part longer than 255 bytes"),
    ],
)
def test_a_name_no_file_system_can_hold_is_refused(name: str, why: str) -> None:
    problem = filename_problem(name)
    assert problem is not None and problem.startswith(why), problem


def test_a_name_whose_path_no_file_system_takes_is_refused(tmp_path: Path) -> None:
    """1,023 characters, each part within 255 bytes, was a name the rule took: in UTF-8 it is
    4,047 bytes, and under any working folder past PATH_MAX (4,096 bytes on Linux), so making
    its folders failed at Downloading ("File name too long") after the object's other files."""
    name = "/".join(["\U0001f600" * 63] * 16)
    assert len(name) == 1023 and len(name.encode()) == 4047
    with pytest.raises(OSError) as too_long:
        (tmp_path / "object" / "producer" / name).mkdir(parents=True)
    assert too_long.value.errno == errno.ENAMETOOLONG

    problem = filename_problem(name)

    assert problem == "is longer than 1,024 bytes in UTF-8", problem
    assert filename_problem("/".join(["\u00e9" * 127] * 4)) is None  # 1,019 bytes


def test_every_ascii_character_is_judged_as_before_the_fast_path() -> None:
    """Names of printable ASCII skip the character loop; every ASCII control is still refused
    as one, and a name with one character outside ASCII still goes through the loop."""
    for code in range(128):
        char = chr(code)
        problem = filename_problem(f"ab{char}c")
        if code < 0x20 or code == 0x7F:
            assert problem is not None and "control character" in problem, (code, problem)
        elif char == "\\":  # kept by Merritt as part of the name: refused
            assert problem is not None and problem.startswith("contains '\\'"), problem
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
        + "#%eof\n"
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
        if "\\" in name:
            # Merritt keeps a backslash as part of the name: refused, never read as a folder.
            assert problem is not None and problem.startswith("contains '\\'"), name
            continue
        if name.startswith("/"):
            assert problem == "is absolute"
            continue
        parts = PurePosixPath(name).parts
        if ".." in parts:
            assert problem == "contains '..'", name
        elif name and not parts:
            assert problem is not None and problem.startswith("names no file"), name
        else:
            assert problem is None, (name, problem)


# Merritt's reader of every manifest (mrt-core2 Manifest.hasMoreElements, Checkm.setRow/dec,
# ManifestRowCheckmAbs.handleEOF; docs/merritt-services.md, "Manifests: read by position").


def test_cells_but_the_url_are_decoded_as_merritt_decodes_them() -> None:
    """``%20`` is a space and ``%7c`` a "|" in every cell but the URL; ``%7C`` and any other
    escape are taken as they are. A file name ``a%20b`` was "a%20b" here, "a b" to Merritt."""
    text = header(BATCH_MANIFEST, " | ".join(BATCH_FIELDS)) + (
        "http://h/a%20b%7c.txt | | | | | %20dir/a%20b%7cc%7C%41.txt%20 | | loc%7c1 | Doe | "
        "A%7cB%20C | 2020\n#%eof\n"
    )

    [row] = parse_checkm(text).rows

    assert row.url == "http://h/a%20b%7c.txt"
    assert row.filename == " dir/a b|c%7C%41.txt "
    assert (row.local_id, row.title) == ("loc|1", "A|B C")


def test_a_name_with_a_bar_a_percent_or_end_spaces_is_written_as_merritt_writes_it() -> None:
    """Encoded as mrt-core2's Checkm.enc encodes: each "|" as %7c, a space that begins or ends
    the cell as %20; read back, here or by Merritt's storage, as it was."""
    name = " producer/a|b 100%.txt "
    text = write_checkm([{"url": "http://h/a", "filename": name}], kind="mrt-add-manifest")

    assert "http://h/a |  |  |  |  | %20producer/a%7cb 100%.txt%20\n#%eof\n" in text
    assert parse_checkm(text).rows[0].filename == name


def test_a_name_merritts_manifests_would_read_otherwise_is_refused() -> None:
    """Merritt's writer leaves "%20" and "%7c" as they are and its reader decodes them: a
    file so named would be stored by another name."""
    for name in ("a%20b.txt", "50%7c.txt"):
        problem = filename_problem(name)
        assert problem is not None and "Merritt's manifests read" in problem, name
    assert filename_problem("a%7C%25.txt") is None


@pytest.mark.parametrize(
    ("tail", "line"),
    [
        ("", 4),  # no #%eof at all
        ("#%eof\n\n", 6),  # an empty line after it is the last line Merritt reads
        ("#%eof\n# a comment\n", 6),
    ],
)
def test_a_manifest_whose_last_line_is_not_eof_is_refused(tail: str, line: int) -> None:
    """Merritt's reader requires its last line to start #%eof and refuses the whole manifest
    otherwise (ManifestRowCheckmAbs.handleEOF, INVALID_DATA_FORMAT)."""
    with pytest.raises(ManifestError, match=rf"^line {line}: the last line is not #%eof"):
        parse_checkm(header() + "http://h/a\n" + tail)


def test_eof_is_read_as_merritt_reads_it() -> None:
    for tail in ("#%eof\n", "#%EOF", "#%eof \r\n", "#%eof | done\n"):
        assert len(parse_checkm(header() + "http://h/a\n" + tail).rows) == 1, tail
    with pytest.raises(ManifestError, match=r"^line 1: the manifest is empty"):
        parse_checkm(b"")


@pytest.mark.parametrize(
    "between",
    [
        "#%eof\n",  # Merritt reads on past it
        "#%prefix | x: | http://x.example/\n",
        "#%checkm_0.7\n# a comment\n",
    ],
)
def test_hash_percent_lines_between_rows_without_a_profile_are_refused(between: str) -> None:
    """Merritt's reader takes the #% lines before each row as headers and, after the first row,
    refuses the whole manifest when they name no #%profile (Checkm.handleHeaders,
    "manifestProfile is missing")."""
    text = header() + "http://h/a\n" + between + "http://h/b\n#%eof\n"

    with pytest.raises(ManifestError, match=r"^line 5: #% lines between rows, before the row"):
        parse_checkm(text)
    with pytest.raises(ManifestError, match=r"^line 5: #% lines between rows"):
        CheckmReader(text).check()  # read without making the rows
    profile = f"#%profile | http://uc3.cdlib.org/registry/ingest/manifest/{OBJECT_MANIFEST}\n"
    assert len(parse_checkm(text.replace(between, between + profile, 1)).rows) == 2


PROFILE_LINE = f"#%profile | http://uc3.cdlib.org/registry/ingest/manifest/{OBJECT_MANIFEST}\n"


@pytest.mark.parametrize(
    ("headers", "line"),
    [
        ("#%checkm_0.7\n", 1),
        ("# a comment\n#%fields | nfo:fileUrl\n", 2),  # a comment is no #% line
        (PROFILE_LINE.replace("#%profile", "#%PROFILE"), 1),  # Merritt: as written
        (PROFILE_LINE.replace("#%profile |", "#%profile|"), 1),  # Merritt: "#%profile " only
        # The first line starting "#%profile" is the one taken: a later one changes nothing.
        (PROFILE_LINE.replace("#%profile |", "#%profile|") + PROFILE_LINE, 1),
    ],
)
def test_hash_percent_lines_before_the_first_row_without_a_profile_are_refused_when_asked(
    headers: str, line: int
) -> None:
    """Merritt's reader hands the #% lines before the first row to Checkm.handleHeaders, which
    takes the first line starting "#%profile" (as written) and refuses the whole manifest when
    it names no profile ("setHeaders - manifestProfile is missing"; Checkm.squeezeHeader
    needs "#%profile "). Asked (a depositor's manifest), so does the reader here, naming the
    first #% line; unasked (a manifest the console or storage wrote), it reads on."""
    text = headers + "http://h/a\n#%eof\n"

    with pytest.raises(ManifestError, match=rf"^line {line}: #% lines before the first row"):
        parse_checkm(text, profile_if_headed=True)
    with pytest.raises(ManifestError, match=rf"^line {line}: #% lines before the first row"):
        CheckmReader(text, only=OBJECT_MANIFEST, profile_if_headed=True).check()
    with pytest.raises(ManifestError, match=rf"^line {line}: #% lines before the first row"):
        CheckmReader(text, only=OBJECT_MANIFEST, profile_if_headed=True).columns()
    assert len(parse_checkm(text).rows) == 1


def test_a_profile_line_merritt_passes_over_does_not_hide_the_next() -> None:
    """ "#%PROFILE" does not start "#%profile": Merritt's reader passes over it to the next."""
    upper = PROFILE_LINE.replace("#%profile", "#%PROFILE")
    text = upper + PROFILE_LINE + "http://h/a\n#%eof\n"

    assert len(parse_checkm(text, profile_if_headed=True).rows) == 1


def test_a_manifest_with_no_hash_percent_line_before_its_first_row_is_read() -> None:
    """Checkm.handleHeaders takes an empty gathering: a manifest whose first line is a row (and
    whose last is #%eof) is read by Merritt's ingest as one of the kind it reads."""
    reader = CheckmReader(
        "\n# a comment\nhttp://h/a | | | | | a.txt\n#%eof\n",
        only=OBJECT_MANIFEST,
        profile_if_headed=True,
    )

    assert [row.filename for row in reader] == ["a.txt"]
    assert reader.kind is None


def test_a_profile_between_rows_is_recognised_as_merritt_recognises_it() -> None:
    """Between rows too, a gathering's profile is its first line starting "#%profile", as
    written and followed by a space."""
    first = header() + "http://h/a\n"
    for between in (
        PROFILE_LINE.replace("#%profile", "#%PROFILE"),
        PROFILE_LINE.replace("#%profile |", "#%profile|") + PROFILE_LINE,
    ):
        with pytest.raises(ManifestError, match=r"^line 5: #% lines between rows"):
            parse_checkm(first + between + "http://h/b\n#%eof\n")
    assert len(parse_checkm(first + PROFILE_LINE + "http://h/b\n#%eof\n").rows) == 2


BATCH_PROFILE_LINE = PROFILE_LINE.replace(OBJECT_MANIFEST, BATCH_MANIFEST)


def test_the_first_profile_line_of_a_gathering_sets_the_kind_as_merritt_takes_it() -> None:
    """Checkm.handleHeaders takes a gathering's first line starting "#%profile" (as written)
    and passes over the rest; Checkm.squeezeHeader reads its profile after "#%profile ",
    with or without a "|", to the end of the line."""
    rows = "http://h/a\n#%eof\n"
    # The later line is not read: not its kind, not its being of another kind than asked.
    assert parse_checkm(PROFILE_LINE + BATCH_PROFILE_LINE + rows).kind == OBJECT_MANIFEST
    assert parse_checkm(BATCH_PROFILE_LINE + PROFILE_LINE + rows).kind == BATCH_MANIFEST
    reader = CheckmReader(PROFILE_LINE + BATCH_PROFILE_LINE + rows, only=OBJECT_MANIFEST)
    assert len(list(reader)) == 1 and reader.kind == OBJECT_MANIFEST
    # "#%PROFILE" is no profile line to Merritt: it neither sets the kind nor hides the next.
    upper = BATCH_PROFILE_LINE.replace("#%profile", "#%PROFILE")
    assert parse_checkm(PROFILE_LINE + upper + rows).kind == OBJECT_MANIFEST
    assert parse_checkm(upper + rows).kind is None
    # Without a "|", the rest of the line is the profile.
    bare = BATCH_PROFILE_LINE.replace("#%profile |", "#%profile")
    manifest = parse_checkm(bare + rows)
    assert manifest.kind == BATCH_MANIFEST and manifest.profile == profile_url(BATCH_MANIFEST)
    # Between rows alike: the later line of the gathering changes nothing.
    first = header() + "http://h/a\n"
    assert len(parse_checkm(first + PROFILE_LINE + BATCH_PROFILE_LINE + rows).rows) == 2


def test_a_profile_line_merritt_reads_as_another_profile_is_refused() -> None:
    """The rest of the line, white space squeezed out, must be one of the class's profiles
    (Checkm.handleHeaders): "URL | more" is none of them."""
    with pytest.raises(ManifestError, match=r"^line 1: #%profile .* is none of the profiles"):
        parse_checkm(PROFILE_LINE.rstrip("\n") + " | v2\nhttp://h/a\n#%eof\n")
    with pytest.raises(ManifestError, match=r"^line 1: #%profile without a URL"):
        parse_checkm("#%profile | \nhttp://h/a\n#%eof\n")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("  " + PROFILE_LINE + "http://h/a\n#%eof\n", 1),  # a row to Merritt, not a header
        (header() + "http://h/a\n\t# a comment\nhttp://h/b\n#%eof\n", 5),
        (header() + "http://h/a\n   \nhttp://h/b\n#%eof\n", 5),  # a row of spaces
        (header() + "http://h/a\n  #%eof\n", 5),  # a row to Merritt: no #%eof at all
    ],
)
def test_a_line_that_starts_with_white_space_is_a_row(text: str, line: int) -> None:
    """Merritt's reader (Manifest.hasMoreElements) looks for "#%" and "#" at a line's first
    character: a line that starts with white space is a row, whose URL (spaces, "#...") fails
    it. Refused here, naming the line."""
    with pytest.raises(ManifestError, match=rf"^line {line}: a line starting with white space"):
        parse_checkm(text)
    with pytest.raises(ManifestError, match=rf"^line {line}: a line starting with white space"):
        CheckmReader(text).check()


def test_a_row_is_cut_as_merritt_cuts_it() -> None:
    """Checkm.setRow splits a row at a "|" and the spaces, tabs and line breaks next to it;
    the URL is read by java.net.URL, which drops the characters up to the space around it.
    What is read alike on both sides is read."""
    text = header() + (
        "\t http://h/a\t|\tmd5 | " + "0" * 32 + " | 10 | | a.txt | text/plain \r\n"
        "http://h/b | | | | | b.txt\r\n"
        "#%eof\r\n"
    )
    first, second = parse_checkm(text).rows

    assert (first.url, first.hash_alg, first.size) == ("http://h/a", "md5", 10)
    assert first.filename == "a.txt"
    assert first.mime_type == "text/plain"  # Merritt keeps its space: not a value we key on
    assert (second.url, second.filename) == ("http://h/b", "b.txt")


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("http://h/a | | | | | a.txt  ", "nfo:fileName"),  # the line's end: not next to a "|"
        ("http://h/a | | | | | a.txt\u00a0 | text/plain", "nfo:fileName"),  # not Java's \s
        ("http://h/a | | | 10\u2003 | | a.txt", "nfo:fileSize"),
        ("http://h/a | md5 | \u3000" + "0" * 32, "nfo:hashValue"),
        ("http://h/a | md5\u00a0 | " + "0" * 32, "nfo:hashAlgorithm"),
        ("http://h/a\u00a0 | | | | | a.txt", "nfo:fileUrl"),  # java.net.URL keeps it
        ("\u2003http://h/a", "nfo:fileUrl"),
    ],
)
def test_white_space_merritt_keeps_in_a_value_that_matters_is_refused(
    row: str, column: str
) -> None:
    """Merritt trims only the spaces, tabs and line breaks next to a "|" (Checkm.setRow);
    what it keeps would make another URL, name, digest or size there than the one read here
    by trimming it. A depositor's manifest is refused."""
    with pytest.raises(ManifestError, match=rf"^line 4: the {column} cell .* white space"):
        parse_checkm(header() + row + "\n#%eof\n", profile_if_headed=True)


def test_a_name_merritt_keeps_with_white_space_is_read_so_in_a_manifest_it_wrote() -> None:
    """Not a depositor's: a name in a manifest Merritt's storage wrote is the file's name
    there, white space and all."""
    [row] = parse_checkm(header() + "http://h/a | | | | | a.txt\u00a0 | text/plain\n#%eof\n").rows
    assert row.filename == "a.txt\u00a0"


def test_batch_identifiers_with_white_space_merritt_keeps_are_refused() -> None:
    fields = " | ".join(BATCH_FIELDS)
    text = header(BATCH_MANIFEST, fields) + "http://h/o | | | | | o | | loc1\u00a0 | Doe\n#%eof\n"
    with pytest.raises(ManifestError, match=r"^line 4: the mrt:localIdentifier cell"):
        parse_checkm(text, profile_if_headed=True)
    other = text.replace("| | loc1\u00a0", "| ark:/99999/fk4a\u00a0 | loc1")
    with pytest.raises(ManifestError, match=r"^line 4: the mrt:primaryIdentifier cell"):
        parse_checkm(other, profile_if_headed=True)
