"""The state machines as data: who may make which move."""

from __future__ import annotations

import pytest

from queues.core.states import ACCESS, BATCH, JOB, InvalidTransition, job_batch_folder


def test_job_operator_actions_per_state() -> None:
    assert JOB.actions_for("Pending") == ("hold", "fail")
    assert JOB.actions_for("Held") == ("release", "delete")
    assert JOB.actions_for("Failed") == ("resume", "delete")
    assert JOB.actions_for("Completed") == ("delete",)
    assert JOB.actions_for("Downloading") == ("fail",)
    assert JOB.action_sources("delete") == {"Held", "Failed", "Completed"}


def test_successor_is_the_next_step() -> None:
    assert JOB.successor("Processing") == "Storing"
    assert JOB.successor("Notify") == "Completed"
    assert JOB.successor("Completed") is None
    assert BATCH.successor("Processing") == "Reporting"
    assert ACCESS.successor("Processing") == "Completed"


@pytest.mark.parametrize(
    ("machine", "source", "target"),
    [
        (JOB, "Held", "Pending"),
        (JOB, "Failed", "Processing"),
        (BATCH, "Held", "Pending"),
        (BATCH, "Failed", "UpdateReporting"),
        (ACCESS, "Failed", "Pending"),
    ],
)
def test_operator_moves_are_refused_to_consumers(machine, source: str, target: str) -> None:
    machine.check(source, target, admin=True)
    with pytest.raises(InvalidTransition, match="a consumer cannot"):
        machine.check(source, target)


def test_every_working_job_state_can_fail() -> None:
    for state in ("Pending", "Estimating", "Provisioning", "Downloading"):
        assert JOB.allows(state, "Failed")
    for state in ("Processing", "Storing", "Recording", "Notify"):
        assert JOB.allows(state, "Failed")
    assert not JOB.allows("Held", "Failed")
    assert not JOB.allows("Completed", "Failed", admin=True)


def test_batch_folder_follows_the_job_state() -> None:
    assert job_batch_folder("Completed") == "batch-completed"
    assert job_batch_folder("Failed") == "batch-failed"
    assert job_batch_folder("Deleted") == "batch-deleted"
    assert job_batch_folder("Held") == "batch-processing"
    assert job_batch_folder("Notify") == "batch-processing"


@pytest.mark.parametrize("machine", [JOB, BATCH, ACCESS], ids=lambda m: m.name)
def test_allows_answers_as_the_list_of_moves_says(machine) -> None:
    """``allows`` looks moves up in a table built once; it must answer what a walk over the
    machine's moves answers, for every pair of states, consumer and operator alike."""
    from queues.core.states import Kind

    for source in machine.states:
        for target in machine.states:
            for admin in (False, True):
                walked = any(
                    m.source == source
                    and m.target == target
                    and (m.kind is not Kind.ADMIN or admin)
                    for m in machine.moves
                )
                assert machine.allows(source, target, admin=admin) is walked, (source, target)
    assert not machine.allows("nowhere", machine.initial)
