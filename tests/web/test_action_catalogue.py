"""The catalogue of operator actions (queues/operator/catalogue.py) against everything derived from
it or written beside it: the state machines' operator moves, the console's and the API's routes, the
role checks and the reason rule. Adding an action is one record there plus its service."""

from __future__ import annotations

import pytest
from django.urls import resolve

from queues.core.roles import ROLES
from queues.core.states import ACCESS, BATCH, JOB
from queues.operator import actions, catalogue
from queues.operator.actions import ReasonRequired
from queues.operator.auth import ACTION_ROLES

MACHINES = {"job": JOB, "batch": BATCH, "access": ACCESS}
# Where each kind's actions are reached: the console page, then the API (None: no such door).
ROUTES = {
    "job": ("/jobs/jid0000000001/{}/", "/api/jobs/jid0000000001/{}"),
    "batch": ("/batches/bid0000000001/{}/", "/api/batches/bid0000000001/{}"),
    "access": ("/access/small/qid0000000001/{}/", "/api/access/small/qid0000000001/{}"),
    "queue": ("/holds/queue/ingest/{}/", "/api/holds/queue/ingest/{}"),
    "collection": ("/holds/collection/letters/{}/", "/api/holds/collection/letters/{}"),
    "node": ("/holds/node/9501/{}/", "/api/holds/node/9501/{}"),
    "service": (
        "/holds/service/depositor:example.org:443/{}/",
        "/api/holds/service/depositor:example.org:443/{}",
    ),
    "consumer": ("/consumers/host-1/{}/", None),
    "consistency": ("/consistency/{}/", None),
}
# Submitting is the batch list's POST (console /submit/, API POST /api/batches), not an item's.
NOT_ITEM_ROUTES = {("batch", "submit")}


def action_id(action: catalogue.Action) -> str:
    """``job-hold``: the same in every process (an action's repr holds its function's address,
    which differs between pytest-xdist's workers, and they must collect the same tests)."""
    return "-".join(action.key)


def test_every_action_is_written_once_with_a_known_role():
    assert len(catalogue.BY_KEY) == len(catalogue.ACTIONS)
    for action in catalogue.ACTIONS:
        assert action.role in ROLES, action
        assert action.kind in ROUTES, action


def test_the_role_checks_are_the_catalogue():
    assert {a.key: a.role for a in catalogue.ACTIONS} == ACTION_ROLES


@pytest.mark.parametrize("kind", sorted(MACHINES))
def test_every_operator_move_of_a_state_machine_has_its_action_and_no_more(kind):
    # Actions that change an item in place (a job's priority) are no moves of its machine.
    listed = {a.name for a in catalogue.ACTIONS if a.kind == kind and a.moves} - {"submit"}
    assert listed == set(MACHINES[kind].actions)


@pytest.mark.parametrize("kind", sorted(MACHINES))
def test_an_action_that_moves_nothing_is_no_move_of_the_state_machine(kind):
    in_place = {a.name for a in catalogue.ACTIONS if a.kind == kind and not a.moves}
    assert not in_place & set(MACHINES[kind].actions)


@pytest.mark.parametrize(
    "action", [a for a in catalogue.ACTIONS if a.key not in NOT_ITEM_ROUTES], ids=action_id
)
def test_every_action_has_its_console_route_and_its_api_route(action):
    page, api = ROUTES[action.kind]
    assert resolve(page.format(action.name)).kwargs.get("action", action.name) in (
        action.name,
        None,
    )
    if api is not None:
        match = resolve(api.format(action.name))
        assert match.url_name.startswith("api-")


@pytest.mark.parametrize("action", catalogue.ACTIONS, ids=action_id)
def test_an_action_that_needs_a_reason_is_refused_without_one(action):
    if action.reason_required:
        with pytest.raises(ReasonRequired):
            actions.check_reason(action.kind, action.name, " ")
    else:
        actions.check_reason(action.kind, action.name, "")
    assert actions.is_destructive(action.kind, action.name) is action.destructive


def test_an_unknown_action_is_nobodys():
    assert catalogue.find("job", "frobnicate") is None
    assert ("job", "frobnicate") not in ACTION_ROLES
