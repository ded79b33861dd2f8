"""``manage.py runconsumer NAME [--once] [--poll SECONDS] [--threads N]``: host consumer daemons.

NAME is one daemon (``batch-pending``, ``pending``, ``estimating``, ..., ``access-large``) or
``all``: every daemon this deployment serves (MRT_DEPLOYMENT, MRT_OWN_STEPS; see
``queues.daemons.registry``) in one process, each in its own thread(s) but for the batched
loops of the short steps, which share one a copy (MRT_SHARED_LOOPS), all sharing one ZooKeeper
client. A daemon the deployment leaves to Merritt's services is refused, with the reason.
Any number of copies may run, on one host or many; the items' ephemeral locks keep them from
working on one item at the same time.

A registration of the process too large for one ZooKeeper node (queues/zk/sized.py) ends the start
in one line, exit status 2, as a bad setting does: no outage to wait out.

``--once`` handles at most one item (with ``all``: at most one per daemon, in pipeline order)
and exits 0, or 1 when that item failed. SIGTERM or SIGINT lets the item in hand finish, then
the process exits 0; a second signal, or ``--stop-timeout`` seconds without the items finished
(a step stuck on a server that does not answer), exits at once with status 1 (the items are
picked up again later: their locks go with the session). ``--once`` installs no signal handlers
(a signal ends it at once, as any script), so ``--stop-timeout`` with it is refused.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser
from django.db import close_old_connections

from queues.core.transient import is_database_outage
from queues.core.transient import reason as transient_reason
from queues.daemons.base import describe
from queues.daemons.registry import (
    ALL,
    NAMES,
    DeploymentError,
    daemon_classes,
    deployment_mode,
    deployment_problems,
)
from queues.daemons.retrying import check_policies
from queues.daemons.runner import Host, tune_collector
from queues.zk.client import close
from queues.zk.errors import is_connection_error
from queues.zk.sized import TooLarge

from ._base import QueueCommand, check_migrated, number_in

# Docker waits 10 s after SIGTERM before SIGKILL, Kubernetes 30 s: within the longer one, so an
# orchestrator that allows it sees the process end by itself.
DEFAULT_STOP_TIMEOUT = 25.0
# The options' upper bounds: an idle wait of an hour at most, an hour to finish after a stop, and
# no more copies of a loop than a host's threads sensibly hold (each copy is a thread, and its
# long steps' threads more).
MAX_POLL = 3600.0
MAX_STOP_TIMEOUT = 3600.0
MAX_THREADS = 256


log = logging.getLogger("queues.daemons")


def _say_ready(host: Host, path: str, stop: threading.Event, timeout: float = 120.0) -> None:
    """Write ``path`` once every daemon's loop has said it started (``MRT_READY_FILE``:
    ``bin/run-console`` prints the first admin's password after these lines, not among them)."""

    def wait_then_write() -> None:
        deadline = time.monotonic() + timeout
        for daemon in host.daemons:
            if stop.is_set() or not daemon.loop_started.wait(max(0.0, deadline - time.monotonic())):
                return
        try:
            with open(path, "w") as out:
                out.write(f"{os.getpid()}\n")
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc)

    threading.Thread(target=wait_then_write, name="ready-file", daemon=True).start()


def _too_large(exc: TooLarge) -> CommandError:
    """The process's registration (or the shared folder's record) is more than one ZooKeeper
    node holds: no outage to wait out, so the start ends in one line naming it (exit status 2,
    as the other start-up refusals), not a traceback; nothing was sent, nothing claimed."""
    return CommandError(f"cannot start: {exc}", returncode=2)


class Command(QueueCommand):
    help = "Run a consumer daemon (or all of them) on the ZooKeeper queues."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", choices=NAMES, help="the daemon to run, or 'all'")
        parser.add_argument(
            "--once", action="store_true", help="handle at most one item, then exit"
        )
        parser.add_argument(
            "--poll",
            type=number_in(0, MAX_POLL),
            default=5.0,
            help="seconds to wait when idle (default 5)",
        )
        parser.add_argument(
            "--threads",
            type=number_in(1, MAX_THREADS, whole=True),
            default=1,
            help="copies of the daemon loop (default 1)",
        )
        parser.add_argument(
            "--stop-timeout",
            type=number_in(0, MAX_STOP_TIMEOUT, above=True),
            default=None,
            help="seconds the items in hand may take to finish after SIGTERM/SIGINT before "
            f"the process exits anyway (default {DEFAULT_STOP_TIMEOUT:.0f}); not with --once",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["once"] and options["stop_timeout"] is not None:
            # --once installs no signal handlers (a signal ends it as any script), so the
            # timeout would be dropped in silence.
            raise CommandError(
                "--stop-timeout goes with a running consumer, not --once (which handles no "
                "signals: SIGTERM ends it at once)"
            )
        try:
            check_policies()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        stop = threading.Event()
        if not options["once"]:
            timeout = options["stop_timeout"]
            self._install_signals(stop, DEFAULT_STOP_TIMEOUT if timeout is None else timeout)
        if not self._wait_for_database(options, stop):
            return
        try:
            host = self._connect(options, stop)
        except TooLarge as exc:
            raise _too_large(exc) from None
        if host is None:
            return
        try:
            if options["once"]:
                code = host.run_once()
                if code:
                    raise SystemExit(code)
                return
            tune_collector()
            ready = os.environ.get("MRT_READY_FILE", "")
            if ready:
                _say_ready(host, ready, stop)
            host.run(stop)
        except TooLarge as exc:
            raise _too_large(exc) from None
        finally:
            host.close()
            close()

    def _wait_for_database(self, options: dict[str, Any], stop: threading.Event) -> bool:
        """The migration check (``check_migrated``: without the tables the steps write and read,
        every job would fail at the first step that touches one, for a reason that is the
        host's, not the job's), before claiming anything, waiting (with back-off) while the
        database is away: a daemon started while PostgreSQL restarts, or SQLite is held by
        another writer, would otherwise exit with a traceback and leave its work to whatever
        restarts it. ``--once`` fails at once. False when stopped before the database answered."""
        delay = 1.0
        while True:
            try:
                check_migrated()
                return True
            except Exception as exc:
                if not is_database_outage(exc):
                    raise
                message = transient_reason(exc)
                if options["once"]:
                    raise CommandError(message) from exc
                self.stderr.write(f"{message}; retrying in {delay:.0f}s")
                close_old_connections()
            if stop.wait(delay):
                return False
            delay = min(delay * 2, 30.0)

    def _connect(self, options: dict[str, Any], stop: threading.Event) -> Host | None:
        """Connect; a long-running daemon waits (with back-off) for ZooKeeper to come up.

        Daemons are often started together with the ensemble, or restarted while it restarts:
        exiting then would leave the work to whatever restarts the process. ``--once`` is for
        scripts, which want the failure at once. None when stopped before a connection.
        """
        self._check_deployment(options["name"])
        delay = 1.0
        while True:
            try:
                return Host(options["name"], threads=options["threads"], poll=options["poll"])
            except Exception as exc:
                # Unreachable, or lost again while the first nodes were being checked (an
                # ensemble restarting), or the database away while the process registers:
                # all are waited out, anything else is a bug.
                if not (is_connection_error(exc) or is_database_outage(exc)):
                    raise
                message = describe(exc)
                close_old_connections()
                if options["once"]:
                    raise CommandError(message) from exc
                self.stderr.write(f"{message}; retrying in {delay:.0f}s")
                close()
            if stop.wait(delay):
                return None
            delay = min(delay * 2, 30.0)

    def _check_deployment(self, name: str) -> None:
        """Refuse a daemon this deployment does not serve (MRT_DEPLOYMENT, MRT_OWN_STEPS), or
        settings under which the served ones cannot work beside Merritt, with the reason."""
        try:
            classes = daemon_classes(name)
            problems = deployment_problems()
        except DeploymentError as exc:
            raise CommandError(str(exc)) from exc
        if problems:
            raise CommandError("; ".join(problems))
        if name == ALL:
            served = ", ".join(cls.name for cls in classes) or "none"
            logging.getLogger("queues.daemons").info(
                "deployment %s: serving %s", deployment_mode(), served
            )

    def _install_signals(self, stop: threading.Event, timeout: float) -> None:
        def on_signal(signum: int, _frame: object) -> None:
            if stop.is_set():
                # Second signal: do not wait for the item in hand; its lock goes with the session.
                os._exit(1)
            self.stderr.write(
                f"{signal.Signals(signum).name}: finishing the current items (at most {timeout:g}s)"
            )
            stop.set()
            # A thread stuck in a step (or on a request no server answers) would otherwise keep
            # the process alive for ever; the timer's thread does not wait for any of them.
            timer = threading.Timer(timeout, self._give_up, args=(timeout,))
            timer.daemon = True
            timer.start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def _give_up(self, timeout: float) -> None:
        me = threading.current_thread()
        names = sorted(t.name for t in threading.enumerate() if t is not me and t.is_alive())
        self.stderr.write(
            f"stopping: items still in hand after {timeout:g}s; exiting without them (their "
            f"locks go with the session). Threads: {', '.join(names)}"
        )
        self.stderr.flush()
        os._exit(1)
