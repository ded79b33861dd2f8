"""The operator commands: submitbatch, queue, queuecheck and zkdump."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from kazoo.client import KazooClient

from queues.core.roles import OPERATOR
from queues.operator.audit import AuditEntry
from queues.zk import access, batches, jobs, locks, maintenance
from queues.zk.records import Batch, Job

from .conftest import OPS
from .helpers import BID_RE, assert_batch_status, assert_job_status, read_json, walk_job

MANAGE = Path(settings.BASE_DIR) / "manage.py"


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def queue(*args: str) -> str:
    """``manage.py queue ARGS --user ops``."""
    return run("queue", *args, "--user", OPS)


def test_submitbatch_creates_a_pending_batch_and_prints_its_id(zk: KazooClient) -> None:
    out = run(
        "submitbatch",
        "--profile",
        "merritt_demo_content",
        "--submitter",
        "dpr/Ada Lovelace",
        "--payload-url",
        "https://example.org/manifest.checkm",
        "--type",
        "batch-manifest",
        "--title",
        "Notes",
    )
    bid = out.strip()
    assert BID_RE.fullmatch(bid)
    assert_batch_status(zk, bid, status="Pending")
    submission = read_json(zk, f"/batches/{bid}/submission")
    assert submission["profile"] == "merritt_demo_content"
    assert submission["submitter"] == "dpr/Ada Lovelace"
    assert submission["payload_url"] == "https://example.org/manifest.checkm"
    # Merritt ingest's type name (its readers need it); the console's beside it.
    assert submission["type"] == "batchManifest"
    assert submission["submission_type"] == "batch-manifest"
    assert submission["update"] is False
    assert submission["title"] == "Notes"
    assert zk.get(f"/batch-uuids/{submission['batchID']}")[0] == bid.encode()


def test_submitbatch_records_a_digest_in_lower_case(zk: KazooClient, tmp_path: Path) -> None:
    bid = run(
        "submitbatch",
        "--profile",
        "merritt_demo_content",
        "--submitter",
        "dpr",
        "--payload-url",
        (tmp_path / "object.zip").as_uri(),
        "--digest-alg",
        "sha256",
        "--digest-value",
        "ABC123" * 10 + "ABCD",
    ).strip()
    submission = read_json(zk, f"/batches/{bid}/submission")
    assert submission["digest"] == {"alg": "sha256", "value": "abc123" * 10 + "abcd"}
    assert submission["type"] == "file"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "../x"], "profile"),
        (["--profile", "no_such_collection"], "no profile named 'no_such_collection' here"),
        (["--payload-url", "ftp://example.org/a"], "payload URL"),
        (["--payload-url", "file:///etc/passwd"], "outside the allowed folders"),
        (["--payload-url", "file://otherhost/a.zip"], "another host"),
        (["--submitter", "  "], "submitter"),
    ],
)
def test_submitbatch_refuses_bad_input_with_a_clear_message(
    zk: KazooClient, args: list[str], message: str
) -> None:
    base = {
        "--profile": "merritt_demo_content",
        "--submitter": "dpr",
        "--payload-url": "https://example.org/a.zip",
    }
    base[args[0]] = args[1]
    with pytest.raises(CommandError, match=message):
        run("submitbatch", *[x for pair in base.items() for x in pair])
    assert batches.batch_ids(zk) == []


def test_file_payloads_are_refused_unless_mrt_file_roots_names_a_folder(
    zk: KazooClient, tmp_path: Path, settings
) -> None:
    settings.MRT_FILE_ROOTS = []
    args = ["--profile", "merritt_demo_content", "--submitter", "dpr"]
    with pytest.raises(CommandError, match="MRT_FILE_ROOTS is empty"):
        run("submitbatch", *args, "--payload-url", (tmp_path / "a.zip").as_uri())
    assert batches.batch_ids(zk) == []
    settings.MRT_FILE_ROOTS = [tmp_path]
    assert BID_RE.fullmatch(
        run("submitbatch", *args, "--payload-url", (tmp_path / "a.zip").as_uri()).strip()
    )


def test_queue_resume_prints_each_move(
    zk: KazooClient, make_job: Callable[..., Job], batch: Batch, ops: Any
) -> None:
    first, second = make_job(), make_job()
    jobs.job_transition(zk, first, "Failed", message="boom")
    failed = walk_job(zk, second, "Downloading")
    jobs.job_transition(zk, failed, "Failed")
    out = queue("resume", first.jid, second.jid)
    assert out.splitlines() == [
        f"job {first.jid}: Failed -> Estimating (retry 1)",
        f"job {second.jid}: Failed -> Downloading (retry 1)",
    ]
    assert_job_status(zk, second.jid, status="Downloading", last_successful="Provisioning", retry=1)


def test_queue_fail_hold_release_and_delete_jobs(zk: KazooClient, job: Job, ops: Any) -> None:
    assert queue("hold", job.jid).strip() == f"job {job.jid}: Pending -> Held"
    assert queue("release", job.jid).strip() == f"job {job.jid}: Held -> Pending"
    assert (
        queue("fail", job.jid, "--reason", "bad host").strip()
        == f"job {job.jid}: Pending -> Failed"
    )
    assert read_json(zk, f"/jobs/{job.jid}/status")["message"] == "bad host"
    out = queue("delete", job.jid, "--reason", "a test job")
    assert out.strip().startswith(f"job {job.jid}: Failed -> Deleted")
    assert zk.exists(f"/jobs/{job.jid}") is None


def test_queue_update_reporting_and_delete_batches(zk: KazooClient, batch: Batch, ops: Any) -> None:
    for state in ("Processing", "Reporting", "Failed"):
        batch = batches.batch_transition(zk, batch, state)
    assert (
        queue("update-reporting", batch.bid).strip()
        == f"batch {batch.bid}: Failed -> UpdateReporting"
    )
    assert_batch_status(zk, batch.bid, status="UpdateReporting")
    batch = batches.batch_transition(zk, batches.batch_load(zk, batch.bid), "Completed")
    assert queue("delete", batch.bid, "--reason", "a test batch").strip() == (
        f"batch {batch.bid}: Completed -> Deleted (0 jobs deleted)"
    )


def test_queue_holds_and_releases_queues_and_collections(
    zk: KazooClient, make_job: Callable[..., Job], ops: Any
) -> None:
    out = queue("hold-queue", "ingest", "--reason", "redeploy")
    assert out.strip() == "queue ingest: released -> held"
    assert zk.get("/locks/queue/ingest")[0] == b""
    assert queue("release-queue", "ingest").strip() == "queue ingest: held -> released"
    out = queue("hold-collection", "ucb_lib_test")
    assert out.strip() == "collection ucb_lib_test: released -> held"
    assert locks.collection_held(zk, "ucb_lib_test")
    held = make_job()
    jobs.job_transition(zk, held, "Held")
    out = queue("release-collection", "ucb_lib_test", "--release-held")
    assert out.splitlines() == [
        "collection ucb_lib_test: held -> released",
        f"job {held.jid}: Held -> Pending",
    ]
    assert not locks.collection_held(zk, "ucb_lib_test")


def test_queue_resumes_and_deletes_access_requests(zk: KazooClient, ops: Any) -> None:
    item = access.access_create(zk, queue="small", token={"token": "t"})
    item = access.access_transition(zk, item, "Processing")
    access.access_transition(zk, item, "Failed")
    out = queue("resume", f"small/{item.qid}", "--to", "Processing")
    assert out.strip() == f"access {item.qid}: Failed -> Processing"
    item = access.access_load(zk, "small", item.qid)
    access.access_transition(zk, item, "Completed")
    out = queue("delete", f"small/{item.qid}", "--reason", "done with")
    assert out.strip().endswith("Completed -> Deleted")
    assert access.access_ids(zk, "small") == []


def test_queue_cleanup_reports_how_many_batches_went(
    zk: KazooClient, batch: Batch, ops: Any
) -> None:
    for state in ("Processing", "Reporting", "Completed"):
        batch = batches.batch_transition(zk, batch, state)
    out = queue("cleanup", "--reason", "housekeeping")
    assert out.splitlines()[-1] == "1 completed batches cleaned up, 0 items marked Deleted removed"
    assert batches.batch_ids(zk) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["resume", "jid0000000001"], "only a Failed job can be resumed"),
        (["resume", "jid12"], "malformed"),
        (["resume", "jid0000009999"], "does not exist"),
        (["update-reporting", "jid0000000001"], "applies to: batch"),
        (["hold-collection", "a/b"], "malformed"),
        (["resume", "small"], "not one of those"),
        (["resume", "medium/qid0000000001"], "not one of"),
        (["delete", "bid0000000000", "--reason", "why"], "cannot move"),
        (["resume"], "needs at least one ID"),
        (["resume", "small/qid0000000001", "--to", "Completed"], "resumes to Pending or"),
        (["hold", "jid0000000001", "--to", "Pending"], "--to goes with resume of an access"),
        (["hold-queue", "ingest", "--to", "Pending"], "--to goes with resume of an access"),
        (["hold-queue", "ingest", "bogus"], "nothing was done"),
        (["release-held", "a b"], "malformed"),
    ],
)
def test_queue_refuses_with_a_clear_message_and_changes_nothing(
    zk: KazooClient, job: Job, ops: Any, args: list[str], message: str
) -> None:
    err = StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("queue", *args, "--user", OPS, stdout=StringIO(), stderr=err)
    assert message in err.getvalue() + str(caught.value)
    assert_job_status(zk, job.jid, status="Pending", last_successful=None)


def test_queue_checks_every_id_before_it_moves_any(
    zk: KazooClient, make_job: Callable[..., Job], ops: Any
) -> None:
    first, second = make_job(), make_job()
    err = StringIO()
    with pytest.raises(CommandError, match="1 of 3 refused; nothing was done"):
        call_command("queue", "hold", first.jid, "jid12", second.jid, "--user", OPS, stderr=err)
    assert "jid12: job ID (expected jid + 10 digits) 'jid12' is malformed" in err.getvalue()
    for job in (first, second):
        assert_job_status(zk, job.jid, status="Pending", last_successful=None)


def test_queue_carries_on_after_a_failed_item_and_exits_non_zero(
    zk: KazooClient, make_job: Callable[..., Job], ops: Any
) -> None:
    failed, pending = make_job(), make_job()
    jobs.job_transition(zk, failed, "Failed")
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match="1 of 2 failed"):
        call_command(
            "queue", "resume", pending.jid, failed.jid, "--user", OPS, stdout=out, stderr=err
        )
    assert f"job {failed.jid}: Failed -> Estimating" in out.getvalue()
    assert pending.jid in err.getvalue()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cleanup", "bid0000000001"], "cleanup takes no IDs"),
        (["archive", "bid0000000001"], "archive takes no IDs"),
        (["hold", "jid0000000001", "--older-than-days", "3"], "--older-than-days goes with"),
        (["cleanup", "--to", "Pending"], "--to goes with resume of an access request"),
        (["hold-queue", "ingest", "--release-held"], "--release-held goes with"),
        (["hold", "jid0000000001", "--release-held"], "--release-held goes with"),
        # The ingest queue's release would be done before the second ID was refused.
        (["release-queue", "ingest", "access-small", "--release-held"], "parks no jobs"),
    ],
)
def test_queue_refuses_ids_or_an_option_its_action_would_drop_and_changes_nothing(
    zk: KazooClient, batch: Batch, job: Job, ops: Any, args: list[str], message: str
) -> None:
    queue("hold-queue", "ingest", "--reason", "redeploy")
    for state in ("Processing", "Reporting", "Completed"):
        batch = batches.batch_transition(zk, batch, state)
    err = StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("queue", *args, "--user", OPS, stdout=StringIO(), stderr=err)
    assert message in err.getvalue() + str(caught.value)
    assert_job_status(zk, job.jid, status="Pending", last_successful=None)
    assert locks.queue_held(zk, "ingest")
    assert_batch_status(zk, batch.bid, status="Completed")


def _entries() -> list[tuple[str, str, str, str, str, str, str, bool, str]]:
    """The audit log, oldest first: (user, action, kind, item, before, after, reason, ok, via)."""
    return [
        (e.username, e.action, e.kind, e.item_id, e.before, e.after, e.reason, e.ok, e.via)
        for e in AuditEntry.objects.order_by("at", "id")
    ]


def test_queue_moves_are_audited_as_the_user_with_the_reason_from_the_command(
    zk: KazooClient, make_job: Callable[..., Job], batch: Batch, ops: Any
) -> None:
    job, other = make_job(), make_job()
    queue("hold", job.jid, "--reason", "looks odd")
    queue("fail", other.jid, "--reason", "bad host")
    queue("hold-queue", "ingest", "--reason", "redeploy")
    for state in ("Processing", "Reporting", "Completed"):
        batch = batches.batch_transition(zk, batch, state)
    queue("cleanup", "--reason", "housekeeping")
    assert _entries() == [
        (OPS, "hold", "job", job.jid, "Pending", "Held", "looks odd", True, "command"),
        (OPS, "fail", "job", other.jid, "Pending", "Failed", "bad host", True, "command"),
        (OPS, "hold", "queue", "ingest", "released", "held", "redeploy", True, "command"),
        (
            OPS,
            "cleanup",
            "batch",
            batch.bid,
            "Completed",
            "Deleted",
            "housekeeping",
            True,
            "command",
        ),
    ]
    assert AuditEntry.objects.filter(user=ops).count() == 4
    # The hold is the user's, as one made on the holds page is.
    about = maintenance.hold_records(zk)[("queue", "ingest")]
    assert (about.by, about.reason) == (OPS, "redeploy")


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (["delete", "{jid}"], "refused: delete is destructive: give a reason"),
        (["fail", "{jid}", "--reason", "  "], "refused: fail is destructive: give a reason"),
        (["hold-queue", "ingest"], "refused: hold on a queue needs a reason"),
    ],
)
def test_queue_refuses_a_destructive_move_without_a_reason_as_the_console_does(
    zk: KazooClient, job: Job, ops: Any, args: list[str], refusal: str
) -> None:
    from queues.operator import actions

    args = [a.format(jid=job.jid) for a in args]
    with pytest.raises(CommandError, match="1 of 1 refused; nothing was done"):
        call_command("queue", *args, "--user", OPS, stdout=StringIO(), stderr=StringIO())
    assert_job_status(zk, job.jid, status="Pending", last_successful=None)
    assert not locks.queue_held(zk, "ingest")
    [entry] = AuditEntry.objects.all()
    assert (entry.user, entry.ok, entry.detail, entry.via) == (ops, False, refusal, "command")
    # The same refusal in the console writes the same entry but where it came from.
    kind, item = ("queue", "ingest") if args[0] == "hold-queue" else ("job", job.jid)
    action = "hold" if args[0] == "hold-queue" else args[0]
    with pytest.raises(actions.ReasonRequired):
        actions.perform(user=ops, kind=kind, action=action, item_id=item, reason=" ")
    fields = ("username", "action", "kind", "item_id", "before", "after", "reason", "detail", "ok")
    console = AuditEntry.objects.get(via="web")
    assert [getattr(entry, f) for f in fields] == [getattr(console, f) for f in fields]


def test_queue_refuses_a_user_without_the_role_audited_and_moves_nothing(
    zk: KazooClient, make_job: Callable[..., Job], make_user: Callable[..., Any]
) -> None:
    first, second = make_job(), make_job()
    make_user("olga", OPERATOR)
    err = StringIO()
    with pytest.raises(CommandError, match="2 of 2 refused; nothing was done"):
        call_command(
            "queue",
            "delete",
            first.jid,
            second.jid,
            "--user",
            "olga",
            "--reason",
            "dupes",
            stdout=StringIO(),
            stderr=err,
        )
    assert "delete on a job needs the admin role" in err.getvalue()
    for job in (first, second):
        assert_job_status(zk, job.jid, status="Pending", last_successful=None)
    assert _entries() == [
        ("olga", "delete", "job", jid, "", "", "dupes", False, "command")
        for jid in (first.jid, second.jid)
    ]
    # An operator may hold: the role is the console's, action by action.
    call_command("queue", "hold", first.jid, "--user", "olga", stdout=StringIO())
    assert jobs.job_load(zk, first.jid).state == "Held"


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ([], "--user NAME is needed"),
        (["--user", "nobody"], "no console user 'nobody'"),
        (["--user", "gone"], "console user 'gone' is inactive"),
    ],
)
def test_queue_refuses_a_missing_unknown_or_inactive_user_and_moves_nothing(
    zk: KazooClient, job: Job, make_user: Callable[..., Any], user: list[str], message: str
) -> None:
    make_user("gone", active=False)
    for args in (["hold", job.jid], ["cleanup", "--reason", "housekeeping"]):
        with pytest.raises(CommandError, match=message):
            call_command("queue", *args, *user, stdout=StringIO(), stderr=StringIO())
    assert_job_status(zk, job.jid, status="Pending", last_successful=None)
    assert not AuditEntry.objects.exists()


def test_queue_refuses_the_same_id_given_twice_before_anything_moves(
    zk: KazooClient, make_job: Callable[..., Job], ops: Any
) -> None:
    first, second = make_job(), make_job()
    with pytest.raises(CommandError, match=f"given more than once: {first.jid}; give each ID"):
        call_command(
            "queue", "hold", first.jid, second.jid, first.jid, "--user", OPS, stdout=StringIO()
        )
    for job in (first, second):
        assert_job_status(zk, job.jid, status="Pending", last_successful=None)
    assert not AuditEntry.objects.exists()


def test_queue_sweeps_need_a_reason_and_the_admin_role(
    zk: KazooClient, batch: Batch, ops: Any, make_user: Callable[..., Any]
) -> None:
    for state in ("Processing", "Reporting", "Completed"):
        batch = batches.batch_transition(zk, batch, state)
    make_user("olga", OPERATOR)
    for args, why in (
        (["cleanup", "--user", OPS], "refused: remove is destructive: give a reason"),
        (["archive", "--user", OPS], "refused: remove is destructive: give a reason"),
        (["cleanup", "--user", "olga", "--reason", "r"], "refused: remove on a batch needs the"),
    ):
        with pytest.raises(CommandError, match="nothing was done"):
            call_command("queue", *args, stdout=StringIO())
        entry = AuditEntry.objects.latest("id")
        assert (entry.action, entry.ok, entry.via) == (args[0], False, "command")
        assert entry.detail.startswith(why)
    assert_batch_status(zk, batch.bid, status="Completed")


def test_queue_release_held_is_audited(
    zk: KazooClient, make_job: Callable[..., Job], ops: Any
) -> None:
    held = make_job()
    jobs.job_transition(zk, held, "Held")
    assert queue("release-held", "ucb_lib_test").strip() == f"job {held.jid}: Held -> Pending"
    assert _entries() == [
        (OPS, "release-held", "job", held.jid, "Held", "Pending", "", True, "command")
    ]


def test_runconsumer_refuses_stop_timeout_with_once_before_it_runs() -> None:
    """--once handles no signals: a --stop-timeout given with it would be dropped in silence."""
    with pytest.raises(CommandError, match="--stop-timeout goes with a running consumer, not"):
        call_command("runconsumer", "estimating", "--once", "--stop-timeout", "5")


@pytest.mark.django_db  # queuecheck records its run in the database
def test_queuecheck_reports_and_repairs(zk: KazooClient, job: Job) -> None:
    assert "0 findings" in run("queuecheck")
    zk.delete(f"/jobs/states/pending/05-{job.jid}")
    out = run("queuecheck")
    assert "1 findings" in out
    assert "job-unindexed" in out and "[repairable]" in out
    assert zk.exists(f"/jobs/states/pending/05-{job.jid}") is None
    out = run("queuecheck", "--repair")
    assert f"repaired: created /jobs/states/pending/05-{job.jid}" in out
    assert "0 findings" in run("queuecheck")


@pytest.mark.django_db
def test_queuecheck_refuses_break_stale_locks_without_repair(zk: KazooClient) -> None:
    from queues.models import ConsistencyRun

    with pytest.raises(CommandError, match="--break-stale-locks goes with --repair"):
        run("queuecheck", "--break-stale-locks")
    assert not ConsistencyRun.objects.exists()  # no check run started


def test_zkdump_prints_decoded_data(zk: KazooClient, job: Job) -> None:
    lines = run("zkdump", f"/jobs/{job.jid}").splitlines()
    assert lines[0] == f"/jobs/{job.jid}"
    by_path = dict(line.split("  ", 1) for line in lines[1:])
    assert by_path[f"/jobs/{job.jid}/priority"] == "5"
    assert json.loads(by_path[f"/jobs/{job.jid}/status"])["status"] == "Pending"
    assert json.loads(by_path[f"/jobs/{job.jid}/bid"]) == job.bid


def test_zkdump_marks_ephemeral_nodes(zk: KazooClient, other_zk: KazooClient, job: Job) -> None:
    other_zk.create(f"/jobs/{job.jid}/lock", b"", ephemeral=True)
    assert f"/jobs/{job.jid}/lock (ephemeral)" in run("zkdump", f"/jobs/{job.jid}")


@pytest.mark.parametrize("path", ["jobs", "/jobs/", "/jobs//x", "/jobs/..", "/jobs/jid9"])
def test_zkdump_refuses_a_bad_or_missing_path(zk: KazooClient, path: str) -> None:
    with pytest.raises(CommandError):
        run("zkdump", path)


def test_manage_py_runs_commands_against_the_configured_ensemble(
    zk: KazooClient, zk_hosts: str, tmp_path: Path
) -> None:
    env = {**os.environ, "ZK_HOSTS": zk_hosts, "MRT_VAR_DIR": str(tmp_path)}

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(MANAGE), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = manage(
        "submitbatch",
        "--profile",
        "merritt_demo_content",
        "--submitter",
        "dpr",
        "--payload-url",
        "https://example.org/a.zip",
    )
    assert done.returncode == 0, done.stderr
    bid = done.stdout.strip()
    assert BID_RE.fullmatch(bid)
    assert batches.batch_load(zk, bid).state == "Pending"
    # The move is made as a console user, so the database is there and knows one.
    assert manage("migrate", "--verbosity", "0").returncode == 0
    env["DJANGO_SUPERUSER_PASSWORD"] = "not-used-here-1"
    made = manage("createsuperuser", "--noinput", "--username", "ops", "--email", "o@example.org")
    assert made.returncode == 0, made.stderr
    refused = manage("queue", "update-reporting", bid, "--user", "ops")
    assert refused.returncode != 0
    assert "cannot move an item from Pending to UpdateReporting" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert_batch_status(zk, bid, status="Pending")


def test_zkserver_leaves_a_configured_ensemble_alone(zk_hosts: str) -> None:
    out = run("zkserver", "status")
    assert out.strip() == f"ZK_HOSTS is set ({zk_hosts}); no local server is used"


# What a command prints reaches a terminal: control characters from outside come as escapes.
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def test_zkdump_shows_control_characters_in_a_node_as_escapes_and_stays_json(
    zk: KazooClient,
) -> None:
    # A title as a depositor may write it, stored by another client of the ensemble: ESC, the
    # one-byte CSI (C1) and a line separator, each of which a terminal acts on.
    title = "a\x1b[31mred\u009b2J\u2028x\x7f"
    zk.create("/zkdump-probe", json.dumps({"title": title}, ensure_ascii=False).encode())
    out = run("zkdump", "/zkdump-probe")
    assert not CONTROLS.search(out), repr(out)
    [line] = out.splitlines()
    assert json.loads(line.split("  ", 1)[1]) == {"title": title}


def test_a_command_error_line_shows_control_characters_as_escapes(
    zk: KazooClient, capsys: pytest.CaptureFixture[str]
) -> None:
    # Django writes a CommandError's line to the command's stderr (run_from_argv), as for any
    # operator running manage.py: an ID copied with an escape sequence in it comes back as text.
    from queues.management.commands.zkdump import Command

    with pytest.raises(SystemExit) as exited:
        Command().run_from_argv(["manage.py", "zkdump", "/jobs/\x1b]0;owned\x07"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "/jobs/\\x1b]0;owned\\x07 does not exist" in err
    assert not CONTROLS.search(err), repr(err)


@pytest.mark.zookeeper  # starts a server of its own (which exits at once)
def test_zkserver_start_shows_the_servers_log_lines_each_on_a_line_of_its_own(
    tmp_path: Path, settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A JVM option Java does not know: the server exits at once and its log says why. The one
    # error line says where the log is; the log's last lines come before it, one a line,
    # escaped as any other (they are the server's text).
    from queues.services.zkserver import free_port

    settings.ZK_HOSTS, settings.MRT_VAR_DIR, settings.ZK_LOCAL_PORT = "local", tmp_path, free_port()
    monkeypatch.setenv("ZK_LOCAL_JVMFLAGS", "-XX:+NoSuchOptionAnywhere")
    err = StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("zkserver", "start", stdout=StringIO(), stderr=err)
    assert str(caught.value).startswith("ZooKeeper exited; see ")
    assert "\n" not in str(caught.value)
    assert "NoSuchOptionAnywhere" in err.getvalue()
    assert len(err.getvalue().splitlines()) > 1
