"""Shared error handling for the operator commands: domain errors become clean exits."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any, TextIO, cast

from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from queues.core.outside_text import for_log
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


class TerminalOutput(OutputWrapper):
    """A command's stdout or stderr, where every line it writes has its control characters
    written as visible escapes (``for_log``'s rule: ESC, BEL, CSI, a carriage return or a new
    line inside a line): what a command prints holds text from outside (ZooKeeper's nodes,
    Merritt's answers, a depositor's title, a token's name typed into a page), and an escape
    sequence in it must not reach the operator's terminal raw, nor a new line forge another
    line of output. Tabs stay: they part a listing's columns (``apitoken list``)."""

    def __init__(self, out: TextIO, ending: str = "\n") -> None:
        super().__init__(out, ending)
        self.stream = out

    def write(  # type: ignore[override]  # OutputWrapper's own signature
        self,
        msg: str = "",
        style_func: Callable[[str], str] | None = None,
        ending: str | None = None,
    ) -> None:
        end = self.ending if ending is None else ending
        if end and msg.endswith(end):
            msg = msg[: -len(end)]
        super().write("\t".join(for_log(part) for part in msg.split("\t")), style_func, ending)

    def status(self, line: str) -> None:
        """A progress line: on a terminal written over the last one, else a line of its own."""
        if self.isatty():
            self.stream.write(f"\r{for_log(line)}\x1b[K")
            self.flush()
        else:
            self.write(line)


def _terminal(out: Any) -> TerminalOutput:
    if isinstance(out, TerminalOutput):
        return out
    if isinstance(out, OutputWrapper):
        # The stream it wraps (``_out``: not in Django's stubs).
        wrapped = TerminalOutput(cast(TextIO, out._out), ending=out.ending)
        wrapped.style_func = out.style_func
        return wrapped
    return TerminalOutput(out)


class QueueCommand(BaseCommand):
    """An operator command: what it prints is escaped for the terminal (``TerminalOutput``,
    its one-line error too, which Django writes to its stderr), and its domain errors print
    one clear line and exit non-zero."""

    # Django sets both in __init__ and again in execute (call_command's stdout=, stderr=):
    # whatever it sets is written through TerminalOutput.
    @property  # type: ignore[override]
    def stdout(self) -> TerminalOutput:
        return self._stdout

    @stdout.setter
    def stdout(self, out: Any) -> None:
        self._stdout = _terminal(out)

    @property  # type: ignore[override]
    def stderr(self) -> TerminalOutput:
        return self._stderr

    @stderr.setter
    def stderr(self, out: Any) -> None:
        self._stderr = _terminal(out)

    def run_safely(self, func: Callable[[], Any]) -> Any:
        try:
            return func()
        except DomainError as exc:
            raise CommandError(str(exc)) from exc
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
