"""The live websocket: authenticated pages hear of the moves they show, and only those."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.conf import settings
from kazoo.client import KazooClient

from queues.live.hub import current_hub
from queues.zk import jobs
from queues.zk.records import Batch, Job

from .conftest import communicator, open_socket, receive_until, run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("live")]


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``condition`` on the event loop until it holds (a generous bound, not a margin)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def test_anonymous_socket_is_closed_with_4401() -> None:
    async def scenario() -> dict:
        socket = communicator(cookie=None)
        connected, _ = await socket.connect(timeout=10)
        assert connected  # accepted only so that the browser can read the close code
        return await socket.receive_output(timeout=10)

    assert run(scenario()) == {"type": "websocket.close", "code": 4401}


def test_a_user_without_a_role_is_closed_with_4403(client: Any, django_user_model: Any) -> None:
    nobody = django_user_model.objects.create_user("eve", "eve@example.org", "secret-pw-2")
    client.force_login(nobody)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value

    async def scenario() -> dict:
        socket = communicator(cookie)
        await socket.connect(timeout=10)
        return await socket.receive_output(timeout=10)

    assert run(scenario()) == {"type": "websocket.close", "code": 4403}


def test_unknown_and_malformed_topics_are_refused_one_by_one(session_cookie: str) -> None:
    async def scenario() -> list[dict]:
        socket = await open_socket(session_cookie, [])
        await socket.send_json_to(
            {"subscribe": ["batch:../../jobs", "jobs:state:Nope", "jobs:state:Failed"]}
        )
        replies = [await socket.receive_json_from(timeout=10) for _ in range(3)]
        await socket.disconnect()
        return replies

    first, second, ack = run(scenario())
    assert first["kind"] == "error" and first["topic"] == "batch:../../jobs"
    assert second["kind"] == "error" and second["topic"] == "jobs:state:Nope"
    assert ack == {"kind": "subscribed", "topics": ["jobs:state:Failed"]}


def test_a_message_nested_deeper_than_any_needs_is_answered_and_the_socket_stays(
    session_cookie: str,
) -> None:
    """A browser's message nested 100,000 deep raised RecursionError out of the JSON parser
    in the consumer; it is answered as any malformed message is, and the socket still works."""

    async def scenario() -> list[dict]:
        socket = await open_socket(session_cookie, [])
        await socket.send_to(text_data='{"subscribe":' + "[" * 100_000 + "]" * 100_000 + "}")
        refused = await socket.receive_json_from(timeout=10)
        await socket.send_json_to({"subscribe": ["jobs:state:Failed"]})
        ack = await socket.receive_json_from(timeout=10)
        await socket.disconnect()
        return [refused, ack]

    refused, ack = run(scenario())
    assert refused["kind"] == "error"
    assert refused["error"].startswith("JSON nested deeper than 32 levels")
    assert ack == {"kind": "subscribed", "topics": ["jobs:state:Failed"]}


def test_a_message_that_gives_a_key_twice_is_refused_not_the_last_taken(
    session_cookie: str,
) -> None:
    """``{"subscribe": [A], "subscribe": []}`` was read as its last "subscribe" alone."""

    async def scenario() -> list[dict]:
        socket = await open_socket(session_cookie, [])
        await socket.send_to(text_data='{"subscribe": ["jobs:state:Failed"], "subscribe": []}')
        refused = await socket.receive_json_from(timeout=10)
        await socket.send_json_to({"subscribe": ["jobs:state:Failed"]})
        ack = await socket.receive_json_from(timeout=10)
        await socket.disconnect()
        return [refused, ack]

    refused, ack = run(scenario())
    assert refused["kind"] == "error"
    assert refused["error"].startswith("key 'subscribe' twice in one object: ")
    assert ack == {"kind": "subscribed", "topics": ["jobs:state:Failed"]}


@pytest.mark.quick
def test_job_moved_by_another_client_reaches_the_pages_that_show_it(
    session_cookie: str,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    shown, hidden = make_batch(), make_batch()
    shown_job, hidden_job = make_job(shown), make_job(hidden)
    shown_topic, hidden_topic = f"batch:{shown.bid}", f"batch:{hidden.bid}"

    async def scenario() -> tuple[list[dict], list[dict], list[dict]]:
        page = await open_socket(session_cookie, ["jobs:state:Failed", shown_topic])
        other_page = await open_socket(session_cookie, [hidden_topic])
        # The hidden batch moves first: were the page subscribed to it, that message would be
        # sent before the shown batch's, so it would be among what the page receives below.
        await asyncio.to_thread(jobs.job_transition, other_zk, hidden_job, "Failed", admin=True)
        other = await receive_until(other_page, lambda m: m.get("topic") == hidden_topic)
        await asyncio.to_thread(jobs.job_transition, other_zk, shown_job, "Failed", admin=True)
        wanted = {"jobs:state:Failed", shown_topic}
        got: set[str] = set()

        def all_seen(message: dict) -> bool:
            got.add(message.get("topic", ""))
            return wanted <= got

        seen = await receive_until(page, all_seen)
        # Anything still in flight for the page: every coalescing window closed (its trailing
        # message handed to the layer), then whatever the layer still carries.
        hub = current_hub()
        assert hub is not None
        await until(lambda: not hub._windows)
        while not await page.receive_nothing(timeout=0.2):
            seen.append(await page.receive_json_from())
        leftover = []
        while not await other_page.receive_nothing(timeout=0.2):
            leftover.append(await other_page.receive_json_from())
        await page.disconnect()
        await other_page.disconnect()
        return seen, other, leftover

    seen, other, leftover = run(scenario())
    topics = {m["topic"] for m in seen}
    assert {"jobs:state:Failed", shown_topic} <= topics
    assert hidden_topic not in topics
    assert all(m["kind"] == "changed" for m in seen)
    assert other[-1]["kind"] == "changed"
    assert shown_topic not in {m["topic"] for m in leftover}


def test_job_page_hears_its_own_job_and_not_another(
    session_cookie: str,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    batch = make_batch()
    mine, theirs = make_job(batch), make_job(batch)

    async def scenario() -> list[dict]:
        page = await open_socket(session_cookie, [f"job:{mine.jid}"])
        await asyncio.to_thread(jobs.job_transition, other_zk, theirs, "Estimating")
        await asyncio.to_thread(jobs.job_transition, other_zk, mine, "Estimating")
        seen = await receive_until(page, lambda m: m.get("topic") == f"job:{mine.jid}")
        await page.disconnect()
        return seen

    seen = run(scenario())
    assert [m["topic"] for m in seen] == [f"job:{mine.jid}"]


def test_closing_the_last_page_of_a_batch_drops_its_watches(
    session_cookie: str, make_batch: Callable[[], Batch]
) -> None:
    batch = make_batch()
    topic = f"batch:{batch.bid}"

    async def scenario() -> tuple[int, int, int]:
        first = await open_socket(session_cookie, [topic])
        second = await open_socket(session_cookie, [topic])
        hub = current_hub()
        assert hub is not None and hub.watcher is not None
        both = hub.watcher.refs(topic)
        await first.disconnect()
        one = hub.watcher.refs(topic)
        await second.disconnect()
        # Disconnect handling finishes after the close frame.
        await until(lambda: hub.watcher is not None and hub.watcher.refs(topic) == 0)
        return both, one, hub.watcher.refs(topic)

    assert run(scenario()) == (2, 1, 0)


def test_a_burst_of_moves_is_coalesced_into_a_few_messages(
    session_cookie: str,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
) -> None:
    moves = 300
    batch = make_batch()
    waiting = [make_job(batch) for _ in range(moves)]

    def move_all() -> None:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda j: jobs.job_transition(other_zk, j, "Estimating"), waiting))

    async def scenario() -> tuple[list[dict], int]:
        page = await open_socket(session_cookie, ["jobs:state:Estimating"])
        seen: list[dict] = []

        async def read() -> None:
            while True:
                seen.append(await page.receive_json_from(timeout=60))

        reader = asyncio.create_task(read())
        await asyncio.to_thread(move_all)
        # Every write is acknowledged, so ZooKeeper has queued each one's event to the hub.
        # (Whether the last moves fall into a window still open, so that its trailing message
        # comes after the writes' acknowledgements, depends on the machine's pace: on a loaded
        # one every window had closed before the last acknowledgement arrived. Not asserted.)
        after_burst = len(seen)
        # The messages go on until a window closes with nothing new: a quiet second.
        count = -1
        while count != len(seen):
            count = len(seen)
            await asyncio.sleep(1.0)
        reader.cancel()
        await page.disconnect()
        return seen, after_burst

    seen, _after_burst = run(scenario(), timeout=120)
    assert all(m["topic"] == "jobs:state:Estimating" and m["kind"] == "changed" for m in seen)
    assert 1 <= len(seen) < moves / 5
    # Each message says how many events it stands for: at most one per move (kazoo may drop
    # an event that arrives while the one before is handed over; the message after covers it).
    assert 1 <= sum(m["events"] for m in seen) <= moves


def test_the_holds_topic_hears_node_holds_caps_and_who_placed_a_hold(
    session_cookie: str, other_zk: KazooClient
) -> None:
    """Issue 53: the overview's cards, its forecast and the holds page follow a storage-node
    hold, a cap and the record of who placed a collection hold (made again, never changed in
    place, so its folder's watch hears it), not only the contract's queue and collection
    markers."""
    from queues.zk import caps, locks, maintenance

    async def heard(page: Any, folder: str, change: Callable[[], Any]) -> None:
        # What the page was still to hear of the change before (every coalescing window
        # closed, its trailing message handed over) is read first, so that the message
        # looked for below can only be this change's.
        hub = current_hub()
        assert hub is not None
        await until(lambda: not hub._windows)
        while not await page.receive_nothing(timeout=0.2):
            await page.receive_json_from()
        await asyncio.to_thread(change)
        await receive_until(page, lambda m: m.get("topic") == "holds" and m.get("folder") == folder)

    async def scenario() -> None:
        page = await open_socket(session_cookie, ["holds"])
        await heard(page, "nodes", lambda: maintenance.node_hold_set(other_zk, 9501, by="a"))
        await heard(page, "caps", lambda: caps.cap_set(other_zk, "letters", 3))
        await asyncio.to_thread(locks.collection_hold_set, other_zk, "letters")

        def record(reason: str) -> None:
            maintenance.hold_record_set(other_zk, "collection", "letters", by="o", reason=reason)

        await heard(page, "about", lambda: record("first"))
        await heard(page, "about", lambda: record("second"))
        await page.disconnect()

    run(scenario())


# A socket whose user may no longer see the console --------------------------------------------
# The consumer checks the socket's session and role again every RECHECK_SECONDS and before each
# message from the page; here the interval is made short, and each test waits for the close.


def _viewer_socket_cookie(client: Any, django_user_model: Any) -> tuple[Any, str]:
    from queues.operator.auth import ensure_groups

    user = django_user_model.objects.create_user("vera", "vera@example.org", "secret-pw-3")
    user.groups.add(ensure_groups()["viewer"])
    client.force_login(user)
    return user, client.cookies[settings.SESSION_COOKIE_NAME].value


def _closed_after(cookie: str, change: Callable[[], Any], topics: list[str]) -> dict:
    async def scenario() -> dict:
        page = await open_socket(cookie, topics)
        await asyncio.to_thread(change)
        closed = await page.receive_output(timeout=20)
        await page.disconnect()
        return closed

    return run(scenario())


@pytest.fixture
def short_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    from queues.live import consumers

    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.05, raising=False)


@pytest.mark.usefixtures("short_recheck")
def test_an_open_socket_is_closed_4401_once_its_user_logs_out_in_another_tab(
    client: Any, django_user_model: Any
) -> None:
    _user, cookie = _viewer_socket_cookie(client, django_user_model)
    closed = _closed_after(cookie, client.logout, ["jobs:state:Failed"])
    assert closed == {"type": "websocket.close", "code": 4401}


@pytest.mark.usefixtures("short_recheck")
def test_an_open_socket_is_closed_4401_once_its_session_expires(
    client: Any, django_user_model: Any
) -> None:
    from datetime import timedelta

    from django.contrib.sessions.models import Session
    from django.utils import timezone

    _user, cookie = _viewer_socket_cookie(client, django_user_model)

    def expire() -> None:
        past = timezone.now() - timedelta(seconds=1)
        Session.objects.filter(session_key=cookie).update(expire_date=past)

    assert _closed_after(cookie, expire, ["holds"]) == {"type": "websocket.close", "code": 4401}


@pytest.mark.usefixtures("short_recheck")
def test_an_open_socket_is_closed_4401_once_its_user_is_deactivated(
    client: Any, django_user_model: Any
) -> None:
    user, cookie = _viewer_socket_cookie(client, django_user_model)

    def deactivate() -> None:
        user.is_active = False
        user.save(update_fields=["is_active"])

    assert _closed_after(cookie, deactivate, []) == {"type": "websocket.close", "code": 4401}


@pytest.mark.usefixtures("short_recheck")
def test_an_open_socket_is_closed_4403_once_its_user_loses_the_viewer_role(
    client: Any, django_user_model: Any
) -> None:
    user, cookie = _viewer_socket_cookie(client, django_user_model)
    closed = _closed_after(cookie, lambda: user.groups.clear(), ["jobs:state:Failed"])
    assert closed == {"type": "websocket.close", "code": 4403}


def test_a_message_from_a_page_whose_user_logged_out_is_answered_with_the_close(
    client: Any, django_user_model: Any
) -> None:
    """Before each message from the page, whatever the interval: a subscription after the
    logout joins nothing."""
    _user, cookie = _viewer_socket_cookie(client, django_user_model)

    async def scenario() -> dict:
        page = await open_socket(cookie, [])
        await asyncio.to_thread(client.logout)
        await page.send_json_to({"subscribe": ["jobs:state:Failed"]})
        closed = await page.receive_output(timeout=20)
        await page.disconnect()
        return closed

    assert run(scenario()) == {"type": "websocket.close", "code": 4401}


@pytest.mark.usefixtures("short_recheck")
def test_a_socket_whose_user_still_may_see_goes_on_hearing_across_rechecks(
    client: Any,
    django_user_model: Any,
    other_zk: KazooClient,
    make_batch: Callable[[], Batch],
    make_job: Callable[[Batch], Job],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from queues.live import consumers

    _user, cookie = _viewer_socket_cookie(client, django_user_model)
    job = make_job(make_batch())
    topic = f"job:{job.jid}"
    # The checks are counted (each still the real one), so that the socket is shown to go on
    # after several of them, not before the first.
    checks: list[str | None] = []
    real = consumers.session_access

    def counted(session_key: str | None, user_id: Any) -> str | None:
        checks.append(answer := real(session_key, user_id))
        return answer

    monkeypatch.setattr(consumers, "session_access", counted)

    async def scenario() -> list[dict]:
        page = await open_socket(cookie, [topic])
        for _ in range(1000):
            if len(checks) >= 4:
                break
            await asyncio.sleep(0.01)
        assert len(checks) >= 4 and set(checks) == {None}
        await asyncio.to_thread(jobs.job_transition, other_zk, job, "Estimating")
        seen = await receive_until(page, lambda m: m.get("topic") == topic)
        await page.send_json_to({"subscribe": []})
        seen.append(await page.receive_json_from(timeout=10))
        await page.disconnect()
        return seen

    seen = run(scenario())
    assert seen[-1] == {"kind": "subscribed", "topics": [topic]}
