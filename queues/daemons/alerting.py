"""Alerts: rule findings become episodes, episodes become messages, messages are delivered.

Episodes (``AlertEpisode``). A rule's finding for a key opens an episode; while it is found
again the episode stays open; once it is no longer found the episode notes since when, and is
resolved when it has stayed clear for the rule's quiet period. A condition that comes back
within the quiet period continues the same episode, so a flapping condition is one alert and
one "resolved", never a stream of them. The database allows one open episode per rule and key
(a partial unique index): when evaluators on two hosts find the same thing, the one whose insert
wins announces it, and a resolution is one conditional update, announced by whoever made it.

Messages (``AlertMessage``) are written in the transaction that opens or resolves the episode,
one per configured channel (``MRT_ALERT_EMAIL``, ``MRT_ALERT_WEBHOOK_URL``), and delivered by
any alerts daemon that claims them (a conditional update with a claim time): a mail server or
webhook that cannot take one now (``queues.core.transient.is_mail_outage``, connection errors, 5xx)
leaves it waiting with a growing delay, as does a mail server's answer every message would meet
(``transient.mail_refusal``: the console's credentials, sender or greeting refused, AUTH or
STARTTLS not offered); only a refusal for good (another 5xx mail answer, HTTP 4xx) marks it
failed, shown on the page. A crash between sending and recording the
send repeats the message once: a duplicate is better than an alert nobody got.

When the database itself is away, findings cannot be written: the evaluator keeps those
episodes and their messages in its own memory and delivers them from there (the database-down
alert itself travels this way). Only the process that holds the alerts leadership evaluates
while ZooKeeper is reachable, so this happens once; when ZooKeeper is away as well, every alerts
process falls back to its memory, and each host says so once rather than nobody.

The daily digest is written by the first evaluator past ``MRT_ALERT_DIGEST_HOUR`` on a day (an
``AlertDigest`` row per day, unique), and travels like any other message.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from queues.core import clock, transient
from queues.core.outside_text import for_slack, url_shown
from queues.daemons.alert_rules import (
    KINDS,
    Context,
    Finding,
    RuleKind,
    RuleSettings,
    console_url,
    defaults,
)
from queues.daemons.alert_rules import rule_settings as load_rule_settings
from queues.models import AlertDigest, AlertEpisode, AlertMessage
from queues.operator import audit
from queues.services import hold_moves
from queues.steps.netpolicy import SYSTEM
from queues.steps.notify import CallbackError, post_callback, send
from queues.zk.errors import is_connection_error

log = logging.getLogger("queues.alerts")

SLACK, JSON = "slack", "json"
WEBHOOK_FORMATS = (SLACK, JSON)
CLAIM = timedelta(minutes=2)  # a claimed message no daemon marked sent is tried again after
RETRY_FIRST = 15.0  # seconds before a message an outage kept is tried again, doubling
RETRY_MOST = 600.0
WEBHOOK_TIMEOUT = 10.0
DELIVER_AT_ONCE = 50  # messages one delivery round takes at most
# A channel that cannot take messages (its server away) is logged when it begins to wait, when
# the reason changes, and at most every WAIT_SAID_EVERY while it lasts; its other tries meanwhile
# are logged at DEBUG. Once it takes one again, a line says how long it waited.
WAIT_SAID_EVERY = timedelta(minutes=10)
DIGEST_EPISODES = 50  # episodes a digest lists by name


# Where messages go ---------------------------------------------------------------------------


def email_recipients() -> list[str]:
    return [a.strip() for a in str(settings.MRT_ALERT_EMAIL or "").split(",") if a.strip()]


def webhook_url() -> str:
    return str(settings.MRT_ALERT_WEBHOOK_URL or "").strip()


def webhook_format() -> str:
    value = str(settings.MRT_ALERT_WEBHOOK_FORMAT or SLACK).strip().lower()
    return value if value in WEBHOOK_FORMATS else SLACK


def webhook_shown() -> str:
    """The webhook as the page shows it: its scheme and host only (a Slack webhook's path is
    its secret)."""
    url = webhook_url()
    if not url:
        return ""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}/…"


def channels() -> list[str]:
    found = []
    if email_recipients():
        found.append(AlertMessage.EMAIL)
    if webhook_url():
        found.append(AlertMessage.WEBHOOK)
    return found


def environment() -> str:
    return str(getattr(settings, "MRT_ENVIRONMENT", "") or "")


def alerts_url() -> str:
    return f"{str(settings.MRT_CONSOLE_URL).rstrip('/')}/alerts/"


# What messages say ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Draft:
    """A message before it is written for each channel."""

    event: str
    subject: str
    text: str
    fields: dict[str, Any]


def _tag() -> str:
    env = environment()
    return f"[Merritt queue{' ' + env if env and env != 'production' else ''}]"


def _iso(moment: datetime | None) -> str | None:
    """A time in a message's machine fields (the webhook's JSON): the API's one ISO form."""
    return clock.exact(moment) if moment else None


def _when(moment: datetime | None) -> str:
    """A time in a message's words: the console's one written form (``queues.core.clock``)."""
    return clock.clock_text(moment)


def _lasted(start: datetime, end: datetime) -> str:
    seconds = max(0, int((end - start).total_seconds()))
    hours, rest = divmod(seconds, 3600)
    return f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min {rest % 60} s"


@dataclass
class Episode:
    """An episode as the messages describe it (a row, or one kept in memory)."""

    kind: str
    key: str
    summary: str
    detail: str
    opened: datetime
    resolved: datetime | None = None
    fused: str = ""


def fired_draft(ep: Episode, settings_: RuleSettings, finding: Finding | None = None) -> Draft:
    """The alert; ``finding`` (when the episode opens) adds its causes and link as fields."""
    kind = KINDS[ep.kind]
    lines = [ep.summary]
    if ep.detail:
        lines += ["", ep.detail]
    if ep.fused:
        lines += ["", ep.fused]
    lines += [
        "",
        f"Rule: {kind.title} (threshold {settings_.threshold:g}: {kind.threshold_help})",
        f"Since: {_when(ep.opened)}",
    ]
    if finding is not None and finding.link:
        lines.append(f"See: {console_url(finding.link)}")
    lines.append(f"Alerts: {alerts_url()}")
    fields = _fields(ep, AlertMessage.FIRED)
    if finding is not None:
        fields["causes"] = [
            {"count": c.count, "cause": c.what, "total": c.total, "url": console_url(c.path)}
            for c in finding.causes
        ]
        fields["link"] = console_url(finding.link) if finding.link else ""
    return Draft(
        AlertMessage.FIRED,
        f"{_tag()} ALERT {kind.title}: {ep.summary}",
        "\n".join(lines) + "\n",
        fields,
    )


def cleared_text(ep: Episode) -> str:
    """What is over, in the rule's words ("storage node 9501 is no longer held: released by
    olga at ..."); a rule without them says the condition is no longer found."""
    kind = KINDS.get(ep.kind)
    if kind is not None and kind.cleared is not None:
        try:
            return kind.cleared(ep.key, ep.opened)
        except Exception as exc:  # the words are a nicety: the resolution goes out regardless
            log.warning("alerts: what cleared %s[%s] not said: %s", ep.kind, ep.key, exc)
    return f"no longer found: {ep.summary}"


def resolved_draft(ep: Episode) -> Draft:
    kind = KINDS.get(ep.kind)
    title = kind.title if kind else ep.kind
    end = ep.resolved or timezone.now()
    over = cleared_text(ep)
    lines = [
        f"Resolved: {over}.",
        "",
        f"The alert was: {ep.summary}",
        f"Began {_when(ep.opened)}, resolved {_when(end)} (after {_lasted(ep.opened, end)}).",
    ]
    if ep.fused:
        lines.append(f"The fuse held the collection: {ep.fused} Release it on the holds page.")
    lines.append(f"Alerts: {alerts_url()}")
    return Draft(
        AlertMessage.RESOLVED,
        f"{_tag()} RESOLVED {title}: {over}",
        "\n".join(lines) + "\n",
        {**_fields(ep, AlertMessage.RESOLVED), "cleared": over},
    )


def _fields(ep: Episode, event: str) -> dict[str, Any]:
    kind = KINDS.get(ep.kind)
    return {
        "event": event,
        "rule": ep.kind,
        "title": kind.title if kind else ep.kind,
        "key": ep.key,
        "summary": ep.summary,
        "detail": ep.detail,
        "fused": ep.fused,
        "opened": _iso(ep.opened),
        "resolved": _iso(ep.resolved),
    }


def payload(draft: Draft, form: str) -> dict[str, Any]:
    """The webhook body: Slack's incoming-webhook ``{"text": ...}``, or the plain JSON form.
    Slack reads ``<...>`` as a link or a mention (``<!channel>``) and ``&`` as the start of an
    entity: every text (an operator's hold reason, a depositor's error) is shown as written."""
    if form == SLACK:
        return {"text": for_slack(f"{draft.subject}\n{draft.text}".strip())}
    return {
        **draft.fields,
        "subject": draft.subject,
        "text": draft.text,
        "environment": environment(),
        "console": alerts_url(),
    }


def write_messages(
    draft: Draft, now: datetime, episode: AlertEpisode | None = None
) -> list[AlertMessage]:
    """One row per configured channel, due at ``now`` (in the caller's transaction)."""
    form = webhook_format()
    return [
        AlertMessage.objects.create(
            episode=episode,
            event=draft.event,
            channel=channel,
            subject=draft.subject[:300],
            text=draft.text,
            payload=payload(draft, form) if channel == AlertMessage.WEBHOOK else {},
            created=now,
            next_try=now,
        )
        for channel in channels()
    ]


# Delivery ------------------------------------------------------------------------------------


class Undelivered(Exception):
    """A message the channel cannot take now (``later``) or refuses for good."""

    def __init__(self, reason: str, *, later: bool) -> None:
        super().__init__(reason)
        self.later = later


def _one_line(exc: BaseException) -> str:
    return " ".join((str(exc).strip() or type(exc).__name__).split())[:500]


def send_email(subject: str, text: str) -> None:
    try:
        send(email_recipients(), subject, text)
    except Exception as exc:
        later = transient.is_mail_outage(exc)
        said = _one_line(exc)
        refusal = transient.mail_refusal(exc)
        if refusal is not None:
            said = f"the mail server {refusal}: {said}"
        raise Undelivered(f"mail: {said}", later=later) from exc


def send_webhook(body: dict[str, Any]) -> None:
    url = webhook_url()
    if not url:
        raise Undelivered("no webhook configured (MRT_ALERT_WEBHOOK_URL)", later=False)
    policy = replace(SYSTEM, timeout=WEBHOOK_TIMEOUT, deadline=2 * WEBHOOK_TIMEOUT)
    try:
        post_callback(url, body, timeout=WEBHOOK_TIMEOUT, retries=0, policy=policy)
    except CallbackError as exc:
        # The URL is the webhook's secret: the reason names the host only (the callback's words
        # name it with its password hidden, when it has one).
        reason = str(exc).replace(url_shown(url), webhook_shown()).replace(url, webhook_shown())
        later = exc.status is None or exc.status >= 500 or exc.status == 429
        raise Undelivered(f"webhook: {reason}", later=later) from exc


def send_message(channel: str, subject: str, text: str, body: dict[str, Any]) -> None:
    if channel == AlertMessage.EMAIL:
        send_email(subject, text)
    else:
        send_webhook(body)


def retry_delay(attempts: int) -> float:
    return float(min(RETRY_MOST, RETRY_FIRST * 2 ** max(0, min(attempts - 1, 16))))


class _ChannelWaits:
    """What this process last said of each channel that waits: (reason, when said, since)."""

    def __init__(self) -> None:
        self._said: dict[str, tuple[str, datetime, datetime]] = {}
        self._lock = threading.Lock()

    def worth_saying(self, channel: str, reason: str, now: datetime) -> bool:
        with self._lock:
            said = self._said.get(channel)
            if said is not None and said[0] == reason and now - said[1] < WAIT_SAID_EVERY:
                return False
            self._said[channel] = (reason, now, said[2] if said else now)
            return True

    def over(self, channel: str) -> datetime | None:
        """When the channel began to wait, if it did; it no longer does."""
        with self._lock:
            said = self._said.pop(channel, None)
        return said[2] if said else None


_channel_waits = _ChannelWaits()


def deliver(message: AlertMessage, *, now: datetime | None = None) -> bool:
    """Send one claimed message and record what happened; True when it went out."""
    now = now or timezone.now()
    attempts = message.attempts + 1
    try:
        send_message(message.channel, message.subject, message.text, message.payload)
    except Undelivered as exc:
        changes: dict[str, Any] = {"attempts": attempts, "error": str(exc), "claimed_until": None}
        if exc.later:
            changes["next_try"] = now + timedelta(seconds=retry_delay(attempts))
        else:
            changes["failed"] = True
        AlertMessage.objects.filter(pk=message.pk).update(**changes)
        said = not exc.later or _channel_waits.worth_saying(message.channel, str(exc), now)
        log.log(
            logging.WARNING if said else logging.DEBUG,
            "alert message %s (%s %s) %s: %s",
            message.pk,
            message.event,
            message.channel,
            "waits" if exc.later else "refused",
            exc,
        )
        return False
    AlertMessage.objects.filter(pk=message.pk).update(
        sent=now, attempts=attempts, error="", claimed_until=None
    )
    since = _channel_waits.over(message.channel)
    if since is not None:
        log.info(
            "alerts: the %s channel takes messages again (it waited from %s)",
            message.channel,
            clock.clock_text(since),
        )
    log.info("alert message %s (%s %s) sent", message.pk, message.event, message.channel)
    return True


def _claimable(now: datetime) -> Q:
    return Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)


def claim(pk: int, now: datetime) -> bool:
    return bool(
        AlertMessage.objects.filter(pk=pk, sent__isnull=True, failed=False)
        .filter(_claimable(now))
        .update(claimed_until=now + CLAIM)
    )


def deliver_due(*, now: datetime | None = None) -> int:
    """Send the messages that are due, each claimed first (several daemons may deliver);
    returns how many went out. A channel that cannot take one now is not tried again this
    round: its other messages wait with it."""
    now = now or timezone.now()
    due = list(
        AlertMessage.objects.filter(sent__isnull=True, failed=False, next_try__lte=now)
        .filter(_claimable(now))
        .order_by("id")[:DELIVER_AT_ONCE]
    )
    sent = 0
    down: set[str] = set()
    for message in due:
        if message.channel in down or not claim(message.pk, now):
            continue
        if deliver(message, now=now):
            sent += 1
            continue
        if not AlertMessage.objects.filter(pk=message.pk, failed=True).exists():
            down.add(message.channel)
    return sent


def send_test(*, user: Any) -> list[AlertMessage]:
    """Write a test message for each channel and try to deliver it at once; one that cannot go
    now is left to the alerts daemon like any other."""
    who = user.get_username() if user is not None else "?"
    draft = Draft(
        AlertMessage.TEST,
        f"{_tag()} test alert",
        f"A test alert sent by {who} from the alerts page; alerts reach this channel.\n"
        f"Alerts: {alerts_url()}\n",
        {
            "event": AlertMessage.TEST,
            "rule": "",
            "title": "Test alert",
            "key": "",
            "summary": f"test alert sent by {who}",
            "detail": "",
            "fused": "",
            "opened": _iso(timezone.now()),
            "resolved": None,
        },
    )
    now = timezone.now()
    messages = write_messages(draft, now)
    for message in messages:
        if claim(message.pk, now):
            deliver(message, now=now)
    return [AlertMessage.objects.get(pk=m.pk) for m in messages]


# The daily digest ----------------------------------------------------------------------------


def digest_draft(now: datetime) -> Draft:
    since = now - timedelta(days=1)
    episodes = list(AlertEpisode.objects.filter(Q(opened__gte=since) | Q(resolved__isnull=True)))
    open_now = [e for e in episodes if e.resolved is None]
    waiting = AlertMessage.objects.filter(sent__isnull=True, failed=False).count()
    refused = AlertMessage.objects.filter(failed=True, created__gte=since).count()
    lines = [
        f"Alerts in the 24 hours to {_when(now)}: {len(episodes) - len(open_now)} resolved "
        f"or opened, {len(open_now)} open now.",
        "",
    ]
    if not episodes:
        lines.append("Nothing fired. The alerts daemon is running and evaluating the rules.")
    for ep in episodes[:DIGEST_EPISODES]:
        title = KINDS[ep.kind].title if ep.kind in KINDS else ep.kind
        state = f"resolved {_when(ep.resolved)}" if ep.resolved else "OPEN"
        lines.append(f"- {title}: {ep.summary} (opened {_when(ep.opened)}, {state})")
    if len(episodes) > DIGEST_EPISODES:
        lines.append(f"  and {len(episodes) - DIGEST_EPISODES} more")
    if waiting or refused:
        lines += ["", f"Messages waiting for delivery: {waiting}; refused for good: {refused}."]
    lines += ["", f"Alerts: {alerts_url()}"]
    summary = f"{len(open_now)} open, {len(episodes)} in the last 24 hours"
    return Draft(
        AlertMessage.DIGEST,
        f"{_tag()} daily alert digest: {summary}",
        "\n".join(lines) + "\n",
        {
            "event": AlertMessage.DIGEST,
            "rule": "",
            "title": "Daily digest",
            "key": "",
            "summary": summary,
            "detail": "",
            "fused": "",
            "opened": _iso(now),
            "resolved": None,
        },
    )


def digest_if_due(now: datetime) -> bool:
    """Write today's digest when its hour has come and nobody wrote it yet; True if written."""
    hour = int(settings.MRT_ALERT_DIGEST_HOUR)
    local = timezone.localtime(now)
    if hour < 0 or local.hour < hour:
        return False
    if AlertDigest.objects.filter(day=local.date()).exists():
        return False
    try:
        with transaction.atomic():
            AlertDigest.objects.create(day=local.date(), created=now)
            write_messages(digest_draft(now), now)
    except IntegrityError:
        return False  # written meanwhile by another evaluator
    log.info("alerts: daily digest for %s written", local.date())
    return True


# Evaluation ----------------------------------------------------------------------------------


@dataclass
class Kept:
    """An episode kept in memory while the database is away, and its undelivered messages."""

    episode: Episode
    clear_since: datetime | None = None
    outbox: list[tuple[str, Draft]] = field(default_factory=list)


def evaluator_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Evaluator:
    """The rules' evaluation in one process: what is sustained since when, the rule settings
    last read, and the episodes kept in memory while the database is away."""

    def __init__(self, *, name: str | None = None) -> None:
        self.name = name or evaluator_name()
        self.since: dict[tuple[str, str], datetime] = {}
        self.settings: dict[str, RuleSettings] = {}
        self.kept: dict[tuple[str, str], Kept] = {}
        # The episodes the database had open at the last round it answered: while it is away,
        # they are not announced again from memory.
        self.stored_open: set[tuple[str, str]] = set()

    # Rules -----------------------------------------------------------------------------------

    def rule_settings(self) -> dict[str, RuleSettings]:
        """The rules as the database has them; the last read (or the defaults) while it is
        away, so that the database-down rule still runs."""
        try:
            self.settings = load_rule_settings()
        except Exception as exc:
            if not transient.is_database_outage(exc):
                raise
            for kind in KINDS.values():
                self.settings.setdefault(kind.kind, defaults(kind))
        return self.settings

    def evaluate(self, *, zk: Any, now: datetime, kinds: list[str] | None = None) -> list[str]:
        """One round over the enabled rules (``kinds``: only those); lines saying what changed."""
        said: list[str] = []
        ctx = Context(zk=zk, now=now)
        rules = [
            (kind, rule)
            for kind_name, rule in self.rule_settings().items()
            if (kind := KINDS.get(kind_name)) is not None
            and rule.enabled
            and (kinds is None or kind_name in kinds)
        ]
        # The open episodes of every rule evaluated, in one query a round (not one a rule);
        # the last-seen times of those still found, in one write at the round's end.
        stored = self._stored_open([kind.kind for kind, _rule in rules])
        seen: list[int] = []
        for kind, rule in rules:
            kind_name = kind.kind
            try:
                findings = kind.check(ctx, rule.threshold)
            except Exception as exc:
                # Not known this round: nothing fires and nothing clears.
                if is_connection_error(exc) or transient.is_transient(exc):
                    log.info("alerts: rule %s not evaluated: %s", kind_name, _one_line(exc))
                else:
                    log.exception("alerts: rule %s failed", kind_name)
                continue
            if kind.sustained:
                findings = self._sustained(kind, rule, findings, now)
            try:
                said += self.apply(kind, rule, findings, now, stored=stored, seen=seen)
            except Exception as exc:
                # ZooKeeper gone while the fuse held a collection: the episode was not
                # written, so the next round opens it (and holds) again.
                if not is_connection_error(exc):
                    raise
                log.warning("alerts: rule %s not applied: %s", kind_name, _one_line(exc))
        if seen:
            try:
                AlertEpisode.objects.filter(pk__in=seen).update(last_seen=now)
            except Exception as exc:
                # Only the times shown are late: the episodes themselves are as they were.
                if not transient.is_database_outage(exc):
                    raise
                log.info("alerts: last seen not written: %s", _one_line(exc))
        return said

    def _stored_open(self, kinds: list[str]) -> dict[str, dict[str, AlertEpisode]] | Exception:
        """The open episodes of ``kinds``, by kind and key; the database's error when it is
        away (each rule then keeps its findings in memory, ``_keep``)."""
        found: dict[str, dict[str, AlertEpisode]] = {kind: {} for kind in kinds}
        if not kinds:
            return found
        try:
            for row in AlertEpisode.objects.filter(kind__in=kinds, resolved__isnull=True):
                found[row.kind][row.key] = row
        except Exception as exc:
            if not transient.is_database_outage(exc):
                raise
            return exc
        return found

    def _sustained(
        self, kind: RuleKind, rule: RuleSettings, findings: list[Finding], now: datetime
    ) -> list[Finding]:
        keys = {f.key for f in findings}
        for gone in [k for k in self.since if k[0] == kind.kind and k[1] not in keys]:
            del self.since[gone]
        lasting = []
        for finding in findings:
            first = self.since.setdefault((kind.kind, finding.key), now)
            if (now - first).total_seconds() >= rule.threshold:
                lasting.append(finding)
        return lasting

    # Episodes --------------------------------------------------------------------------------

    def apply(
        self,
        kind: RuleKind,
        rule: RuleSettings,
        findings: list[Finding],
        now: datetime,
        *,
        stored: dict[str, dict[str, AlertEpisode]] | Exception | None = None,
        seen: list[int] | None = None,
    ) -> list[str]:
        """Open, keep or resolve ``kind``'s episodes for this round's ``findings``. ``stored``:
        the open episodes as the round read them (``_stored_open``; None: read here); ``seen``:
        where the episodes still found whose last-seen time alone changes are gathered, for the
        round's one write (None: written here)."""
        said: list[str] = []
        found = {f.key: f for f in findings}
        said += self._apply_kept(kind, rule, found, now)
        try:
            if isinstance(stored, Exception):
                raise stored
            open_ = None if stored is None else stored.get(kind.kind, {})
            said += self._apply_stored(kind, rule, found, now, open_, seen)
        except Exception as exc:
            if not transient.is_database_outage(exc):
                raise
            said += self._keep(kind, rule, found, now, _one_line(exc))
        return said

    def _apply_stored(
        self,
        kind: RuleKind,
        rule: RuleSettings,
        found: dict[str, Finding],
        now: datetime,
        stored: dict[str, AlertEpisode] | None = None,
        seen: list[int] | None = None,
    ) -> list[str]:
        said = []
        if stored is None:
            stored = {
                e.key: e for e in AlertEpisode.objects.filter(kind=kind.kind, resolved__isnull=True)
            }
        for key, finding in found.items():
            if (kind.kind, key) in self.kept:
                continue
            episode = stored.get(key)
            if episode is None:
                said += self._open(kind, rule, finding, now)
            elif (
                seen is not None
                and episode.clear_since is None
                and episode.summary == finding.summary
                and episode.detail == finding.detail
            ):
                seen.append(episode.pk)  # only its last-seen time changes: the round's write
            else:
                AlertEpisode.objects.filter(pk=episode.pk).update(
                    last_seen=now, clear_since=None, summary=finding.summary, detail=finding.detail
                )
        self.stored_open = {k for k in self.stored_open if k[0] != kind.kind}
        self.stored_open |= {(kind.kind, key) for key in set(stored) | set(found)}
        for key, episode in stored.items():
            if key in found:
                continue
            if episode.clear_since is None:
                AlertEpisode.objects.filter(pk=episode.pk, clear_since__isnull=True).update(
                    clear_since=now
                )
            elif (now - episode.clear_since).total_seconds() >= rule.quiet:
                said += self._resolve(episode, now)
        return said

    def _open(
        self, kind: RuleKind, rule: RuleSettings, finding: Finding, now: datetime
    ) -> list[str]:
        try:
            with transaction.atomic():
                row = AlertEpisode.objects.create(
                    kind=kind.kind,
                    key=finding.key,
                    summary=finding.summary,
                    detail=finding.detail,
                    opened=now,
                    last_seen=now,
                    evaluator=self.name,
                )
                if kind.fuse and rule.fuse and finding.key:
                    # Inside the transaction: if the episode is not written, the next round
                    # holds again (a hold already in place is left as it is) and says so then.
                    row.fused = self._fuse(finding.key, finding.summary)
                    row.save(update_fields=["fused"])
                write_messages(fired_draft(_episode(row), rule, finding), now, row)
        except IntegrityError:
            return []  # another evaluator opened it first and announces it
        line = f"alert {kind.kind}[{finding.key}] fired: {finding.summary}"
        log.warning("alerts: %s", line)
        return [line]

    def _fuse(self, profile: str, summary: str) -> str:
        outcome = hold_moves.collection_hold(
            profile=profile, by="alert fuse", reason=summary[:2000], keep_record=True
        )
        if outcome.before == "held":
            return f"The collection {profile} was already held."
        audit.record(
            user=None,
            action="hold",
            kind="collection",
            item_id=profile,
            before="released",
            after="held",
            reason=f"alert fuse: {summary}",
            via="alerts",
        )
        log.warning("alerts: fuse held collection %s: %s", profile, summary)
        return (
            f"The fuse held the collection {profile}: its jobs wait until an operator "
            "releases it on the holds page."
        )

    def _resolve(self, episode: AlertEpisode, now: datetime) -> list[str]:
        with transaction.atomic():
            if not AlertEpisode.objects.filter(pk=episode.pk, resolved__isnull=True).update(
                resolved=now
            ):
                return []  # resolved meanwhile by another evaluator
            episode.resolved = now
            write_messages(resolved_draft(_episode(episode)), now, episode)
        line = f"alert {episode.kind}[{episode.key}] resolved: {episode.summary}"
        log.info("alerts: %s", line)
        return [line]

    # Episodes kept in memory while the database is away -------------------------------------

    def _keep(
        self,
        kind: RuleKind,
        rule: RuleSettings,
        found: dict[str, Finding],
        now: datetime,
        why: str,
    ) -> list[str]:
        """Open in memory what the database could not take; an episode the database had open
        at its last answer stays the database's (announced already, resolved once it is back)."""
        said = []
        for key, finding in found.items():
            if (kind.kind, key) in self.kept or (kind.kind, key) in self.stored_open:
                continue
            ep = Episode(kind.kind, key, finding.summary, finding.detail, now)
            ep.detail = "\n".join(filter(None, [ep.detail, f"(the database is away: {why})"]))
            kept = Kept(ep)
            kept.outbox = [(c, fired_draft(ep, rule, finding)) for c in channels()]
            self.kept[(kind.kind, key)] = kept
            said.append(f"alert {kind.kind}[{key}] fired (kept in memory): {finding.summary}")
            log.warning("alerts: %s", said[-1])
        return said

    def _apply_kept(
        self, kind: RuleKind, rule: RuleSettings, found: dict[str, Finding], now: datetime
    ) -> list[str]:
        said = []
        for (kind_name, key), kept in list(self.kept.items()):
            if kind_name != kind.kind or kept.episode.resolved is not None:
                continue
            if key in found:
                kept.clear_since = None
            elif kept.clear_since is None:
                kept.clear_since = now
            elif (now - kept.clear_since).total_seconds() >= rule.quiet:
                kept.episode.resolved = now
                kept.outbox += [(c, resolved_draft(kept.episode)) for c in channels()]
                said.append(f"alert {kind_name}[{key}] resolved: {kept.episode.summary}")
                log.info("alerts: %s", said[-1])
        return said

    def deliver_kept(self) -> int:
        """Send what the episodes kept in memory have to say; a resolved one whose messages
        all went out is written to the database for the page (once it answers), and dropped."""
        sent = 0
        for ident, kept in list(self.kept.items()):
            while kept.outbox:
                channel, draft = kept.outbox[0]
                try:
                    send_message(
                        channel, draft.subject, draft.text, payload(draft, webhook_format())
                    )
                except Undelivered as exc:
                    if exc.later:
                        break
                    log.warning("alerts: kept message refused: %s", exc)
                kept.outbox.pop(0)
                sent += 1
            if kept.outbox or kept.episode.resolved is None:
                continue
            try:
                _record_kept(kept.episode, self.name)
            except Exception as exc:
                if not transient.is_database_outage(exc):
                    raise
                continue
            del self.kept[ident]
        return sent


def _episode(row: AlertEpisode) -> Episode:
    return Episode(row.kind, row.key, row.summary, row.detail, row.opened, row.resolved, row.fused)


def _record_kept(ep: Episode, evaluator: str) -> None:
    """An episode that lived in memory, into the database's history (already resolved)."""
    AlertEpisode.objects.create(
        kind=ep.kind,
        key=ep.key,
        summary=ep.summary,
        detail=ep.detail,
        opened=ep.opened,
        last_seen=ep.resolved or ep.opened,
        clear_since=ep.resolved,
        resolved=ep.resolved,
        evaluator=evaluator,
    )
