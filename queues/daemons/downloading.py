"""Job Downloading: GET every file at once into the job's working folder.

Each download goes through the depositor fetch policy (queues/steps/netpolicy.py, set up in
queues/services/depositors.py: addresses, redirects, a deadline on the whole response and a minimum
rate, headers included), is retried a bounded number of times with back-off (MRT_DOWNLOAD_RETRIES),
checked against the depositor's digest and size when given, and lands under its final name only
when complete. The object as a whole may not take more than
MRT_MAX_OBJECT_BYTES, counted while the bytes arrive and again while a container is unpacked
into ``object/producer`` (which may also expand at most MRT_MAX_COMPRESSION_RATIO times). Any file
that cannot be fetched fails the job with a message naming it. ``space_needed`` is then set to
what the folder really holds.

A process runs MRT_DOWNLOAD_JOBS downloading loops, and passes over a job whose depositor server
already has MRT_DOWNLOADS_PER_HOST downloads under way in it: one slow depositor cannot hold
every loop while other depositors' jobs wait. The server is the address the fetch policy
resolves the payload URL to, so spelling one address several ways does not buy more loops.

Safe to run twice: the object folder is emptied first, so a re-run never keeps a file from an
earlier attempt that the payload no longer has.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

from django.conf import settings

from queues.core.states import JobState
from queues.daemons.base import Claim, ItemResult, JobDaemon, Next, Step, StepFailed
from queues.daemons.fetching import HOST_SLOTS, SERVER_KEYS
from queues.daemons.retrying import RetryWaits
from queues.daemons.waiting import chained
from queues.daemons.workfolder import (
    CONTAINERS_DIR,
    disk_bytes,
    job_spec,
    object_dir,
    object_files,
    priority_for_size,
    workdir,
)
from queues.services.depositors import depositor_policy, payload_roots
from queues.steps.erc import PRODUCER_DIR
from queues.steps.fetch import ContainerError, DownloadError, download_all, extract_container
from queues.steps.netpolicy import FetchPolicy
from queues.zk import paths as zpaths
from queues.zk.codecs import decode_json
from queues.zk.errors import MalformedNode
from queues.zk.jobs import job_set_space_needed
from queues.zk.nodes import read_many
from queues.zk.records import Job

log = logging.getLogger("queues.daemons")

BACKOFF = 0.5


class CappedHosts:
    """What a downloading loop's listing passes over unclaimed: the jobs waiting for their next
    try, and those whose depositor server has every slot taken (``HOST_SLOTS``) while it stays
    full. Without it, every look claimed, read and gave back each job of a server at its cap
    (issue 51). A job is taken up again once its server has a slot free; a slot given back
    wakes the idle loops (``Downloading.wake_on``). A job's server is learnt from its
    configuration, which never changes: read in bulk by ``ServerScreen``, or under the job's
    lock when a claim finds the server full (``Downloading.accept``)."""

    LIMIT = 1_000_000  # jobs remembered at most (the screen keeps only the listed ones)

    def __init__(self, retry_waits: RetryWaits) -> None:
        self.retry_waits = retry_waits
        self._server: dict[str, str] = {}  # jid -> its server ("": none that has a cap)

    def note(self, jid: str, server: str) -> None:
        if len(self._server) >= self.LIMIT:
            self._server.clear()  # forgotten ones are claimed or read once more
        self._server[jid] = server

    def server(self, jid: str) -> str:
        return self._server.get(jid, "")

    def waits_try(self, jid: str) -> bool:
        return self.retry_waits.waits(jid)

    def knows(self, jid: str) -> bool:
        return jid in self._server

    def knows_any(self) -> bool:
        """Whether the server of any job is known (none is read before a server is full)."""
        return bool(self._server)

    def keep_only(self, jids: set[str]) -> None:
        """Forget the jobs gone from the listing (one that comes back is read again)."""
        if not self._server.keys() <= jids:
            self._server = {j: s for j, s in self._server.items() if j in jids}

    def __bool__(self) -> bool:
        return bool(self._server) or bool(self.retry_waits)

    def __call__(self, jid: str) -> bool:
        server = self._server.get(jid)
        if server and _slots_free(server) <= 0:
            return True  # kept while the job waits: a slot taken again makes it wait again
        return self.retry_waits.waits(jid)


class ServerScreen:
    """Passes over, unclaimed, the listed jobs whose depositor server is full. While no server
    is, it reads nothing. Once one is, it reads the configurations of the listed jobs it does
    not know yet, 200 to a request (``multiRead``), and notes each job's server in ``capped``:
    at 100,000 jobs of one silent server, a loop that learnt a job's server only by claiming
    it sent three requests a job and never settled (docs/benchmarks.md, "Waiting work"). The
    check under the lock stays (``Downloading.accept``). Called from the loop's thread only."""

    CHUNK = 200

    def __init__(self, zk: Any, capped: CappedHosts) -> None:
        self.zk = zk
        self.capped = capped

    def __call__(self, names: list[str]) -> list[str]:
        if not HOST_SLOTS.full(settings.MRT_DOWNLOADS_PER_HOST):
            return names
        jids = {name: zpaths.entry_jid(name) for name in names}
        listed = {jid for jid in jids.values() if jid is not None}
        self.capped.keep_only(listed)
        unknown = [jid for jid in listed if not self.capped.knows(jid)]
        policy = depositor_policy()
        for start in range(0, len(unknown), self.CHUNK):
            part = unknown[start : start + self.CHUNK]
            nodes = {jid: zpaths.job_node(jid, "configuration") for jid in part}
            found = read_many(self.zk, list(nodes.values()))
            for jid, node in nodes.items():
                self.capped.note(jid, _server(node, found[node], policy))
        kept = []
        passed: dict[str, str] = {}
        for name, listed_jid in jids.items():
            if listed_jid is None or not self.capped(listed_jid):
                kept.append(name)
            elif len(passed) < HOST_SLOTS.PASSED_SHOWN and not self.capped.waits_try(listed_jid):
                passed[listed_jid] = self.capped.server(listed_jid)
        HOST_SLOTS.note_passed(passed)  # what the process says it waits for (registration)
        return kept


class ServerParking:
    """A downloading loop's listed jobs whose depositor server is known (``CappedHosts``) wait
    under it (``StateListing.parking``) and are taken as its slots are free, those the listing
    passed over for a full server included, without the folder listed again: with a batch's
    jobs on one server, a loop walked and refused a full server's jobs at every take and listed
    its whole folder again at every slot given back (docs/benchmarks.md, "A batch's jobs on
    one depositor server"). A job waiting for its next try waits for the next listing."""

    def __init__(self, capped: CappedHosts) -> None:
        self.capped = capped

    def key(self, jid: str) -> str | None:
        if self.capped.waits_try(jid):
            return None
        return self.capped.server(jid) or None

    def room(self, key: str) -> int:
        return _slots_free(key)

    def keys_any(self) -> bool:
        return self.capped.knows_any()


def _server(node: str, read: tuple[bytes, Any] | None, policy: FetchPolicy) -> str:
    """The server a job's configuration node sends its download to ("": none, or unreadable:
    the claim finds out and says so)."""
    if read is None:
        return ""
    try:
        configuration = decode_json(node, read[0])
    except MalformedNode:
        return ""
    return payload_server(configuration, policy)


def _slots_free(server: str) -> int:
    """The download slots of ``server`` not taken in this process (MRT_DOWNLOADS_PER_HOST)."""
    return settings.MRT_DOWNLOADS_PER_HOST - HOST_SLOTS.busy(server)


def _slot_left(server: str, taking: Counter[str]) -> bool:
    """Whether ``server`` has a slot left after those ``taking`` counts (then counted there)."""
    if _slots_free(server) - taking[server] <= 0:
        return False
    taking[server] += 1
    return True


def payload_server(configuration: dict[str, Any], policy: FetchPolicy) -> str:
    """The depositor server whose download slots a job with this configuration takes ("": its
    payload URL is missing or not text)."""
    url = configuration.get("payload_url")
    return SERVER_KEYS.key(url, policy) if isinstance(url, str) else ""


class Downloading(JobDaemon):
    name: ClassVar[str] = "downloading"
    step: ClassVar[str] = "downloading"
    state: ClassVar[str] = JobState.DOWNLOADING

    def services_of(self, item: Job) -> tuple[str, ...]:
        return self.payload_service(item)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The one-job loop: the job that took this loop's last slot (given back at the latest
        # when the loop takes its next job).
        self.slot_job: str | None = None
        self.capped = CappedHosts(self.retry_waits)
        self.screen = ServerScreen(self.zk, self.capped)

    def unclaimed_skip(self) -> Callable[[str], bool]:
        return self.capped

    def listing_screen(self) -> Callable[[list[str]], list[str]] | None:
        return self.screen

    def listing_parking(self) -> ServerParking:
        return ServerParking(self.capped)

    def unclaimed_screen(self) -> Callable[[list[str]], list[str]] | None:
        return chained(self.screen, super().unclaimed_screen())

    def wake_on(self, event: threading.Event) -> None:
        super().wake_on(event)
        HOST_SLOTS.subscribe(event)  # a slot given back: the jobs passed over for it are due

    @classmethod
    def default_copies(cls) -> int:
        return max(1, settings.MRT_DOWNLOAD_JOBS)

    def accept(self, job: Job) -> bool:
        """A slot of the job's depositor server is taken with the job (under its lock), and
        given back when its step ends (``run_step``) or the loop lets the job go (``let_go``):
        at most MRT_DOWNLOADS_PER_HOST of one server's jobs are in hand at once."""
        if not self.workers and self.slot_job is not None:
            HOST_SLOTS.give_back_job(self.slot_job)
        server = payload_server(job.configuration, depositor_policy())
        if not HOST_SLOTS.try_take(server, settings.MRT_DOWNLOADS_PER_HOST, job=job.jid):
            log.debug("%s downloading: passed over, %s is at its download cap", job.jid, server)
            self.capped.note(job.jid, server)
            return False
        if not self.workers:
            self.slot_job = job.jid
        return True

    def would_take(self, job: Job, taking: Counter[str]) -> bool:
        """Not while the job's depositor server has no slot left for it after the jobs handed
        over before it: ``accept`` would give its lock back at once."""
        return _slot_left(payload_server(job.configuration, depositor_policy()), taking)

    def claim_limit(
        self, kept: dict[str, str], known: dict[str, Job]
    ) -> Callable[[str], bool] | None:
        """No more of a server's jobs in a claim than it has slots free after the jobs this
        loop holds (a slot is taken at ``accept``, under the lock): ``accept`` would give the
        others back at once, and the slot each of them gives back wakes the loop for the next
        such claim (about five claims a job with a batch's jobs on one server). A job whose
        server is not known (none of the listed jobs' servers is read while no server is full:
        ``ServerScreen``) is claimed: ``accept`` learns it."""
        taking: Counter[str] | None = None
        passing = super().claim_limit(kept, known)

        def may_claim(jid: str) -> bool:
            nonlocal taking
            if passing is not None and not passing(jid):
                return False
            server = self.capped.server(jid)
            if not server:
                return True
            if taking is None:  # the first job of a known server: count the jobs held
                taking = self._held_servers(kept, known)
            return _slot_left(server, taking)

        return may_claim

    def _held_servers(self, kept: dict[str, str], known: dict[str, Job]) -> Counter[str]:
        """The servers of the jobs this loop holds the locks of, by how many, where known."""
        policy = depositor_policy()
        held: Counter[str] = Counter()
        for jid in kept:
            job = known.get(jid)
            server = (
                payload_server(job.configuration, policy)
                if job is not None
                else self.capped.server(jid)
            )
            if server:
                held[server] += 1
        return held

    def run_step(
        self, item: Job, started: float, claim: Claim
    ) -> tuple[Job, Next | None, ItemResult | None]:
        try:
            return super().run_step(item, started, claim)
        finally:
            HOST_SLOTS.give_back_job(item.jid)

    def let_go(self, jids: list[str]) -> None:
        for jid in jids:
            HOST_SLOTS.give_back_job(jid)

    def work(self, item: Job) -> Step:
        spec = job_spec(item)
        files = object_files(spec)
        folder = workdir(item)
        target = object_dir(item)
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(folder / CONTAINERS_DIR, ignore_errors=True)
        producer = target / PRODUCER_DIR
        producer.mkdir(parents=True, exist_ok=True)
        into = folder / CONTAINERS_DIR if spec.payload_type == "container" else producer
        try:
            results = download_all(
                files,
                into,
                threads=settings.MRT_DOWNLOAD_THREADS,
                retries=settings.MRT_DOWNLOAD_RETRIES,
                backoff=BACKOFF,
                timeout=settings.MRT_HTTP_TIMEOUT,
                file_roots=payload_roots(),
                policy=depositor_policy(),
                max_bytes=settings.MRT_MAX_OBJECT_BYTES,
            )
        except DownloadError as exc:
            raise StepFailed(str(exc)) from exc
        if spec.payload_type == "container":
            unpacked = 0
            for result in results:
                try:
                    extract_container(
                        result.path,
                        producer,
                        max_bytes=settings.MRT_MAX_OBJECT_BYTES - unpacked,
                        max_ratio=settings.MRT_MAX_COMPRESSION_RATIO,
                    )
                except ContainerError as exc:
                    raise StepFailed(f"container {result.url}: {exc}") from exc
                result.path.unlink(missing_ok=True)
                unpacked = disk_bytes(producer)
            shutil.rmtree(folder / CONTAINERS_DIR, ignore_errors=True)
        if not any(producer.rglob("*")):
            raise StepFailed(f"{spec.payload_url} gave no files")
        space = disk_bytes(folder)
        job_set_space_needed(self.zk, item, space)
        return Next(JobState.PROCESSING, priority=priority_for_size(item.priority, space))
