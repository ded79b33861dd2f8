"""Immutable views of queue items as read from ZooKeeper.

Each record keeps the raw JSON it was decoded from (so unknown keys survive a read-modify-write)
and the version of its status node (so a write can be checked against what was read).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar, overload

from queues.core.states import job_batch_folder

from . import paths
from .codecs import local_time, parse_stamp
from .errors import MalformedNode, NotFound

V = TypeVar("V")


@dataclass(frozen=True)
class LockInfo:
    created: datetime
    session_id: int

    def age_at(self, now: float) -> float:
        """Seconds held at ``now``: the ZooKeeper server's time (``servertime``), the clock of
        the lock node's ``ctime`` this is made from."""
        return max(0.0, now - self.created.timestamp())


class _once(Generic[V]):  # used as a decorator, like functools.cached_property
    """``functools.cached_property`` without its lock (Python 3.11 takes one at every first
    look, and a consumer makes two new records a transition): the value is computed at the
    first look and kept in the instance's ``__dict__``, where later looks find it first. Two
    threads racing on the first look both compute the same value."""

    def __init__(self, compute: Callable[[Any], V]) -> None:
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> _once[V]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> V: ...

    def __get__(self, instance: object, owner: type | None = None) -> V | _once[V]:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


@dataclass(frozen=True, eq=False)
class Status:
    """A status node: the state name and the rest of its JSON."""

    raw: dict[str, Any]
    version: int
    mtime: datetime

    @staticmethod
    def from_server(raw: dict[str, Any], version: int, mtime_ms: int) -> Status:
        """A status as the server's stat gives its version and mtime (milliseconds), the
        mtime made into local time at its first look only: a consumer reads or moves thousands
        of jobs a second and looks at few of their mtimes."""
        status = object.__new__(_ServerStatus)
        status.__dict__.update(raw=raw, version=version, _mtime_ms=mtime_ms)
        return status

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Status):
            return NotImplemented
        return (self.raw, self.version, self.mtime) == (other.raw, other.version, other.mtime)

    __hash__ = None  # type: ignore[assignment]  # raw is a dict: as unhashable as before

    @_once
    def status(self) -> str:
        """The state (looked up once: a consumer asks a job's state many times a move)."""
        value = self.raw.get("status")
        return value if isinstance(value, str) else "?"

    @property
    def message(self) -> str:
        value = self.raw.get("message")
        return value if isinstance(value, str) else ""

    @property
    def last_modified(self) -> datetime | None:
        return parse_stamp(self.raw.get("last_modified")) or self.mtime

    @property
    def last_successful_status(self) -> str | None:
        value = self.raw.get("last_successful_status")
        return value if isinstance(value, str) and value else None

    @property
    def retry_count(self) -> int:
        value = self.raw.get("retry_count", 0)
        return value if isinstance(value, int) else 0

    @property
    def mtime_seconds(self) -> float:
        """``mtime`` as seconds since the epoch."""
        return self.mtime.timestamp()

    def age_at(self, now: float) -> float:
        """Seconds in the current state at ``now``, from the node's own modification time: the
        ZooKeeper server's clock, so ``now`` is the server's too (``servertime.server_now``),
        not the host's, which may be minutes off."""
        return max(0.0, now - self.mtime_seconds)


class _ServerStatus(Status):
    """``Status.from_server``'s: ``mtime`` is made at its first look (the dataclass's own
    ``__init__`` is not run; ``dataclasses.replace`` and ``evolve`` work as on any Status)."""

    @_once
    def mtime(self) -> datetime:
        return local_time(self.__dict__["_mtime_ms"] / 1000)

    @property
    def mtime_seconds(self) -> float:
        # The server's milliseconds while ``mtime`` was neither looked at nor given (``evolve``,
        # ``dataclasses.replace``): the step history asks for every job, and makes no datetime.
        values = self.__dict__
        if "mtime" in values:
            return float(values["mtime"].timestamp())
        return float(values["_mtime_ms"] / 1000)


R = TypeVar("R")


def evolve(record: R, **changes: Any) -> R:
    """``dataclasses.replace`` for these records, made by copying the fields instead of running
    the generated ``__init__`` again (the daemons make a moved Job at every transition)."""
    new = object.__new__(type(record))
    values = new.__dict__
    values.update(record.__dict__)
    values.update(changes)
    if len(values) != len(record.__dict__):  # a change that names no field (or a field
        # made at its first look and not looked at yet: a read status's ``mtime``)
        fields: dict[str, Any] = record.__dataclass_fields__  # type: ignore[attr-defined]
        unknown = changes.keys() - fields.keys()
        if unknown:
            raise TypeError(f"{type(record).__name__} has no field {', '.join(sorted(unknown))}")
    return new


def text_field(node: dict[str, Any], key: str) -> str:
    """A text field of a decoded node; anything else (missing, null, a number) reads as ""."""
    value = node.get(key)
    return value if isinstance(value, str) else ""


class _Item:
    """What a job and a batch both answer: the state, and whom and which collection the item is
    for (a job's ``configuration``, a batch's ``submission``)."""

    status: Status

    def _sent(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def state(self) -> str:
        return self.status.status

    @property
    def profile(self) -> str:
        return text_field(self._sent(), "profile")

    @property
    def submitter(self) -> str:
        return text_field(self._sent(), "submitter")


@dataclass(frozen=True)
class Job(_Item):
    jid: str
    bid: str
    priority: int
    space_needed: int
    configuration: dict[str, Any]
    status: Status
    created: datetime
    identifiers: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    inventory: dict[str, Any] | None = None
    store: dict[str, Any] | None = None
    lock: LockInfo | None = None
    # Optional nodes that exist but do not decode: path -> reason. Shown, never fatal.
    problems: dict[str, str] = field(default_factory=dict)
    # The configuration node's version when read (-1: not known), so a job read again while
    # its lock is held is not decoded again when nobody changed it.
    configuration_version: int = field(default=-1, compare=False, repr=False)

    def _sent(self) -> dict[str, Any]:
        return self.configuration

    @property
    def primary_id(self) -> str:
        return text_field(self.identifiers or {}, "primary_id")

    @property
    def local_ids(self) -> list[str]:
        value = (self.identifiers or {}).get("local_id") or []
        return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

    @property
    def index_path(self) -> str:
        return paths.job_index_entry(self.state, self.priority, self.jid)

    @property
    def batch_index_path(self) -> str:
        return f"{paths.batch_index(self.bid, job_batch_folder(self.state))}/{self.jid}"


@dataclass(frozen=True)
class Batch(_Item):
    bid: str
    submission: dict[str, Any]
    status: Status
    created: datetime
    started: bool
    report: dict[str, Any] | None = None
    lock: LockInfo | None = None
    problems: dict[str, str] = field(default_factory=dict)

    def _sent(self) -> dict[str, Any]:
        return self.submission

    @property
    def uuid(self) -> str:
        return text_field(self.submission, "batchID")

    @property
    def title(self) -> str:
        return text_field(self.submission, "title")

    @property
    def type(self) -> str:
        return text_field(self.submission, "type")


@dataclass(frozen=True)
class AccessRequest:
    queue: str
    qid: str
    token: dict[str, Any]
    status: Status
    created: datetime
    lock: LockInfo | None = None

    @property
    def state(self) -> str:
        return self.status.status


@dataclass(frozen=True)
class Broken:
    """An item that exists but cannot be loaded: shown with the reason, never acted on blindly."""

    kind: str
    id: str
    path: str
    reason: str


T = TypeVar("T")


def decode_each(kind: str, ids: Iterable[str], decode: Callable[[str], T]) -> list[T | Broken]:
    """Each item decoded in order: one whose nodes do not decode is a ``Broken`` record (shown,
    never acted on blindly), one gone since it was listed is left out."""
    result: list[T | Broken] = []
    for item_id in ids:
        try:
            result.append(decode(item_id))
        except NotFound:
            continue
        except MalformedNode as exc:
            result.append(Broken(kind, item_id, exc.path, exc.reason))
    return result
