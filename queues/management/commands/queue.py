"""``manage.py queue <action> <ID>...``: every operator move from the command line."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError

from queues.core.states import AccessState, BatchState
from queues.operator import archive, catalogue
from queues.services import hold_moves, moves
from queues.zk import paths
from queues.zk.errors import DomainError

from ._base import QueueCommand, number_in

# Ages are given in days, up to a century: a larger number is a mistake, not a policy.
MAX_DAYS = 36_500

# The catalogue's kinds an action name applies to on the command line, and the item names each
# kind takes. Every move goes through its catalogue record, as from the console and the API.
ITEM_ACTIONS: dict[str, tuple[str, ...]] = {
    name: tuple(k for k in ("job", "batch", "access") if catalogue.find(k, name))
    for name in ("hold", "release", "resume", "fail", "delete", "remove", "update-reporting")
}

# Where ``resume --to`` may send an access request.
RESUME_TARGETS = (AccessState.PENDING, AccessState.PROCESSING)

# The actions that go through every finished item rather than the IDs given.
SWEEPS = ("cleanup", "archive")

# The actions whose catalogue record keeps ``--message`` (a failed job's message, a hold's
# reason); any other would drop it.
REASON_ACTIONS = ("fail", "hold-queue", "hold-collection")

# The releases that can also release what their hold parked (``--release-held``).
RELEASE_HELD_ACTIONS = ("release-collection", "release-queue")

# Holds: command name -> (kind, action) in the catalogue.
HOLD_ACTIONS: dict[str, tuple[str, str]] = {
    "hold-queue": ("queue", "hold"),
    "release-queue": ("queue", "release"),
    "hold-collection": ("collection", "hold"),
    "release-collection": ("collection", "release"),
}


def _kind_of(item: str) -> str:
    for prefix, kind in (("jid", "job"), ("bid", "batch")):
        if item.startswith(prefix):
            return kind
    return "access" if "/" in item else "unknown"


def _outcomes(result: Any) -> list[moves.Outcome]:
    return list(result) if isinstance(result, list) else [result]


class Command(QueueCommand):
    help = (
        "Operator moves: hold|release|resume|fail|delete|remove JID..., release|update-reporting|"
        "delete|remove BID..., resume|delete|remove small/QID..., hold-queue|release-queue ingest|"
        "access-small|access-large, hold-collection|release-collection|release-held PROFILE, "
        "cleanup (Completed batches, and every item marked Deleted), archive (finished batches "
        "and their jobs into the database, then out of ZooKeeper)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "action",
            choices=[*ITEM_ACTIONS, *HOLD_ACTIONS, "release-held", "cleanup", "archive"],
            help="what to do",
        )
        parser.add_argument("ids", nargs="*", help="job, batch or access IDs; queue or profile")
        parser.add_argument(
            "--message",
            default="",
            help="fail: the job's message; hold-queue, hold-collection: the hold's reason",
        )
        parser.add_argument("--to", default="", help="access resume target: Pending|Processing")
        parser.add_argument(
            "--release-held",
            action="store_true",
            help=(
                "with release-collection: also release the collection's held jobs and batches; "
                "with release-queue ingest: also release the batches the hold parked"
            ),
        )
        parser.add_argument(
            "--older-than-days",
            type=number_in(0, MAX_DAYS),
            default=None,
            help="cleanup: completed (or marked Deleted) at least N days ago (default 0); "
            "archive: finished at least N days ago (default MRT_RETENTION_DAYS)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        action, ids = opts["action"], opts["ids"]
        days = opts["older_than_days"]
        _check_options(action, ids, opts)
        if action == "cleanup":
            self.run_safely(lambda: self.cleanup(timedelta(days=days or 0)))
            return
        if action == "archive":
            age = archive.retention_age() if days is None else timedelta(days=days)
            self.run_safely(lambda: self.archive(age))
            return
        if not ids:
            raise CommandError(f"{action} needs at least one ID")
        # Every ID is checked before any is acted on: a typo in the third of five IDs moves none.
        calls, refused = [], []
        for item in ids:
            try:
                calls.append(_call(action, item, opts))
            except (DomainError, CommandError) as exc:
                refused.append(f"{item}: {exc}")
        if refused:
            for line in refused:
                self.stderr.write(line)
            raise CommandError(f"{len(refused)} of {len(ids)} refused; nothing was done")
        failures = 0
        for item, call in zip(ids, calls, strict=True):
            try:
                outcomes = _outcomes(call())
            except (DomainError, ValueError, CommandError) as exc:
                failures += 1
                self.stderr.write(f"{item}: {exc}")
                continue
            for outcome in outcomes:
                self.stdout.write(str(outcome))
        if failures:
            raise CommandError(f"{failures} of {len(ids)} failed")

    def cleanup(self, older_than: timedelta) -> None:
        """One line per item as it goes (thousands take a while), then the counts.

        Completed batches are deleted with their jobs; batches, jobs and access requests marked
        Deleted (Merritt's library marks instead of removing) are removed.
        """
        cleaned = removed = 0
        for outcome in moves.batches_cleanup(older_than=older_than):
            self.stdout.write(str(outcome))
            cleaned += (
                outcome.before == BatchState.COMPLETED and outcome.after == BatchState.DELETED
            )
            removed += outcome.after == moves.REMOVED
        for outcome in moves.deleted_cleanup(older_than=older_than):
            self.stdout.write(str(outcome))
            removed += outcome.after == moves.REMOVED
        self.stdout.write(
            f"{cleaned} completed batches cleaned up, {removed} items marked Deleted removed"
        )

    def archive(self, older_than: timedelta) -> None:
        """Retention by hand: one line per finished batch as it goes, then the counts."""
        archived = left = jobs = 0
        for outcome in archive.sweep(older_than=older_than):
            self.stdout.write(str(outcome))
            archived += outcome.done
            left += not outcome.done
            jobs += outcome.jobs if outcome.done else 0
        self.stdout.write(
            f"{archived} batches ({jobs} jobs) archived and removed from ZooKeeper, "
            f"{left} left alone (finished at least {older_than.total_seconds() / 86400:g} days ago)"
        )


def _check_options(action: str, ids: list[str], opts: dict) -> None:
    """CommandError for an option or IDs ``action`` would not use, before anything is read
    or moved: an option dropped in silence would leave the operator thinking it was applied."""
    if action in SWEEPS and ids:
        raise CommandError(
            f"{action} takes no IDs (it goes through every finished item); got {len(ids)}"
        )
    if opts["older_than_days"] is not None and action not in SWEEPS:
        raise CommandError(f"--older-than-days goes with cleanup or archive, not {action}")
    if opts["to"] and action != "resume":
        raise CommandError(f"--to goes with resume of an access request, not {action}")
    if opts["message"] and action not in REASON_ACTIONS:
        raise CommandError(
            f"--message is the reason of {', '.join(REASON_ACTIONS)}; {action} keeps none"
        )
    if opts["release_held"] and action not in RELEASE_HELD_ACTIONS:
        raise CommandError(
            f"--release-held goes with release-collection or release-queue ingest, not {action}"
        )


def _call(action: str, item: str, opts: dict) -> Callable[[], Any]:
    """What ``action`` does to ``item``, to be called once every item is known good; the
    item's form is checked here (InvalidID or CommandError), before anything is read or moved."""
    params: dict[str, Any] = {}
    if opts["to"] and (action, _kind_of(item)) != ("resume", "access"):
        raise CommandError(f"--to goes with resume of an access request, not {item!r}")
    if action == "release-held":
        paths.profile(item)
        return functools.partial(hold_moves.collection_release_held, profile=item)
    if action in HOLD_ACTIONS:
        kind, name = HOLD_ACTIONS[action]
        if kind == "queue":
            paths.queue_hold(item)
            if opts["release_held"] and item != "ingest":
                # Checked here with the other IDs: refused after the ingest queue's release,
                # it would leave that one done.
                raise CommandError(
                    f"--release-held goes with release-queue ingest: the hold of {item} "
                    "parks no jobs to release"
                )
        else:
            paths.profile(item)
        params["release_jobs"] = opts["release_held"]
    else:
        kind, name = _kind_of(item), action
        if kind not in ITEM_ACTIONS[action]:
            valid = ", ".join(ITEM_ACTIONS[action])
            raise CommandError(f"{action} applies to: {valid}; {item!r} is not one of those")
        if kind == "job":
            paths.jid(item)
        elif kind == "batch":
            paths.bid(item)
        else:
            params["queue"], _, item = item.partition("/")
            paths.access_queue(params["queue"])
            paths.qid(item)
            params["to"] = opts["to"] or AccessState.PENDING
            if params["to"] not in RESUME_TARGETS:
                raise CommandError(
                    f"--to {params['to']!r}: an access request resumes to "
                    + " or ".join(RESUME_TARGETS)
                )
    record = catalogue.find(kind, name)
    assert record is not None  # ITEM_ACTIONS and HOLD_ACTIONS name only catalogued actions
    return functools.partial(
        record.run, catalogue.Call(item, reason=opts["message"], params=params)
    )
