from __future__ import annotations

import json
import re
import tracemalloc

import pytest

from queues.steps.checkm import (
    BATCH_MANIFEST,
    CONTAINER_BATCH_MANIFEST,
    OBJECT_FIELDS,
    OBJECT_MANIFEST,
    SINGLE_FILE_BATCH_MANIFEST,
    ManifestError,
    profile_url,
    write_checkm,
)
from queues.steps.merritt import merritt_digest_name
from queues.steps.submission import (
    ObjectSpec,
    PayloadFile,
    expand_submission,
    payload_files,
)

MD5 = "9e107d9d372bb6826bd81d3542a419d6"


def fetcher(documents: dict[str, str | bytes]):
    def fetch(url: str) -> str | bytes:
        return documents[url]

    return fetch


def no_fetch(url: str) -> str:
    raise AssertionError(f"nothing should be fetched, asked for {url}")


def batch(kind: str, *rows: dict[str, object]) -> str:
    return write_checkm(rows, kind=kind)


@pytest.mark.parametrize("submission_type", ["file", "container", "object-manifest"])
def test_single_object_submissions_make_one_spec_without_fetching(submission_type: str) -> None:
    specs = expand_submission(
        submission_type=submission_type,
        payload_url="http://h/deposits/thesis%20final.pdf",
        fetch_text=no_fetch,
        title="Thesis",
        creator="Doe, J.",
        date="2024",
        local_id="loc001",
        digest_alg="MD5",
        digest_value=MD5.upper(),
    )

    assert specs == [
        ObjectSpec(
            payload_url="http://h/deposits/thesis%20final.pdf",
            payload_type=submission_type,  # type: ignore[arg-type]
            filename="thesis final.pdf",
            local_id="loc001",
            creator="Doe, J.",
            title="Thesis",
            date="2024",
            digest_alg="md5",
            digest_value=MD5,
        )
    ]


def test_half_a_digest_is_refused() -> None:
    with pytest.raises(ManifestError, match="both an algorithm and a value"):
        expand_submission(
            submission_type="file", payload_url="http://h/a", fetch_text=no_fetch, digest_alg="md5"
        )


@pytest.mark.parametrize(
    ("submission_type", "kind", "payload_type"),
    [
        ("single-file-batch-manifest", SINGLE_FILE_BATCH_MANIFEST, "file"),
        ("container-batch-manifest", CONTAINER_BATCH_MANIFEST, "container"),
        ("batch-manifest", BATCH_MANIFEST, "object-manifest"),
    ],
)
def test_batch_manifests_make_one_spec_per_row(
    submission_type: str, kind: str, payload_type: str
) -> None:
    manifest = batch(
        kind,
        {"url": "http://h/1", "filename": "one.bin", "local_id": "loc1", "title": "One"},
        {
            "url": "http://h/2",
            "hash_alg": "md5",
            "hash_value": MD5,
            "size": 7,
            "primary_id": "ark:/99999/fk4two",
            "creator": "Roe, R.",
            "date": "1999",
        },
    )

    specs = expand_submission(
        submission_type=submission_type,
        payload_url="http://h/batch.checkm",
        fetch_text=fetcher({"http://h/batch.checkm": manifest}),
        title="The batch's own title",
    )

    assert [s.payload_type for s in specs] == [payload_type, payload_type]
    first, second = specs
    assert (first.filename, first.local_id, first.title, first.creator) == (
        "one.bin",
        "loc1",
        "One",
        None,
    )
    assert (second.filename, second.primary_id, second.digest_alg, second.size) == (
        "2",
        "ark:/99999/fk4two",
        "md5",
        7,
    )


def test_batch_manifest_of_another_kind_is_refused() -> None:
    manifest = batch(CONTAINER_BATCH_MANIFEST, {"url": "http://h/1"})

    with pytest.raises(ManifestError, match="needs a mrt-batch-manifest manifest, got mrt-cont"):
        expand_submission(
            submission_type="batch-manifest",
            payload_url="http://h/b",
            fetch_text=fetcher({"http://h/b": manifest}),
        )


def test_empty_batch_manifest_is_refused() -> None:
    with pytest.raises(ManifestError, match="lists no objects"):
        expand_submission(
            submission_type="batch-manifest",
            payload_url="http://h/b",
            fetch_text=fetcher({"http://h/b": batch(BATCH_MANIFEST)}),
        )


def test_corrupt_batch_manifest_reports_its_line() -> None:
    manifest = batch(BATCH_MANIFEST, {"url": "http://h/1"}).replace("http://h/1", "gopher://h/1")

    with pytest.raises(ManifestError, match=r"^line 6: unsupported URL scheme"):
        expand_submission(
            submission_type="batch-manifest",
            payload_url="http://h/b",
            fetch_text=fetcher({"http://h/b": manifest.encode()}),
        )


def test_unknown_submission_type_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown submission type 'folder'"):
        expand_submission(submission_type="folder", payload_url="http://h/a", fetch_text=no_fetch)


def test_configuration_round_trips_through_json() -> None:
    spec = ObjectSpec(
        payload_url="http://h/a.zip",
        payload_type="container",
        filename="a.zip",
        primary_id="ark:/99999/fk4x",
        local_id="loc",
        creator="C",
        title="T",
        date="D",
        digest_alg="sha256",
        digest_value="ab" * 32,
        size=12,
    )

    config = json.loads(json.dumps(spec.to_configuration()))

    assert config == {
        "payload_url": "http://h/a.zip",
        "type": "container",
        "filename": "a.zip",
        "primaryID": "ark:/99999/fk4x",
        "localID": "loc",
        "creator": "C",
        "title": "T",
        "date": "D",
        "digest": {"alg": "sha256", "value": "ab" * 32},
        # Merritt ingest's keys beside the console's; its size is a number, its digest type
        # the DigestEnum value its own writers put there (its readers know no "sha256").
        "objectID": "ark:/99999/fk4x",
        "digestType": "SHA-256",
        "digestValue": "ab" * 32,
        "size": 12,
    }
    assert ObjectSpec.from_configuration(config) == spec


@pytest.mark.parametrize(
    ("digest_type", "alg"),
    [("SHA-256", "sha256"), ("sha256", "sha256"), ("MD5", "md5"), ("SHA-1", "sha1")],
)
def test_a_jobs_digest_type_is_read_in_merritts_spelling_and_the_consoles_old_one(
    digest_type: str, alg: str
) -> None:
    """A job as Merritt's ingest writes it (``SHA-256``, no ``digest``), and one this console
    wrote before it wrote Merritt's names (``sha256``), both give the algorithm to check."""
    config = {
        "payload_url": "http://h/a.txt",
        "type": "file",
        "digestType": digest_type,
        "digestValue": "ab",
    }
    spec = ObjectSpec.from_configuration(config)
    assert (spec.digest_alg, spec.digest_value) == (alg, "ab")


@pytest.mark.parametrize(
    ("alg", "name"),
    [
        *[("md5", "MD5"), ("sha1", "SHA-1"), ("sha256", "SHA-256"), ("sha512", "SHA-512")],
        *[("SHA-256", "SHA-256"), ("sha-512", "SHA-512"), ("MD5", "MD5")],
    ],
)
def test_merritts_digest_name_is_its_digestenum_value(alg: str, name: str) -> None:
    assert merritt_digest_name(alg) == name


def test_configuration_leaves_out_empty_values() -> None:
    spec = ObjectSpec(payload_url="http://h/a", payload_type="file", filename="a")

    assert spec.to_configuration() == {"payload_url": "http://h/a", "type": "file", "filename": "a"}


def test_configuration_written_by_merritt_java_is_understood() -> None:
    config = {
        "payload_url": "http://h/o.checkm",
        "payload_type": "object_manifest",
        "erc_what": "Title",
        "profile_name": "merritt_demo_content",
    }

    spec = ObjectSpec.from_configuration(config)

    assert (spec.payload_type, spec.title, spec.filename) == ("object-manifest", "Title", "")


def test_object_manifest_payload_lists_its_files() -> None:
    manifest = write_checkm(
        [
            {"url": "http://h/a/1.tif", "hash_alg": "md5", "hash_value": MD5, "size": 5},
            {"url": "http://h/a/2.txt", "filename": "text/2.txt"},
        ],
        kind=OBJECT_MANIFEST,
    )
    spec = ObjectSpec(payload_url="http://h/a.checkm", payload_type="object-manifest")

    files = payload_files(spec, fetch_text=fetcher({"http://h/a.checkm": manifest}))

    assert files == [
        PayloadFile("http://h/a/1.tif", "1.tif", "md5", MD5, 5),
        PayloadFile("http://h/a/2.txt", "text/2.txt"),
    ]


def test_a_large_object_manifest_is_read_holding_little_beside_its_files() -> None:
    """A manifest of 20,000 files: reading it holds, beside the files it gives, less than the
    manifest's own size (its rows were held all at once with their files, and its text
    decoded whole beside its bytes: 1.66 times the files at 200,000 rows, 1.35 now)."""
    rows = "".join(
        f"https://h/set-{n // 1000:02d}/file-{n:06d}.dat | sha256 | {n:064x} | {n} | | "
        f"set-{n // 1000:02d}/file-{n:06d}.dat | application/octet-stream\n"
        for n in range(20_000)
    )
    data = (write_checkm([], kind=OBJECT_MANIFEST).split("#%eof")[0] + rows + "#%eof\n").encode()
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")

    tracemalloc.start()
    try:
        files = payload_files(spec, fetch_text=lambda _url: data)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert len(files) == 20_000 and files[-1].filename == "set-19/file-019999.dat"
    assert peak - kept < len(data)


def test_an_object_manifest_of_another_kind_is_refused_at_its_profile() -> None:
    """A batch manifest given where an object's manifest is wanted is refused at its
    ``#%profile`` line, before any of its rows is taken as a file."""
    manifest = batch(BATCH_MANIFEST, {"url": "http://h/1"})
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")

    with pytest.raises(
        ManifestError, match=f"^line 2: a {OBJECT_MANIFEST} is needed here, got {BATCH_MANIFEST}$"
    ):
        payload_files(spec, fetch_text=fetcher({"http://h/m": manifest}))


def test_an_object_manifest_merritt_would_read_by_other_columns_is_refused() -> None:
    """The size and modification time left out of #%fields: Merritt's ingest reads the
    fourth cell as the size whatever #%fields says (mrt-core2
    ManifestRowIngest), where the console read it as the file name. (Without a #%profile,
    the same manifest is refused for that first: see the test below.)"""
    manifest = (
        f"#%checkm_0.7\n#%profile | {profile_url(OBJECT_MANIFEST)}\n"
        "#%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileName\n"
        f"http://h/a/1.tif | md5 | {MD5} | one.tif\n"
        "#%eof\n"
    )
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")

    with pytest.raises(
        ManifestError, match=r"^line 3: #%fields names nfo:fileName as column 4, where Merritt"
    ):
        payload_files(spec, fetch_text=fetcher({"http://h/m": manifest}))


def test_a_manifest_with_headers_but_no_profile_is_refused_at_intake() -> None:
    """Merritt's ingest refuses a manifest whose #% lines before its first row name no
    #%profile (mrt-core2 Manifest.hasMoreElements, Checkm.handleHeaders): a job's object
    manifest and a batch manifest are refused, naming the first #% line. An object manifest
    with no #% line before its first row is read, as Merritt's ingest reads it."""
    rows = f"http://h/a/1.tif | md5 | {MD5} | | | one.tif\n#%eof\n"
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")
    headed = "#%checkm_0.7\n#%fields | " + " | ".join(OBJECT_FIELDS) + "\n" + rows
    with pytest.raises(ManifestError, match=r"^line 1: #% lines before the first row"):
        payload_files(spec, fetch_text=fetcher({"http://h/m": headed}))

    [file] = payload_files(spec, fetch_text=fetcher({"http://h/m": rows}))
    assert file.filename == "one.tif"

    text = batch(SINGLE_FILE_BATCH_MANIFEST, {"url": "http://h/1"})
    text = text.replace(f"#%profile | {profile_url(SINGLE_FILE_BATCH_MANIFEST)}\n", "")
    with pytest.raises(ManifestError, match=r"^line 1: #% lines before the first row"):
        expand_submission(
            submission_type="single-file-batch-manifest",
            payload_url="http://h/b",
            fetch_text=fetcher({"http://h/b": text}),
        )


def test_a_batch_manifest_merritt_would_read_by_other_columns_is_refused() -> None:
    manifest = batch(BATCH_MANIFEST, {"url": "http://h/1", "local_id": "loc1"}).replace(
        "mrt:primaryIdentifier | mrt:localIdentifier", "mrt:localIdentifier | mrt:primaryIdentifier"
    )

    with pytest.raises(ManifestError, match="names mrt:localIdentifier as column 7, where"):
        expand_submission(
            submission_type="batch-manifest",
            payload_url="http://h/b",
            fetch_text=fetcher({"http://h/b": manifest}),
        )


def test_an_object_manifests_cells_are_read_as_merritt_decodes_them() -> None:
    """Merritt's ingest decodes %20 and %7c in every cell but the URL (mrt-core2 Checkm.dec):
    the file of a row named ``scan%201%7cb.tif`` is "scan 1|b.tif" there, and now here."""
    manifest = (
        f"#%checkm_0.7\n#%profile | {profile_url(OBJECT_MANIFEST)}\n"
        "http://h/a/scan%201.tif | | | | | scan%201%7cb.tif | image%7ctiff\n#%eof\n"
    )
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")

    [file] = payload_files(spec, fetch_text=fetcher({"http://h/m": manifest}))

    assert (file.url, file.filename) == ("http://h/a/scan%201.tif", "scan 1|b.tif")


@pytest.mark.parametrize(
    ("tail", "problem"),
    [
        ("", r"^line 3: the last line is not #%eof"),
        ("#%eof\n\n", r"^line 5: the last line is not #%eof"),
        ("#%eof\nhttp://h/b\n#%eof\n", r"^line 4: #% lines between rows"),
    ],
)
def test_a_manifest_merritt_refuses_whole_is_refused_at_intake(tail: str, problem: str) -> None:
    """Merritt's reader refuses a manifest whose last line is not #%eof, or with #% lines but
    no #%profile between its rows (mrt-core2 Manifest, ManifestRowCheckmAbs.handleEOF,
    Checkm.handleHeaders): a job's object manifest and a batch manifest are refused whole."""
    head = f"#%checkm_0.7\n#%profile | {profile_url(OBJECT_MANIFEST)}\n"
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")
    with pytest.raises(ManifestError, match=problem):
        payload_files(spec, fetch_text=fetcher({"http://h/m": head + "http://h/a\n" + tail}))

    text = batch(BATCH_MANIFEST, {"url": "http://h/1"}).replace("#%eof\n", tail)
    with pytest.raises(ManifestError, match=r"(last line is not #%eof|between rows)"):
        expand_submission(
            submission_type="batch-manifest",
            payload_url="http://h/b",
            fetch_text=fetcher({"http://h/b": text}),
        )


def test_object_manifest_with_a_repeated_file_name_is_refused() -> None:
    manifest = write_checkm(
        [{"url": "http://h/a/x", "filename": "x"}, {"url": "http://h/b/x"}], kind=OBJECT_MANIFEST
    )
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")

    with pytest.raises(ManifestError, match=r"^line 7: file name 'x' already used on line 6$"):
        payload_files(spec, fetch_text=fetcher({"http://h/m": manifest}))


@pytest.mark.parametrize(("first", "second"), [("a", "./a"), ("a", "a/"), ("dir/a", "dir//a")])
def test_two_names_of_one_file_are_a_repeated_file_name(first: str, second: str) -> None:
    """Both rows were downloaded to one file, the last to finish kept, two results reported."""
    manifest = write_checkm(
        [{"url": "http://h/1", "filename": first}, {"url": "http://h/2", "filename": second}],
        kind=OBJECT_MANIFEST,
    )
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")

    with pytest.raises(ManifestError, match=r"^line 7: file name .* already used on line 6$"):
        payload_files(spec, fetch_text=fetcher({"http://h/m": manifest}))


def test_a_name_with_a_backslash_is_refused_where_the_manifest_is_read() -> None:
    """``b\\c`` was read here as the file ``c`` in the folder ``b``, where Merritt's ingest
    keeps the backslash as part of one name (java.io.File on Linux): stored under another name
    than Merritt would give it. Refused now, naming the line."""
    manifest = write_checkm(
        [{"url": "http://h/1", "filename": "a"}, {"url": "http://h/2", "filename": "b-c"}],
        kind=OBJECT_MANIFEST,
    ).replace("| b-c", "| b\\c")  # write_checkm refuses to write it
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")

    said = "line 7: file name " + repr("b\\c") + " contains '\\'"
    with pytest.raises(ManifestError, match="^" + re.escape(said)):
        payload_files(spec, fetch_text=fetcher({"http://h/m": manifest}))


@pytest.mark.parametrize(
    ("first", "second", "why"),
    [
        ("a", "a/b", "'a/b' puts a file under 'a', the file on line 6"),
        ("d/a", "d/a/b/c", "'d/a/b/c' puts a file under 'd/a', the file on line 6"),
        ("a/b", "a", "'a' is the folder of the file on line 6"),
        ("x/y/z", "./x//y/", "'./x//y/' is the folder of the file on line 6"),
    ],
)
def test_a_name_that_is_a_file_and_a_folder_at_once_is_refused(
    first: str, second: str, why: str
) -> None:
    """One object cannot hold a file "a" and a file "a/b": Merritt's ingest failed such an
    object as a "Duplicate filename", and this console downloaded every other file before the
    disk refused one of the two ("File exists" or "Is a directory", whichever came first)."""
    manifest = write_checkm(
        [{"url": "http://h/1", "filename": first}, {"url": "http://h/2", "filename": second}],
        kind=OBJECT_MANIFEST,
    )
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")

    with pytest.raises(ManifestError) as refused:
        payload_files(spec, fetch_text=fetcher({"http://h/m": manifest}))
    assert str(refused.value).startswith(f"line 7: file name {why}"), str(refused.value)
    assert str(refused.value).endswith("one name cannot be a file and a folder")


def test_names_that_differ_in_case_or_unicode_form_alone_are_two_files() -> None:
    """Merritt's ingest names each file with ``java.io.File`` on its Linux disk, byte by byte:
    ``README`` and ``readme``, ``é`` composed and decomposed, are two files there and here
    (a working disk that folds them is refused at the download: ``fetch._land``)."""
    names = ["README", "readme", "caf\u00e9.txt", "cafe\u0301.txt"]
    manifest = write_checkm(
        [{"url": f"http://h/{i}", "filename": name} for i, name in enumerate(names)],
        kind=OBJECT_MANIFEST,
    )
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")

    found = payload_files(spec, fetch_text=fetcher({"http://h/m": manifest}))
    assert [f.filename for f in found] == names


def test_names_that_share_a_folder_or_a_beginning_are_no_clash() -> None:
    names = ["a/b", "a/c", "ab", "a.txt", "a b/c", "d/a", "d/ab/c"]
    manifest = write_checkm(
        [{"url": f"http://h/{i}", "filename": name} for i, name in enumerate(names)],
        kind=OBJECT_MANIFEST,
    )
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")

    found = payload_files(spec, fetch_text=fetcher({"http://h/m": manifest}))
    assert [f.filename for f in found] == names


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://h/..%2F..%2Fetc%2Fpasswd", "contains '..'"),
        ("http://h/%2Fetc%2Fpasswd", "is absolute"),
        ("http://h/a%00b", "control character"),
        ("http://h/a%0Ab", "control character"),
        ("http://h/a%E2%80%AEb", "bidirectional-text control"),
    ],
)
def test_a_name_taken_from_the_url_is_checked_like_a_name_given(url: str, why: str) -> None:
    """With no nfo:fileName the name comes from the URL, unquoted, and was never checked:
    "..%2F..%2Fetc%2Fpasswd" named the file "../../etc/passwd"."""
    manifest = write_checkm([{"url": url}], kind=OBJECT_MANIFEST)
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")

    with pytest.raises(
        ManifestError, match=f"^line 6: the file name .* taken from the URL .*{why}"
    ):
        payload_files(spec, fetch_text=fetcher({"http://h/m": manifest}))


def test_a_name_taken_from_the_url_is_its_last_part_unquoted() -> None:
    manifest = write_checkm([{"url": "http://h/a/scan%201.tif"}], kind=OBJECT_MANIFEST)
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")

    [found] = payload_files(spec, fetch_text=fetcher({"http://h/m": manifest}))
    assert found.filename == "scan 1.tif"


def test_file_and_container_payloads_are_their_own_single_download() -> None:
    spec = ObjectSpec(
        payload_url="http://h/c.tar.gz",
        payload_type="container",
        filename="c.tar.gz",
        digest_alg="md5",
        digest_value=MD5,
    )

    assert payload_files(spec, fetch_text=no_fetch) == [
        PayloadFile("http://h/c.tar.gz", "c.tar.gz", "md5", MD5, None)
    ]


@pytest.mark.parametrize("columns", [11, 1])
def test_a_batch_manifest_with_no_hash_percent_line_names_the_profile_it_needs(
    columns: int,
) -> None:
    """Merritt's reader takes a manifest with no #% line before its first row, and ingest then
    fails the batch at that row: each object's type comes from the profile (mrt-ingest
    HandlerDisaggregate.getObjectType, on a null profile). Refused here at the first row,
    saying so and naming the profile the submission needs, whatever the row's cells."""
    row = "http://h/1 | | | | | one | | loc1 | | | " if columns == 11 else "http://h/1"
    text = "# a comment\n" + row + "\n#%eof\n"

    with pytest.raises(ManifestError) as raised:
        expand_submission(
            submission_type="single-file-batch-manifest",
            payload_url="http://h/b",
            fetch_text=fetcher({"http://h/b": text}),
        )

    message = str(raised.value)
    assert message.startswith("line 2: the batch manifest names no #%profile"), message
    assert f"#%profile | {profile_url(SINGLE_FILE_BATCH_MANIFEST)}" in message


@pytest.mark.parametrize(
    "host_and_path",
    [
        "https://uc3.cdlib.org/registry/ingest/manifest/",  # https
        "http://example.org/any/path/",  # another host and path
        "http://uc3.cdlib.org/registry/",  # another path
    ],
)
def test_a_profile_merritts_ingest_refuses_is_refused_at_intake(host_and_path: str) -> None:
    """Merritt's ingest takes only its own profile URLs, matched whole (mrt-core2
    ManifestRowIngest 450aab1, ManifestRowBatch 64d6bd2, Checkm.handleHeaders "manifestProfile
    does not match expected form"). A job's object manifest and a batch manifest naming their
    kind at the end of another URL are refused here too, naming the URLs Merritt takes, where
    until this change the last path part was enough."""
    rows = f"http://h/a/1.tif | md5 | {MD5} | | | one.tif\n#%eof\n"
    spec = ObjectSpec(payload_url="http://h/m", payload_type="object-manifest")
    other = f"#%profile | {host_and_path}{OBJECT_MANIFEST}\n{rows}"
    with pytest.raises(ManifestError) as refused:
        payload_files(spec, fetch_text=fetcher({"http://h/m": other}))
    assert str(refused.value).startswith("line 1: #%profile "), refused.value
    assert profile_url(OBJECT_MANIFEST) in str(refused.value)

    text = batch(SINGLE_FILE_BATCH_MANIFEST, {"url": "http://h/1"})
    ours = profile_url(SINGLE_FILE_BATCH_MANIFEST)
    text = text.replace(ours, f"{host_and_path}{SINGLE_FILE_BATCH_MANIFEST}")
    with pytest.raises(ManifestError) as refused:
        expand_submission(
            submission_type="single-file-batch-manifest",
            payload_url="http://h/b",
            fetch_text=fetcher({"http://h/b": text}),
        )
    assert str(refused.value).startswith("line 2: #%profile "), refused.value
    assert ours in str(refused.value)
