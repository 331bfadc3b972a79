"""The log level: ``--log-level``, ``$RATEBEAM_LOG_LEVEL``, and a quiet terminal by default.

The INFO lines (scopes fetched, periods due and committed, retries) are for the logs of a
scheduler; a person at a terminal sees the run's summary and warnings, and a progress bar
instead (``progress``).  So the default is WARNING when stderr is a terminal and INFO otherwise
(a pipe, a file, cron, systemd, a test): a scheduled run logs exactly what it logged before.
``$RATEBEAM_LOG_LEVEL`` sets the default for a whole environment, ``--log-level`` for one command,
``-v`` stays the short way to DEBUG.

``--log-format json`` (or ``$RATEBEAM_LOG_FORMAT=json``) writes one JSON object per line
(``time``, ``level``, ``logger``, ``message``, and ``exception`` when there is one) for log
shippers (Fluent Bit, Vector, journald's JSON readers), which then need no multi-line parsing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import UTC, datetime

from ratebeam.pipelines.errors import InputError

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
ENV = "RATEBEAM_LOG_LEVEL"
FORMATS = ("text", "json")
FORMAT_ENV = "RATEBEAM_LOG_FORMAT"
#: Libraries whose INFO lines are about their own internals, not the user's work.
NOISY = ("apache_beam", "absl", "alembic", "matplotlib")


def add_log_arguments(parser: argparse.ArgumentParser, *, suppress_default: bool = False) -> None:
    """``--log-level`` (on the top parser and, with ``suppress_default``, again on each command)."""
    parser.add_argument(
        "--log-level", type=str.upper, choices=LEVELS, metavar="{" + ",".join(LEVELS) + "}",
        default=argparse.SUPPRESS if suppress_default else None,
        help=f"log level on stderr (default: ${ENV}, else WARNING on a terminal and INFO otherwise)",
    )
    parser.add_argument(
        "--log-format", type=str.lower, choices=FORMATS, default=argparse.SUPPRESS if suppress_default else None,
        help=f"text lines, or one JSON object per line for log shippers (default: ${FORMAT_ENV}, else text)",
    )


def level_of(args: argparse.Namespace) -> int:
    """The level asked for: ``-v``, ``--log-level``, ``$RATEBEAM_LOG_LEVEL``, else by the terminal."""
    if getattr(args, "verbose", False):
        return logging.DEBUG
    name = getattr(args, "log_level", None) or os.environ.get(ENV, "").strip().upper()
    if not name:
        return logging.WARNING if sys.stderr.isatty() else logging.INFO
    if name not in LEVELS:
        raise InputError("environment", ENV, f"not a log level (one of {', '.join(LEVELS)})", name)
    return logging.getLevelName(name)


def configure_logging(args: argparse.Namespace) -> None:
    """Log to stderr at the asked level, the noisy libraries at WARNING.

    The level is the stderr handler's: ratebeam's loggers still make their INFO records, which the
    progress of a run is fed from (``run_progress``), though the terminal does not show them.
    Where the root logger has handlers already (an embedding program, pytest), its level is set.
    """
    level = level_of(args)
    root = logging.getLogger()
    if root.handlers:
        root.setLevel(level)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter() if format_of(args) == "json"
                             else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.setLevel(level)
        root.addHandler(handler)
        root.setLevel(min(level, logging.INFO))
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def format_of(args: argparse.Namespace) -> str:
    """The log format asked for: ``--log-format``, ``$RATEBEAM_LOG_FORMAT``, else ``text``."""
    name = getattr(args, "log_format", None) or os.environ.get(FORMAT_ENV, "").strip().lower() or "text"
    if name not in FORMATS:
        raise InputError("environment", FORMAT_ENV, f"not a log format (one of {', '.join(FORMATS)})", name)
    return name


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO-8601), ``level``, ``logger``, ``message``, ``exception``."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (a traceback stays inside its string)."""
        entry = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)
