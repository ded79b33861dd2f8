"""The outside parts a chaos fault acts on, each started by the run in its scratch folder:
a PostgreSQL cluster, a Redis server, a web worker under daphne and a small working disk."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import requests

from queues.core.states import JOB
from queues.services.zkserver import free_port


class InfraError(RuntimeError):
    pass


def wait_for_port(port: int, *, wait: float, what: str) -> None:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise InfraError(f"{what} did not listen on port {port} within {wait:.0f}s")


# PostgreSQL -------------------------------------------------------------------------------------

PG_SYSTEM_USER = "postgres"  # Debian's postgresql package creates it
PG_ROLE = "mrt"


def pg_bin_dir() -> Path | None:
    """The newest of Debian's /usr/lib/postgresql/<version>/bin holding initdb."""
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if not found:
        return None
    return Path(max(found, key=lambda p: int(Path(p).parts[-3]))).parent


@dataclass
class Postgres:
    """A throwaway cluster of Debian's PostgreSQL on a loopback port, password login over TCP
    only (scram-sha-256), so its URL is one an operator would set as ``DATABASE_URL``. The one
    PostgreSQL launcher of the project: ``manage.py chaosrun`` and the tests (``tests/pg.py``)
    both start theirs here.

    PostgreSQL refuses to run as root, so a root run starts it as the ``postgres`` system user.
    ``start`` starts it, and starts it again after ``stop`` on the same data, port and settings.
    """

    directory: Path
    port: int = 0
    password: str = field(default_factory=lambda: secrets.token_hex(12))
    owner: str | None = None
    bin_dir: Path = field(default_factory=Path)

    @classmethod
    def create(cls, *, port: int = 0) -> Postgres:
        """A new cluster in a folder of its own, initialised but not started: not under a
        run's scratch folder (or pytest's), which the ``postgres`` user of a root run cannot
        enter. ``remove`` deletes it."""
        bin_dir = pg_bin_dir()
        if bin_dir is None:
            raise InfraError(
                "PostgreSQL is not installed (/usr/lib/postgresql/*/bin/initdb): "
                "bin/install --tests installs Debian's postgresql package"
            )
        owner = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(PG_SYSTEM_USER)
            except KeyError:
                raise InfraError(
                    f"running as root and there is no {PG_SYSTEM_USER!r} user to run PostgreSQL as"
                ) from None
            owner = PG_SYSTEM_USER
        directory = Path(tempfile.mkdtemp(prefix="mrt-pg-"))
        cluster = cls(directory, port or free_port(), owner=owner, bin_dir=bin_dir)
        try:
            cluster.initdb()
        except subprocess.CalledProcessError as exc:
            cluster.remove()
            raise InfraError(f"initdb failed: {exc.stderr}") from None
        return cluster

    @classmethod
    def started(cls, *, port: int = 0) -> Postgres:
        """``create`` and ``start``; the folder is removed again if it does not start."""
        cluster = cls.create(port=port)
        try:
            cluster.start()
        except BaseException:
            cluster.remove()
            raise
        return cluster

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log_file(self) -> Path:
        return self.directory / "postgres.log"

    @property
    def url(self) -> str:
        return self.database_url("postgres")

    def database_url(self, name: str) -> str:
        return f"postgres://{PG_ROLE}:{self.password}@127.0.0.1:{self.port}/{name}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` (owned by the cluster's role) and return its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.database_url(name)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self.owner:
            command = ["runuser", "-u", self.owner, "--", *command]
        return subprocess.run(
            command, check=check, capture_output=True, text=True, cwd=self.directory
        )

    def initdb(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        pwfile = self.directory / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.owner:
            entry = pwd.getpwnam(self.owner)
            for path in (self.directory, pwfile):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb", "-D", str(self.data), "-U", PG_ROLE, "--pwfile", str(pwfile),
            "--auth-host=scram-sha-256", "--auth-local=reject", "-E", "UTF8", "--locale=C",
            "--no-sync",
        )  # fmt: skip
        pwfile.unlink()

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        log = self.log_file
        done = self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(log), "-o", options, "-w", "start",
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise InfraError(f"pg_ctl start failed: {done.stderr}\n{tail}")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)


# Redis ------------------------------------------------------------------------------------------


@dataclass
class Redis:
    directory: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.port = self.port or free_port()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise InfraError("redis-server is not installed: bin/install --tests installs it")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            cwd=self.directory, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for_port(self.port, wait=20, what="redis-server")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# The web worker ---------------------------------------------------------------------------------

WEB_USER, WEB_PASSWORD = "chaos-admin", secrets.token_hex(16)


@dataclass
class WebWorker:
    """One daphne worker of the console, and a poller that reads the overview page and
    ``/healthz`` every second as an operator's open tab would, counting every answer."""

    manage: Path
    env: dict[str, str]
    log: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    answers: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.port = self.port or free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**self.env, "DJANGO_SUPERUSER_PASSWORD": WEB_PASSWORD}
        subprocess.run(
            [sys.executable, str(self.manage), "createsuperuser", "--noinput", "--username",
             WEB_USER, "--email", "chaos@example.org"],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                 "mrtadmin.asgi:application"],
                cwd=self.manage.parent, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        wait_for_port(self.port, wait=60, what="daphne")
        threading.Thread(target=self._poll, daemon=True).start()
        threading.Thread(target=lambda: asyncio.run(self._listen()), daemon=True).start()

    def _login(self) -> requests.Session:
        session = requests.Session()
        session.get(f"{self.url}/login/", timeout=10)
        session.post(
            f"{self.url}/login/",
            data={"username": WEB_USER, "password": WEB_PASSWORD},
            headers={"X-CSRFToken": session.cookies.get("csrftoken", ""),
                     "Referer": f"{self.url}/login/"},
            timeout=10,
        )  # fmt: skip
        return session

    def _poll(self) -> None:
        session: requests.Session | None = None
        while not self.stopping.wait(1.0):
            try:
                if session is None:
                    session = self._login()
                for page in ("/", "/healthz"):
                    answer = session.get(f"{self.url}{page}", timeout=15, allow_redirects=False)
                    self.answers[f"{page} {answer.status_code}"] += 1
                    if answer.status_code >= 500 and answer.status_code != 503:
                        self.errors.append(f"{page} answered {answer.status_code}")
            except requests.RequestException as exc:
                self.answers["no answer"] += 1
                self.errors.append(f"the web worker did not answer: {type(exc).__name__}")
                session = None

    async def _listen(self) -> None:
        """A live-console socket subscribed to every job state, as an open overview keeps one;
        when the worker drops it, opened again after a second. Counts what it hears."""
        import websockets  # a test tool: in requirements-dev only

        topics = [f"jobs:state:{state}" for state in JOB.states]
        while not self.stopping.is_set():
            try:
                cookie = (await asyncio.to_thread(self._login)).cookies.get("sessionid", "")
                async with websockets.connect(
                    self.url.replace("http://", "ws://") + "/ws/live/",
                    additional_headers={"Cookie": f"sessionid={cookie}", "Origin": self.url},
                ) as socket_:
                    self.answers["socket opened"] += 1
                    await socket_.send(json.dumps({"subscribe": topics}))
                    while not self.stopping.is_set():
                        with contextlib.suppress(TimeoutError):
                            json.loads(await asyncio.wait_for(socket_.recv(), 1.0))
                            self.answers["socket messages"] += 1
            except (OSError, requests.RequestException, websockets.WebSocketException):
                self.answers["socket dropped"] += 1
            await asyncio.sleep(1.0)

    def tracebacks(self) -> int:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.count("Traceback (most recent call last)")

    def stop(self) -> None:
        self.stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# The working disk -------------------------------------------------------------------------------


@dataclass
class WorkDisk:
    """A small tmpfs mounted as the run's MRT_WORK_DIR (root only), that ``fill`` fills to the
    last byte and ``free`` empties again."""

    mount_point: Path
    megabytes: int
    filler: Path | None = None

    def mount(self) -> None:
        if os.geteuid() != 0:
            raise InfraError("a full working disk needs root (it mounts a tmpfs)")
        self.mount_point.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.megabytes}m,mode=0755", "tmpfs",
             str(self.mount_point)],
            check=True, capture_output=True,
        )  # fmt: skip

    def fill(self) -> int:
        """Write one file until the disk refuses; the bytes written."""
        self.filler = self.mount_point / f".chaos-filler-{os.getpid()}"
        written = 0
        block = b"\0" * (1 << 20)
        with self.filler.open("wb", buffering=0) as out:
            while True:
                try:
                    written += out.write(block)
                except OSError:
                    break
            while True:  # the last partial megabyte, byte by byte in pages
                try:
                    written += out.write(b"\0" * 4096)
                except OSError:
                    break
        return written

    def free(self) -> None:
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)
            self.filler = None

    def unmount(self) -> None:
        self.free()
        subprocess.run(["umount", "-l", str(self.mount_point)], check=False, capture_output=True)
