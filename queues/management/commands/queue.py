"""``manage.py queue <action> <ID>...``: every operator move from the command line."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError

from queues import archive, services
from queues.states import AccessState, BatchState
from queues.zk import paths
from queues.zk.errors import DomainError

from ._base import QueueCommand


def _job(action: str) -> Callable[[str, dict], list[services.Outcome]]:
    def run(item: str, opts: dict) -> list[services.Outcome]:
        func = services.JOB_ACTIONS[action]
        if action == "fail":
            return [func(jid=item, message=opts["message"] or "failed by an operator")]
        return [func(jid=item)]

    return run


def _batch(action: str) -> Callable[[str, dict], list[services.Outcome]]:
    def run(item: str, opts: dict) -> list[services.Outcome]:
        return [services.BATCH_ACTIONS[action](bid=item)]

    return run


def _access(action: str) -> Callable[[str, dict], list[services.Outcome]]:
    def run(item: str, opts: dict) -> list[services.Outcome]:
        queue, _, qid = item.partition("/")
        if not qid:
            raise CommandError(f"access requests are named QUEUE/QID (small/qid...), got {item!r}")
        if action == "resume":
            return [
                services.access_resume(queue=queue, qid=qid, to=opts["to"] or AccessState.PENDING)
            ]
        if action == "remove":
            return [services.access_remove_deleted(queue=queue, qid=qid)]
        return [services.access_remove(queue=queue, qid=qid)]

    return run


def _kind_of(item: str) -> str:
    for prefix, kind in (("jid", "job"), ("bid", "batch")):
        if item.startswith(prefix):
            return kind
    return "access" if "/" in item else "unknown"


ACTIONS: dict[str, dict[str, Callable[[str, dict], list[services.Outcome]]]] = {
    "hold": {"job": _job("hold")},
    "release": {"job": _job("release"), "batch": _batch("release")},
    "resume": {"job": _job("resume"), "access": _access("resume")},
    "fail": {"job": _job("fail")},
    "delete": {"job": _job("delete"), "batch": _batch("delete"), "access": _access("delete")},
    # Items marked Deleted (by Merritt's library): their nodes go. "delete" does the same.
    "remove": {"job": _job("remove"), "batch": _batch("remove"), "access": _access("remove")},
    "update-reporting": {"batch": _batch("update-reporting")},
}

HOLD_ACTIONS = {
    "hold-queue": lambda name, o: [services.queue_hold(name=name)],
    "release-queue": lambda name, o: [services.queue_release(name=name)],
    "hold-collection": lambda name, o: [services.collection_hold(profile=name)],
    "release-collection": lambda name, o: services.collection_release(
        profile=name, release_jobs=o["release_held"]
    ),
    "release-held": lambda name, o: services.collection_release_held(profile=name),
}


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
            "action", choices=[*ACTIONS, *HOLD_ACTIONS, "cleanup", "archive"], help="what to do"
        )
        parser.add_argument("ids", nargs="*", help="job, batch or access IDs; queue or profile")
        parser.add_argument("--message", default="", help="reason, for fail")
        parser.add_argument("--to", default="", help="access resume target: Pending|Processing")
        parser.add_argument(
            "--release-held",
            action="store_true",
            help="with release-collection: also release the collection's held jobs and batches",
        )
        parser.add_argument(
            "--older-than-days",
            type=float,
            default=None,
            help="cleanup: completed (or marked Deleted) at least N days ago (default 0); "
            "archive: finished at least N days ago (default MRT_RETENTION_DAYS)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        action, ids = opts["action"], opts["ids"]
        days = opts["older_than_days"]
        if days is not None and days < 0:
            raise CommandError("--older-than-days must not be negative")
        if action == "cleanup":
            self.run_safely(lambda: self.cleanup(timedelta(days=days or 0)))
            return
        if action == "archive":
            age = archive.retention_age() if days is None else timedelta(days=days)
            self.run_safely(lambda: self.archive(age))
            return
        if not ids:
            raise CommandError(f"{action} needs at least one ID")
        failures = 0
        for item in ids:
            try:
                outcomes = self._run(action, item, opts)
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
        for outcome in services.batches_cleanup(older_than=older_than):
            self.stdout.write(str(outcome))
            cleaned += (
                outcome.before == BatchState.COMPLETED and outcome.after == BatchState.DELETED
            )
            removed += outcome.after == services.REMOVED
        for outcome in services.deleted_cleanup(older_than=older_than):
            self.stdout.write(str(outcome))
            removed += outcome.after == services.REMOVED
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

    def _run(self, action: str, item: str, opts: dict) -> list[services.Outcome]:
        if action in HOLD_ACTIONS:
            return HOLD_ACTIONS[action](item, opts)
        kind = _kind_of(item)
        if kind == "job":
            paths.jid(item)
        elif kind == "batch":
            paths.bid(item)
        handlers = ACTIONS[action]
        if kind not in handlers:
            valid = ", ".join(sorted(handlers))
            raise CommandError(f"{action} applies to: {valid}; {item!r} is not one of those")
        return handlers[kind](item, opts)
