"""Operations: /healthz during an outage, runconsumer and the operator commands on a database
not ready, and bin/run-console stopped by a signal to its own PID."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from kazoo.client import KazooClient

from queues.services.zkserver import LocalZooKeeper, four_letter, free_port, free_ports
from queues.zk import batches, jobs
from queues.zk import client as zkmod
from queues.zk import consumers as zconsumers

BASE = Path(settings.BASE_DIR)
# A hang guard only: the old /healthz took 25-30 s with ZooKeeper down, the new one answers
# at once; a request that has no answer by then raises instead of passing.
HANG_GUARD = 5.0
# A line of the console's log (mrtadmin/settings.py: asctime first), not one the script echoes.
LOG_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")


# ---- /healthz while ZooKeeper is down ---------------------------------------------------------


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LocalZooKeeper]:
    """A ZooKeeper of this test's own, which it may stop."""
    server = LocalZooKeeper(tmp_path / "zookeeper", free_port())
    server.start()
    old = settings.ZK_HOSTS
    settings.ZK_HOSTS = server.hosts
    zkmod.close()
    yield server
    zkmod.close()
    settings.ZK_HOSTS = old
    server.stop()


def health(base: str) -> int:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=HANG_GUARD) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_healthz_answers_503_at_once_while_zookeeper_is_down(
    own_server: LocalZooKeeper, live_server: object
) -> None:
    base = str(live_server)
    assert health(base) == 200
    own_server.stop()
    # The process's connected client, now talking to nobody.
    assert health(base) == 503
    # No client yet: connecting would take ZK_TIMEOUT, the answer may not.
    zkmod.close()
    assert health(base) == 503
    assert health(base) == 503  # joins the probe still under way
    own_server.start()
    deadline = time.monotonic() + 60
    while health(base) != 200:
        assert time.monotonic() < deadline, "/healthz did not recover"
        time.sleep(0.5)


# ---- runconsumer on a database that was never migrated --------------------------------------


def test_runconsumer_refuses_an_unmigrated_database_before_claiming(
    zk: KazooClient, zk_hosts: str, tmp_path: Path
) -> None:
    batch = batches.batch_create(zk, submission={"profile": "ucb_lib_test", "type": "file"})
    job = jobs.job_create(zk, bid=batch.bid, configuration={"profile": "ucb_lib_test"})
    env = {
        **os.environ,
        "ZK_HOSTS": zk_hosts,
        "MRT_VAR_DIR": str(tmp_path / "var"),
        "MRT_DATABASE_PATH": str(tmp_path / "never-migrated.sqlite3"),
        "DJANGO_SECRET_KEY": "x" * 50,
    }
    try:
        done = subprocess.run(
            [sys.executable, str(BASE / "manage.py"), "runconsumer", "all"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("runconsumer started on a database that was never migrated")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "manage.py migrate" in lines[0]
    # Nothing was claimed or moved.
    assert jobs.job_load(zk, job.jid).state == "Pending"
    assert zk.exists(f"/jobs/{job.jid}/lock") is None
    assert batches.batch_load(zk, batch.bid).state == "Pending"


def _command(
    command: tuple[str, ...], *, var: Path, database: Path
) -> subprocess.CompletedProcess[str]:
    """``manage.py COMMAND...`` as an operator runs it, with a ZooKeeper that never answers."""
    env = {
        **os.environ,
        "ZK_HOSTS": "127.0.0.1:1",
        "MRT_VAR_DIR": str(var),
        "MRT_DATABASE_PATH": str(database),
        "DJANGO_SECRET_KEY": "x" * 50,
    }
    return subprocess.run(
        [sys.executable, str(BASE / "manage.py"), *command],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


@pytest.mark.parametrize(
    "command",
    [
        ("apitoken", "list"),
        ("apitoken", "create", "--user", "someone", "--name", "monitor"),
        ("setupconsole",),
        ("queuecheck", "--repair"),
    ],
    ids=lambda command: " ".join(command[:2]),
)
@pytest.mark.parametrize("database", ["never-migrated", "cannot-open"])
def test_a_command_that_needs_the_database_refuses_one_not_ready_in_one_line(
    command: tuple[str, ...], database: str, tmp_path: Path
) -> None:
    var = tmp_path / "var"
    path = (
        tmp_path / "never-migrated.sqlite3"
        if database == "never-migrated"
        else tmp_path / "no-such-folder" / "console.sqlite3"
    )
    # ZooKeeper is never asked: the database is looked at first.
    done = _command(command, var=var, database=path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback
    if database == "never-migrated":
        assert "is not migrated" in lines[0] and "manage.py migrate" in lines[0]
    else:
        assert f"the database {path} does not answer" in lines[0]
    assert not (var / "admin-password").exists()  # nothing made


@pytest.mark.parametrize(
    "command, option, value",
    [
        (("runconsumer", "estimating"), "--poll", "nan"),
        (("runconsumer", "estimating"), "--poll", "1e309"),
        (("runconsumer", "estimating"), "--poll", "-1"),
        (("runconsumer", "estimating"), "--threads", "100000"),
        (("runconsumer", "estimating"), "--threads", "2.5"),
        (("runconsumer", "estimating"), "--stop-timeout", "0"),
        (("runconsumer", "estimating"), "--stop-timeout", "nan"),
        (("queue", "archive"), "--older-than-days", "1e309"),
        (("queue", "cleanup"), "--older-than-days", "nan"),
        (("queue", "cleanup"), "--older-than-days", "-1"),
    ],
)
def test_a_number_an_option_cannot_take_is_refused_before_anything_runs(
    command: tuple[str, ...], option: str, value: str, tmp_path: Path
) -> None:
    """A number out of an option's range, or none (nan, inf), is argparse's error naming the
    option, exit status 2: before, "nan" ran a daemon whose idle wait was nan, 1e309 archived
    with a traceback (OverflowError), and 100,000 copies of a loop were started."""
    # Neither ZooKeeper nor the database is asked: the options are read first.
    done = _command(
        (*command, option, value), var=tmp_path / "var", database=tmp_path / "never-made.sqlite3"
    )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"manage.py {command[0]}: error: argument {option}: must be "), last
    assert f"got {value!r}" in last
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "never-made.sqlite3").exists()  # nothing opened, nothing made


# ---- bin/run-console and signals ----------------------------------------------------------------


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def children_of(pid: int) -> set[int]:
    """Every live descendant of ``pid``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def processes_using(marker: str) -> list[str]:
    """Live processes whose command line or environment mention ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not alive(int(entry.name)):
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().decode(errors="replace")
            if marker in cmdline or marker in environ:
                found.append(f"{entry.name}: {cmdline[:200]}")
    return found


@pytest.mark.slow
@pytest.mark.zookeeper
@pytest.mark.live_server
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_run_console_stops_everything_on_a_signal_to_its_pid(
    tmp_path: Path, signum: signal.Signals
) -> None:
    var = tmp_path / "var"
    web_port, zk_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if k not in ("ZK_HOSTS", "REDIS_URL")}
    env.update(
        MRT_VAR_DIR=str(var),
        MRT_BIND="127.0.0.1",
        MRT_PORT=str(web_port),
        ZK_LOCAL_PORT=str(zk_port),
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
        LOG_LEVEL="WARNING",
    )
    log = tmp_path / "run-console.log"
    # A shell started with SIGINT ignored cannot trap it (POSIX), and a test run started in the
    # background by a non-interactive shell has it ignored: the script is started as from a
    # terminal, with SIGINT at its default (a Python handler is not inherited across exec).
    inherited = signal.getsignal(signal.SIGINT)
    if inherited is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", str(BASE / "bin" / "run-console")],
                cwd=BASE,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group, for the clean-up below only
            )
    finally:
        if inherited is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        deadline = time.monotonic() + 300  # bin/install may have packages to add first
        while True:
            with contextlib.suppress(OSError):
                url = f"http://127.0.0.1:{web_port}/healthz"
                with urllib.request.urlopen(url, timeout=5) as answer:
                    if answer.status == 200:
                        break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"run-console did not serve:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        assert four_letter(zk_port)  # its own ZooKeeper serves
        # runconsumer is up too once it has registered, so the signal finds every part running.
        watcher = zkmod.connect(f"127.0.0.1:{zk_port}")
        try:
            deadline = time.monotonic() + 120
            while not (
                watcher.exists(zconsumers.CONSUMERS) and watcher.get_children(zconsumers.CONSUMERS)
            ):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"runconsumer did not register:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)
        finally:
            watcher.stop()
            watcher.close()
        started = children_of(proc.pid)

        os.kill(proc.pid, signum)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            living = "\n".join(f"  {pid}: {command_of(pid)}" for pid in started if alive(pid))
            pytest.fail(
                f"run-console ignored {signum.name}; still running:\n{living}\n"
                f"{log.read_text()[-3000:]}"
            )
        left = [pid for pid in started if alive(pid)]
        assert left == [], f"children still running after {signum.name}: {left}"
        assert processes_using(str(var)) == []
        assert four_letter(zk_port) is None  # the local ZooKeeper is stopped
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        # A ZooKeeper it left behind runs in its own session: stop it through its folder.
        LocalZooKeeper(var / "zookeeper", zk_port).stop()


@pytest.mark.slow
@pytest.mark.zookeeper
@pytest.mark.live_server
def test_run_console_keeps_requests_out_of_its_terminal_and_the_password_in_sight(
    tmp_path: Path,
) -> None:
    """Issue 53, item 6: 6,715 lines in 32 minutes, 174 of them favicon 404s, scrolled the admin
    password away. Requests go to the access log file; the favicon is served; the password is
    the last thing the start-up prints."""
    var = tmp_path / "var"
    web_port, zk_port = free_ports(2)
    env = _run_console_env(tmp_path, web_port, zk_port, LOG_LEVEL="INFO")
    log = tmp_path / "run-console.log"
    proc = _start_run_console(env, log)
    base = f"http://127.0.0.1:{web_port}"
    try:
        _wait_served(proc, log)
        # The password comes again after the "console on http" line (setupconsole printed it
        # first, at the very start): wait for that second time, the start-up's last words.
        password = (var / "admin-password").read_text().strip()

        def said_again() -> list[int]:
            lines = log.read_text(errors="replace").splitlines()
            served = next(i for i, line in enumerate(lines) if "console on http" in line)
            return [i for i, line in enumerate(lines) if password in line and i > served]

        deadline = time.monotonic() + 30
        while not said_again():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        startup = log.read_text(errors="replace").splitlines()
        said = said_again()
        # The start-up's own words end with the password, and every daemon said it started
        # before it. Log records may follow (the read index filling, a daemon's first round):
        # they are the console at work, not its start-up.
        own = [i for i, line in enumerate(startup) if not LOG_RECORD.match(line)]
        assert own[-1] == said[-1], startup[said[-1] :][:10]
        started = [i for i, line in enumerate(startup) if ": started" in line]
        assert started and started[-1] < said[-1], startup[said[-1] :][:10]

        for _ in range(40):
            for path in ("/healthz", "/login/", "/favicon.ico"):
                with urllib.request.urlopen(base + path, timeout=10) as answer:
                    assert answer.status == 200
                    if path == "/favicon.ico":
                        assert answer.headers["Content-Type"] == "image/svg+xml"
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(base + "/no-such-page/", timeout=10)
        access = var / "log" / "access.log"
        deadline = time.monotonic() + 30
        while access.read_text().count('"GET /favicon.ico') < 40:
            assert time.monotonic() < deadline, access.read_text()[-2000:]
            time.sleep(0.2)
        terminal = log.read_text(errors="replace")
        assert "GET /healthz" not in terminal and "favicon" not in terminal
        assert "Not Found: /no-such-page/" in terminal  # an error still shows here
        # 121 requests, not one line for them (the daemons' own lines go on as before).
        assert [line for line in terminal.splitlines() if '"GET ' in line] == []
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _run_console_env(tmp_path: Path, web_port: int, zk_port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ZK_HOSTS", "REDIS_URL")}
    env.update(
        MRT_VAR_DIR=str(tmp_path / "var"),
        MRT_BIND="127.0.0.1",
        MRT_PORT=str(web_port),
        ZK_LOCAL_PORT=str(zk_port),
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
        LOG_LEVEL="WARNING",
    )
    env.update(extra)
    return env


def _start_run_console(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """bin/run-console in a process group of its own, everything it says into ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            ["bash", str(BASE / "bin" / "run-console")],
            cwd=BASE,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _wait_served(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the script says where the console is served (it may install packages first)."""
    deadline = time.monotonic() + 300
    while "console on http" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"run-console did not serve:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def _stop_run_console(proc: subprocess.Popen[bytes], var: Path, zk_port: int) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    LocalZooKeeper(var / "zookeeper", zk_port).stop()


@pytest.mark.zookeeper
@pytest.mark.live_server
def test_run_console_refuses_a_url_prefix_that_is_not_one_before_starting_anything(
    tmp_path: Path,
) -> None:
    web_port, zk_port = free_ports(2)
    env = _run_console_env(tmp_path, web_port, zk_port, MRT_ROOT_PATH="/queue/")
    proc = subprocess.Popen(
        ["bash", str(BASE / "bin" / "run-console")],
        cwd=BASE,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        _stop_run_console(proc, tmp_path / "var", zk_port)
        pytest.fail("run-console started with MRT_ROOT_PATH=/queue/")
    assert proc.returncode == 2, err
    assert b"environment variable MRT_ROOT_PATH must be a URL prefix" in err
    assert b"'/queue/'" in err
    assert out == b""
    # Nothing was made or started: no folder, no ZooKeeper.
    assert not (tmp_path / "var").exists()
    assert four_letter(zk_port) is None


@pytest.mark.slow
@pytest.mark.zookeeper
@pytest.mark.live_server
def test_run_console_serves_under_mrt_root_path(tmp_path: Path) -> None:
    """MRT_ROOT_PATH=/queue is daphne's --root-path: pages and their links are under /queue."""
    var = tmp_path / "var"
    web_port, zk_port = free_ports(2)
    env = _run_console_env(tmp_path, web_port, zk_port, MRT_ROOT_PATH="/queue")
    log = tmp_path / "run-console.log"
    proc = _start_run_console(env, log)
    try:
        _wait_served(proc, log)
        assert f"console on http://127.0.0.1:{web_port}/queue/ " in log.read_text()
        # A proxy may pass the path on whole or without the prefix: both are the console's.
        for path in ("/queue/login/", "/login/"):
            url = f"http://127.0.0.1:{web_port}{path}"
            with urllib.request.urlopen(url, timeout=10) as answer:
                assert answer.status == 200
                page = answer.read().decode()
            assert 'action="/queue/login/"' in page, page[:2000]
            assert 'href="/queue/static/' in page, page[:2000]
    finally:
        _stop_run_console(proc, var, zk_port)


@pytest.mark.slow
@pytest.mark.live_server
@pytest.mark.django_db(transaction=True)
def test_pages_the_api_and_healthz_answer_503_at_once_through_daphne_while_zookeeper_is_away(
    own_server: LocalZooKeeper, tmp_path: Path
) -> None:
    """README, "ZooKeeper goes away": "pages and /healthz answer 503 at once", for a console
    that was serving (its read index filled) when ZooKeeper stopped, through daphne as users
    reach it; and every one of them answers again once ZooKeeper is back."""
    from tests.live.conftest import api_token, console_env, daphne, log_in

    env = console_env(own_server.hosts, tmp_path, user="ops", password="pw-" + "x" * 20)
    key = api_token(env, tmp_path / "key", user="ops", name="ops")
    with daphne(env, tmp_path / "daphne.log") as url:
        browser = log_in(url, "ops", "pw-" + "x" * 20)

        def statuses() -> dict[str, int]:
            found = {"/healthz": health(url)}
            for path in ("/", "/jobs/?state=Failed", "/holds/", "/failed/"):
                found[path] = browser.get(url + path, timeout=HANG_GUARD).status_code
            api = urllib.request.Request(
                f"{url}/api/overview", headers={"Authorization": f"Bearer {key}"}
            )
            try:
                with urllib.request.urlopen(api, timeout=HANG_GUARD) as answer:
                    found["/api/overview"] = answer.status
            except urllib.error.HTTPError as exc:
                found["/api/overview"] = exc.code
            return found

        deadline = time.monotonic() + 60
        while set(statuses().values()) != {200}:  # the read index fills after the start
            assert time.monotonic() < deadline, statuses()
            time.sleep(0.2)
        own_server.stop()
        # At once: each asked right after the stop, within the hang guard, says 503.
        assert set(statuses().values()) == {503}, statuses()
        own_server.start()
        deadline = time.monotonic() + 60
        while set(statuses().values()) != {200}:
            assert time.monotonic() < deadline, statuses()
            time.sleep(0.5)
