"""The project's own ZooKeeper: Debian's ``zookeeper`` package run on a loopback port.

Not part of the contract (``queues.zk`` never starts a server): used when ``ZK_HOSTS=local`` (the
README's run command sets it), by ``manage.py zkserver``, the chaos run, the benchmarks and the
tests, which also start a three-member ensemble on loopback (``LocalEnsemble``).
``resolve_hosts`` is what the Django app hands ``queues.zk.client.configure`` to turn
``ZK_HOSTS`` into a connection string. The server is a detached Java process with its data, log,
pid and config under one folder, so several projects (or test runs) can each have their own on
different ports.

Two environment variables tune a server when it starts (one already running keeps its own):
``ZK_LOCAL_HEAP`` (the JVM's ``-Xmx``, default ``512m``) and ``ZK_JUTE_MAXBUFFER`` (bytes, default
ZooKeeper's own 0xfffff, 1 MiB - 1: the largest request the server accepts, ZooKeeper's
``jute.maxbuffer`` system property). The default is what Merritt's ensemble most likely runs,
so the console and the tests work within it (``queues.zk.sized``); the benchmarks' bulk loader
raises it. ``ZK_LOCAL_JVMFLAGS`` adds options to the JVM's command line (split as a shell would,
as ZooKeeper's own ``zkServer.sh`` takes ``JVMFLAGS``): the tests start dozens of short-lived
servers and run them without the optimizing compiler and without a disk flush per write.

A folder's data belongs to one server. A command started with another ``ZK_LOCAL_PORT`` than the
running console (a shell without its environment) uses the server already running from the
folder, on that server's port, rather than starting a second one on the same data.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from queues.zk.errors import Unavailable

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
# ZooKeeper logs through SLF4J; without a binding on the class path (Debian's package leaves it to
# zkServer.sh's log4j) it says nothing at all. SLF4J's simple binding, from libslf4j-java, which
# Debian's ZooKeeper depends on, writes to standard error, which goes to the server's log.
SLF4J_SIMPLE_JAR = Path("/usr/share/java/slf4j-simple.jar")
LOG_FLAGS = (
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
    # A client gone without closing its session (a consumer killed) is a warning with a stack
    # trace here, a kilobyte each; the session's expiry says the same.
    "-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.NIOServerCnxn=error",
    # At every start: "maxCnxns is not configured, using default value 0" (no limit on the
    # server's connections, what this server wants). ZooKeeper warns of 0 whether or not the
    # ``zookeeper.maxCnxns`` property says it; in Debian's 3.8 this class warns of nothing else.
    "-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.ServerCnxnFactory=error",
)
# An ensemble member's elections and syncs, the story of a leader lost and found again.
QUORUM_LOG_FLAG = "-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.quorum=info"
# The lines of each member's log an election that did not end quotes.
LOG_LINES = 20
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

LOCAL = "local"  # ZK_HOSTS=local: the project's own server under MRT_VAR_DIR

# ZooKeeper's own default (1 MiB - 1), which Merritt's servers and Java clients most likely keep:
# whatever runs against the project's own server runs against theirs.
DEFAULT_JUTE_MAXBUFFER = 0xFFFFF
JUTE_MAXBUFFER_ENV = "ZK_JUTE_MAXBUFFER"


class LocalServerError(RuntimeError):
    pass


def is_installed() -> bool:
    return ZOOKEEPER_JAR.exists() and shutil.which("java") is not None


def install() -> None:
    """Install Debian's zookeeper package (root only); a clear error otherwise."""
    if is_installed():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise LocalServerError(
            "ZooKeeper is not installed: run `make install` as root (it runs "
            "`apt-get install zookeeper`), or set ZK_HOSTS to an existing ensemble"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", "zookeeper"], check=True, env=env)


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` different free ports: each is held until all are chosen (``free_port`` called
    again may give a port it has just given, and two members of an ensemble then ask for the
    same one: a member that cannot bind its quorum port never leads)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            s = held.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def four_letter(port: int, word: str = "srvr", timeout: float = 1.0) -> str | None:
    """Send a four-letter command; None when nothing answers on the port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(word.encode("ascii"))
            chunks = []
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return None
    return b"".join(chunks).decode("utf-8", errors="replace")


def heap_from_env() -> str:
    """ZK_LOCAL_HEAP, a Java heap size (512m, 2g, ...), or 512m; a clear error otherwise."""
    raw = os.environ.get("ZK_LOCAL_HEAP", "").strip() or "512m"
    if not re.fullmatch(r"[1-9][0-9]*[kKmMgG]?", raw):
        raise LocalServerError(
            f"ZK_LOCAL_HEAP={raw!r}: expected a Java heap size such as 512m or 2g"
        )
    return raw


def jvm_flags_from_env() -> list[str]:
    """ZK_LOCAL_JVMFLAGS as separate options (none unless set); a clear error otherwise."""
    raw = os.environ.get("ZK_LOCAL_JVMFLAGS", "")
    try:
        flags = shlex.split(raw)
    except ValueError as exc:
        raise LocalServerError(f"ZK_LOCAL_JVMFLAGS={raw!r}: {exc}") from exc
    for flag in flags:
        if not flag.startswith("-"):
            raise LocalServerError(
                f"ZK_LOCAL_JVMFLAGS={raw!r}: {flag!r} is not a JVM option (they start with -)"
            )
    return flags


def jute_maxbuffer_from_env() -> int:
    """ZK_JUTE_MAXBUFFER in bytes (a plain integer), or the default; a clear error otherwise."""
    raw = os.environ.get(JUTE_MAXBUFFER_ENV, "").strip()
    if not raw:
        return DEFAULT_JUTE_MAXBUFFER
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1024:
        raise LocalServerError(
            f"{JUTE_MAXBUFFER_ENV}={raw!r}: expected a number of bytes (at least 1024), "
            "e.g. 67108864 for 64 MiB"
        )
    return value


@dataclass
class LocalZooKeeper:
    directory: Path
    port: int
    # jute.maxbuffer for a server this object starts; None: ZK_JUTE_MAXBUFFER, or 1 MiB - 1.
    jute_maxbuffer: int | None = None
    # A member of an ensemble: its server id and the ``server.N=...`` lines of every member.
    myid: int | None = None
    peers: tuple[str, ...] = ()

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.directory / "zookeeper.pid"

    @property
    def log_file(self) -> Path:
        return self.directory / "zookeeper.log"

    @property
    def config_file(self) -> Path:
        return self.directory / "zoo.cfg"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def running(self) -> int | None:
        """The process id of the server started from this folder, while it runs."""
        pid = self.pid()
        if pid is None:
            return None
        try:
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return pid  # no /proc to ask: trust the pid file
        # After a reboot the pid file may name some other process.
        return pid if str(self.config_file).encode() in arguments else None

    def stopped(self) -> bool:
        return self.running() is None

    def configured_port(self) -> int | None:
        """The client port in this folder's zoo.cfg (that of the last server started here)."""
        try:
            found = re.search(r"^clientPort=(\d+)$", self.config_file.read_text(), re.M)
        except OSError:
            return None
        return int(found.group(1)) if found else None

    def is_serving(self) -> bool:
        answer = four_letter(self.port)
        return answer is not None and "Zookeeper version" in answer

    @contextlib.contextmanager
    def _starting(self) -> Iterator[None]:
        """One process at a time decides whether to start the server."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / "start.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def start(self, *, wait: float = 60.0) -> None:
        """Start the server unless it already serves; wait until it answers.

        When this folder's server already runs on another port, that port is used instead.
        """
        with self._starting():
            self.follow_running()
            if self.is_serving():
                return
            if self.running() is not None:  # started by another process, not answering yet
                self.wait_until_serving(wait, lambda: self.running() is None)
                return
            self._spawn(wait)

    def follow_running(self) -> None:
        """Take the port of the server running from this folder, when nothing serves on ours."""
        if self.running() is not None and not self.is_serving():
            self.port = self.configured_port() or self.port

    def wait_until_serving(self, wait: float, exited: Callable[[], bool]) -> None:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.is_serving():
                return
            if exited():
                tail = self.log_file.read_text(errors="replace")[-2000:]
                raise LocalServerError(f"ZooKeeper exited; see {self.log_file}:\n{tail}")
            time.sleep(0.2)
        raise LocalServerError(f"ZooKeeper did not answer on port {self.port} within {wait}s")

    def _spawn(self, wait: float) -> None:
        proc = self.launch()
        self.wait_until_serving(wait, lambda: proc.poll() is not None)

    def _config_lines(self, data: Path) -> list[str]:
        lines = [
            "tickTime=2000",
            f"dataDir={data}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=srvr,ruok,mntr,stat",
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
            # Tests and benchmarks create many sessions quickly.
            "minSessionTimeout=2000",
            "maxSessionTimeout=30000",
        ]
        if self.peers:
            # A follower that loses its leader elects a new one within a few ticks.
            lines += ["initLimit=10", "syncLimit=5", *self.peers]
        return [*lines, ""]

    def launch(self) -> subprocess.Popen[bytes]:
        """Write the config and start the server process, without waiting for it to answer.

        An ensemble's members only answer once a quorum of them runs, so it starts them all
        before waiting for any.
        """
        install()
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        if self.myid is not None:
            (data / "myid").write_text(f"{self.myid}\n")
        config = self.config_file
        config.write_text("\n".join(self._config_lines(data)))
        heap = heap_from_env()
        flags = jvm_flags_from_env()
        maxbuffer = self.jute_maxbuffer or jute_maxbuffer_from_env()
        classpath, logging = str(ZOOKEEPER_JAR), []
        if SLF4J_SIMPLE_JAR.exists():
            classpath += f":{SLF4J_SIMPLE_JAR}"
            logging = [*LOG_FLAGS, QUORUM_LOG_FLAG] if self.peers else list(LOG_FLAGS)
        with self.log_file.open("ab") as log:
            proc = subprocess.Popen(
                [
                    "java",
                    f"-Xmx{heap}",
                    *flags,
                    # jute.maxbuffer as such: ZooKeeper ignores zookeeper.jute.maxbuffer.
                    f"-Djute.maxbuffer={maxbuffer}",
                    *logging,
                    "-cp",
                    classpath,
                    # A member's main class reads the server.N lines; alone it would refuse them.
                    QUORUM_MAIN_CLASS if self.peers else MAIN_CLASS,
                    str(config),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.directory,
            )
        self.pid_file.write_text(str(proc.pid))
        return proc

    def mode(self) -> str | None:
        """``leader``, ``follower`` or ``standalone`` from ``srvr``; None when it does not serve."""
        answer = four_letter(self.port)
        found = re.search(r"^Mode: (\w+)", answer or "", re.M)
        return found.group(1) if found else None

    def kill(self) -> None:
        """SIGKILL the server: no goodbye to its peers or clients, as when a host dies."""
        pid = self.running()
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        _reap(pid, wait=5.0)
        self.pid_file.unlink(missing_ok=True)

    def stop(self, *, wait: float = 20.0) -> bool:
        """Stop the server this folder started; True when a process was stopped."""
        pid = self.running()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.running() is None:
                break
            # Reap it when it is our own child (tests); harmless otherwise.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
        _reap(pid, wait=5.0)
        self.pid_file.unlink(missing_ok=True)
        return True


def _reap(pid: int, *, wait: float) -> None:
    """Collect ``pid`` when it is this process's child (tests start servers themselves).

    A server that has let go of its command line may not have exited yet: one non-blocking
    wait could miss it and leave a zombie that still answers to its pid.
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return  # not our child (another process reaps it), or reaped already
        if done or time.monotonic() > deadline:
            return
        time.sleep(0.05)


class LocalEnsemble:
    """Several of Debian's ZooKeeper servers on loopback forming one ensemble (3 by default).

    For the tests and the chaos run: a leader killed, a member stopped and started again, as an
    operator's ensemble lives through them. Members are numbered from 1 (their ``myid``), each
    with its own folder under ``directory`` and its own client, quorum and election ports.
    """

    def __init__(self, directory: Path, size: int = 3) -> None:
        free = free_ports(3 * size)
        ports = [(free[3 * n], free[3 * n + 1], free[3 * n + 2]) for n in range(size)]
        peers = tuple(
            f"server.{n}=127.0.0.1:{quorum}:{election}"
            for n, (_client, quorum, election) in enumerate(ports, start=1)
        )
        self.members: dict[int, LocalZooKeeper] = {
            n: LocalZooKeeper(Path(directory) / f"zk{n}", client, myid=n, peers=peers)
            for n, (client, _quorum, _election) in enumerate(ports, start=1)
        }

    @property
    def hosts(self) -> str:
        return ",".join(member.hosts for member in self.members.values())

    def start(self, *, wait: float = 90.0) -> None:
        """Start every member that is not running and wait until all of them serve."""
        launched: dict[int, subprocess.Popen[bytes]] = {}
        for n, member in self.members.items():
            if member.running() is None:
                launched[n] = member.launch()
        deadline = time.monotonic() + wait
        for n, member in self.members.items():
            # A member started here has exited when its process has (the pid file's test reads
            # /proc/PID/cmdline, which a busy machine once answered without the config's path
            # for a member that was starting: "ZooKeeper exited" with a healthy log).
            proc = launched.get(n)
            exited: Callable[[], bool] = member.stopped
            if proc is not None:
                exited = functools.partial(_exited, proc)
            member.wait_until_serving(max(deadline - time.monotonic(), 0.1), exited)

    def stop(self) -> None:
        for member in self.members.values():
            member.stop()

    def leader(self) -> int | None:
        """The member that answers ``Mode: leader`` to ``srvr``; None during an election."""
        for n, member in self.members.items():
            if member.mode() == "leader":
                return n
        return None

    def wait_for_leader(self, *, wait: float = 60.0, other_than: int | None = None) -> int:
        """The leader once one is elected (one other than ``other_than`` when given)."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            n = self.leader()
            if n is not None and n != other_than:
                return n
            time.sleep(0.2)
        raise LocalServerError(f"no leader elected within {wait}s; {self.describe()}")

    def describe(self) -> str:
        """Each member's mode and the last lines of its log: what an election that did not end
        leaves to read once the test's folders are gone."""
        parts = []
        for n, member in self.members.items():
            state = member.mode() or ("not serving" if member.running() else "not running")
            try:
                tail = member.log_file.read_text(errors="replace").splitlines()[-LOG_LINES:]
            except OSError as exc:
                tail = [f"(no log: {exc})"]
            parts.append(f"server {n}: {state}; its log ends:\n" + "\n".join(tail))
        return "\n".join(parts)

    def kill(self, n: int) -> None:
        """SIGKILL member ``n``."""
        self.members[n].kill()

    def start_one(self, n: int, *, wait: float = 60.0) -> None:
        """Start member ``n`` again and wait until it has rejoined and serves."""
        member = self.members[n]
        if member.running() is None:
            proc = member.launch()
            member.wait_until_serving(wait, lambda: proc.poll() is not None)

    def stop_one(self, n: int) -> None:
        """Stop member ``n`` cleanly (SIGTERM)."""
        self.members[n].stop()


def local_server(var_dir: Path, port: int) -> LocalZooKeeper:
    """The project's own server: data under ``var_dir/zookeeper``, on ``port`` (ZK_LOCAL_PORT)."""
    return LocalZooKeeper(Path(var_dir) / "zookeeper", port)


def resolve_hosts(hosts: str, var_dir: Path, port: int) -> str:
    """The connection string for ZK_HOSTS (stripped): the setting, or the project's own server.

    ``local`` starts that server when needed. Empty uses it only while it runs from
    MRT_VAR_DIR (a shell command beside ``bin/run-console``); otherwise Unavailable says what to
    set: a production host with ZK_HOSTS forgotten must not quietly get an empty queue of its own.
    """
    if hosts and hosts != LOCAL:
        return hosts
    server = local_server(var_dir, port)
    if hosts == LOCAL:
        server.start()
        return server.hosts
    if server.running() is not None:
        server.follow_running()
        return server.hosts
    raise Unavailable(
        "ZK_HOSTS is not set: name the ensemble (host:port,host:port[/chroot]), or set "
        "ZK_HOSTS=local for the project's own ZooKeeper under MRT_VAR_DIR"
    )
