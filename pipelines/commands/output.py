"""Rows printed as a table, JSON or CSV (``--format``): the listings of ``failures`` and ``gaps``."""

from __future__ import annotations

import csv
import json
import sys
from typing import Any, TextIO

from ratebeam.pipelines.commands.common import _cell, json_default, print_table

FORMATS = ("table", "json", "csv")


def print_rows(rows: list[dict[str, Any]], columns: list[str], fmt: str, out: TextIO | None = None) -> None:
    """``rows`` (only ``columns``, in that order) as an aligned table, a JSON list or CSV with a header."""
    out = out or sys.stdout
    if fmt == "json":
        json.dump([{c: row.get(c) for c in columns} for row in rows], out, default=json_default, indent=1)
        print(file=out)
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_cell(row.get(c)) for c in columns] for row in rows)
    else:
        print_table(rows, columns, out)
