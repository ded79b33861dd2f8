"""Shared error handling for the operator commands: domain errors become clean exits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from queues.zk.errors import DomainError


class QueueCommand(BaseCommand):
    """A command whose domain errors print one clear line and exit non-zero."""

    def run_safely(self, func: Callable[[], Any]) -> Any:
        try:
            return func()
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
