"""Every field of every API answer that docs/console.md names (its table "The fields of the
answers"), read from the console against a real ZooKeeper and checked for its kind (issue 53,
item 5: ``GET /api/batches/BID`` answered ``"state": ""`` for months and no test read it).

The table is the test's input: a field the docs name that an answer lacks, or carries as
another kind (an empty state, a time in another form), fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from console.conftest import PROFILE
from queues.core.states import BATCH, JOB
from queues.services import hold_moves
from queues.zk import batches

pytestmark = pytest.mark.django_db

DOCS = Path(__file__).resolve().parents[2] / "docs" / "console.md"
EXACT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\+00:00")
ROW = re.compile(r"^\| `GET (/api/[^`]+)`( items\[\])? \| (.+) \|$")
FIELD = re.compile(r"^([a-z_]+) \(([A-Za-z ]+?)(\?)?\)$")


def documented() -> list[tuple[str, bool, list[tuple[str, str, bool]]]]:
    """(answer, per item, [(field, kind, may be null)]) for each row of the docs' table."""
    text = DOCS.read_text()
    section = text[text.index("### The fields of the answers") :]
    section = section[: section.index("\n## ")]
    rows = []
    for line in section.splitlines():
        found = ROW.match(line)
        if not found:
            continue
        fields = []
        for part in found.group(3).split(", "):
            field = FIELD.match(part.strip())
            assert field, f"docs/console.md: cannot read {part!r} in {line!r}"
            fields.append((field.group(1), field.group(2), bool(field.group(3))))
        rows.append((found.group(1), bool(found.group(2)), fields))
    return rows


def of_kind(value: Any, kind: str) -> bool:
    return {
        "text": lambda v: isinstance(v, str),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "time": lambda v: isinstance(v, str) and EXACT.fullmatch(v) is not None,
        "list": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
        "job state": lambda v: isinstance(v, str) and JOB.is_state(v),
        "batch state": lambda v: isinstance(v, str) and BATCH.is_state(v),
        "job ID": lambda v: isinstance(v, str) and re.fullmatch(r"jid\d{10}", v) is not None,
        "batch ID": lambda v: isinstance(v, str) and re.fullmatch(r"bid\d{10}", v) is not None,
    }[kind](value)


def test_the_table_names_the_answers_and_reads_as_fields() -> None:
    rows = documented()
    assert len(rows) >= 15
    for _answer, _items, fields in rows:
        for _name, kind, _null in fields:
            assert kind in {
                "text",
                "number",
                "bool",
                "time",
                "list",
                "object",
                "job state",
                "batch state",
                "job ID",
                "batch ID",
            }, kind


def test_every_documented_field_of_every_answer_is_there_as_documented(
    zk: Any, make_job: Any, make_batch: Any, make_access: Any, token_for: Any, admin: Client
) -> None:
    batch = make_batch()
    failed = make_job("Failed", batch=batch)
    done = make_job("Completed", batch=batch)
    make_access("Failed")
    batches.batch_write_report(
        zk, batches.batch_load(zk, batch.bid), failed=[failed.jid], successful=[done.jid]
    )
    batches.batch_transition(zk, batches.batch_load(zk, batch.bid), "Processing")
    hold_moves.node_hold(node="9501", reason="patch", by="olga")
    admin.post(f"/holds/collection/{PROFILE}/hold/", {"reason": "look"})  # an audit entry
    admin.post(f"/notes/job/{failed.jid}/", {"text": "seen"})
    where = {
        "/api/jobs/JID": f"/api/jobs/{failed.jid}",
        "/api/batches/BID": f"/api/batches/{batch.bid}",
        "/api/notes": f"/api/notes?kind=job&item={failed.jid}",
    }
    api = Client(**token_for("viewer"))
    read = 0
    for answer, per_item, fields in documented():
        response = api.get(where.get(answer, answer))
        assert response.status_code == 200, (answer, response.content[:300])
        body = response.json()
        targets = body["items"] if per_item else [body]
        assert targets, f"{answer}: no items to read (the test made some)"
        for target in targets:
            for name, kind, nullable in fields:
                assert name in target, f"{answer}: no field {name} (docs/console.md names it)"
                value = target[name]
                if value is None:
                    assert nullable, f"{answer}: {name} is null"
                    continue
                assert of_kind(value, kind), f"{answer}: {name} = {value!r} is no {kind}"
                read += 1
    assert read >= 150

    # The fields of the batch that were wrong: its own state, and the filter's echo.
    own = api.get(f"/api/batches/{batch.bid}").json()
    assert own["state"] == "Processing" and own["job_state"] == ""
    filtered = api.get(f"/api/batches/{batch.bid}?state=Failed").json()
    assert filtered["state"] == "Processing" and filtered["job_state"] == "Failed"
    assert filtered["jobs"] == {"Failed": [failed.jid]}
