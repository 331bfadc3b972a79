"""How every listing and report prints its rows: an aligned table, JSON, CSV or bare values.

One module so that every command renders a cell the same way, whatever the format: exact decimals
as plain strings (never a float, never an exponent: a price read back from JSON or CSV is the
stored one), instants as ISO-8601 in UTC (a naive value from SQLite is UTC), ``None`` as an empty
cell (``null`` in JSON).  ``--format`` is added by :func:`add_format_argument`, so its choices and
help read the same on every command; scripts read ``json`` or ``csv``, people the table.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TextIO

#: The formats of every listing and report.
FORMATS = ("table", "json", "csv")
#: Bare values, one row per line (``-f value`` of the OpenStack client), for shell scripts.
VALUE = "value"
#: ``rate``'s default: the rated file format (a JSON line per point, then the summary line).
RATED_JSONL = "jsonl"

Row = Mapping[str, Any]


def add_format_argument(parser: argparse.ArgumentParser, choices: Sequence[str] = FORMATS, *,
                        default: str = "table",
                        help: str = "output format: an aligned table for people, json or csv for programs") -> None:
    """``-f/--format`` (as the OpenStack client) with ``choices`` (every command's include ``FORMATS``).

    And ``--json``, the alias of ``-f json`` kept for scripts written against ``run --json``.
    """
    parser.add_argument("-f", "--format", choices=tuple(choices), default=default, help=help)
    parser.add_argument("--json", dest="format", action="store_const", const="json", help="the same as -f json")


def iso_utc(value: datetime) -> str:
    """An instant as ISO-8601 in UTC; a naive one (SQLite gives them back so) is taken as UTC."""
    aware = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return aware.isoformat()


def json_default(value: Any) -> Any:
    """``json.dump``'s fallback: exact decimals as plain strings, instants as ISO-8601 UTC."""
    from ratebeam.pipelines.interchange import plain_decimal

    if isinstance(value, Decimal):
        return plain_decimal(value)
    if isinstance(value, datetime):
        return iso_utc(value)
    raise TypeError(type(value).__name__)


def cell(value: Any) -> str:
    """One value as text: the same in the table, the CSV and the value format."""
    if value is None:
        return ""
    if isinstance(value, (datetime, Decimal)):
        return json_default(value)
    return str(value)


def write_json(document: Any, out: TextIO | None = None) -> None:
    """A JSON document (a report's own shape) with exact decimals and UTC instants."""
    out = out or sys.stdout
    json.dump(document, out, default=json_default, indent=1)
    out.write("\n")


def write_rows(rows: Iterable[Row], columns: Sequence[str], fmt: str, out: TextIO | None = None, *,
               footer: str | None = None) -> None:
    """``rows`` in ``fmt``, each reduced to ``columns`` (in that order).

    ``json`` is a list of objects, ``csv`` a header line then one line per row, ``value`` the bare
    cells separated by spaces; ``footer`` (e.g. a row count) is printed under the table only, so the
    machine formats hold nothing but rows.
    """
    out = out or sys.stdout
    rows = list(rows)
    if fmt == "json":
        write_json([{c: row.get(c) for c in columns} for row in rows], out)
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([cell(row.get(c)) for c in columns] for row in rows)
    elif fmt == VALUE:
        for row in rows:
            print(" ".join(cell(row.get(c)) for c in columns), file=out)
    elif fmt == "table":
        print_table(rows, columns, out)
        if footer is not None:
            print(footer, file=out)
    else:
        raise ValueError(f"unknown output format {fmt!r}")


def print_table(rows: Sequence[Row], columns: Sequence[str], out: TextIO | None = None) -> None:
    """A plain aligned text table (numbers right-aligned)."""
    out = out or sys.stdout
    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r.get(c), (int, float, Decimal)) for r in rows) for c in columns]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric, strict=True))

    print(line(columns), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for row in cells:
        print(line(row), file=out)
