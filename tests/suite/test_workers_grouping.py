"""The suite's own scheduling (tests/workers.py): the modules of ``TOGETHER`` run whole on one
worker, any other test is a unit of its own, and a mark that would not group fails collection."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import workers

ROOT = Path(__file__).resolve().parents[2]


def test_a_together_module_is_one_unit_and_any_other_test_its_own() -> None:
    module = "tests/faults/test_request_bodies.py"
    assert module in workers.TOGETHER
    assert workers.together_scope(f"{module}::test_x[a]") == module
    assert workers.together_scope(f"{module}::test_y") == module
    other = "tests/core/test_counters.py::test_counter_starts_at_one_and_counts_up_as_plain_text"
    assert workers.together_scope(other) == other


def test_the_scheduler_is_the_suites_only_for_its_own_dist() -> None:
    config = SimpleNamespace(option=SimpleNamespace(dist="load"))
    assert workers.pytest_xdist_make_scheduler(config, None) is None


def _item(name: str, grouped: bool) -> Any:
    marker = object() if grouped else None
    return SimpleNamespace(
        path=Path(name), get_closest_marker=lambda mark: marker if mark == "xdist_group" else None
    )


def test_an_xdist_group_mark_or_a_missing_together_module_fails_collection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workers.refuse_xdist_groups([_item("test_a.py", False)])  # nothing to say
    with pytest.raises(pytest.UsageError, match=r"xdist_group does nothing.*test_b\.py"):
        workers.refuse_xdist_groups([_item("test_a.py", False), _item("test_b.py", True)])
    monkeypatch.setattr(workers, "TOGETHER", frozenset({"tests/no/such_module.py"}))
    with pytest.raises(pytest.UsageError, match="no such module"):
        workers.refuse_xdist_groups([])


@pytest.mark.slow
def test_on_two_workers_a_together_modules_tests_all_run_on_one() -> None:
    """Through pytest-xdist itself: the module's tests that need no server, on two workers."""
    env = {**os.environ, "MRT_TEST_WORKERS": "2"}
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-v",
            "tests/faults/test_request_bodies.py",
            "-k",
            "in_front_of_any_asgi_server or without_a_length",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    passed = r"^\[(gw\d+)\] .* PASSED tests/faults/test_request_bodies\.py"
    ran_on = re.findall(passed, run.stdout, re.M)
    assert len(ran_on) >= 3 and len(set(ran_on)) == 1, run.stdout[-3000:]
