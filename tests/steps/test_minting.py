from __future__ import annotations

import base64
import itertools

import pytest

from queues.steps.minting import (
    XDIGITS,
    EzidMinter,
    LocalMinter,
    MintError,
    noid_check_char,
    to_base29,
)
from tests.steps.conftest import Loopback, Reply, Seen


def counter(start: int = 0):
    numbers = itertools.count(start)
    asked: list[str] = []

    def next_number(shoulder: str) -> int:
        asked.append(shoulder)
        return next(numbers)

    next_number.asked = asked  # type: ignore[attr-defined]
    return next_number


def test_local_minter_appends_counter_and_check_char_to_the_shoulder() -> None:
    next_number = counter()
    minter = LocalMinter(next_number)

    first, second = minter.mint("ark:/99999/fk4"), minter.mint("ark:/99999/fk4")

    assert first == "ark:/99999/fk40000" + noid_check_char("99999/fk40000")
    assert second.startswith("ark:/99999/fk40001")
    assert next_number.asked == ["ark:/99999/fk4", "ark:/99999/fk4"]  # type: ignore[attr-defined]


def test_local_minter_is_stable_for_a_number() -> None:
    assert LocalMinter(lambda s: 12345).mint("ark:/99999/fk4") == LocalMinter(lambda s: 12345).mint(
        "ark:/99999/fk4"
    )


def test_local_minter_uses_only_noid_characters() -> None:
    minter = LocalMinter(counter(29**4 - 3))

    arks = [minter.mint("ark:/99999/fk4") for _ in range(6)]

    assert len(set(arks)) == 6
    assert all(set(a.removeprefix("ark:/99999/fk4")) <= set(XDIGITS) for a in arks)
    assert len(arks[-1]) == len(arks[0]) + 1


def test_base29_counts_in_noid_digits() -> None:
    assert [to_base29(n, width=1) for n in (0, 9, 10, 28, 29)] == ["0", "9", "b", "z", "10"]


def test_check_char_catches_a_transposition() -> None:
    assert noid_check_char("13030/xt2t4") != noid_check_char("13030/xt24t")


def test_local_minter_refuses_a_non_ark_shoulder() -> None:
    with pytest.raises(MintError, match="not an ARK shoulder"):
        LocalMinter(counter()).mint("doi:10.5072/FK2")


def test_ezid_minter_posts_to_the_shoulder_with_basic_auth(http_server: Loopback) -> None:
    http_server.add("POST", "/shoulder/ark:/99999/fk4", Reply(201, b"success: ark:/99999/fk4zz9\n"))
    minter = EzidMinter(http_server.url, "apitest", "s3cret", timeout=5)

    ark = minter.mint("ark:/99999/fk4", {"_target": "http://h/x", "erc.who": "a%b\nc"})

    assert ark == "ark:/99999/fk4zz9"
    [request] = http_server.seen("POST", "/shoulder/ark:/99999/fk4")
    assert (
        request.headers["Authorization"] == "Basic " + base64.b64encode(b"apitest:s3cret").decode()
    )
    assert request.headers["Content-Type"].startswith("text/plain")
    assert request.body == b"_target: http://h/x\nerc.who: a%25b%0Ac\n"


def test_ezid_minter_reads_the_identifier_before_a_shadow(http_server: Loopback) -> None:
    http_server.add(
        "POST", "/shoulder/ark:/99999/fk4", Reply(201, b"success: ark:/99999/fk4a | ark:/b/c")
    )

    assert EzidMinter(http_server.url, "u", "p").mint("ark:/99999/fk4") == "ark:/99999/fk4a"


def test_ezid_error_becomes_mint_error(http_server: Loopback) -> None:
    def refuse(seen: Seen) -> Reply:
        return Reply(401, b"error: unauthorized")

    http_server.add("POST", "/shoulder/ark:/99999/fk4", refuse)

    with pytest.raises(MintError, match="EZID refused to mint on ark:/99999/fk4: unauthorized"):
        EzidMinter(http_server.url, "u", "wrong").mint("ark:/99999/fk4")


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (Reply(500, b"<html>oops</html>"), "HTTP 500"),
        (Reply(200, b"hello"), "something unexpected"),
        (Reply(201, b"success: ark:/12345/other"), "not on shoulder"),
    ],
)
def test_ezid_odd_answers_become_mint_errors(
    http_server: Loopback, reply: Reply, message: str
) -> None:
    http_server.add("POST", "/shoulder/ark:/99999/fk4", reply)

    with pytest.raises(MintError, match=message):
        EzidMinter(http_server.url, "u", "p").mint("ark:/99999/fk4")


def test_unreachable_ezid_is_a_mint_error() -> None:
    with pytest.raises(MintError, match="unreachable"):
        EzidMinter("http://127.0.0.1:9", "u", "p", timeout=2).mint("ark:/99999/fk4")
