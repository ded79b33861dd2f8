"""A stand-in of Merritt's ingest door (``POST /poster/submit``) as Merritt's ingest reads it:
the form fields it reads, its package types, the upload it keeps (``PosterUpload``) and
``IngestPosterStandIn``, which answers as ingest does (docs/merritt-poster.md).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

from queues.chaos.standins import Answer, Request, StandIn, exception_document
from queues.steps.checkm import parse_checkm
from queues.steps.erc import DC_NAMES

BATCH_NS = "http://uc3.cdlib.org/ontology/mrt/ingest/batch"
# The form fields Merritt's ingest door reads (mrt-ingest JerseyBase.getFormData, ccc78fe2),
# and ``retainTargetURL``, which the current one reads too (Merritt's UI forwards it to
# ``poster/submit``; ``IngestRequest.setRetainTargetURL``). Any other field is logged as not
# supported and ignored. docs/merritt-poster.md has the sources.
INGEST_FIELDS = frozenset(
    {
        "submitter",
        "object",
        "profile",
        "filename",
        "type",
        "size",
        "digestType",
        "digestValue",
        "creator",
        "title",
        "date",
        "localIdentifier",
        "primaryIdentifier",
        "note",
        "erc",
        "notification",
        "responseForm",
        "notificationFormat",
        "DataCite.resourceType",
        "synchronousMode",
        "retainTargetURL",
        *(f"DC.{name}" for name in DC_NAMES),
    }
)


# Ingest's form ``type`` names (JerseyBase maps the hyphenated ones onto PackageTypeEnum).
INGEST_TYPES = {
    "file": "file",
    "container": "container",
    "manifest": "manifest",
    "batchManifest": "batchManifest",
    "batchManifestFile": "batchManifestFile",
    "batchManifestContainer": "batchManifestContainer",
    "object-manifest": "manifest",
    "single-file-batch-manifest": "batchManifestFile",
    "container-batch-manifest": "batchManifestContainer",
    "batch-manifest": "batchManifest",
}


JAVA_INT_MAX = 2**31 - 1


def java_url_file(url: str) -> str:
    """``java.net.URL.getFile()``: the path and the query, as written in the URL."""
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


@dataclass
class PosterUpload:
    """One ``POST /poster/submit`` as Merritt's ingest read it: its form fields, the uploaded
    file's name and bytes, the batch ID ingest minted for it, and the fields it ignored."""

    batch_id: str
    fields: dict[str, str]
    filename: str
    content: bytes
    ignored: list[str] = field(default_factory=list)

    def stored_names(self) -> list[str]:
        """The names ingest gives the files a manifest upload lists: a row's ``fileName``, else
        one made of its URL, as each of ingest's handlers makes it. An object manifest
        (``manifest``): ``download/HandlerRetrieve`` downloads to ``url.getFile()`` without its
        leading ``/`` (folders and query included). A batch manifest:
        ``queue/HandlerDisaggregate.unpack`` takes ``url.getFile()`` with every ``/`` removed."""
        kind = INGEST_TYPES.get(self.fields.get("type", ""), "")
        if kind not in ("manifest", "batchManifest", "batchManifestFile", "batchManifestContainer"):
            return [self.filename]
        names = []
        for row in parse_checkm(self.content).rows:
            if row.filename:
                names.append(row.filename)
            elif kind == "manifest":
                names.append(java_url_file(row.url).removeprefix("/"))
            else:
                names.append(java_url_file(row.url).replace("/", ""))
        return names


class IngestPosterStandIn(StandIn):
    """Merritt's ingest service's depositor door (docs/merritt-poster.md, mrt-ingest
    ``JerseyBase``): a multipart ``POST <context>/poster/submit`` (or ``update``) with one
    uploaded file and the form fields. As ingest's ``getFormData``, it keeps the fields of
    ``INGEST_FIELDS`` and ignores any other (listed in the upload's ``ignored``), refuses a
    ``size`` that is not a Java ``int`` (``new Integer(size)``: ``INVALID_OR_MISSING_PARM``) and
    names the upload by its ``filename`` field, else the part's own file name. It mints
    ``bid-<uuid>``, hands the upload to ``accept`` (which writes the batch into the queue, as
    ingest does before it answers) and answers the batch state in the ``responseForm`` asked
    for (XML by default), ``batchStatus`` ``QUEUED``; a missing profile, submitter or file is
    refused with ``REQUEST_INVALID``. ``trickle`` (seconds a byte) makes it send the status
    line and headers of its answers that slowly, once the batch is written."""

    name = "ingest"

    def __init__(self, accept: Callable[[PosterUpload], None], context: str = "/ingest") -> None:
        super().__init__()
        self.accept = accept
        self.context = context
        self.uploads: list[PosterUpload] = []
        self.trickle = 0.0

    @staticmethod
    def parse(request: Request) -> tuple[dict[str, str], str, bytes] | None:
        head = f"Content-Type: {request.headers.get('Content-Type', '')}\r\n\r\n".encode()
        message = BytesParser(policy=HTTP).parsebytes(head + request.body)
        if not message.is_multipart():
            return None
        fields: dict[str, str] = {}
        filename, content = "", b""
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            raw = payload if isinstance(payload, bytes) else b""
            if part.get_filename():
                filename, content = str(part.get_filename()), raw
            elif name:
                fields[str(name)] = raw.decode("utf-8")
        return fields, filename, content

    def handle(self, request: Request) -> Answer:
        verbs = (f"{self.context}/poster/submit", f"{self.context}/poster/update")
        if request.method != "POST" or request.path not in verbs:
            return exception_document("REQUESTED_ITEM_NOT_FOUND", f"no route {request.path}")
        parsed = self.parse(request)
        if parsed is None:
            return exception_document("REQUEST_INVALID", "not a multipart form")
        sent, filename, content = parsed
        fields = {k: v for k, v in sent.items() if k in INGEST_FIELDS}
        ignored = sorted(k for k in sent if k not in INGEST_FIELDS)
        form = fields.get("responseForm", "xml")
        size = fields.get("size")
        if size is not None and not (
            re.fullmatch(r"[+-]?[0-9]+", size) and abs(int(size)) <= JAVA_INT_MAX
        ):
            return exception_document(
                "INVALID_OR_MISSING_PARM",
                "JerseyBase: Could not process form field: size",
                form=form,
            )
        for needed in ("profile", "submitter"):
            if not fields.get(needed):
                return exception_document("REQUEST_INVALID", f"{needed} missing", form=form)
        if not filename:
            return exception_document("REQUEST_INVALID", "no file uploaded", form=form)
        filename = fields.get("filename") or filename
        upload = PosterUpload(f"bid-{uuid.uuid4()}", fields, filename, content, ignored)
        self.accept(upload)
        with self.lock:
            self.uploads.append(upload)
        state = {
            "batchID": upload.batch_id,
            "batchStatus": "QUEUED",
            "userAgent": fields["submitter"],
            "submissionDate": "2026-11-21T10:02:03-08:00",
            "jobStates": "",
        }
        if form == "json":
            body = {
                "bat:batchState": {
                    "xmlns:bat": BATCH_NS,
                    **{f"bat:{k}": v for k, v in state.items()},
                }
            }
            return Answer(200, json.dumps(body).encode(), "application/json", trickle=self.trickle)
        inner = "".join(f"<bat:{k}>{escape(v)}</bat:{k}>" for k, v in state.items())
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<bat:batchState xmlns:bat="{BATCH_NS}">{inner}</bat:batchState>'
        )
        return Answer(200, xml.encode(), trickle=self.trickle)
