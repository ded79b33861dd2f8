"""The chaos run's verdict: what must hold after any fault, each breach one violation line."""

from __future__ import annotations

import email
import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from queues.chaos import txnlog
from queues.chaos.depositors import HOSTILE
from queues.chaos.flapping import FLAPPING_SERVICES
from queues.core.states import JOB, BatchState, JobState, job_batch_folder
from queues.core.words import digits
from queues.operator.check import run_check
from queues.zk import paths
from queues.zk.batches import batch_ids, batch_job_ids, batch_states, batches_load
from queues.zk.consumers import CONSUMERS
from queues.zk.jobs import jobs_load
from queues.zk.nodes import children, children_many, exists_many
from queues.zk.records import Batch, Broken, Job
from queues.zk.side_effects import CALLBACKS

# The console's words follow Merritt's subject (``Ingest: OK -- Submission Processed: ...;``).
SUBJECT_RE = re.compile(r"^Subject: .*?\bMerritt batch (bid[0-9]{10}) ", re.MULTILINE)
TERMINAL_BATCH = frozenset({BatchState.COMPLETED, BatchState.FAILED})
TERMINAL_JOB = frozenset({JobState.COMPLETED, JobState.FAILED})
# A Failed job whose message names one of these was failed by our infrastructure (ZooKeeper,
# the database, Redis, the disk, a connection of ours), not by its depositor.
INFRASTRUCTURE = re.compile(
    r"zookeeper|connectionloss|sessionexpired|session expired|connection loss|"
    r"database|sqlite|psycopg|operationalerror|interfaceerror|redis|errno 28|"
    r"no space left|enospc|disk is full|storage service unreachable|"
    r"connection (?:refused|reset|aborted)",
    re.IGNORECASE,
)


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fail(self, line: str) -> None:
        self.violations.append(line)


@dataclass(frozen=True, order=True)
class Lock:
    path: str
    owner: int  # the session that holds it
    age: float  # seconds since it was created


def locks(zk: Any) -> list[Lock]:
    """Every item lock (jobs, batches) and per-object lock (storage, inventory, our Recording's)."""
    candidates = [
        paths.job_node(j, "lock") for j in children(zk, paths.JOBS) if paths.JID_RE.fullmatch(j)
    ]
    candidates += [
        paths.batch_node(b, "lock")
        for b in children(zk, paths.BATCHES)
        if paths.BID_RE.fullmatch(b)
    ]
    for folder in paths.OBJECT_LOCK_ROOTS:
        candidates += [f"{folder}/{name}" for name in children(zk, folder)]
    now = time.time()
    return sorted(
        Lock(p, stat.ephemeralOwner, now - stat.ctime / 1000)
        for p, stat in exists_many(zk, candidates).items()
        if stat is not None
    )


def consumer_sessions(zk: Any) -> dict[int, str]:
    """Session -> the consumer process registered in it (``host-pid``)."""
    names = children(zk, CONSUMERS)
    stats = exists_many(zk, [f"{CONSUMERS}/{n}" for n in names])
    return {stat.ephemeralOwner: path.rsplit("/", 1)[1] for path, stat in stats.items() if stat}


# The batch index folders of a batch's finished jobs (Completed, Failed).
_FINISHED_FOLDERS = (job_batch_folder(JobState.COMPLETED), job_batch_folder(JobState.FAILED))


def progress(
    zk: Any, expected: dict[str, set[str]], hostile: Collection[str] = ()
) -> tuple[int, set[str], str, dict[str, int]] | None:
    """(finished jobs, the finished batches' IDs, a line, jobs per state), or None while
    ZooKeeper cannot answer. The jobs of the ``hostile`` batches are left out of the finished
    count (they are in the line's counts): what a strike waits for, and the jobs it finds in
    flight, are the good batches' jobs the verdict judges."""
    try:
        folders = {s: paths.job_state_folder(s) for s in JOB.states}
        hostile_folders = [paths.batch_index(b, f) for b in hostile for f in _FINISHED_FOLDERS]
        stats = exists_many(zk, [*folders.values(), *hostile_folders])
        counts = {s: st.numChildren for s, f in folders.items() if (st := stats[f]) is not None}
        states = batch_states(zk, list(expected))
    except Exception:  # ZooKeeper is away: report again once it is back
        return None
    finished = counts.get(JobState.COMPLETED, 0) + counts.get(JobState.FAILED, 0)
    finished -= sum(st.numChildren for f in hostile_folders if (st := stats[f]) is not None)
    done = {bid for bid, s in states.items() if s in TERMINAL_BATCH}
    working = ", ".join(f"{s} {n}" for s, n in counts.items() if n and s not in TERMINAL_JOB)
    line = (
        f"jobs: {counts.get(JobState.COMPLETED, 0)} Completed, "
        f"{counts.get(JobState.FAILED, 0)} Failed"
        + (f", {working}" if working else "")
        + f" | batches: {len(done)}/{len(expected)} finished"
    )
    return finished, done, line, counts


def wait_for_locks(zk: Any, verdict: Verdict, *, until: float, say: Callable[[str], None]) -> None:
    """With every consumer still running: each lock must go by ``until`` (monotonic; the last
    fault's heal plus the grace). A lock that stays is held by a live session that lost track
    of it (an orphan), or by a job that does not move (stuck)."""
    while True:
        found = locks(zk)
        if not found or time.monotonic() > until:
            break
        time.sleep(1.0)
    sessions = consumer_sessions(zk)
    for lock in found:
        holder = sessions.get(lock.owner)
        who = f"consumer {holder}, still running" if holder else "a session no consumer names"
        verdict.fail(
            f"lock left after the grace: {lock.path}, held {lock.age:.0f}s by session "
            f"0x{lock.owner:x} ({who})"
        )
    say(f"locks after the grace: {len(found)}")


def load_jobs(zk: Any, verdict: Verdict) -> dict[str, Job]:
    jids = sorted(j for j in children(zk, paths.JOBS) if paths.JID_RE.fullmatch(j))
    jobs: dict[str, Job] = {}
    for start in range(0, len(jids), 500):
        for item in jobs_load(zk, jids[start : start + 500]):
            if isinstance(item, Broken):
                verdict.fail(f"job {item.id} does not load: {item.path}: {item.reason}")
            else:
                jobs[item.jid] = item
    return jobs


def local_id(job: Job) -> str:
    return str(job.configuration.get("localID") or (job.local_ids or [""])[0])


def judge_stuck(zk: Any, verdict: Verdict) -> None:
    """No job outside Completed and Failed at the end; each one that is, with its lock."""
    held = {lock.path: lock for lock in locks(zk)}
    for jid, job in sorted(load_jobs(zk, verdict).items()):
        if job.state in TERMINAL_JOB:
            continue
        lock = held.get(paths.job_node(jid, "lock"))
        how = f"locked for {lock.age:.0f}s" if lock else "not locked"
        verdict.fail(f"stuck: job {jid} ({local_id(job)}) still {job.state}, {how}")


def judge_queue(
    zk: Any, var: Path, expected: dict[str, set[str]], verdict: Verdict, say: Callable[[str], None]
) -> dict[str, Job]:
    """The queue after every consumer stopped: consistent, every job ended once, every batch
    reported and mailed once. Returns the jobs."""
    for lock in locks(zk):
        verdict.fail(f"lock left after every consumer stopped: {lock.path}")
    # A consumer killed between reserving a job ID (the sequential create the contract
    # prescribes) and the transaction that writes the job leaves an empty /jobs/jid node; that
    # window cannot be closed, and `queuecheck --repair` removes such nodes once abandoned.
    empty = empty_jobs(zk)
    for path in empty:
        zk.delete(path)
    if empty:
        say(
            f"removed {len(empty)} empty job node(s) left by consumers killed or cut off "
            f"during job creation: {', '.join(empty[:5])}"
        )
    report = run_check(zk, stale_lock_seconds=0)
    for finding in report.findings:
        if finding.kind != "stale-lock":  # locks are judged on their own, above
            verdict.fail(f"consistency check: {finding.kind} {finding.path}: {finding.detail}")

    folders = children(zk, paths.JOB_STATES)
    listed = children_many(zk, [f"{paths.JOB_STATES}/{f}" for f in folders])
    entries: dict[str, list[str]] = defaultdict(list)
    for folder in folders:
        for name in listed[f"{paths.JOB_STATES}/{folder}"] or []:
            match = paths.INDEX_ENTRY_RE.fullmatch(name)
            if match:
                entries[match.group(2)].append(folder)
    jobs = load_jobs(zk, verdict)
    failures: Counter[str] = Counter()
    for jid, job in jobs.items():
        if job.state not in TERMINAL_JOB:
            verdict.fail(f"job {jid} ended {job.state}")
        if job.state == JobState.FAILED:
            failures[job.status.message[:120]] += 1
        if len(entries.get(jid, [])) != 1:
            verdict.fail(f"job {jid} is in {len(entries.get(jid, []))} state folders")

    loaded = {b.bid: b for b in batches_load(zk, list(expected)) if isinstance(b, Batch)}
    for bid, local_ids in expected.items():
        _judge_batch(zk, bid, local_ids, loaded.get(bid), jobs, verdict)
    for bid in sorted(set(batch_ids(zk)) - set(expected)):
        verdict.fail(f"unexpected batch {bid}")
    lines = sum(len(v) for v in expected.values())
    if len(jobs) != lines:
        verdict.fail(f"{len(jobs)} jobs exist for {lines} manifest lines")

    sent = mails(var / "mail")
    for bid in expected:
        if len(sent[bid]) != 1:
            verdict.fail(
                f"batch {bid}: {len(sent[bid])} summary mails (by Message-ID), expected exactly 1"
            )
    for bid in set(sent) - set(expected):
        verdict.fail(f"summary mail for unknown batch {bid}")
    repeated = sum(n - 1 for ids in sent.values() for n in ids.values())
    judge_mail_outcomes(zk, var / "mail", jobs, verdict)

    completed = sum(1 for j in jobs.values() if j.state == JobState.COMPLETED)
    failed = sum(1 for j in jobs.values() if j.state == JobState.FAILED)
    unfinished = len(jobs) - completed - failed
    say(
        f"checked {len(jobs)} jobs ({completed} Completed, {failed} Failed"
        + (f", {unfinished} unfinished" if unfinished else "")
        + "), "
        f"{len(expected)} batches, {sum(len(ids) for ids in sent.values())} summary mails"
        + (f" ({repeated} sent again under the same Message-ID)" if repeated else "")
        + "; "
        f"consistency check: {len(report.findings)} findings"
    )
    for message, count in failures.most_common(8):
        say(f"  failed jobs: {count} x {message}")
    return jobs


def judge_mail_outcomes(zk: Any, folder: Path, jobs: dict[str, Job], verdict: Verdict) -> None:
    """The depositor is told the final outcome only: each summary mail's count of jobs gone
    well is the count of its batch's jobs that ended Completed, and it says failed when any did
    not (a mail sent while a job was still being retried would count it as failed, or not at
    all)."""
    for bid, told in sorted(mail_outcomes(folder).items()):
        members = {j for js in batch_job_ids(zk, bid).values() for j in js} & set(jobs)
        ok = sum(1 for j in members if jobs[j].state == JobState.COMPLETED)
        want = ("failed" if ok < len(members) else "completed", ok, len(members))
        for state, good, total in told:
            if (state, good, total) != want:
                verdict.fail(
                    f"batch {bid}: summary mail told {state} ({good}/{total} ok), but its jobs "
                    f"ended {ok} of {len(members)} Completed"
                )


def _judge_batch(
    zk: Any,
    bid: str,
    local_ids: set[str],
    batch: Batch | None,
    jobs: dict[str, Job],
    verdict: Verdict,
) -> None:
    """Every manifest line exactly one job; the batch reported exactly once."""
    if batch is None:
        verdict.fail(f"batch {bid} is gone or broken")
        return
    if batch.state not in TERMINAL_BATCH:
        verdict.fail(f"batch {bid} ended {batch.state}")
    if batch.state == BatchState.FAILED and not local_ids & set(HOSTILE):
        # Every manifest line of a good batch is a good job: the batch Completes.
        verdict.fail(f"good batch {bid} failed: {batch.status.message[:200]!r}")
    index = batch_job_ids(zk, bid)
    members = sorted({j for js in index.values() for j in js})
    seen = Counter(
        lid
        for j in members
        if j in jobs
        for lid in (jobs[j].local_ids or [str(jobs[j].configuration.get("localID", ""))])
    )
    duplicated = sorted(lid for lid, n in seen.items() if n > 1)
    missing = sorted(local_ids - set(seen))
    if duplicated:
        verdict.fail(f"batch {bid}: manifest lines made more than one job: {duplicated[:5]}")
    if missing:
        verdict.fail(f"batch {bid}: manifest lines without a job: {missing[:5]}")
    report = batch.report or {}
    reported_ok = report.get("successful_jobs") or []
    reported_failed = report.get("failed_jobs") or []
    if not batch.report:
        verdict.fail(f"batch {bid} has no status report")
    elif sorted(reported_ok + reported_failed) != members:
        verdict.fail(f"batch {bid}: status report does not list exactly its jobs")
    elif batch.report.get("history"):
        verdict.fail(f"batch {bid} was reported {1 + len(batch.report['history'])} times")
    want = BatchState.FAILED if reported_failed else BatchState.COMPLETED
    if batch.report and batch.state != want:
        verdict.fail(f"batch {bid} is {batch.state} but its report says {want}")


def judge_failures(jobs: dict[str, Job], verdict: Verdict, say: Callable[[str], None]) -> None:
    """Good jobs Completed, and none Failed by the infrastructure."""
    by_infrastructure = 0
    for jid, job in sorted(jobs.items()):
        lid = local_id(job)
        if lid in HOSTILE or job.state != JobState.FAILED:
            continue
        message = job.status.message
        if INFRASTRUCTURE.search(message):
            by_infrastructure += 1
            verdict.fail(f"failed by the infrastructure: job {jid} ({lid}): {message[:200]!r}")
        else:
            verdict.fail(f"good job {jid} ({lid}) failed: {message[:200]!r}")
    say(f"good jobs failed by the infrastructure: {by_infrastructure}")


def judge_callbacks(
    zk: Any,
    jobs: dict[str, Job],
    callbacks: Counter[str],
    verdict: Verdict,
    say: Callable[[str], None],
    keys: dict[str, set[str]] | None = None,
    told: dict[str, list[str]] | None = None,
) -> None:
    """Every Completed job's callback arrived once as its receiver counts it: by its delivery
    key (``Idempotency-Key``, docs/daemons.md), one key a Completed job, every post keyed. A post
    repeated with the same key (a claim lost while the answer was on its way posts it again:
    docs/zookeeper-contract-notes.md, "The callback record") is a figure, dropped by a receiver
    that keeps its keys; so are records left behind (one whose deletion met an outage).

    Only final outcomes are told (``told``: the ``jobStatus`` of each post, per job): a post for
    a job that did not end Completed, or one telling another status than COMPLETED, told the
    depositor something before (or other than) the job's outcome."""
    keys = keys or {}
    for jid, statuses in sorted((told or {}).items()):
        job = jobs.get(jid)
        ended = job.state if job is not None else "unknown to the queue"
        if ended != JobState.COMPLETED or set(statuses) != {"COMPLETED"}:
            verdict.fail(
                f"callback for job {jid} told {', '.join(statuses)} but the job ended {ended}"
            )
    completed = [jid for jid, job in jobs.items() if job.state == JobState.COMPLETED]
    for jid in sorted(completed):
        seen = keys.get(jid, set())
        if callbacks[jid] == 0:
            verdict.fail(f"job {jid} Completed without its callback")
        elif "" in seen:
            verdict.fail(f"job {jid}: a callback without its delivery key")
        elif len(seen) > 1:
            verdict.fail(f"job {jid}: one outcome delivered under {len(seen)} keys")
    repeated = sum(1 for jid in completed if callbacks[jid] > 1)
    left = len(children(zk, CALLBACKS))
    by_key = sum(len(keys.get(jid, set()) - {""}) for jid in completed)
    say(
        f"callbacks: {len(completed)} Completed jobs called back, {repeated} posted more than "
        f"once ({sum(callbacks.values())} posts, {by_key} by key); {left} callback records left"
    )


def judge_hostile(
    jobs: dict[str, Job],
    var: Path,
    sentinel_hits: int,
    verdict: Verdict,
    say: Callable[[str], None],
) -> None:
    """Every hostile depositor Failed for its own reason, the refused address never asked,
    nothing left in the working folders or storage that is a link or reads as a host file."""
    seen: set[str] = set()
    for job in jobs.values():
        hostile = HOSTILE.get(local_id(job))
        if hostile is None:
            continue
        seen.add(hostile.local_id)
        message = job.status.message if job.state == JobState.FAILED else ""
        if not any(reason in message for reason in hostile.reasons):
            verdict.fail(
                f"hostile job {job.jid} ({hostile.local_id}) ended {job.state}: "
                f"{job.status.message[:200]!r}, expected a failure with "
                + " or ".join(repr(r) for r in hostile.reasons)
            )
    for lid in sorted(set(HOSTILE) - seen):
        verdict.fail(f"hostile object {lid} made no job")
    if sentinel_hits:
        verdict.fail(f"the refused address was asked {sentinel_hits} time(s)")
    for folder in (var / "work", var / "storage"):
        for path in folder.rglob("*") if folder.is_dir() else ():
            if path.is_symlink():
                verdict.fail(f"a link was left in {path}")
            elif path.is_file() and b"root:x:0:0" in path.read_bytes()[:65536]:
                verdict.fail(f"a host file was copied into {path}")
    good = sum(
        1
        for job in jobs.values()
        if (h := HOSTILE.get(local_id(job))) is not None
        and job.state == JobState.FAILED
        and any(reason in job.status.message for reason in h.reasons)
    )
    say(
        f"hostile depositors: {good} of {len(HOSTILE)} failed for their reasons, the refused "
        f"address asked {sentinel_hits} times"
    )


def judge_versions(
    versions: dict[str, list[str]], verdict: Verdict, say: Callable[[str], None]
) -> None:
    """One storage version per object: each object is added once, and an add sent again after
    a lost claim must not make a second version of the same content."""
    doubled = 0
    for ark, digests in sorted(versions.items()):
        if len(digests) > 1:
            doubled += len(digests) - 1
            same = "identical content" if len(set(digests)) == 1 else "different content"
            verdict.fail(f"storage: {ark} has {len(digests)} versions ({same}); expected one")
    say(f"storage: {len(versions)} objects, {doubled} extra versions")


def judge_flaps(
    figures: dict[str, Counter[str]], verdict: Verdict, say: Callable[[str], None]
) -> None:
    """What the flapping services did: spoiled answers per service and kind. A run whose flaps
    spoiled no answer proved nothing of them."""
    total = sum(sum(kinds.values()) for kinds in figures.values())
    if not total:
        verdict.fail(
            "flaps: no answer of a service outside was spoiled; the fault never acted "
            "(no request was made while the services flapped: had every job finished?)"
        )
    for service in sorted(set(figures) | set(FLAPPING_SERVICES)):
        kinds = figures.get(service, Counter())
        shown = ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))
        say(
            f"flaps: {service}: {sum(kinds.values())} answers spoiled"
            + (f" ({shown})" * bool(shown))
        )
    say(f"flaps: {total} answers spoiled in all")


def local_versions(root: Path) -> dict[str, list[str]]:
    """The local store's objects: ARK folder -> the content digest of each version."""
    found: dict[str, list[str]] = {}
    for folder in sorted(root.iterdir()) if root.is_dir() else ():
        if not folder.is_dir():
            continue
        named = ((digits(p.name), p) for p in folder.iterdir())
        numbers = sorted(n for n, p in named if n is not None and p.is_dir())
        digests = []
        for number in numbers:
            try:
                info = json.loads((folder / str(number) / "version.json").read_text())
            except (OSError, ValueError):
                info = {}
            digests.append(str(info.get("content_digest", number)))
        if digests:
            found[folder.name] = digests
    return found


def empty_jobs(zk: Any) -> list[str]:
    candidates = [paths.job(j) for j in children(zk, paths.JOBS) if paths.JID_RE.fullmatch(j)]
    return sorted(
        p for p, stat in exists_many(zk, candidates).items() if stat and stat.numChildren == 0
    )


OUTCOME_RE = re.compile(
    r"^Ingest: \w+ -- Submission Processed: .*?;"
    r" Merritt batch (bid[0-9]{10}) (\w+): .* \((\d+)/(\d+) ok\)$"
)


def mail_outcomes(folder: Path) -> dict[str, list[tuple[str, int, int]]]:
    """Batch ID -> (state word, jobs ok, jobs) of each summary mail's subject."""
    found: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    if folder.is_dir():
        for path in folder.iterdir():
            for message in path.read_text(errors="replace").split("\n" + "-" * 79 + "\n"):
                parsed = email.message_from_string(message.lstrip())
                subject = " ".join(str(parsed.get("Subject", "")).split())
                match = OUTCOME_RE.fullmatch(subject)
                if match:
                    bid, state, good, total = match.groups()
                    found[bid].append((state, int(good), int(total)))
    return found


def mails(folder: Path) -> dict[str, Counter[str]]:
    """Summary mails per batch ID, from the file mail backend's folder: how many times each
    Message-ID was sent. A summary sent again by a consumer that took the batch over from one
    killed between sending it and recording it (docs/daemons.md) is the same message, under
    the same Message-ID, which mail systems and readers drop; a second Message-ID is a second
    summary."""
    found: dict[str, Counter[str]] = defaultdict(Counter)
    if folder.is_dir():
        for path in folder.iterdir():
            for message in path.read_text(errors="replace").split("\n" + "-" * 79 + "\n"):
                parsed = email.message_from_string(message.lstrip())
                subject = " ".join(str(parsed.get("Subject", "")).split())  # unfolded
                match = SUBJECT_RE.match(f"Subject: {subject}")
                if match:
                    found[match.group(1)][str(parsed.get("Message-ID", ""))] += 1
    return found


# At most this many findings of each kind are written out as violations; the rest are counted.
TXNLOG_SHOWN = 20


def judge_txnlog(
    data_dirs: list[Path],
    kept: Path | None,
    chroot: str,
    verdict: Verdict,
    say: Callable[[str], None],
) -> txnlog.Judgement | None:
    """ZooKeeper's own record of the run (``queues.chaos.txnlog``): every lock deleted by its
    owner or with its session, none taken over a standing one, every consumer write to a job
    made under the job's lock. None when the servers are not the run's own (no logs to read)."""
    if not data_dirs:
        say("txn log: not read (the servers are not this run's own)")
        return None
    judged = txnlog.judge_txnlog(data_dirs, kept=kept, chroot=chroot)
    say(judged.figures())
    for shape, count in judged.patterns():
        say(f"  txn log: {count} x {shape}")
    kinds = (
        txnlog.NON_OWNER_DELETE,
        txnlog.ABSENT_DELETE,
        txnlog.OVER_LIVE_LOCK,
        txnlog.UNFENCED_WRITE,
    )
    for kind in kinds:
        found = judged.of(kind)
        for finding in found[:TXNLOG_SHOWN]:
            name = judged.names.get(finding.session)
            verdict.fail(f"txn log: {finding}" + (f" (consumer {name})" if name else ""))
        if len(found) > TXNLOG_SHOWN:
            verdict.fail(f"txn log: {len(found) - TXNLOG_SHOWN} more of: {kind}")
    return judged
