"""Minting through a stand-in of EZID, the way Merritt's ingest mints and describes an ARK:
the ERC record, ``mrt.creator``, ``_owner``, then ``_target`` once the ARK is known."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from queues.chaos.standins import EzidStandIn, running, unused_url
from queues.daemons import clients
from queues.steps.erc import Erc
from queues.steps.minting import EzidMinter, MintError, merritt_target

SHOULDER = "ark:/99999/fk4"


@pytest.fixture
def ezid() -> Iterator[EzidStandIn]:
    with running(EzidStandIn("apitest", "s3cret")) as stand_in:
        yield stand_in


def _profile(**extra: str) -> SimpleNamespace:
    fields = {"ezid_coowner": None, "context": None, **extra}
    return SimpleNamespace(name="demo", ark_shoulder=SHOULDER, **fields)


def test_minting_sends_the_erc_then_the_target_and_owner(ezid: EzidStandIn, settings) -> None:
    settings.MRT_EZID_URL = ezid.url
    settings.MRT_EZID_USER, settings.MRT_EZID_PASSWORD = "apitest", "s3cret"
    settings.MRT_EZID_TARGET_URL = "https://merritt.example.org/"
    erc = Erc(who="Doe, Jane", what="Field notes: 1907", when="1907")

    ark = clients.mint_ark(
        None,
        _profile(ezid_coowner="merritt", context="Demo library"),
        erc=erc,
        local_id="notes-1907",
    )

    assert ark == "ark:/99999/fk40001"
    mint, update = ezid.seen("POST")
    assert mint.path == "/shoulder/ark:/99999/fk4"
    assert mint.content_type == "text/plain"
    assert EzidStandIn.parse_anvl(mint.body) == {
        "erc": "who: Doe, Jane\nwhat: Field notes: 1907\nwhen: 1907\nwhere: notes-1907\n",
        "mrt.creator": "Demo library",
        "_owner": "merritt",
    }
    assert update.path == "/id/ark:/99999/fk40001"
    assert ezid.identifiers[ark] == {
        "erc": (
            "who: Doe, Jane\nwhat: Field notes: 1907\nwhen: 1907\n"
            "where: ark:/99999/fk40001\nwhere: notes-1907\n"
        ),
        "mrt.creator": "Demo library",
        "_owner": "merritt",
        "_target": "https://merritt.example.org/m/ark%253A%252F99999%252Ffk40001",
    }
    # On the wire the ERC is one ANVL line, its newlines percent-encoded.
    assert b"erc: who: Doe, Jane%0Awhat: Field notes: 1907%0A" in update.body


def test_the_target_encodes_the_ark_twice() -> None:
    assert merritt_target("https://merritt.cdlib.org", "ark:/13030/m5abc") == (
        "https://merritt.cdlib.org/m/ark%253A%252F13030%252Fm5abc"
    )


def test_ezid_refusal_names_ezid_and_its_reason(ezid: EzidStandIn) -> None:
    with pytest.raises(MintError) as refused:
        EzidMinter(ezid.url, "apitest", "wrong", timeout=5).mint(SHOULDER)
    assert str(refused.value) == f"EZID refused to mint on {SHOULDER}: unauthorized (HTTP 401)"

    minter = EzidMinter(ezid.url, "apitest", "s3cret", timeout=5)
    with pytest.raises(MintError, match="bad request - no such identifier"):
        minter.update("ark:/99999/fk4nope", {"_target": "https://x/m/y"})
    with pytest.raises(MintError, match="bad request - unrecognized shoulder"):
        minter.mint("doi:10.5072/FK2")


def test_a_failed_target_update_names_the_minted_ark(ezid: EzidStandIn, settings) -> None:
    settings.MRT_EZID_URL = ezid.url
    settings.MRT_EZID_USER, settings.MRT_EZID_PASSWORD = "apitest", "s3cret"
    original = ezid.handle

    def refuse_updates(request):  # the mint goes through, the update is refused
        if request.path.startswith("/id/"):
            return ezid._text(400, "error: bad request - target not allowed")
        return original(request)

    ezid.handle = refuse_updates  # type: ignore[method-assign]
    with pytest.raises(MintError, match="minted ark:/99999/fk40001, but could not set"):
        clients.mint_ark(None, _profile(), erc=Erc(what="x"))


def test_an_unreachable_ezid_is_a_mint_error() -> None:
    url = unused_url()
    with pytest.raises(MintError, match=f"EZID at {url} unreachable"):
        EzidMinter(url, "u", "p", timeout=2, retries=0).mint(SHOULDER)
