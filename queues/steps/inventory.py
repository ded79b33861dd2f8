"""Recording a stored version in an inventory: Merritt's service, or local Django tables."""

from __future__ import annotations

from typing import Any, Protocol

import requests

from queues.core.outside_text import url_shown
from queues.core.retries import unavailable
from queues.steps.erc import Erc
from queues.steps.fetch import DEFAULT_TIMEOUT
from queues.steps.merritt_wire import (
    answered_ok,
    is_ark_answer,
    json_document,
    local_name,
    merritt_error,
    merritt_urlencode,
    service_session,
    state_fields,
    unavailable_answer,
)

INVENTORY = "inventory"  # the service's name for its retry policy (queues.core.retries)
# mrt-inventory answers a manifest URL it cannot take apart with a 500 INVALID_OR_MISSING_PARM
# (SaveObject.extractParts: "URL invalid", "URL format invalid", "ingestURL missing";
# InvActionAbs.getVersionMap: "node missing" for a node below 1): the request is wrong, and no
# wait mends it. The same kind also names inventory's own trouble ("connection not supplied",
# a node's virtual settings), so only these reasons fail the job (docs/merritt-services.md,
# "Inventory's refusals").
WRONG_MANIFEST_URL = (
    "url invalid",
    "url format invalid",
    "ingesturl missing",
    "storage_url missing",
    "getversionmap - node missing",
)
INVENTORY_REFUSALS = {"INVALID_OR_MISSING_PARM": WRONG_MANIFEST_URL}  # ``unavailable_answer``


class InventoryError(Exception):
    pass


class InventoryClient(Protocol):
    def record(
        self,
        *,
        ark: str,
        version: int,
        manifest_url: str,
        local_id: str | None = None,
        erc: Erc | None = None,
    ) -> None: ...


class HttpInventory:
    """Client for Merritt's inventory service (mrt-inventory), speaking its own wire format.

    * ``record``: ``POST {base}/add`` as multipart form data (the only form the service takes
      there) with ``url`` = the storage manifest URL and ``responseForm=xml``. The service reads
      everything else from the object, so ``local_id`` and ``erc`` are not sent. Its 2xx must
      be inventory's process state (``is_process_state``); any other body is an
      answer about the console (a wrong ``MRT_INVENTORY_URL``), raised from an outage marked
      ``ours``: the breaker opens and the job waits, not completed unrecorded.
    * ``primary_for_local_id``: ``GET {base}/primary/{owner}/{local id}?t=json``, answered by a
      local-container state: ``{"invloc:localContainerState": {"invloc:exists": ...,
      "invloc:primaryIdentifier": ...}}``; ``exists`` false means no object has that local id.
    * ``add_local_id``: ``POST {base}/primary/{ark}/{owner}/{local id}?t=xml``, how Merritt's
      ingest records a new object's local id.

    Path segments are URL-encoded the way Merritt's ingest encodes them (``merritt_urlencode``:
    a space is ``%20``, not the ``+`` a path segment keeps as a plus). A refusal is the
    service's exception document; its reason ends up in InventoryError, raised from an outage
    (the job waits and is tried again) for a 408, 429 or 5xx, unless it is inventory's 500 for a
    manifest URL it cannot take apart (``WRONG_MANIFEST_URL``). Inventory's own trouble (its
    database: a 500 ``GENERAL_EXCEPTION``) and storage's while inventory reads the manifest (a
    503, or a 500 for a connection that failed) are outages; storage's 404 for the manifest is
    inventory's 404, which fails the job.
    """

    def __init__(
        self,
        base_url: str,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        session: requests.Session | None = None,
        retries: int = 3,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # Inventory's adds and local-id records are keyed by ARK, version and id: repeating
        # one after a lost reply changes nothing, so POSTs may be retried too.
        self.session = session or service_session(retries=retries, retry_posts=True)

    def _call(self, method: str, url: str, what: str, **kwargs: Any) -> requests.Response:
        try:
            response = self.session.request(method, url, timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise InventoryError(
                f"inventory service unreachable at {url_shown(url)}: {exc}"
            ) from unavailable(INVENTORY, exc)
        if not answered_ok(response):
            raise InventoryError(
                f"inventory service refused {what}: {merritt_error(response)}"
            ) from unavailable_answer(INVENTORY, response, refusals=INVENTORY_REFUSALS)
        return response

    def record(
        self,
        *,
        ark: str,
        version: int,
        manifest_url: str,
        local_id: str | None = None,
        erc: Erc | None = None,
    ) -> None:
        # (None, value) parts make requests send multipart/form-data fields without file names.
        fields = {"url": (None, manifest_url), "responseForm": (None, "xml")}
        response = self._call(
            "POST", f"{self.base_url}/add", f"to record {ark} v{version}", files=fields
        )
        if not is_process_state(response.content):
            # Not inventory's answer (a page of whatever stands at the configured URL): every
            # add would meet it, and taking it for a record would complete the job unrecorded.
            why = (
                f"inventory service answered the add of {ark} v{version} without its process "
                f"state (invp:invProcessState): {response.text[:200]!r}"
            )
            raise InventoryError(why) from unavailable(INVENTORY, why, ours=True)

    def primary_for_local_id(self, owner: str, local_id: str) -> str | None:
        """The ARK inventory holds for ``local_id`` under ``owner``, or None."""
        url = f"{self.base_url}/primary/{merritt_urlencode(owner)}/{merritt_urlencode(local_id)}"
        what = f"the look-up of local id {local_id!r} (owner {owner})"
        response = self._call("GET", url, what, params={"t": "json"})
        data = json_document(response.content)
        if data is None:
            raise InventoryError(
                f"inventory service answered {what} with no JSON: {response.text[:200]!r}"
            )
        state = _keyed(data, "localContainerState")
        if not isinstance(state, dict):
            raise InventoryError(
                f"inventory service answered {what} without a localContainerState: "
                f"{response.text[:200]!r}"
            )
        exists = _keyed(state, "exists")
        if exists is not True and str(exists).lower() != "true":
            return None
        primary = _keyed(state, "primaryIdentifier")
        if not isinstance(primary, str) or not primary.strip():
            return None
        if not is_ark_answer(primary.strip()):
            raise InventoryError(
                f"inventory service answered {what} with {primary[:200]!r}, which is no ARK"
            )
        return primary.strip()

    def add_local_id(self, ark: str, owner: str, local_id: str) -> None:
        """Record that ``ark`` has ``local_id`` under ``owner`` (repeating it changes nothing)."""
        url = (
            f"{self.base_url}/primary/{merritt_urlencode(ark)}/{merritt_urlencode(owner)}/"
            f"{merritt_urlencode(local_id)}"
        )
        self._call("POST", url, f"local id {local_id!r} for {ark}", params={"t": "xml"})


def is_process_state(content: bytes) -> bool:
    """Whether ``content`` is mrt-inventory's answer to an add: its ``InvProcessState`` (root
    ``invProcessState``, XML or JSON; docs/merritt-services.md, "Recording a version"). Its
    ``processUrl`` is not compared with the URL sent: the document's name tells inventory's
    answer from a page of whatever stands at a wrong URL, and a URL written back in another
    spelling by some version would turn every real record into a wait."""
    state = state_fields(content)
    return state is not None and state[0] == "invProcessState"


def _keyed(data: object, name: str) -> Any:
    """The value under the key whose local name (after any ``invloc:`` prefix) is ``name``."""
    if not isinstance(data, dict):
        return None
    return next((v for k, v in data.items() if local_name(str(k)) == name), None)
