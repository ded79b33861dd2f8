"""``manage.py chaosrun``: the queue worked through by real consumer processes under the faults
an operator meets in production, then judged. The engine is ``queues.chaos``; this command
reads the options and prints. Exits 1 on any violation.

Always on: consumers killed with SIGKILL every ``--kill-every`` seconds (``--no-kills``), hostile
depositors among the good ones (``--no-hostile``). Each other fault is chosen by its count:
``--zk-restarts``, ``--leader-kills`` and ``--leader-storms`` (with ``--ensemble``), ``--pauses``,
``--black-holes``, ``--db-outages``, ``--redis-stops``, ``--disk-fills``, ``--flaps`` (the
services outside answering 503s, resets and slow answers for a spell; storage, inventory and EZID
stand-ins, the depositors' files and the callback receiver); ``--all-faults`` turns each on.

Time is not a verdict: the run waits while jobs move, prints its throughput, and fails as
stalled when no job moved and no fault acted for ``--stall`` seconds (``--limit`` adds a limit
of the whole run). At the end it reads the ZooKeeper servers' own transaction logs and judges
them (``queues.chaos.txnlog``).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from queues.chaos.engine import ChaosError, Options, Run
from queues.chaos.infra import InfraError
from queues.management.commands._base import number_in

# --all-faults: strikes of each fault not set on the command line.
ALL_FAULTS = {
    "zk_restarts": 2,
    "leader_kills": 3,
    "leader_storms": 1,
    "pauses": 3,
    "black_holes": 2,
    "db_outages": 2,
    "redis_stops": 2,
    "disk_fills": 2,
    "flaps": 3,
}


# Each number an option takes is checked before the run starts (argparse's error, exit 2):
# "nan", "-5" or "1e400" seconds made a run that never struck or never ended.
DAY = 86_400
SECONDS = number_in(0, DAY)
POSITIVE_SECONDS = number_in(0, DAY, above=True)
COUNT = number_in(0, 1_000_000, whole=True)
AT_LEAST_ONE = number_in(1, 1_000_000, whole=True)
SEED = number_in(0, 2**63 - 1, whole=True)
PORT = number_in(0, 65_535, whole=True)


class Command(BaseCommand):
    help = (
        "Run jobs through every daemon under faults, then judge the queue, and ZooKeeper's own "
        "transaction logs: a lock deleted by a session that did not create it, a lock taken "
        "over a standing one, or a consumer writing a job whose lock it did not hold at that "
        "zxid fails the run (on an existing ensemble named by ZK_HOSTS they are not read). "
        "Prints the throughput (jobs/s) as it goes; fails when nothing moves for --stall "
        "seconds, not when a slow machine takes long."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add = parser.add_argument
        add("--jobs", type=AT_LEAST_ONE, default=1000)
        add(
            "--batches",
            type=COUNT,
            default=0,
            help="default: one per 100 jobs, and at least one a strike (a wave of its own)",
        )
        add("--consumers", type=AT_LEAST_ONE, default=3, help="runconsumer all processes")
        add(
            "--loop",
            choices=("one", "batched"),
            default="batched",
            help="the default (the batched loop for its short steps: MRT_CLAIM_BATCH, "
            "MRT_KEEP_LOCKS), or the one-job loop for every step",
        )
        add(
            "--claim-batch",
            type=AT_LEAST_ONE,
            default=settings.MRT_CLAIM_BATCH,
            help="MRT_CLAIM_BATCH of the batched loop (default: this installation's)",
        )
        add(
            "--storage",
            choices=("http", "local"),
            default="http",
            help="http: a stand-in of Merritt's storage that makes a version for every add",
        )
        add(
            "--storage-add-seconds",
            type=SECONDS,
            default=0.5,
            help="how long the storage stand-in takes to answer an add it has made",
        )
        add("--database", choices=("sqlite", "postgres"), default="sqlite")
        add(
            "--session-timeout",
            type=POSITIVE_SECONDS,
            default=4.0,
            help="the consumers' ZK_TIMEOUT",
        )
        add("--no-kills", dest="kills", action="store_false", help="no consumer SIGKILLs")
        add(
            "--kill-every",
            type=POSITIVE_SECONDS,
            nargs=2,
            default=(2.0, 6.0),
            metavar=("MIN", "MAX"),
            help="seconds between SIGKILLs, drawn uniformly (default 2 6)",
        )
        add(
            "--all-faults",
            action="store_true",
            help="every fault below that is not given a count, with the ensemble and a web worker",
        )
        add("--zk-restarts", type=COUNT, default=None, help="ZooKeeper stopped and started (2)")
        add(
            "--zk-down",
            type=SECONDS,
            default=None,
            help="seconds ZooKeeper stays down (default: half the session timeout)",
        )
        add("--ensemble", action="store_true", help="a 3-server ensemble instead of one server")
        add("--leader-kills", type=COUNT, default=None, help="the ensemble's leader killed")
        add(
            "--leader-down",
            type=POSITIVE_SECONDS,
            default=2.0,
            help="seconds a killed leader stays down",
        )
        add(
            "--leader-storms",
            type=COUNT,
            default=None,
            help="storms of leader kills in the ensemble: --storm-kills kills, --storm-every "
            "seconds apart, each killed server started again after --leader-down seconds",
        )
        add("--storm-kills", type=AT_LEAST_ONE, default=9, help="leader kills in one storm (9)")
        add(
            "--storm-every",
            type=POSITIVE_SECONDS,
            default=9.0,
            help="seconds between a storm's kills (9)",
        )
        add("--pauses", type=COUNT, default=None, help="a consumer SIGSTOPped, then SIGCONTed")
        add(
            "--pause-seconds",
            type=SECONDS,
            default=None,
            help="default: twice the session timeout and 2 s",
        )
        add(
            "--black-holes",
            type=COUNT,
            default=None,
            help="consumer 0's ZooKeeper connection stops forwarding, nothing closed",
        )
        add("--black-hole-seconds", type=SECONDS, default=None, help="as --pause-seconds")
        add(
            "--db-outages",
            type=COUNT,
            default=None,
            help="PostgreSQL stopped, or SQLite held by another writer",
        )
        add("--db-outage-seconds", type=SECONDS, default=10.0)
        add("--web", action="store_true", help="a daphne web worker polled through the run")
        add("--redis-stops", type=COUNT, default=None, help="Redis stopped (adds the web worker)")
        add("--redis-down", type=SECONDS, default=10.0)
        add(
            "--disk-fills",
            type=COUNT,
            default=None,
            help="the working disk (a tmpfs, root only) filled to the last byte",
        )
        add("--disk-full-seconds", type=SECONDS, default=7.0)
        add("--work-disk-mb", type=AT_LEAST_ONE, default=64)
        add(
            "--flaps",
            type=COUNT,
            default=None,
            help="spells of the services outside flapping: storage, inventory and EZID (stand-ins "
            "of each, instead of the local inventory and minter), the depositors' files and the "
            "callback receiver answer 503 (with and without Retry-After), reset connections "
            "(before answering, or halfway through the answer of a request carried out) and "
            "answer slowly, a kind a phase, then well again",
        )
        add(
            "--flap-seconds", type=POSITIVE_SECONDS, default=20.0, help="seconds a spell lasts (20)"
        )
        add(
            "--no-hostile",
            dest="hostile",
            action="store_false",
            help="leave out the hostile depositors",
        )
        add(
            "--lock-grace",
            type=SECONDS,
            default=60.0,
            help="seconds after the last fault within which every lock must be gone",
        )
        add(
            "--stall",
            type=POSITIVE_SECONDS,
            default=180.0,
            help="fail as stalled when no job moved and no fault acted for this long (180)",
        )
        add(
            "--stop-timeout",
            type=POSITIVE_SECONDS,
            default=60.0,
            help="seconds a consumer may take to stop on SIGTERM",
        )
        add(
            "--limit",
            type=POSITIVE_SECONDS,
            default=None,
            help="seconds the whole run may take (default: no limit; the run waits while "
            "jobs move, and --stall fails it when nothing does)",
        )
        add("--seed", type=SEED, default=None)
        add(
            "--keep",
            action="store_true",
            help="keep the scratch folder and the logs (always kept when the run fails)",
        )
        for name in ("zk", "files", "storage", "work", "web", "redis", "pg", "proxy"):
            add(f"--{name}-port", type=PORT, default=0, help="default: a free port")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["jobs"] < 1 or options["consumers"] < 1:
            raise CommandError("--jobs and --consumers must be at least 1")
        everything = options["all_faults"]
        counts = {
            name: options[name] if options[name] is not None else
            (ALL_FAULTS[name] if everything else (2 if name == "zk_restarts" else 0))
            for name in ALL_FAULTS
        }  # fmt: skip
        if options["storage"] != "http" and options["flaps"] is None:
            counts["flaps"] = 0  # the flaps need the storage stand-in
        fields = set(Options.__dataclass_fields__)
        chosen = {k: v for k, v in options.items() if k in fields and v is not None}
        if options["limit"] is not None and options["limit"] <= 0:
            raise CommandError("--limit must be a positive number of seconds")
        chosen.update(counts)
        chosen["kill_every"] = tuple(options["kill_every"])
        chosen["ensemble"] = options["ensemble"] or (
            everything and (counts["leader_kills"] > 0 or counts["leader_storms"] > 0)
        )
        chosen["web"] = options["web"] or everything
        hosts = settings.ZK_HOSTS.strip()
        chosen["zk_hosts"] = "" if hosts in ("", "local") else hosts
        run = Run(Options(**chosen), self.say, Path(settings.BASE_DIR) / "manage.py")
        # SIGTERM unwinds like Ctrl-C: the servers, consumers and the mounted disk the run
        # started are stopped and removed on the way out.
        signal.signal(signal.SIGTERM, _interrupted)
        try:
            run.execute()
        except (ChaosError, InfraError) as exc:
            raise CommandError(str(exc)) from None
        if not run.conclude():
            raise SystemExit(1)

    def say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
