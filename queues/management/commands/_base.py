"""Shared error handling for the operator commands: domain errors become clean exits."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from queues.core.transient import is_database_outage
from queues.core.words import range_words, within
from queues.zk.errors import DomainError


def check_migrated() -> None:
    """CommandError (exit 2) when the console's database has migrations not applied; a database
    that does not answer raises its own error (``runconsumer`` waits for it)."""
    from django.db import DEFAULT_DB_ALIAS, connections
    from django.db.migrations.executor import MigrationExecutor

    connection = connections[DEFAULT_DB_ALIAS]
    executor = MigrationExecutor(connection)
    pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if pending:
        raise CommandError(
            f"the database {connection.settings_dict['NAME']} is not migrated "
            f"({len(pending)} migrations pending): run `manage.py migrate` first",
            returncode=2,
        )


def require_database() -> None:
    """For a command that reads or writes the console's database: one clear line and exit 2,
    before anything is done, when the database is not migrated or does not answer (rather
    than a traceback from the first query)."""
    from django.db import DEFAULT_DB_ALIAS, connections

    try:
        check_migrated()
    except CommandError:
        raise
    except Exception as exc:
        if not is_database_outage(exc):
            raise
        name = connections[DEFAULT_DB_ALIAS].settings_dict["NAME"]
        raise CommandError(f"the database {name} does not answer: {exc}", returncode=2) from exc


def number_in(
    low: float, high: float, *, whole: bool = False, above: bool = False
) -> Callable[[str], float]:
    """An option's type: a finite number from ``low`` (more than ``low`` with ``above``) to
    ``high``, a whole one with ``whole``; anything else (text, "nan", "inf", "1e309", out of
    range) is argparse's own error naming the option, exit status 2, before the command runs.
    Read and said as the settings' numbers are (``queues.core.words``)."""
    said = range_words("a whole number" if whole else "a number", low, high, above=above)

    def parse(text: str) -> float:
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            value = math.nan
        if not within(value, low, high, above=above):
            raise argparse.ArgumentTypeError(f"must be {said}, got {text!r}")
        return value

    return parse


class QueueCommand(BaseCommand):
    """A command whose domain errors print one clear line and exit non-zero."""

    def run_safely(self, func: Callable[[], Any]) -> Any:
        try:
            return func()
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
