"""The node layout of the contract: identifier patterns and path builders.

Every identifier that comes from outside (a URL, a form, the command line) goes through one of
the ``*_id`` validators before it is joined into a path, so that nothing like ``../`` or a slash
can ever address a node it should not.
"""

import functools
import re

from queues.core.states import job_batch_folder, job_index_folder

from .errors import InvalidID

BATCHES = "/batches"
BATCH_UUIDS = "/batch-uuids"
JOBS = "/jobs"
JOB_STATES = "/jobs/states"
ACCESS = "/access"
ACCESS_QUEUES = ("small", "large")
LOCKS = "/locks"
QUEUE_LOCKS = "/locks/queue"
COLLECTION_LOCKS = "/locks/collections"
STORAGE_LOCKS = "/locks/storage"
INVENTORY_LOCKS = "/locks/inventory"
# Nodes of our own, outside the shared layout: counters for the local minter; the per-object
# lock our Recording takes (Merritt's inventory owns /locks/inventory: docs/merritt-services.md,
# "The object lock").
CONSOLE = "/mrt-console"
MINTER_COUNTERS = "/mrt-console/minter"
RECORDING_LOCKS = "/mrt-console/locks/recording"
# Every folder of per-object locks (ARK-named, ephemeral).
OBJECT_LOCK_ROOTS = (STORAGE_LOCKS, INVENTORY_LOCKS, RECORDING_LOCKS)

BID_RE = re.compile(r"^bid[0-9]{10}$")
JID_RE = re.compile(r"^jid[0-9]{10}$")
QID_RE = re.compile(r"^qid[0-9]{10}$")
# A batch's external id (its submission's batchID, the name under /batch-uuids): any safe node
# name. Merritt's ingest writes "bid-<uuid>", the library accepts any non-empty string; the
# contract allows any name without "/", without control characters (nor the other characters
# ZooKeeper refuses in a path), other than "." and "..", of at most 200 characters.
BATCH_UUID_MAX = 200
NODE_NAME_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\uffff/]")
# "." and ".." are not node names: ZooKeeper refuses them as relative paths.
PROFILE_CHARS = r"[A-Za-z0-9_.-]{1,100}"
# "." and ".." are made of allowed characters but name no node ZooKeeper would accept.
PROFILE_RE = re.compile(rf"^(?!\.\.?$){PROFILE_CHARS}$")
INDEX_ENTRY_RE = re.compile(r"^([0-9]{2})-(jid[0-9]{10})$")

# Queue holds: the node name under /locks/queue for each queue an operator can hold.
QUEUE_HOLDS = {"ingest": "ingest", "access-small": "accessSmall", "access-large": "accessLarge"}
ACCESS_HOLD = {"small": "accessSmall", "large": "accessLarge"}


def _valid(value: str, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidID(f"{what} {value!r} is malformed")
    return value


def bid(value: str) -> str:
    return _bid(value) if isinstance(value, str) else _valid(value, BID_RE, _BID)


def jid(value: str) -> str:
    return _jid(value) if isinstance(value, str) else _valid(value, JID_RE, _JID)


# A daemon builds a job's paths many times a transition; the IDs seen last are not matched again.
_BID = "batch ID (expected bid + 10 digits)"
_JID = "job ID (expected jid + 10 digits)"


@functools.lru_cache(maxsize=4096)
def _bid(value: str) -> str:
    return _valid(value, BID_RE, _BID)


@functools.lru_cache(maxsize=16384)
def _jid(value: str) -> str:
    return _valid(value, JID_RE, _JID)


def qid(value: str) -> str:
    return _valid(value, QID_RE, "access request ID (expected qid + 10 digits)")


def profile(value: str) -> str:
    return _valid(value, PROFILE_RE, "profile name (letters, digits, _ . -)")


def batch_uuid(value: str) -> str:
    """A batch's external id (``batchID``), the one validator for it wherever it comes from.

    Raises InvalidID saying what is wrong: empty, too long, ``.``/``..``, a ``/`` or a control
    character. Anything else is accepted as it is (``bid-<uuid>``, a UUID, any plain string).
    """
    return node_name(value, "batchID", BATCH_UUID_MAX)


def node_name(value: str, what: str, most: int) -> str:
    """``value`` as one node name ZooKeeper takes, of at most ``most`` characters; InvalidID
    naming ``what`` and what is wrong (empty, too long, ``.``/``..``, a ``/``, a control
    character or another character ZooKeeper refuses, which kazoo would fail to send)."""
    if not isinstance(value, str) or not value:
        raise InvalidID(f"{what} must be a non-empty string")
    if len(value) > most:
        raise InvalidID(f"{what} is {len(value)} characters long; at most {most} are allowed")
    if value in (".", ".."):
        raise InvalidID(f"{what} {value!r} is not a node name")
    bad = NODE_NAME_BAD_CHARS.search(value)
    if bad:
        char = bad.group()
        if char == "/":
            why = "a slash"
        elif char <= "\x9f":
            why = f"the control character U+{ord(char):04X}"
        else:
            why = f"U+{ord(char):04X}, a character ZooKeeper refuses in a node name"
        raise InvalidID(f"{what} {value[:60]!r} contains {why}")
    return value


def is_batch_uuid(value: object) -> bool:
    """Whether ``value`` would pass ``batch_uuid`` (for readers that must not raise)."""
    try:
        batch_uuid(value)  # type: ignore[arg-type]
    except InvalidID:
        return False
    return True


def access_queue(value: str) -> str:
    if value not in ACCESS_QUEUES:
        raise InvalidID(f"access queue {value!r} is not one of {', '.join(ACCESS_QUEUES)}")
    return value


def queue_hold(value: str) -> str:
    if value not in QUEUE_HOLDS:
        raise InvalidID(f"queue {value!r} is not one of {', '.join(QUEUE_HOLDS)}")
    return value


def batch(b: str) -> str:
    return f"{BATCHES}/{bid(b)}"


def batch_node(b: str, name: str) -> str:
    return f"{batch(b)}/{name}"


def batch_index(b: str, folder: str) -> str:
    return f"{batch(b)}/states/{folder}"


def batch_index_entry(b: str, state: str, j: str) -> str:
    return f"{batch_index(b, job_batch_folder(state))}/{jid(j)}"


def uuid_entry(u: str) -> str:
    return f"{BATCH_UUIDS}/{batch_uuid(u)}"


def job(j: str) -> str:
    return f"{JOBS}/{_jid(j)}"  # _jid: validated or InvalidID, looked up once per ID


def job_node(j: str, name: str) -> str:
    return f"{job(j)}/{name}"


@functools.lru_cache(maxsize=64)
def job_state_folder(state: str) -> str:
    return f"{JOB_STATES}/{job_index_folder(state)}"


# A consumer names a job's index entries at every step (the one it leaves, the one it makes,
# the one its listing holds): the names of the jobs under way are made once.
@functools.lru_cache(maxsize=16384)
def job_index_entry(state: str, priority: int, j: str) -> str:
    return f"{job_state_folder(state)}/{index_name(priority, j)}"


@functools.lru_cache(maxsize=16384)
def index_name(priority: int, j: str) -> str:
    return f"{priority:02d}-{_jid(j)}"


def entry_jid(name: str) -> str | None:
    """The job ID of a state folder's entry name (``NN-jid...``; None: not such a name)."""
    match = INDEX_ENTRY_RE.fullmatch(name)
    return match.group(2) if match else None


def access(queue: str, q: str) -> str:
    return f"{ACCESS}/{access_queue(queue)}/{qid(q)}"


def access_node(queue: str, q: str, name: str) -> str:
    return f"{access(queue, q)}/{name}"


def queue_lock(name: str) -> str:
    return f"{QUEUE_LOCKS}/{QUEUE_HOLDS[queue_hold(name)]}"


def collection_lock(p: str) -> str:
    return f"{COLLECTION_LOCKS}/{profile(p)}"


OBJECT_LOCK_SEPARATOR = re.compile(":?/")
OBJECT_LOCK_MAX = 1024  # far beyond any ARK
# What the console wrote before it followed the contract's rule: every ':', '?' and '/' became
# '_' on its own, so "ark:/13030/m5abc" was locked as "ark__13030_m5abc". Every ARK starts with
# "ark:/", whose "ark_" under the contract's rule is never followed by a second "_".
LEGACY_OBJECT_LOCK_RE = re.compile(r"^ark__")


def object_lock_name(ark: str) -> str:
    """The node name of an ARK's per-object lock, by the contract (and Merritt's Java library):
    every match of the regular expression ``:?/`` becomes one ``_``, so ``ark:/13030/m5abc``
    is locked as ``ark_13030_m5abc``. InvalidID when the name is none ZooKeeper takes."""
    return node_name(
        OBJECT_LOCK_SEPARATOR.sub("_", ark),
        f"the object lock name of {ark[:60]!r}",
        OBJECT_LOCK_MAX,
    )


def is_legacy_object_lock_name(name: str) -> bool:
    """Whether a name under /locks/storage or /locks/inventory is in the old, wrong form."""
    return bool(LEGACY_OBJECT_LOCK_RE.match(name))


def storage_lock(ark: str) -> str:
    return f"{STORAGE_LOCKS}/{object_lock_name(ark)}"


def inventory_lock(ark: str) -> str:
    return f"{INVENTORY_LOCKS}/{object_lock_name(ark)}"


def recording_lock(ark: str) -> str:
    """The console's own per-object lock for Recording: keeps two of our Recording jobs of one
    object apart without holding the node Merritt's inventory takes in its add."""
    return f"{RECORDING_LOCKS}/{object_lock_name(ark)}"
