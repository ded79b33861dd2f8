from __future__ import annotations

from typing import Any

from queues import services

from ._base import QueueCommand


class Command(QueueCommand):
    help = "Create a Pending batch for one payload URL and print its batch ID."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--profile", required=True, help="ingest profile name")
        parser.add_argument("--submitter", required=True)
        parser.add_argument(
            "--payload-url", required=True, help="http(s):// URL, or file:// under MRT_FILE_ROOTS"
        )
        parser.add_argument(
            "--type",
            default="file",
            choices=services.SUBMISSION_TYPES,
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
        bid = self.run_safely(
            lambda: services.batch_submit(
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
        self.stdout.write(bid)
