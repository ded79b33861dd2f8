"""Read and write Merritt's checkm manifests (see shared/design/manifests.md).

The parser is strict on purpose: a job whose manifest is corrupt goes straight from Pending to
Failed, and the only help the depositor gets is the message, so every error names its line.
What Merritt's reader (mrt-core2 ``Manifest``, ``Checkm``) refuses whole is refused here, and
cells are decoded and encoded as it does (docs/merritt-services.md, "Manifests: read by
position").
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import PurePosixPath
from typing import Any, AnyStr
from urllib.parse import urlsplit

from queues.core.outside_text import url_shown
from queues.core.words import LONG_MAX, digits

PROFILE_BASE = "http://uc3.cdlib.org/registry/ingest/manifest/"

OBJECT_MANIFEST = "mrt-ingest-manifest"
BATCH_MANIFEST = "mrt-batch-manifest"
CONTAINER_BATCH_MANIFEST = "mrt-container-batch-manifest"
SINGLE_FILE_BATCH_MANIFEST = "mrt-single-file-batch-manifest"
# The manifest of a version handed to storage (``add``): Merritt's storage reads it with
# mrt-core2's ManifestRowAdd, which refuses any #%profile but its own (docs/merritt-services.md).
ADD_MANIFEST = "mrt-add-manifest"
ADD_PROFILE = "http://uc3.cdlib.org/registry/store/manifest/" + ADD_MANIFEST
MANIFEST_KINDS = frozenset(
    {
        OBJECT_MANIFEST,
        BATCH_MANIFEST,
        CONTAINER_BATCH_MANIFEST,
        SINGLE_FILE_BATCH_MANIFEST,
        ADD_MANIFEST,
    }
)

# The #%profile URLs Merritt's readers take, by the kind the console reads such a manifest as:
# mrt-core2 ManifestRowIngest (450aab1) for an object manifest, ManifestRowBatch (64d6bd2) for
# the three batch kinds (any of its four, whatever the batch's type), ManifestRowAdd (64d6bd2)
# for storage's add. Checkm.handleHeaders compares a manifest's profile, its white space
# squeezed out, with each as Java's String.matches: the whole text, the URL as the pattern
# (``_java_pattern``). Each kind's first URL is the one the console writes (``profile_url``).
_REGISTRY = "http://uc3.cdlib.org/registry/"
MERRITT_PROFILES: dict[str, tuple[str, ...]] = {
    OBJECT_MANIFEST: (PROFILE_BASE + OBJECT_MANIFEST, _REGISTRY + "mrt/" + OBJECT_MANIFEST),
    BATCH_MANIFEST: (PROFILE_BASE + BATCH_MANIFEST, _REGISTRY + "mrt/" + BATCH_MANIFEST),
    CONTAINER_BATCH_MANIFEST: (PROFILE_BASE + CONTAINER_BATCH_MANIFEST,),
    SINGLE_FILE_BATCH_MANIFEST: (PROFILE_BASE + SINGLE_FILE_BATCH_MANIFEST,),
    ADD_MANIFEST: (ADD_PROFILE, _REGISTRY + "mrt/" + ADD_MANIFEST),
}
# The kinds Merritt's ingest reads a depositor's manifest as (ManifestRowIngest, ManifestRowBatch).
_BATCH_KINDS = (BATCH_MANIFEST, CONTAINER_BATCH_MANIFEST, SINGLE_FILE_BATCH_MANIFEST)
INGEST_KINDS = (OBJECT_MANIFEST, *_BATCH_KINDS)
# What "." matches in a Java pattern compiled without flags: any character but a line
# terminator (java.util.regex.Pattern, "Line terminators"; DOTALL is not set).
_JAVA_DOT = "[^\n\r\x85\u2028\u2029]"


def _java_pattern(url: str) -> re.Pattern[str]:
    """``url`` as the pattern Java's String.matches makes of it. Merritt's profile URLs hold
    no regular-expression character but "." (letters, digits, ":", "/", "-" match themselves),
    which matches any one character but a line terminator."""
    if not re.fullmatch(r"[a-z0-9:/.-]+", url):
        raise ValueError(f"{url!r} holds a character read otherwise as a pattern")
    return re.compile("".join(_JAVA_DOT if char == "." else re.escape(char) for char in url))


_MERRITT_PATTERNS = tuple(
    (_java_pattern(url), kind) for kind, urls in MERRITT_PROFILES.items() for url in urls
)


# The characters java.util.StringTokenizer cuts at by default, which mrt-core2's
# StringUtil.squeeze drops from a profile before comparing it.
_SQUEEZED = re.compile(r"[ \t\n\r\f]")


def merritt_profile_kind(profile: str) -> str | None:
    """The kind whose Merritt reader takes ``profile`` (a ``#%profile`` line's text, as
    ``Checkm.squeezeHeader`` gives it), or None: its white space squeezed out
    (``StringUtil.squeeze``), it must match one of ``MERRITT_PROFILES`` whole, as Java's
    String.matches matches it. So http only, no "/" or "?..." after the URL, case as written;
    a "." of the URL stands for any one character."""
    squeezed = _SQUEEZED.sub("", profile)
    for pattern, kind in _MERRITT_PATTERNS:
        if pattern.fullmatch(squeezed):
            return kind
    return None


PREFIXES = {
    "mrt": "http://merritt.cdlib.org/terms#",
    "nfo": "http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#",
}

# Field name (as written in #%fields) -> attribute of ManifestRow.
FIELD_KEYS: dict[str, str] = {
    "nfo:fileUrl": "url",
    "nfo:hashAlgorithm": "hash_alg",
    "nfo:hashValue": "hash_value",
    "nfo:fileSize": "size",
    "nfo:fileLastModified": "last_modified",
    "nfo:fileName": "filename",
    "mrt:mimeType": "mime_type",
    "mrt:primaryIdentifier": "primary_id",
    "mrt:localIdentifier": "local_id",
    "mrt:creator": "creator",
    "mrt:title": "title",
    "mrt:date": "date",
}
# Manifests in the wild differ in the case of field names; match them case-insensitively.
_FIELD_KEYS_FOLDED = {name.lower(): key for name, key in FIELD_KEYS.items()}

# The file columns both profiles open with.
_FILE_FIELDS: tuple[str, ...] = (
    "nfo:fileUrl",
    "nfo:hashAlgorithm",
    "nfo:hashValue",
    "nfo:fileSize",
    "nfo:fileLastModified",
    "nfo:fileName",
)
OBJECT_FIELDS: tuple[str, ...] = (*_FILE_FIELDS, "mrt:mimeType")
# mrt-core2's ManifestRowAdd columns; Merritt reads a row's cells by position, not by #%fields.
ADD_FIELDS: tuple[str, ...] = _FILE_FIELDS
BATCH_FIELDS: tuple[str, ...] = (
    *_FILE_FIELDS,
    "mrt:primaryIdentifier",
    "mrt:localIdentifier",
    "mrt:creator",
    "mrt:title",
    "mrt:date",
)
# The columns Merritt's reader of each kind takes a row's cells by, in their order: mrt-core2's
# ManifestRowIngest (object manifests), ManifestRowBatch (the three batch kinds), ManifestRowAdd.
# They never read a manifest's #%fields: cell i is their column i, whatever #%fields names there
# (docs/merritt-services.md, "Manifests: read by position"). So a #%fields line is held to them.
MERRITT_COLUMNS: dict[str, tuple[str, ...]] = {
    OBJECT_MANIFEST: OBJECT_FIELDS,
    BATCH_MANIFEST: BATCH_FIELDS,
    CONTAINER_BATCH_MANIFEST: BATCH_FIELDS,
    SINGLE_FILE_BATCH_MANIFEST: BATCH_FIELDS,
    ADD_MANIFEST: ADD_FIELDS,
}

# Hex digest length per algorithm: a wrong length is a corrupt manifest, better caught at parse
# time than reported later as a digest mismatch.
HASH_LENGTHS = {"md5": 32, "sha1": 40, "sha256": 64, "sha512": 128}
_HEX = re.compile(r"^[0-9a-fA-F]+$")
URL_SCHEMES = frozenset({"http", "https", "file"})


class ManifestError(ValueError):
    """A manifest that cannot be used; the message names the line (when there is one)."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message)


class TooManyRows(ManifestError):
    """A manifest with more rows than its reader takes; found while reading, at the first row
    past the limit (a million rows took 30 s and 570 MB to read whole before they were
    counted)."""

    def __init__(self, most: int, *, line: int) -> None:
        self.most = most
        super().__init__(f"more than {most:,} rows", line=line)


@dataclass(frozen=True, slots=True)
class ManifestRow:
    """One data line. Text fields are "" when empty; ``size`` is None when not given."""

    url: str
    hash_alg: str = ""
    hash_value: str = ""
    size: int | None = None
    last_modified: str = ""
    filename: str = ""
    mime_type: str = ""
    primary_id: str = ""
    local_id: str = ""
    creator: str = ""
    title: str = ""
    date: str = ""
    # Columns this module has no name for, keyed by their #%fields name, kept for round trips.
    extra: tuple[tuple[str, str], ...] = ()
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Manifest:
    kind: str | None
    profile: str | None
    fields: tuple[str, ...]
    rows: tuple[ManifestRow, ...]
    prefixes: tuple[tuple[str, str], ...] = ()


# Merritt's manifest profiles name at most 13 columns; a manifest of 100 is no Merritt manifest.
MAX_COLUMNS = 100


def _local_name(column: str) -> str:
    """A column's name without its prefix, folded: Merritt's own readers write ``nfo:fileURL``
    and ``nie:mimeType`` where manifests write ``nfo:fileUrl`` and ``mrt:mimeType``."""
    return column.rsplit(":", 1)[-1].strip().lower()


# The names of the columns this module reads, by local name.
_KNOWN_LOCAL_NAMES = frozenset(_local_name(name) for name in FIELD_KEYS)


def columns_problem(kind: str, declared: Sequence[str]) -> str | None:
    """Why rows read by the ``declared`` columns (a ``#%fields`` line) would not mean what they
    mean to Merritt's reader of a ``kind`` manifest, which takes cell i as its own column i
    (``MERRITT_COLUMNS``), or None. Its columns may be cut short at the end; none may be moved
    or left out before the last one named, and no column it reads may be named after them."""
    merritt = MERRITT_COLUMNS[kind]
    order = " | ".join(merritt)
    for position, name in enumerate(declared):
        if position < len(merritt):
            if _local_name(name) != _local_name(merritt[position]):
                return (
                    f"#%fields names {name} as column {position + 1}, where Merritt reads "
                    f"{merritt[position]}: Merritt reads the cells of an {kind} by position, "
                    f"ignoring #%fields, in the order {order} (a column may be left empty, or "
                    "the last ones left out, but none moved)"
                )
        elif _local_name(name) in _KNOWN_LOCAL_NAMES:
            return (
                f"#%fields names {name} as column {position + 1}, which Merritt does not read: "
                f"Merritt reads only the {len(merritt)} columns of an {kind}, by position, in "
                f"the order {order}"
            )
    return None


def profile_url(kind: str) -> str:
    return ADD_PROFILE if kind == ADD_MANIFEST else PROFILE_BASE + kind


def parse_checkm(
    data: bytes | str,
    *,
    most_rows: int | None = None,
    profile_if_headed: bool = False,
    profile_needed: str | None = None,
) -> Manifest:
    """Parse a checkm manifest; raise ManifestError naming the first bad line, TooManyRows at
    the first row past ``most_rows``. ``profile_if_headed``, ``profile_needed``: as
    ``CheckmReader``'s."""
    reader = CheckmReader(
        data,
        most_rows=most_rows,
        profile_if_headed=profile_if_headed,
        profile_needed=profile_needed,
    )
    rows = tuple(reader)
    return Manifest(
        kind=reader.kind,
        profile=reader.profile,
        fields=reader.fields,
        rows=rows,
        prefixes=tuple(reader.prefixes),
    )


class CheckmReader:
    """A checkm manifest's rows, one at a time, as ``parse_checkm`` reads them: what a row
    becomes can be kept without every row's being held at once (a manifest may list a million
    files). The headers read so far (``kind``, ``profile``, ``fields``, ``prefixes``) are known
    once the rows are; the usual manifest gives them before its first row. ``only``: the kind
    (or kinds) a ``#%profile`` may name (a manifest without one is not refused).

    Rows are read as Merritt reads them: by the columns of the manifest's kind (its
    ``#%profile``, else the one kind ``only`` names), in their order (``MERRITT_COLUMNS``). A
    ``#%fields`` line that names them in another order is refused (``columns_problem``) rather
    than read otherwise than Merritt reads it; without one, the kind's columns are read. Cells
    but the URL are decoded as Merritt decodes them (``_dec``). As Merritt's reader refuses
    them, so is refused, once the rows are read, a manifest whose last line is not ``#%eof``,
    and one with ``#%`` lines but no ``#%profile`` between two rows (``#%eof`` ends nothing
    before the last line: Merritt reads on past it). ``profile_if_headed`` (a depositor's
    manifest): refuse too, as Merritt's ingest refuses it, one with ``#%`` lines before its
    first row but no ``#%profile`` among them (one with no ``#%`` line before its first row is
    read), and a row whose URL, name, digest, size or identifier Merritt reads with white space
    at an end (``_parse_row``); a reading of a manifest the console or Merritt's storage wrote
    leaves the first out and reads the second as Merritt does.
    ``profile_needed``: a batch manifest of this kind is read; one with no ``#%profile`` before
    its first row is refused there, naming the profile it needs (Merritt's ingest fails it).

    Lines, headers and cells are told apart as Merritt's reader tells them apart
    (docs/merritt-services.md): a ``#%`` line or a comment starts at the line's first
    character, a line that starts with white space is a row (refused when it holds only white
    space or goes on with ``#``); a gathering's kind is its first line starting ``#%profile``
    (as written), read as ``Checkm.squeezeHeader`` reads it (``_profile``), its later profile
    lines passed over; a row is cut at a ``|`` with the ASCII white space next to it
    (``_parse_row``)."""

    def __init__(
        self,
        data: bytes | str,
        *,
        most_rows: int | None = None,
        only: str | tuple[str, ...] | None = None,
        profile_if_headed: bool = False,
        profile_needed: str | None = None,
    ) -> None:
        self._data: bytes | str = (
            data.removeprefix(b"\xef\xbb\xbf")
            if isinstance(data, bytes)
            else data.removeprefix("\ufeff")
        )
        self.most_rows = most_rows
        self.only = (only,) if isinstance(only, str) else only
        self.profile_if_headed = profile_if_headed
        self.profile_needed = profile_needed
        self.kind: str | None = None
        self.profile: str | None = None
        self.fields: tuple[str, ...] = OBJECT_FIELDS
        self.prefixes: list[tuple[str, str]] = []
        self.count = 0  # rows given so far
        self._fields_line = 0  # the #%fields line's number; 0 when there is none (yet)
        self._settled = False  # the columns rows are read by are fixed (at the first row)
        self._headers_only = False
        self._cells = True  # rows are made (``check`` reads without making them)

    def columns(self) -> tuple[str, ...]:
        """Read the headers before the first row only, and give the columns the rows are read
        by; ManifestError as reading the rows would raise it for the headers."""
        self._headers_only = True
        for _row in self:
            pass
        return self.fields

    def check(self) -> None:
        """Read the whole manifest as reading its rows would, without making them: its
        headers, the ``#%`` lines between rows and its last line are judged, a row's cells are
        not. ManifestError as reading the rows would raise it for those."""
        self._cells = False
        for _row in self:
            pass

    def __iter__(self) -> Iterator[ManifestRow]:
        data, self._data = self._data, ""  # read once
        # Bytes are decoded a line at a time: the whole text decoded would be held beside the
        # bytes for as long as the rows are read.
        lines = _lines(data) if isinstance(data, str) else _decoded_lines(data)
        # One string for each distinct value of the columns that repeat (a million rows of one
        # MIME type held a million copies of it), kept for this reading only.
        shared: dict[str, str] = {}
        # Merritt's reader (mrt-core2 Manifest) reads on past #%eof and judges the #% lines
        # gathered before each row: such a group needs a #%profile (before the first row, where
        # ``profile_if_headed`` asks). What ends a manifest is its last line, which must be
        # #%eof (docs/merritt-services.md).
        previous: str | None = None  # the last two lines read, for the last line's sake
        last: str | None = None
        number = 0
        group = 0  # the line of the first #% line since the last row; 0 when none
        group_profile: bool | None = None  # whether the group's profile line is one Merritt reads
        rows_seen = False
        for number, raw in enumerate(lines, start=1):
            previous, last = last, raw
            # Java's readLine, which Merritt's reader reads by, drops the "\r" of a "\r\n".
            line = raw[:-1] if raw.endswith("\r") else raw
            if not line:
                continue
            if line.startswith("#%"):
                self._header(line, number)
                group = group or number
                if group_profile is None and line.startswith("#%profile"):
                    group_profile = self._profile(line, number)
                continue
            if line.startswith("#"):
                continue
            if not line.strip() or line.lstrip().startswith("#"):
                raise ManifestError(_indented_line(), line=number)
            if group and not group_profile:
                if rows_seen:
                    raise ManifestError(_between_rows(number), line=group)
                if self.profile_if_headed:
                    raise ManifestError(_before_rows(number), line=group)
            group, group_profile, rows_seen = 0, None, True
            if not self._settled:
                if self.profile_needed is not None and self.kind is None:
                    raise ManifestError(_no_batch_profile(self.profile_needed), line=number)
                self._settle()
            if self._headers_only:
                return
            if self.most_rows is not None and self.count >= self.most_rows:
                raise TooManyRows(self.most_rows, line=number)
            self.count += 1
            if self._cells:
                yield _parse_row(line, self.fields, number, shared, self.profile_if_headed)
        if not self._settled:
            self._settle()  # a manifest without rows: its headers are judged all the same
        if not self._headers_only:
            _check_last_line(previous, last, number)

    def _settle(self) -> None:
        """Fix the columns rows are read by: those of the manifest's kind, as Merritt reads
        them, when the kind is known; a ``#%fields`` line that says otherwise is refused."""
        self._settled = True
        kind = self.kind
        if kind is None and self.only is not None and len(self.only) == 1:
            kind = self.only[0]
        if kind is None:
            return  # no kind: the #%fields line's names, else the object manifest's columns
        merritt = MERRITT_COLUMNS[kind]
        if not self._fields_line:
            self.fields = merritt
            return
        problem = columns_problem(kind, self.fields)
        if problem:
            raise ManifestError(problem, line=self._fields_line)
        # Merritt's spelling of the columns it reads (``nie:mimeType`` is its MIME type too).
        self.fields = (*merritt[: len(self.fields)], *self.fields[len(merritt) :])

    def _header(self, line: str, number: int) -> str:
        """Take in a ``#%`` line; its name (``profile``, ``eof``, ...), folded."""
        parts = [p.strip() for p in line[2:].split("|")]
        name = parts[0].lower()
        if name == "fields":
            if self._settled:
                # Merritt's readers take their columns once, before the first row.
                raise ManifestError("a #%fields line after the first row", line=number)
            columns = tuple(parts[1:])
            if len(columns) > MAX_COLUMNS:
                # Every row is padded to the columns: 20,000 of them over 2,000 short rows
                # (0.2 MB) took 2.7 GB.
                raise ManifestError(
                    f"#%fields names {len(columns):,} columns; at most {MAX_COLUMNS}",
                    line=number,
                )
            if not columns or any(not c for c in columns):
                raise ManifestError("#%fields names an empty column", line=number)
            if "nfo:fileurl" not in (c.lower() for c in columns):
                raise ManifestError("#%fields has no nfo:fileUrl column", line=number)
            self.fields = columns
            self._fields_line = number
        elif name == "prefix" and len(parts) >= 3:
            self.prefixes.append((parts[1], parts[2]))
        # Other headers (#%checkm_0.7, #%eof, future ones) carry nothing we act on here; a
        # profile line is read by ``_profile``, when it is the one Merritt's reader reads.
        return name

    def _profile(self, line: str, number: int) -> bool:
        """Take in a gathering's first line starting ``#%profile`` (as written), as Merritt's
        reader takes it (mrt-core2 ``Checkm.handleHeaders``, ``squeezeHeader``): the profile
        follows ``#%profile `` and the spaces and ``|`` after it, to the end of the line, white
        space squeezed out (``StringUtil.squeeze``), which must be one Merritt's reader takes
        (``merritt_profile_kind``), of a kind ``only`` names (else, in a depositor's manifest,
        one Merritt's ingest reads; in others, any). Whether the line names one: without the
        space it names none."""
        if not line.startswith("#%profile "):
            return False
        profile = line[len("#%profile ") :].lstrip(" |")
        if not profile:  # squeezeHeader: INVALID_DATA_FORMAT "invalid format for #%profile"
            raise ManifestError("#%profile without a URL", line=number)
        kind = merritt_profile_kind(profile)
        allowed = self.only or (INGEST_KINDS if self.profile_if_headed else tuple(MERRITT_PROFILES))
        if kind is None:
            raise ManifestError(_not_merritts_profile(profile, allowed), line=number)
        if kind not in allowed:
            wanted = " or ".join(allowed)
            raise ManifestError(f"a {wanted} is needed here, got {kind}", line=number)
        if self.profile_if_headed and kind in _BATCH_KINDS and kind not in profile:
            # mrt-ingest HandlerDisaggregate.getObjectType: the profile as written must hold
            # the kind's name, or the batch fails at its first row.
            raise ManifestError(_batch_kind_split(profile, kind), line=number)
        profile = _SQUEEZED.sub("", profile)
        if self._settled and kind != self.kind:
            raise ManifestError(
                f"a #%profile of {kind} after the first row, which was read as "
                f"{self.kind or 'a manifest without #%profile'}",
                line=number,
            )
        self.profile, self.kind = profile, kind
        return True


def _lines(text: AnyStr) -> Iterator[AnyStr]:
    """The lines of ``text``, one at a time (a list of a million of them took as much memory as
    the text). Only "\n" ends a line: str.splitlines() would also split on characters such as
    U+2028 inside a title, and writer and reader must agree on what a line is."""
    newline: Any = "\n" if isinstance(text, str) else b"\n"
    start = 0
    while (end := text.find(newline, start)) >= 0:
        yield text[start:end]
        start = end + 1
    yield text[start:]


def _decoded_lines(data: bytes) -> Iterator[str]:
    """``_lines`` of UTF-8 bytes, each line decoded on its own (a byte 0x0A is never part of
    another character in UTF-8)."""
    for number, raw in enumerate(_lines(data), start=1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ManifestError(
                f"not valid UTF-8 (byte 0x{raw[exc.start]:02x})", line=number
            ) from None


def _not_merritts_profile(profile: str, kinds: Sequence[str]) -> str:
    urls = ", ".join(url for kind in kinds for url in MERRITT_PROFILES[kind])
    return (
        f"#%profile {profile!r} is none of the profiles Merritt's reader takes here, which "
        "compares the whole URL as written, white space aside (http, not https; no '/' or "
        f"'?...' after it; case as given): {urls}"
    )


def _batch_kind_split(profile: str, kind: str) -> str:
    return (
        f"#%profile {profile!r}: white space inside {kind}: Merritt's ingest reads the profile "
        "without it, but takes each object's type from the profile as written, and fails the "
        f"batch when that does not hold {kind!r}"
    )


def _indented_line() -> str:
    return (
        "a line starting with white space, holding nothing else or going on with '#': "
        "Merritt's ingest takes a #% line or a comment only where '#' is the line's first "
        "character, and reads any other line as a row, which this one cannot be"
    )


def _no_batch_profile(kind: str) -> str:
    return (
        "the batch manifest names no #%profile before its first row: Merritt's ingest takes "
        "the type of each object of a batch from it and fails the batch without one; this "
        f"submission needs '#%profile | {profile_url(kind)}' before the first row"
    )


def _before_rows(row: int) -> str:
    return (
        f"#% lines before the first row (line {row}), without a #%profile among them: "
        "Merritt's ingest reads the #% lines before a row as the manifest's headers, and "
        "refuses the whole manifest when they name no #%profile (a line starting "
        "'#%profile ', in lower case); a manifest with no #% line before its first row is read"
    )


def _between_rows(row: int) -> str:
    return (
        f"#% lines between rows, before the row on line {row}, without a #%profile among them: "
        "Merritt's ingest reads the #% lines before each row as a new set of headers, and "
        "refuses the whole manifest for one without a #%profile (a #%eof before the end of the "
        "rows is one)"
    )


# Java's readLine ends a line at "\r\n", "\n" or "\r"; Merritt's reader judges the last one.
_JAVA_LINE_END = re.compile(r"\r\n|\r|\n")


def _check_last_line(previous: str | None, last: str | None, number: int) -> None:
    """Refuse a manifest whose last line, as Merritt's reader (mrt-core2 Manifest, by Java's
    readLine) reads it, does not start ``#%eof``; ``previous`` and ``last``: the last two
    pieces of the text cut at "\n", ``number`` the last one's."""
    if previous is None and not last:
        raise ManifestError("the manifest is empty: Merritt refuses an empty manifest", line=1)
    tail = (last or "") if previous is None else f"{previous}\n{last}"
    if not last:
        number -= 1  # the text ends with a line break: the line before it is the last
    for end in ("\r\n", "\n", "\r"):
        if tail.endswith(end):
            tail = tail[: -len(end)]
            break
    final = _JAVA_LINE_END.split(tail)[-1]
    if not final.lower().startswith("#%eof"):
        raise ManifestError(
            "the last line is not #%eof: Merritt's ingest and storage refuse a manifest that "
            "does not end with a #%eof line (nothing after it, not even an empty line)",
            line=number,
        )


def _dec(value: str) -> str:
    """A cell as Merritt's reader takes it (mrt-core2 ``Checkm.dec``): ``%20`` is a space and
    ``%7c`` (lower case only) a ``|``; no other escape means anything."""
    return value.replace("%20", " ").replace("%7c", "|")


# Where mrt-core2's Checkm.setRow cuts a row: at a "|" and Java's \s (ASCII white space only)
# on either side of it.
_MERRITT_BAR = re.compile(r"[ \t\n\x0b\f\r]*\|[ \t\n\x0b\f\r]*")
# What java.net.URL drops at either end of the text it is made from (every character up to
# the space), and so Merritt's reader around a row's URL.
_URL_ENDS = "".join(map(chr, range(0x21)))
# The columns whose value Merritt's reader keeps with the white space at its ends, where the
# console trimmed it: a URL, a name, a digest, a size or an identifier read otherwise on the two
# sides is refused rather than read (the MIME type, dates and descriptions are trimmed).
_KEPT_AS_CUT = frozenset(
    {"url", "hash_alg", "hash_value", "size", "filename", "primary_id", "local_id"}
)


def _parse_row(
    line: str, columns: Sequence[str], number: int, shared: dict[str, str], depositors: bool
) -> ManifestRow:
    """A row, cut as Merritt cuts it. A value of ``_KEPT_AS_CUT`` that Merritt keeps with white
    space at an end is refused in a depositor's manifest (``depositors``) and read as Merritt
    reads it in others (a name in a manifest Merritt's storage wrote is the file's name there);
    the other values are trimmed."""
    values = _MERRITT_BAR.split(line)
    if len(values) > len(columns):
        # A trailing "|" leaves empty extra cells; only real data beyond the columns is an error.
        if any(v.strip() for v in values[len(columns) :]):
            raise ManifestError(
                f"{len(values)} fields but #%fields declares {len(columns)}", line=number
            )
        values = values[: len(columns)]
    values += [""] * (len(columns) - len(values))
    known: dict[str, str] = {}
    extra: list[tuple[str, str]] = []
    for column, value in zip(columns, values, strict=True):
        key = _FIELD_KEYS_FOLDED.get(column.lower())
        if key == "url":
            value = value.strip(_URL_ENDS)
        if value != value.strip():
            if key not in _KEPT_AS_CUT:
                value = value.strip()
            elif depositors:
                raise ManifestError(_kept_white_space(column, value), line=number)
        if "%" in value and key != "url":  # Merritt decodes every cell but the URL
            value = _dec(value)
        if key is None:
            extra.append((column, value))
        else:
            known[key] = value
    url = known.get("url", "")
    _check_url(url, number)
    hash_alg = known.get("hash_alg", "").lower()
    hash_alg = shared.setdefault(hash_alg, hash_alg)
    hash_value = known.get("hash_value", "").lower()
    _check_hash(hash_alg, hash_value, number)
    size = _parse_size(known.get("size", ""), number)
    filename = known.get("filename", "")
    _check_filename(filename, number)
    mime_type = known.get("mime_type", "")
    mime_type = shared.setdefault(mime_type, mime_type)
    return ManifestRow(
        url=url,
        hash_alg=hash_alg,
        hash_value=hash_value,
        size=size,
        last_modified=known.get("last_modified", ""),
        filename=filename,
        mime_type=mime_type,
        primary_id=known.get("primary_id", ""),
        local_id=known.get("local_id", ""),
        creator=known.get("creator", ""),
        title=known.get("title", ""),
        date=known.get("date", ""),
        extra=tuple(extra),
        line=number,
    )


def _kept_white_space(column: str, value: str) -> str:
    return (
        f"the {column} cell {value!r} begins or ends with white space, which Merritt's ingest "
        "keeps there (it trims only spaces, tabs and line breaks next to a '|', and around a "
        "URL only the characters up to the space): it would read another value than the one "
        "read here; remove it (a space meant at either end of a value is written %20)"
    )


def _check_url(url: str, number: int) -> None:
    if not url:
        raise ManifestError("missing file URL", line=number)
    shown = url_shown(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ManifestError(f"malformed URL {shown!r}", line=number) from None
    if parts.scheme.lower() not in URL_SCHEMES:
        raise ManifestError(f"unsupported URL scheme in {shown!r}", line=number)
    if parts.scheme.lower() in {"http", "https"} and not parts.netloc:
        raise ManifestError(f"URL without a host: {shown!r}", line=number)
    if any(not c.isprintable() or c.isspace() for c in parts.netloc):
        # The fetch refuses it too ("127.0.0.1\x00.example" resolved to the text before the
        # NUL); here it is refused with its line, before any job is made.
        raise ManifestError(
            f"the host of {shown!r} contains a control character or a space", line=number
        )
    if parts.scheme.lower() == "file" and not parts.path:
        raise ManifestError(f"file URL without a path: {shown!r}", line=number)


def hash_problem(alg: str, value: str) -> str | None:
    """Why a digest (``alg`` as the console names it, lower case, and ``value``) cannot be
    right, or None: an algorithm not in HASH_LENGTHS, a value without an algorithm, a value
    that is not hex digits of the algorithm's length. The one rule for a manifest row's digest
    and a submission's."""
    if alg and alg not in HASH_LENGTHS:
        return f"unsupported hash algorithm {alg!r}"
    if not value:
        return None
    if not alg:
        return "hash value without a hash algorithm"
    if not _HEX.match(value) or len(value) != HASH_LENGTHS[alg]:
        return f"{alg} value must be {HASH_LENGTHS[alg]} hex digits, got {value!r}"
    return None


def _check_hash(alg: str, value: str, number: int) -> None:
    problem = hash_problem(alg, value)
    if problem:
        raise ManifestError(problem, line=number)


def _parse_size(value: str, number: int) -> int | None:
    if not value:
        return None
    size = digits(value)
    if size is None:
        raise ManifestError(f"file size {value!r} is not a whole number", line=number)
    if size > LONG_MAX:  # Merritt's ingest reads a size as a Java long
        raise ManifestError(f"file size {value!r} is larger than {LONG_MAX:,}", line=number)
    return size


def _check_filename(name: str, number: int) -> None:
    if not name:
        return
    problem = filename_problem(name)
    if problem:
        raise ManifestError(f"file name {name!r} {problem}", line=number)


# Characters that reorder how text is shown (U+202E makes "gpj.exe" read as "exe.jpg"): the
# embeddings, overrides and isolates, which no title needs, and with the marks (U+061C, U+200E,
# U+200F, which right-to-left text may carry) all a file name is refused for.
BIDI_OVERRIDES = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
BIDI_CONTROLS = BIDI_OVERRIDES | frozenset("\u061c\u200e\u200f")


# Unicode gives control characters no names; these are the ones a depositor meets.
_CONTROL_NAMES = {
    "\x00": "NUL",
    "\t": "TAB",
    "\n": "LINE FEED",
    "\x0b": "LINE TABULATION",
    "\x0c": "FORM FEED",
    "\r": "CARRIAGE RETURN",
    "\x1b": "ESCAPE",
    "\x7f": "DELETE",
    "\x85": "NEXT LINE",
}


def _char_words(char: str) -> str:
    """``U+2028 (LINE SEPARATOR)``: a character named the way Unicode names it."""
    name = unicodedata.name(char, "") or _CONTROL_NAMES.get(char, "")
    return f"U+{ord(char):04X} ({name})" if name else f"U+{ord(char):04X}"


# A file name's whole length in UTF-8 (4,000 characters of "a/" made the download's folders
# recurse past Python's limit; 1,023 characters of four bytes each, in parts of 252 bytes, made
# a path past Linux's PATH_MAX of 4,096 bytes, whatever the working folder), and one part's,
# which Linux's file systems hold to 255 bytes. With at most 1,024 bytes a name leaves 3,000
# bytes of a path for MRT_WORK_DIR and the job's own folders.
MAX_NAME_BYTES = 1024
MAX_PART_BYTES = 255


def text_problem(text: str, *, bidi: frozenset[str] = BIDI_OVERRIDES) -> str | None:
    """Why ``text`` cannot be one line of text as given, or None: it holds a control character
    (C0, DEL, C1), a line or paragraph separator, half a surrogate pair, or one of ``bidi``
    (the characters that reorder how text is shown, disguising it). The rule for a file name
    and for a submission's free text alike; the words follow "the title " or "file name 'x' "."""
    # Printable ASCII has none of the characters looked for below (controls are not printable;
    # the others are not ASCII): most texts skip the loop, a third of a manifest's parse.
    for char in () if text.isascii() and text.isprintable() else text:
        kind = unicodedata.category(char)
        if kind == "Cc":
            # C0, DEL and C1: line breaks, tabs, NEL (U+0085), the file separators that
            # str.splitlines also splits at.
            return f"contains the control character {_char_words(char)}"
        if kind in ("Zl", "Zp"):
            return f"contains {_char_words(char)}, which splits a log or manifest line"
        if kind == "Cs":
            return f"contains {_char_words(char)}, half of a surrogate pair, not a character"
        if char in bidi:
            return f"contains the bidirectional-text control character {_char_words(char)}"
    return None


def filename_problem(name: str) -> str | None:
    """Why ``name`` cannot be a path inside an object, or None when it can.

    The one rule for file names, applied at every door (the console's form, the API,
    ``submitbatch``), to manifest rows and to container members alike.
    """
    if "\\" in name:
        # Merritt's ingest keeps a backslash as a character of the name (java.io.File on
        # Linux), where a Windows reading makes it a folder: refused, the object would be named
        # otherwise here than there (docs/merritt-services.md, "File names in an object").
        return (
            "contains '\\', which Merritt keeps as part of the name, not as a folder: "
            "write folders with '/'"
        )
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "is absolute"
    if "%20" in name or "%7c" in name:
        # Merritt's manifests cannot carry them: its reader decodes them in every manifest,
        # its writer leaves them as they are (mrt-core2 Checkm.dec, Checkm.enc).
        return (
            "contains '%20' or '%7c', which Merritt's manifests read as a space and a '|': "
            "stored by Merritt's storage, the file would be named otherwise"
        )
    problem = text_problem(name, bidi=BIDI_CONTROLS)
    if problem:
        return problem
    # The parts as PurePosixPath gives them for a relative name, without its interning every
    # part (the interpreter's table of them grew by a million entries for a million-file
    # manifest).
    parts = [p for p in name.split("/") if p and p != "."]
    if ".." in parts:
        return "contains '..'"
    if name and not parts:
        return "names no file (only '.' and '/')"
    if len(name) > MAX_NAME_BYTES or (not name.isascii() and len(name.encode()) > MAX_NAME_BYTES):
        return f"is longer than {MAX_NAME_BYTES:,} bytes in UTF-8"
    if any(len(part.encode()) > MAX_PART_BYTES for part in parts):
        return f"has a part longer than {MAX_PART_BYTES} bytes, more than a file system holds"
    return None


def same_file_key(name: str) -> str:
    """What two names of one file have in common: "a", "./a" and "a/" are one file."""
    return "/".join(PurePosixPath(name).parts)


class ObjectNames:
    """The file names of one object, each added as its manifest names it: ManifestError for a
    name that names a file given before (``same_file_key``), and for one that is a file and a
    folder at once (``a`` and ``a/b``). Merritt's ingest downloads each row to
    ``new File(producer, name)``, its folders made first, and refuses a file that exists: such
    an object failed there as a "Duplicate filename", and here with whatever the disk said
    first ("File exists", "Is a directory"), after every other file was downloaded
    (docs/merritt-services.md, "File names in an object")."""

    def __init__(self) -> None:
        self.files: dict[str, int] = {}  # key -> the line that named it
        self.folders: dict[str, int] = {}  # every folder a name makes -> its first line

    def add(self, name: str, line: int) -> None:
        key = same_file_key(name)
        if key in self.files:
            raise ManifestError(
                f"file name {name!r} already used on line {self.files[key]}", line=line
            )
        if key in self.folders:
            raise ManifestError(
                f"file name {name!r} is the folder of the file on line {self.folders[key]}: "
                "one name cannot be a file and a folder",
                line=line,
            )
        cut = key.find("/")
        while cut != -1:
            folder = key[:cut]
            if folder in self.files:
                raise ManifestError(
                    f"file name {name!r} puts a file under {folder!r}, the file on line "
                    f"{self.files[folder]}: one name cannot be a file and a folder",
                    line=line,
                )
            self.folders.setdefault(folder, line)
            cut = key.find("/", cut + 1)
        self.files[key] = line


def write_checkm(
    rows: Iterable[ManifestRow | Mapping[str, object]],
    *,
    kind: str = OBJECT_MANIFEST,
    columns: Sequence[str] | None = None,
) -> str:
    """Write rows as a checkm manifest that :func:`parse_checkm` reads back unchanged.

    ``rows`` are ManifestRow objects or mappings with ManifestRow attribute names. ``columns``
    defaults to the columns Merritt reads for ``kind`` (``MERRITT_COLUMNS``); given, they must
    begin with those, in order (``columns_problem``). Cells other than the URL are written as
    Merritt writes them (``_cell``), so that Merritt's readers and ours take them back as they
    were; values that checkm cannot carry raise ValueError rather than being mangled. The last
    line is ``#%eof``, which Merritt's readers require.
    """
    if kind not in MANIFEST_KINDS:
        raise ValueError(f"unknown manifest kind {kind!r}")
    if columns is None:
        columns = MERRITT_COLUMNS[kind]
    lines = [
        "#%checkm_0.7",
        f"#%profile | {profile_url(kind)}",
        *(f"#%prefix | {p}: | {uri}" for p, uri in PREFIXES.items()),
        "#%fields | " + " | ".join(columns),
    ]
    row_keys = {f.name for f in fields(ManifestRow)}
    for row in rows:
        values = _row_values(row, row_keys)
        cells = []
        for column in columns:
            key = _FIELD_KEYS_FOLDED.get(column.lower())
            extra = values.get("extra")
            value = values.get(key) if key else (extra or {}).get(column)  # type: ignore[attr-defined]
            cells.append(_cell(value, column))
        lines.append(" | ".join(cells).rstrip())
    lines.append("#%eof")
    text = "\n".join(lines) + "\n"
    # Re-reading is cheap and guarantees we never hand storage a manifest we would reject.
    parse_checkm(text)
    return text


def _row_values(row: ManifestRow | Mapping[str, object], row_keys: set[str]) -> dict[str, object]:
    if isinstance(row, ManifestRow):
        values: dict[str, object] = {k: getattr(row, k) for k in row_keys}
        values["extra"] = dict(row.extra)
        return values
    unknown = set(row) - row_keys
    if unknown:
        raise ValueError(f"unknown manifest row keys: {sorted(unknown)}")
    values = dict(row)
    values["extra"] = dict(values.get("extra") or ())  # type: ignore[call-overload]
    return values


def _cell(value: object, column: str) -> str:
    """A value as a cell, encoded as mrt-core2's ``Checkm.enc`` encodes it: each ``|`` as
    ``%7c``, a space that begins or ends it as ``%20``. Merritt's reader (``Checkm.dec``)
    decodes those two escapes in every cell but the URL, which is written as it is. So a line
    break, a URL with a ``|`` or with spaces around it, any other space character around a
    value, and a value holding ``%20`` or ``%7c`` (which would be read back decoded) cannot be
    carried: ValueError."""
    if value is None:
        return ""
    text = cell = str(value)
    if _FIELD_KEYS_FOLDED.get(column.lower()) != "url":
        carried = "%20" not in text and "%7c" not in text  # else read back as " " and "|"
        cell = text.replace("|", "%7c")
        if cell.startswith(" "):
            cell = "%20" + cell[1:]
        if cell.endswith(" "):
            cell = cell[:-1] + "%20"
    else:
        carried = "|" not in text
    if not carried or "\n" in cell or "\r" in cell or cell != cell.strip():
        raise ValueError(f"{column} value {text!r} cannot be written to a checkm manifest")
    return cell
