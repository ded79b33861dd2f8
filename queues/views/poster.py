"""``POST /poster/submit`` and ``/poster/update``: Merritt ingest's door for depositor tools.

What Merritt's own door takes and answers is in docs/merritt-poster.md, with its sources. Here:

* **Authentication** by the console's API token, checked by the same code as the API's
  (``queues.operator.auth.token_from``, ``ApiToken.find``): ``Authorization: Bearer KEY``, or HTTP
  Basic with the key as the password (the user name, when given, must be the token's user), which is
  how Merritt's depositor tools send credentials. A session cookie is never enough, which is
  why the view may be CSRF-exempt. The user needs the role of the ``("batch", "submit")``
  action; refusals are audited like every other action's.
* **The batch** is made by the very action the console's /submit/ page and the API run
  (``actions.perform(kind="batch", action="submit")`` with ``SubmitForm``'s checks), so every
  rule of those doors (profile, submitter, type, digest, payload URL policy) applies here too.
* **The payload** is either a ``url`` field (this console's addition: Merritt's door takes an
  uploaded file only) or one uploaded file, written under
  ``MRT_WORK_DIR/poster/<batchID>/<filename>`` (never outside: the name is one path part, no
  ``..``) and handed on as its file:// URL. ``MRT_POSTER_MAX_BYTES`` caps an upload (413). The
  daemons read file:// payloads only under ``MRT_FILE_ROOTS``: an upload is accepted only when
  that includes ``MRT_WORK_DIR/poster``.
* **Merritt's own fields** ``erc`` (the depositor's EZID metadata), ``retainTargetURL`` and
  ``size`` are kept in the batch's submission under Merritt's keys, and so reach each job's
  configuration, where Processing reads ``erc`` and ``retainTargetURL`` for EZID.
* **The answer** is Merritt's batch-state document in the ``responseForm`` field's format (else
  the Accept header's, else XML): ``bat:batchState`` with ``batchID`` (``bid-<uuid>``, which the
  batch's ``submission`` carries as ``batchID``), ``batchStatus`` ``QUEUED``, ``userAgent``,
  ``submissionDate``, ``updateFlag`` and an empty ``jobStates``; the ZooKeeper batch ID is in
  the ``X-Batch-ID`` header and ``Location``. Errors are Merritt's exception document
  (``exc:tException.<NAME>`` with ``statusName``, ``statusDescription``, ``error``, ``detail``).
* **Beside Merritt with ``MRT_BATCH_INTAKE=merritt``** the same action sends the submission on
  to Merritt ingest's own door (``queues.steps.merritt_ingest_client``), every field the
  depositor gave with it, and the answer is ingest's batch state: its own XML document, or its
  elements in the JSON or ANVL asked for; its ``batchID`` is the one ingest wrote into the
  queue. The upload kept here to send it is removed once ingest has it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import HttpRequest, HttpResponse
from django.urls import re_path, reverse
from django.views.decorators.csrf import csrf_exempt

from queues.operator import actions
from queues.operator.audit import ApiToken
from queues.operator.auth import BEARER_CHALLENGE, may, token_from
from queues.services.depositors import payload_roots
from queues.steps import uploads
from queues.steps.checkm import filename_problem as object_filename_problem
from queues.steps.checkm import text_problem
from queues.steps.erc import DC_ELEMENTS
from queues.steps.merritt import MERRITT_TYPES, canonical_type
from queues.steps.merritt_ingest_client import IngestRefused, IngestUnavailable
from queues.steps.submission import size_number
from queues.views.common import refusal_for
from queues.web.forms import SubmitForm

log = logging.getLogger("queues.poster")

BATCH_NS = "http://uc3.cdlib.org/ontology/mrt/ingest/batch"
EXC_NS = "http://uc3.cdlib.org/ontology/mrt/core/exc"

# The type names the door takes: Merritt's and ours (queues/steps/merritt.py maps them).
TYPES = tuple(dict.fromkeys([*MERRITT_TYPES.values(), *MERRITT_TYPES]))

# The Dublin Core fields the door takes: those ingest writes, and DCrights, which it accepts too.
DC_NAMES = (*DC_ELEMENTS, "rights")

# Fields kept in the batch submission under the key Merritt's ingest uses for them.
PASSED_ON = {
    "note": "note",
    "notification": "notification",
    "notificationFormat": "notificationFormat",
    "responseForm": "responseForm",
    "DataCite.resourceType": "DataCiteResourceType",
    **{f"DC.{name}": f"DC{name}" for name in DC_NAMES},
}

# Merritt's exception kinds used here: (status description, HTTP status).
EXCEPTIONS = {
    "REQUEST_INVALID": ("User/request supplied required parm is missing or invalid", 400),
    "USER_NOT_AUTHENTICATED": ("User not authenticated", 401),
    "USER_NOT_AUTHORIZED": ("User not authorized", 403),
    "REQUEST_ELEMENT_UNSUPPORTED": ("User/request supplied parm type is not supported", 501),
    "EXTERNAL_SERVICE_UNAVAILABLE": ("Unavailable remote service", 503),
    # Relayed from Merritt's ingest (MRT_BATCH_INTAKE=merritt), as its door answers them.
    "INVALID_OR_MISSING_PARM": ("Program required parm is missing or invalid", 500),
    "GENERAL_EXCEPTION": ("Unexpected Programmic exception", 500),
}

FORMS = {"xml": "text/xml", "json": "application/json", "anvl": "text/x-anvl"}

# The depositor's own EZID metadata (``erc``) rides in the batch and each job's ZooKeeper node,
# which must stay far below ZooKeeper's 1 MiB.
MAX_ERC_CHARS = 16 * 1024


class Refused(Exception):
    def __init__(self, message: str, name: str = "REQUEST_INVALID", status: int | None = None):
        super().__init__(message)
        self.name = name
        self.status = status or EXCEPTIONS[name][1]


# Answers -----------------------------------------------------------------------------------


def response_form(request: HttpRequest, asked: str = "") -> str:
    """The ``responseForm`` field, else the Accept header, else xml (unknown names: xml)."""
    asked = asked.strip().lower()
    if asked:
        return "json" if asked == "json2" else asked if asked in FORMS else "xml"
    accept = request.META.get("HTTP_ACCEPT", "")
    for form, mime in FORMS.items():
        if mime in accept:
            return form
    return "xml"


def _document(root: str, prefix: str, ns: str, fields: list[tuple[str, Any]], form: str) -> str:
    if form == "json":
        body: dict[str, Any] = {f"xmlns:{prefix}": ns}
        body.update({f"{prefix}:{k}": v for k, v in fields})
        return json.dumps({f"{prefix}:{root}": body}, indent=2) + "\n"
    if form == "anvl":
        return "".join(f"{k}: {_anvl_value(_text(v))}\n" for k, v in fields)
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<{prefix}:{root} xmlns:{prefix}="{ns}">',
        *(f"  <{prefix}:{k}>{escape(_text(v))}</{prefix}:{k}>" for k, v in fields),
        f"</{prefix}:{root}>",
    ]
    return "\n".join(lines) + "\n"


def _anvl_value(text: str) -> str:
    """``text`` as one ANVL value: a line break in it (outside text, such as what Merritt's
    ingest answered) continues the value on a line that begins with white space, as ANVL
    continues a value, instead of starting a field line of its own."""
    return "\n  ".join(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"))


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _answer(body: str, form: str, status: int) -> HttpResponse:
    return HttpResponse(body, status=status, content_type=f"{FORMS[form]}; charset=utf-8")


def error_response(request: HttpRequest, exc: Refused, form: str = "") -> HttpResponse:
    form = form or response_form(request)
    description = EXCEPTIONS[exc.name][0]
    fields = [
        ("status", exc.name),
        ("statusName", exc.name),
        ("statusDescription", description),
        ("httpResponse", exc.status),
        ("error", f"{exc.name}[{description}] {exc}"),
        ("detail", str(exc)),
    ]
    response = _answer(
        _document(f"tException.{exc.name}", "exc", EXC_NS, fields, form), form, exc.status
    )
    if exc.status == 401:
        response["WWW-Authenticate"] = f'Basic realm="mrt-console", {BEARER_CHALLENGE}'
    return response


def batch_state(
    *, batch_id: str, user_agent: str, submitted: datetime, update: bool, form: str
) -> str:
    fields: list[tuple[str, Any]] = [
        ("batchID", batch_id),
        ("batchStatus", "QUEUED"),
        ("userAgent", user_agent),
        ("submissionDate", submitted.isoformat(timespec="seconds")),
        ("updateFlag", update),
        ("jobStates", ""),
    ]
    return _document("batchState", "bat", BATCH_NS, fields, form)


# Who is asking -----------------------------------------------------------------------------


def depositor_token(request: HttpRequest) -> ApiToken | None:
    """The depositor's API token (Bearer, or HTTP Basic with the key as the password), or None;
    also asked by ``mrtadmin.bodylimit`` before a large upload is read."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return token_from(request)
    try:
        user, _, key = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    token = ApiToken.find(key)
    if token is not None and user and user != token.user.get_username():
        return None
    return token


# The upload --------------------------------------------------------------------------------


def max_bytes() -> int:
    return int(settings.MRT_POSTER_MAX_BYTES)


def upload_root() -> Path:
    return uploads.upload_root(settings.MRT_WORK_DIR)


def uploads_readable() -> bool:
    """Whether the daemons may read file:// payloads in the upload folder."""
    root = upload_root()
    return any(root.is_relative_to(Path(r).resolve()) for r in payload_roots())


def filename_problem(name: str) -> str | None:
    if not name:
        return "the file has no name: give one in the filename field"
    if len(name) > 255:
        return "filename is longer than 255 characters"
    if name in (".", "..") or "/" in name or "\\" in name or ".." in name.split("."):
        return f"filename {name!r} must be a plain file name (no folders, no '..')"
    if name.startswith("."):
        return f"filename {name!r} must not start with '.'"
    # The one character rule of every door (controls, line separators, bidi controls), checked
    # before the upload is moved under this name.
    problem = object_filename_problem(name)
    return f"filename {name!r} {problem}" if problem else None


class _Capped(FileUploadHandler):
    """Writes each uploaded file straight into ``folder``, stopping past ``limit`` bytes."""

    def __init__(self, folder: Path, limit: int, request: HttpRequest | None = None) -> None:
        super().__init__(request)
        self.folder = folder
        self.limit = limit
        self.received = 0
        self.too_big = False
        self.parts: list[Path] = []
        self._handle: Any = None

    def new_file(self, *args: Any, **kwargs: Any) -> None:
        super().new_file(*args, **kwargs)
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".upload-", dir=self.folder)
        self.parts.append(Path(name))
        self._handle = os.fdopen(fd, "wb")

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        self.received += len(raw_data)
        if self.received > self.limit:
            self.too_big = True
            self._handle.close()
            raise StopUpload(connection_reset=False)
        self._handle.write(raw_data)
        return None

    def file_complete(self, file_size: int) -> UploadedFile:
        self._handle.close()
        stored = UploadedFile(file=self.parts[-1].open("rb"), name=self.file_name, size=file_size)
        stored.stored_path = self.parts[-1]  # type: ignore[attr-defined]
        return stored

    def upload_interrupted(self) -> None:
        if self._handle is not None:
            self._handle.close()


# The door ----------------------------------------------------------------------------------


def _form_data(request: HttpRequest, user: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """SubmitForm's fields and the submission's extra keys from Merritt's field names."""
    post = request.POST
    for key in post:
        if len(post.getlist(key)) > 1:
            raise Refused(f"field {key} is given more than once")
    kind = post.get("type", "").strip()
    if not kind:
        raise Refused(f"type is required: one of {', '.join(TYPES)}")
    try:
        ours = canonical_type(kind)
    except ValueError:
        raise Refused(f"type {kind!r} is not one of: {', '.join(TYPES)}") from None
    submitter = post.get("submitter", "").strip()
    if not submitter:
        full = user.get_full_name() if hasattr(user, "get_full_name") else ""
        submitter = f"{user.get_username()}/{full}" if full else user.get_username()
    digest_alg = post.get("digestType", "").strip().lower().replace("-", "")
    data = {
        "profile": post.get("profile", ""),
        "submitter": submitter,
        "submission_type": ours,
        "title": post.get("title", ""),
        "creator": post.get("creator", ""),
        "date": post.get("date", ""),
        "local_id": post.get("localIdentifier", ""),
        "primary_id": post.get("primaryIdentifier", "") or post.get("object", ""),
        "digest_alg": digest_alg,
        "digest_value": post.get("digestValue", "").strip(),
        "filename": post.get("filename", "").strip(),
    }
    extra: dict[str, Any] = {
        ours: post[theirs] for theirs, ours in PASSED_ON.items() if post.get(theirs)
    }
    for theirs in PASSED_ON:
        # Kept with the batch and shown, mailed, sent on: one line of text, as the title is.
        problem = text_problem(post.get(theirs, ""))
        if problem:
            raise Refused(f"{theirs} {problem}")
    extra.update(_merritt_extras(post))
    return data, extra


def _merritt_extras(post: Any) -> dict[str, Any]:
    """``erc``, ``retainTargetURL`` and ``size`` as Merritt's ingest keeps them: the ERC text
    as given (it is what EZID is sent for the object), ``retainTargetURL`` as ``"true"`` only
    when asked, the size as a number of bytes."""
    extra: dict[str, Any] = {}
    erc = post.get("erc", "")
    if erc.strip():
        if len(erc) > MAX_ERC_CHARS:
            raise Refused(f"erc is longer than {MAX_ERC_CHARS} characters")
        # Its lines are ANVL's ("who: ...", "what: ..."): line breaks, and nothing else of the kind.
        problem = text_problem(erc.replace("\r", " ").replace("\n", " "))
        if problem:
            raise Refused(f"erc {problem}")
        extra["erc"] = erc
    if post.get("retainTargetURL", "").strip().lower() == "true":
        extra["retainTargetURL"] = "true"
    size = post.get("size", "").strip()
    if size:
        number = size_number(size)
        if number is None:
            raise Refused(f"size {size!r} is not a number of bytes")
        extra["size"] = number
    return extra


def _submit(request: HttpRequest, verb: str, primary_id: str) -> HttpResponse:
    token = depositor_token(request)
    if token is None:
        raise Refused(
            "a valid API token is required (Authorization: Bearer KEY, or HTTP Basic with the "
            "key as password)",
            "USER_NOT_AUTHENTICATED",
        )
    user = token.user
    if not may(user, "batch", "submit"):
        try:  # the refusal is audited by the action itself
            actions.perform(user=user, kind="batch", action="submit", item_id="", via="poster")
        except PermissionDenied as exc:
            raise Refused(str(exc) or "not allowed to submit", "USER_NOT_AUTHORIZED") from None
    batch_id = f"bid-{uuid.uuid4()}"
    folder = upload_root() / batch_id
    limit = max_bytes()
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > limit + 1024**2:  # the fields around a file are far below 1 MiB
        raise Refused(f"the request is {length} bytes; uploads are capped at {limit}", status=413)
    handler = _Capped(folder, limit, request)
    request.upload_handlers = [handler]
    try:
        return _submit_parsed(request, verb, primary_id, user, batch_id, folder, handler)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        for part in handler.parts:
            part.unlink(missing_ok=True)


def _submit_parsed(
    request: HttpRequest,
    verb: str,
    primary_id: str,
    user: Any,
    batch_id: str,
    folder: Path,
    handler: _Capped,
) -> HttpResponse:
    try:
        post, uploads = request.POST, request.FILES
    except RequestDataTooBig as exc:
        raise Refused(str(exc), status=413) from None
    if handler.too_big:
        raise Refused(f"the uploaded file is over {max_bytes()} bytes, the cap here", status=413)
    form = response_form(request, post.get("responseForm", ""))
    data, extra = _form_data(request, user)
    if primary_id:
        data["primary_id"] = primary_id
    files = [f for name in uploads for f in uploads.getlist(name)]
    url = post.get("url", "").strip()
    if len(files) > 1:
        raise Refused("upload one file per submission")
    if files and url:
        raise Refused("give either a file or a url, not both")
    if not files and not url:
        raise Refused("a payload is required: upload a file, or give its url")
    if files:
        if not uploads_readable():
            raise Refused(
                "file uploads are off here: the daemons read file:// payloads only under "
                f"MRT_FILE_ROOTS, which does not include {upload_root()}; give a url instead",
                "REQUEST_ELEMENT_UNSUPPORTED",
            )
        upload = files[0]
        name = data["filename"] or (upload.name or "")
        problem = filename_problem(name)
        if problem:
            raise Refused(problem)
        target = (folder / name).resolve()
        if target.parent != folder.resolve():
            raise Refused(f"filename {name!r} must be a plain file name")
        upload.close()
        os.replace(upload.stored_path, target)  # type: ignore[attr-defined]
        data["filename"] = name
        url = target.as_uri()
    data["payload_url"] = url
    submit_form = SubmitForm(data)
    if not submit_form.is_valid():
        problems = "; ".join(
            f"{field}: {' '.join(map(str, errors))}"
            if field != "__all__"
            else " ".join(map(str, errors))
            for field, errors in submit_form.errors.items()
        )
        raise Refused(problems)
    update = verb == "update"
    submitted = datetime.now().astimezone()
    extra.update(batchID=batch_id, update=update, submission_mode="update" if update else "add")
    outcomes = actions.perform(
        user=user,
        kind="batch",
        action="submit",
        item_id="",
        params={**submit_form.cleaned_data, "extra": extra},
        via="poster",
    )
    outcome = outcomes[0]
    bid = outcome.id
    if outcome.ingest_state:
        # Sent to Merritt's ingest (MRT_BATCH_INTAKE=merritt): the depositor gets ingest's own
        # batch state, its batchID the one its batch carries in the queue. Ingest has the upload
        # now; the copy kept here for sending it has no batch to go with.
        shutil.rmtree(folder, ignore_errors=True)
        state = dict(outcome.ingest_state)
        log.info(
            "poster %s: sent to Merritt's ingest as %s (%s) by %s",
            verb,
            state.get("batchID", ""),
            bid,
            user.get_username(),
        )
        if form == "xml" and outcome.ingest_document:
            body = outcome.ingest_document.decode("utf-8", "replace")  # ingest's own, as it is
        else:  # the same elements in the format asked for (ingest was asked for XML)
            body = _document("batchState", "bat", BATCH_NS, list(outcome.ingest_state), form)
    else:
        log.info("poster %s: %s (%s) by %s", verb, bid, batch_id, user.get_username())
        body = batch_state(
            batch_id=batch_id,
            user_agent=submit_form.cleaned_data["submitter"],
            submitted=submitted,
            update=update,
            form=form,
        )
    response = _answer(body, form, 200)
    response["X-Batch-ID"] = bid
    if not bid.startswith("bid-"):  # a batch in the queue (ingest's ID alone names none yet)
        response["Location"] = reverse("api-batch", args=[bid])
    return response


@csrf_exempt
def door(
    request: HttpRequest, verb: str, scheme: str = "", shoulder: str = "", objectid: str = ""
) -> HttpResponse:
    if request.method != "POST":
        response = error_response(request, Refused(f"{request.method} is not allowed: POST"))
        response.status_code = 405
        response["Allow"] = "POST"
        return response
    primary_id = f"{scheme}/{shoulder}/{objectid}" if objectid else ""
    try:
        return _submit(request, verb, primary_id)
    except Refused as exc:
        return error_response(request, exc, _form_of(request))
    except (IngestRefused, IngestUnavailable) as exc:
        return error_response(request, _from_ingest(exc), _form_of(request))
    except Exception as exc:
        refusal = refusal_for(exc)
        if refusal is None:
            raise
        # The console's one mapping, in Merritt's error names: 403 not authorized, 503 a service
        # (ZooKeeper) unreachable, anything else the depositor's request.
        name = {403: "USER_NOT_AUTHORIZED", 503: "EXTERNAL_SERVICE_UNAVAILABLE"}.get(
            refusal.status, "REQUEST_INVALID"
        )
        message = f"ZooKeeper is unavailable: {exc}" if refusal.unavailable else refusal.message
        response = error_response(request, Refused(message, name), _form_of(request))
        if refusal.unavailable:
            response["Retry-After"] = "10"
        return response


def _from_ingest(exc: IngestRefused | IngestUnavailable) -> Refused:
    """Merritt's ingest refused or failed the submission sent on to it: its own exception and
    status when it answered one of the kinds named here, else REQUEST_INVALID (a refusal) or
    EXTERNAL_SERVICE_UNAVAILABLE (ingest away, too slow, or failing)."""
    if exc.kind in EXCEPTIONS and exc.status:
        return Refused(str(exc), exc.kind, exc.status)
    if isinstance(exc, IngestRefused):
        return Refused(str(exc))
    return Refused(str(exc), "EXTERNAL_SERVICE_UNAVAILABLE")


def _form_of(request: HttpRequest) -> str:
    """The answer's format for an error: the form field only if the body was already read."""
    asked = ""
    if hasattr(request, "_post"):
        with contextlib.suppress(Exception):
            asked = request.POST.get("responseForm", "")
    return response_form(request, asked)


VERBS = r"(?P<verb>submit|add|update)"

urlpatterns = [
    re_path(rf"^{VERBS}/?$", door, name="poster"),
    re_path(
        rf"^{VERBS}/(?P<scheme>[^/]+)/(?P<shoulder>[^/]+)/(?P<objectid>[^/]+)/?$",
        door,
        name="poster-object",
    ),
]
