from __future__ import annotations

from typing import Any

from queues.services import moves

from ._base import QueueCommand


class Command(QueueCommand):
    help = (
        "Submit one payload URL and print its batch ID: a Pending batch made here, or, with "
        "MRT_BATCH_INTAKE=merritt, the submission sent to Merritt ingest's door (the batch "
        "its ingest wrote into the queue, else ingest's own batch ID)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--profile", required=True, help="ingest profile name")
        parser.add_argument("--submitter", required=True)
        parser.add_argument(
            "--payload-url", required=True, help="http(s):// URL, or file:// under MRT_FILE_ROOTS"
        )
        parser.add_argument(
            "--type",
            default="file",
            choices=moves.SUBMISSION_TYPES,
            help="submission type (default: file)",
        )
        parser.add_argument("--title", default="")
        parser.add_argument("--creator", default="")
        parser.add_argument("--date", default="")
        parser.add_argument("--local-id", default="")
        parser.add_argument("--primary-id", default="", help="the object's ARK, if it has one")
        parser.add_argument(
            "--digest-alg", default="", choices=["", "md5", "sha1", "sha256", "sha512"]
        )
        parser.add_argument("--digest-value", default="")
        parser.add_argument("--filename", default="")

    def handle(self, *args: Any, **opts: Any) -> None:
        # The submit action of every door: under MRT_BATCH_INTAKE=merritt it goes to ingest's
        # door, never straight into the shared queue.
        outcome = self.run_safely(
            lambda: moves.batch_submit_outcome(
                profile=opts["profile"],
                submitter=opts["submitter"],
                payload_url=opts["payload_url"],
                submission_type=opts["type"],
                title=opts["title"],
                creator=opts["creator"],
                date=opts["date"],
                local_id=opts["local_id"],
                primary_id=opts["primary_id"],
                digest_alg=opts["digest_alg"],
                digest_value=opts["digest_value"],
                filename=opts["filename"],
            )
        )
        if outcome.detail and outcome.detail != "submitted":
            self.stderr.write(outcome.detail)
        self.stdout.write(outcome.id)
