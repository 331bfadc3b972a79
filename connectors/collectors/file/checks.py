"""What a usage file's sample must have, checked when the file is read.

A sample without a metric, a timestamp, a value or a scope id cannot be billed; it used to be
dropped silently and its period committed as if it had no usage — revenue lost without a word.
Such a file is refused as a whole, with the first offending place: ``usage.csv: line 7: value:
empty`` (CSV: the line in the file, the header being line 1; Parquet and JSONL: the 1-based row).
``FatalConnectorError``: the run stops before it takes any lease (``Collector.check`` reads the
files), so nothing is written and no state moves until the file is fixed.

A cell holding a list or an object (JSONL, Parquet) is refused the same way: no sample has one.

A NaN or infinite value is not a missing one: it is no sample, the rule the Prometheus collector
follows (docs/prometheus.md); the collector counts those it leaves out (``samples_not_finite``).
"""

from __future__ import annotations

import polars as pl

from ratebeam.connectors.errors import FatalConnectorError

#: The columns every sample needs, checked in this order (the scope key comes last).
NEEDED = ("metric", "timestamp", "value")


def place(fmt: str, index: int) -> str:
    """Where the ``index``-th (0-based) sample of a file is, the way its user finds it."""
    return f"line {index + 2}" if fmt == "csv" else f"row {index + 1}"


def refuse_nested(frame: pl.DataFrame, path: str, fmt: str, offset: int = 0) -> None:
    """Raise naming the first cell of ``frame`` that holds a list or an object (JSONL, Parquet).

    ``frame`` holds the file's samples from the ``offset``-th (0-based) on (a chunk of the file).

    A sample's metric, timestamp, value and labels are single values: Polars would cast a list to
    text only by failing, and an object to a text such as ``'{1}'`` that no label ever had.
    """
    for column, dtype in frame.schema.items():
        if dtype.is_nested():
            bad = frame.select(pl.col(column).is_not_null().arg_true().first()).item()
            raise FatalConnectorError(f"file collector: {path}: {place(fmt, offset + (bad or 0))}: {column}: "
                                      f"a list or an object, not a single value ({dtype})")


def refuse_missing(frame: pl.DataFrame, path: str, fmt: str, scope_key: str, offset: int = 0) -> None:
    """Raise naming the first sample of ``frame`` whose metric, timestamp, value or scope id is empty.

    ``frame`` holds the file's samples from the ``offset``-th (0-based) on (a chunk of the file).
    """
    if scope_key not in frame.columns:
        raise FatalConnectorError(f"file collector: {path}: no {scope_key!r} column (the scope key)")
    columns = (*NEEDED, scope_key)

    def empty(column: str) -> pl.Expr:
        values = pl.col(column)
        missing = values.is_null()
        return missing | (values.str.strip_chars() == "") if frame.schema[column] == pl.String else missing

    # One pass over the chunk for every column (Polars runs them in parallel), then the first one named.
    first = frame.select(empty(c).arg_true().first().alias(c) for c in columns).row(0)
    for column, bad in zip(columns, first, strict=True):
        if bad is not None:
            what = f"{column}: empty" + (" (the scope key)" if column == scope_key else "")
            raise FatalConnectorError(f"file collector: {path}: {place(fmt, offset + bad)}: {what}")
