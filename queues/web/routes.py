"""Pieces of URL patterns, derived from the ID patterns in ``zk.paths`` and the operator actions
in ``states``, so the console's and the API's URLs accept exactly what the rest of the code does
(the zk validators still check every ID again before a ZooKeeper path is built)."""

import re

from queues.core.states import ACCESS, BATCH, JOB
from queues.zk import paths
from queues.zk.maintenance import NODE_RE


def _inner(pattern: re.Pattern[str]) -> str:
    return pattern.pattern.removeprefix("^").removesuffix("$")


def _choice(names: tuple[str, ...] | list[str]) -> str:
    return "|".join(re.escape(n) for n in names)


JID = rf"(?P<jid>{_inner(paths.JID_RE)})"
BID = rf"(?P<bid>{_inner(paths.BID_RE)})"
QID = rf"(?P<queue>{_choice(paths.ACCESS_QUEUES)})/(?P<qid>{_inner(paths.QID_RE)})"
# A path segment, so "." and ".." are refused before the next "/" rather than at the end.
_PROFILE = rf"(?!\.\.?/){paths.PROFILE_CHARS}"
PROFILE = rf"(?P<profile>{_PROFILE})"
HELD_PROFILE = rf"(?P<name>{_PROFILE})"  # the API names a collection hold's profile "name"
QUEUE_HOLD = rf"(?P<name>{_choice(list(paths.QUEUE_HOLDS))})"
NODE = rf"(?P<node>{_inner(NODE_RE)})"  # a storage node's number
HELD_NODE = rf"(?P<name>{_inner(NODE_RE)})"  # the API names it "name", as other holds
# A service outside, as its hold's node is named: ``ezid``, ``depositor:example.org:443``.
_SERVICE = r"(?:inventory|ezid|(?:depositor|callback):[^/?#\s]{3,110})"
SERVICE = rf"(?P<service>{_SERVICE})"
HELD_SERVICE = rf"(?P<name>{_SERVICE})"
HOLD_ACTION = r"(?P<action>hold|release)"
JOB_ACTION = rf"(?P<action>{_choice(JOB.actions)})"
BATCH_ACTION = rf"(?P<action>{_choice(BATCH.actions)})"
ACCESS_ACTION = rf"(?P<action>{_choice(ACCESS.actions)})"
