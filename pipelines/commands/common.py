"""What every command group shares: instants from the command line, the configuration, the database.

How rows are printed lives in ``output`` (re-exported here for the commands that print tables).
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ratebeam.pipelines.commands.output import json_default, print_table
from ratebeam.pipelines.errors import InputError, excerpt
from ratebeam.pipelines.exit_codes import EXIT_FAILED

__all__ = ["CommandError", "engine_of", "json_default", "load", "parse_instant", "print_table"]

if TYPE_CHECKING:  # the commands import their heavy modules only when they run
    from sqlalchemy import Engine

    from ratebeam.pipelines.config import RatebeamConfig


class CommandError(Exception):
    """A command that ran but could not do what was asked (``status`` is the exit code)."""

    def __init__(self, message: str, status: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.status = status



#: Set by a service whose stopped streaming job may leave the in-process SDK worker's gRPC threads
#: running: the console script then ends the process without finalizing it (``cli.console_main``).
END_WITHOUT_FINALIZING = threading.Event()

def parse_instant(text: str, what: str) -> datetime:
    """An ISO-8601 instant from the command line; naive means UTC.

    An instant whose UTC time falls outside Python's years 1-9999 (``9999-12-31T23:59:59-23:59``)
    is refused here rather than overflowing later in whatever reads it.
    """
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError("command line", what, "not an ISO-8601 date or time", text) from None
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:
        raise InputError("command line", what, "outside the years 1-9999 once in UTC", text) from None


def integer(text: str) -> int:
    """Argparse's ``type`` of an integer argument: its refusal quotes at most a short excerpt.

    (``type=int`` would quote a 5,000-digit argument whole, or fail past Python's 4,300-digit limit.)
    """
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {excerpt(text)}") from None


def number(text: str) -> float:
    """Argparse's ``type`` of a real-number argument (``--interval``): as ``integer``, a short excerpt."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {excerpt(text)}") from None


def bounded(value: int, what: str, low: int, high: int) -> int:
    """``value`` (an integer argument) if it lies in ``[low, high]``, else the ``InputError`` why not."""
    if not low <= value <= high:
        raise InputError("command line", what, f"must be an integer from {low} to {high}", value)
    return value


#: Largest row id a command accepts: the id columns are SQL ``INTEGER`` (int32 on PostgreSQL),
#: and a larger number is no id at all (SQLite's driver cannot even bind one past int64).
ROW_ID_MAX = 2**31 - 1


def row_ids(values: Sequence[int], what: str) -> tuple[int, ...]:
    """``values`` (ids from the command line) if each is a possible row id, else the ``InputError`` why not."""
    return tuple(bounded(value, what, 1, ROW_ID_MAX) for value in values)


def load(args: argparse.Namespace, *, metrics: bool | None = True) -> RatebeamConfig:
    """The validated configuration named by ``--config``.

    ``metrics=False`` for commands that never read ``metrics.yml``: a mistake there blocks only
    the commands that need it; ``None``: read it when configured (the event stream's commands).
    """
    from ratebeam.pipelines.commands.grammar import config_path
    from ratebeam.pipelines.config import load_config

    return load_config(config_path(args.config), metrics=metrics)


def engine_of(config: RatebeamConfig, *, check: bool = True) -> Engine:
    """The configured database; ``check`` refuses a schema that is not up to date."""
    from ratebeam.connectors.sql.engine import make_engine
    from ratebeam.connectors.sql.migrations import check_schema

    engine = make_engine(config.database_url)
    if check:
        check_schema(engine)
    return engine
