"""``manage.py queue <action> <ID>...``: every operator move from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.management.base import CommandError

from queues.core.states import REMOVE, AccessState, BatchState
from queues.operator import actions, archive, audit, catalogue
from queues.operator.audit import record
from queues.services import hold_moves, moves
from queues.zk import paths
from queues.zk.errors import DomainError, is_connection_error

from ._base import QueueCommand, number_in, require_database

# How the audit log tells a change made here from one made in the console ("web") or the API.
VIA = "command"

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

# The actions with no record of their own in the catalogue go by the role and reason rule of
# one that has: release-held releases what a collection's release with its held items would;
# cleanup and archive take batches (with their jobs) out of ZooKeeper, as a batch's remove does.
RULES: dict[str, tuple[str, str]] = {
    "release-held": ("collection", "release"),
    "cleanup": ("batch", REMOVE),
    "archive": ("batch", REMOVE),
}

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


@dataclass(frozen=True)
class Move:
    """One ID's move, its form checked: the catalogue's kind and action (or release-held's),
    the item and the parameters, as the console's views give them to ``actions.perform``."""

    given: str  # the ID as the operator typed it
    kind: str
    action: str
    item_id: str
    params: dict[str, Any] = field(default_factory=dict)


class Command(QueueCommand):
    help = (
        "Operator moves, made as a console user (--user NAME, whose role is checked as in the "
        "console) and audited: hold|release|resume|fail|delete|remove JID..., "
        "release|update-reporting|delete|remove BID..., resume|delete|remove small/QID..., "
        "hold-queue|release-queue ingest|access-small|access-large, "
        "hold-collection|release-collection|release-held PROFILE, cleanup (Completed batches, "
        "and every item marked Deleted), archive (finished batches and their jobs into the "
        "database, then out of ZooKeeper). A destructive one needs --reason."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "action",
            choices=[*ITEM_ACTIONS, *HOLD_ACTIONS, "release-held", "cleanup", "archive"],
            help="what to do",
        )
        parser.add_argument("ids", nargs="*", help="job, batch or access IDs; queue or profile")
        parser.add_argument(
            "--user",
            default="",
            help="the console user the change is made as (needed): its role is checked and it "
            "is the actor of the audit entries, as in the console",
        )
        parser.add_argument(
            "--reason",
            "--message",
            dest="reason",
            default="",
            help="why, kept in the audit entry; needed by the destructive actions (fail, "
            "delete, remove, cleanup, archive) and hold-queue; fail: also the job's message; "
            "hold-queue, hold-collection: also the hold's reason",
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
        action, ids, reason = opts["action"], opts["ids"], opts["reason"]
        days = opts["older_than_days"]
        # Everything is checked before anything moves: the options, the IDs' form, the user,
        # its role and the reason. A refusal changes nothing.
        _check_options(action, ids, opts)
        if action not in SWEEPS and not ids:
            raise CommandError(f"{action} needs at least one ID")
        twice = sorted({item for item in ids if ids.count(item) > 1})
        if twice:
            raise CommandError(
                f"given more than once: {', '.join(twice)}; give each ID once, nothing was done"
            )
        if not opts["user"]:
            raise CommandError(
                "--user NAME is needed: the console user the change is made as, for its role "
                "and the audit log; nothing was done"
            )
        if action in SWEEPS:
            require_database()
            user = _console_user(opts["user"])
            try:
                actions.check(
                    user=user,
                    kind="batch",
                    action=action,
                    item_id="",
                    reason=reason,
                    via=VIA,
                    rule=RULES[action],
                )
            except (PermissionDenied, DomainError) as exc:
                raise CommandError(f"{action} refused ({exc}); nothing was done") from exc
            if action == "cleanup":
                self.run_safely(lambda: self.cleanup(timedelta(days=days or 0), user, reason))
            else:
                age = archive.retention_age() if days is None else timedelta(days=days)
                self.run_safely(lambda: self.archive(age, user, reason))
            return
        # Every ID is checked before any is acted on: a typo in the third of five IDs moves none.
        planned, refused = [], []
        for item in ids:
            try:
                planned.append(_move(action, item, opts))
            except (DomainError, CommandError) as exc:
                refused.append(f"{item}: {exc}")
        if not refused:
            require_database()
            user = _console_user(opts["user"])
            for move in planned:
                # The console's checks, each refusal audited as the console audits it.
                try:
                    actions.check(
                        user=user,
                        kind=move.kind,
                        action=move.action,
                        item_id=move.item_id,
                        reason=reason,
                        params=move.params,
                        via=VIA,
                        rule=RULES.get(action),
                    )
                except (PermissionDenied, DomainError) as exc:
                    refused.append(f"{move.given}: {exc}")
        if refused:
            for line in refused:
                self.stderr.write(line)
            raise CommandError(f"{len(refused)} of {len(ids)} refused; nothing was done")
        failures = 0
        for move in planned:
            try:
                outcomes = _perform(move, user, reason)
            except (DomainError, ValueError, PermissionDenied) as exc:
                failures += 1
                self.stderr.write(f"{move.given}: {exc}")
                continue
            for outcome in outcomes:
                self.stdout.write(str(outcome))
        if failures:
            raise CommandError(f"{failures} of {len(ids)} failed")

    def cleanup(self, older_than: timedelta, user: Any, reason: str) -> None:
        """One line per item as it goes (thousands take a while), then the counts; every item
        taken away audited as it goes.

        Completed batches are deleted with their jobs; batches, jobs and access requests marked
        Deleted (Merritt's library marks instead of removing) are removed.
        """
        audit.writable()  # as actions.perform: no move its entry could not follow
        cleaned = removed = stopped = 0
        for outcome in moves.batches_cleanup(older_than=older_than):
            self.stdout.write(str(outcome))
            _audit_swept(outcome, user, reason)
            if outcome.detail.startswith(moves.PARTWAY):
                stopped += 1
                continue
            cleaned += (
                outcome.before == BatchState.COMPLETED and outcome.after == BatchState.DELETED
            )
            removed += outcome.after == moves.REMOVED
        for outcome in moves.deleted_cleanup(older_than=older_than):
            self.stdout.write(str(outcome))
            _audit_swept(outcome, user, reason)
            removed += outcome.after == moves.REMOVED
        self.stdout.write(
            f"{cleaned} completed batches cleaned up, {removed} items marked Deleted removed"
            + (
                f", {stopped} batches stopped part-way (marked Deleted; cleanup again finishes "
                "them)"
                if stopped
                else ""
            )
        )

    def archive(self, older_than: timedelta, user: Any, reason: str) -> None:
        """Retention by hand: one line per finished batch as it goes, then the counts; every
        batch archived audited as it goes."""
        archived = left = jobs = stopped = 0
        lost: BaseException | None = None
        sweep = archive.sweep(older_than=older_than)
        while True:
            try:
                outcome = next(sweep)
            except StopIteration:
                break
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                lost = exc  # the sweep ends; what it did is counted below all the same
                break
            self.stdout.write(str(outcome))
            # Stopped part-way: some of its jobs removed, the batch marked Deleted.
            if outcome.partway or outcome.done:
                record(
                    user=user,
                    action="archive",
                    kind="batch",
                    item_id=outcome.bid,
                    before=outcome.state,
                    after="archived" if outcome.done else BatchState.DELETED,
                    reason=reason.strip(),
                    detail=(
                        f"with {outcome.jobs} jobs, removed from ZooKeeper"
                        if outcome.done
                        else f"stopped: {outcome.detail}"
                    ),
                    ok=bool(outcome.done),
                    via=VIA,
                )
            archived += outcome.done
            stopped += outcome.partway
            left += not outcome.done and not outcome.partway
            jobs += outcome.jobs if outcome.done else 0
        self.stdout.write(
            f"{archived} batches ({jobs} jobs) archived and removed from ZooKeeper, "
            f"{left} left alone (finished at least {older_than.total_seconds() / 86400:g} days ago)"
            + (
                f", {stopped} batches stopped part-way (marked Deleted; archive again finishes "
                "them)"
                if stopped
                else ""
            )
        )
        if lost is not None:
            raise CommandError(
                f"ZooKeeper was lost ({str(lost) or type(lost).__name__}); the sweep stopped "
                "there: archive again, once it answers, to go on (a batch marked Deleted is "
                "finished then)"
            ) from lost


def _console_user(name: str) -> Any:
    """The console user a change is made as: it must exist and be active (its role is checked
    per action by ``actions.check``, as in the console)."""
    user = get_user_model().objects.filter(username=name).first()
    if user is None:
        raise CommandError(f"no console user {name!r}; nothing was done")
    if not user.is_active:
        raise CommandError(f"console user {name!r} is inactive; nothing was done")
    return user


def _perform(move: Move, user: Any, reason: str) -> list[moves.Outcome]:
    """The move through the console's path (``actions.perform``: role, reason, audit); release-
    held, which has no record in the catalogue, audited the same way."""
    if move.action != "release-held":
        return actions.perform(
            user=user,
            kind=move.kind,
            action=move.action,
            item_id=move.item_id,
            reason=reason,
            params=move.params,
            via=VIA,
        )
    audit.writable()  # as actions.perform: no move its entry could not follow
    try:
        outcomes = hold_moves.collection_release_held(profile=move.item_id)
    except (DomainError, ValueError) as exc:
        actions.audit_refusal(
            exc,
            user=user,
            kind=move.kind,
            action=move.action,
            item_id=move.item_id,
            reason=reason,
            via=VIA,
        )
        raise
    _stop_if_kept(
        actions.audit_made(outcomes, user=user, action=move.action, reason=reason, via=VIA)
    )
    return outcomes


def _audit_swept(outcome: moves.Outcome, user: Any, reason: str) -> None:
    """A cleanup's item, audited when it was taken away, or some of it was (one left alone did
    not move; a Deleted batch whose removal stopped part-way lost some of its jobs)."""
    if outcome.before == outcome.after and not outcome.detail.startswith(moves.PARTWAY):
        return
    # An access request's outcome names its queue in its detail ("small queue").
    queue = outcome.detail.removesuffix(" queue") if outcome.kind == "access" else ""
    _stop_if_kept(
        actions.audit_made(
            [outcome], user=user, action="cleanup", reason=reason, params={"queue": queue}, via=VIA
        )
    )


def _stop_if_kept(kept: list[Any]) -> None:
    """As the console's actions: nothing moves without its entry. A move whose entry met a
    database outage stops the command there (the entry is in the log; a command's process ends
    before the database can take it), rather than going on moving unaudited."""
    if kept:
        raise CommandError(
            "the database went away after the last move: its audit entry is in the log above "
            "(a WARNING); nothing more was moved"
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
    if opts["release_held"] and action not in RELEASE_HELD_ACTIONS:
        raise CommandError(
            f"--release-held goes with release-collection or release-queue ingest, not {action}"
        )


def _move(action: str, item: str, opts: dict) -> Move:
    """What ``action`` does to ``item``, to be done once every item is known good; the item's
    form is checked here (InvalidID or CommandError), before anything is read or moved."""
    params: dict[str, Any] = {}
    if opts["to"] and (action, _kind_of(item)) != ("resume", "access"):
        raise CommandError(f"--to goes with resume of an access request, not {item!r}")
    if action == "release-held":
        paths.profile(item)
        return Move(item, "collection", "release-held", item)
    given = item
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
        # As the console's hold forms give them: what the hold parked, and who holds.
        params["release_jobs"] = opts["release_held"]
        params["by"] = opts["user"]
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
    assert catalogue.find(kind, name) is not None  # ITEM_ACTIONS and HOLD_ACTIONS name these
    return Move(given, kind, name, item, params)
