"""Reading usage files: which files a URL names, and their samples checked and normalised.

Why chunks: a usage export can be larger than the memory a worker should use, so a Parquet file is
read a bounded number of rows at a time (``read_chunks``); the collector keeps or spills them
(``spill``).  Errors are ``FatalConnectorError`` naming the file and the place in it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import PurePosixPath
from typing import IO

import fsspec
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ratebeam.connectors.collectors.file.checks import NEEDED, place, refuse_missing, refuse_nested
from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.extras import url_to_fs
from ratebeam.transforms import schema
from ratebeam.transforms.frames import to_frame
from ratebeam.transforms.long_integers import find_long_integer
from ratebeam.transforms.schema import quantize_qty

FORMATS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
#: The extensions read, as a file not read is told.
READ = f"read: {', '.join(FORMATS)}, in any case"
#: Column marking the samples whose value is NaN or infinite (no sample; counted when collected).
NOT_FINITE = "__not_finite"
#: Rows of a Parquet usage file read at a time.
CHUNK_ROWS = 262_144


@dataclass(frozen=True)
class UsageFiles:
    """What a collector's URL names: the files read, and those of its directory that are not, with why.

    A file of the directory that is left must be said: its usage would be missing
    from the bill, the state moving past it, without a word.
    """

    fs: fsspec.AbstractFileSystem
    #: (path, format) of each file read, in order.
    files: list[tuple[str, str]]
    #: (path, why) of each file of the directory not read, in order.
    not_read: list[tuple[str, str]] = field(default_factory=list)


def list_files(url: str, fmt: str = "auto") -> UsageFiles:
    """The usage files under ``url`` (a file, a directory or a glob), and those a directory holds but are not.

    A directory's files are read, below it at any depth, but those of a name (or below a directory
    of a name) beginning with ``.`` or ``_`` — hidden files, a sync tool's or editor's temporary
    copies, macOS's ``._u.csv``, markers such as Spark's ``_SUCCESS``: the rule of Arrow's and
    Spark's datasets — and those of an extension that is no usage format (``.gz``, ``README``).
    A file or a glob names its files itself: one of an unknown format is refused.
    """
    fs, path = url_to_fs(url, "collector.url")
    not_read: list[tuple[str, str]] = []
    if any(ch in path for ch in "*?["):
        paths = sorted(fs.glob(path))
    elif fs.isdir(path):
        paths = []
        for found in sorted(fs.find(path)):
            why = _why_not_read(found.removeprefix(path.rstrip("/") + "/"))
            if why is None:
                paths.append(found)
            else:
                not_read.append((found, why))
    elif fs.exists(path):
        paths = [path]
    else:
        raise FatalConnectorError(f"file collector: {url!r} does not exist")
    files = [(p, _format(p, fmt)) for p in paths]
    unknown = [p for p, f in files if f is None]
    if unknown:
        raise FatalConnectorError(f"file collector: unknown file format for {unknown[0]!r} (use .parquet, .csv or .jsonl)")
    if not files:
        left = f" ({len(not_read)} file(s) not read, e.g. {not_read[0][0]}: {not_read[0][1]})" if not_read else ""
        raise FatalConnectorError(f"file collector: no usage file under {url!r}{left}")
    return UsageFiles(fs, files, not_read)  # type: ignore[arg-type]  # no format is None: refused above


def _why_not_read(relative: str) -> str | None:
    """Why the file at ``relative`` (below the collector's directory) is not read, or None when it is."""
    for part in relative.split("/"):
        if part.startswith((".", "_")):
            return (f"not read: {part!r} begins with {part[0]!r} (hidden files, and markers such as _SUCCESS, "
                    "are not usage)")
    if _format(relative, "auto") is None:
        extension = PurePosixPath(relative).suffix
        return f"not read: {f'unknown extension {extension!r}' if extension else 'no extension'} ({READ})"
    return None


def _format(path: str, fmt: str) -> str | None:
    if fmt != "auto":
        return fmt
    for ext, name in FORMATS.items():
        if path.lower().endswith(ext):
            return name
    return None


def read_chunks(fs: fsspec.AbstractFileSystem, path: str, fmt: str, scope_key: str,
                chunk_rows: int | None = None) -> Iterator[pl.DataFrame]:
    """The file's samples, checked and normalised, in chunks of at most ``chunk_rows`` (Parquet) or whole.

    A Parquet file is read ``chunk_rows`` (default ``CHUNK_ROWS``) rows at a time, so reading holds
    one chunk, not the file;
    CSV and JSONL files are read whole (Polars infers their columns from the whole text).
    Normalised: ``metric`` and every label as text, ``timestamp`` as a UTC instant, ``value`` as an
    exact decimal and the NaN / infinite mark.  A refused sample is named by its place in the file.
    """
    try:
        with fs.open(path, "rb") as fh:
            if fmt == "parquet":
                yield from (_normalised(frame, path, fmt, scope_key, offset)
                            for offset, frame in _parquet_chunks(fs, path, fh, chunk_rows or CHUNK_ROWS))
                return
            frame = pl.read_csv(fh, infer_schema=False) if fmt == "csv" else pl.read_ndjson(fh)
    except (OSError, pl.exceptions.PolarsError, pa.ArrowException) as exc:
        # an empty CSV, invalid UTF-8, a corrupt Parquet file: said with the file, without Polars' hints
        if fmt == "jsonl" and isinstance(exc, pl.exceptions.PolarsError):
            _refuse_long_integer(fs, path)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FatalConnectorError(f"file collector: {path}: cannot read as {fmt}: {reason}") from None
    yield _normalised(frame, path, fmt, scope_key, 0)


def _refuse_long_integer(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Name the line, column and key of an integer over 4,300 digits, if one made Polars refuse the file.

    Polars says only "InvalidNumber at character N", of no line; looked for once the file failed.
    """
    limit = sys.get_int_max_str_digits()
    with fs.open(path, "rb") as fh:
        text = fh.read().decode("utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        found = find_long_integer(line) if len(line) > limit else None
        if found is not None:
            key = f": {found[2]}" if found[2] else ""
            raise FatalConnectorError(f"file collector: {path}: line {number} column {found[1]}{key}: a number has "
                                      f"more than {limit} digits")


def _parquet_chunks(fs: fsspec.AbstractFileSystem, path: str, fh: IO[bytes],
                    rows: int) -> Iterator[tuple[int, pl.DataFrame]]:
    """(offset, samples) of a Parquet file, ``rows`` at a time.

    A local file is read by Polars' own reader, a slice at a time (it reads only the row groups a
    slice needs): 7x faster than Arrow's reader then a conversion to Polars, which stays for other
    file systems (``memory://``, s3fs...), whose open file is what Polars would get.
    """
    parquet = pq.ParquetFile(fh)  # reads the footer: refuses a file that is not Parquet
    readable = _readable_schema(parquet.schema_arrow, path)
    if "file" in fs.protocol:
        scan = pl.scan_parquet(path)
        for offset in range(0, parquet.metadata.num_rows, rows):
            yield offset, scan.slice(offset, rows).collect()
        return
    offset = 0
    for batch in parquet.iter_batches(batch_size=rows):
        yield offset, to_frame(batch if batch.schema == readable else batch.cast(readable))
        offset += batch.num_rows


#: What a Parquet usage column may hold, said when it holds something else (by column; labels: the rest).
_ACCEPTED = {"value": "an integer, a float, a decimal of at most 38 digits or a number's text",
             "timestamp": "a timestamp or ISO-8601 text"}
_LABEL_ACCEPTED = "text, an integer, a float, a boolean, a date or a decimal of at most 38 digits"


def _readable_schema(schema: pa.Schema, path: str) -> pa.Schema:
    """``schema`` with each 256-bit decimal as a 128-bit one; a decimal of more than 38 digits refused.

    Polars holds decimals of at most 38 digits (a ``decimal256(76, 0)`` column made it say only
    "precision must be between 1 and 38, got 76"), and converts no 256-bit decimal from Arrow (it
    panics), though its own reader takes one of 38 digits or fewer: so Arrow's batches are cast.
    """
    fields = []
    for column in schema:
        kind = column.type
        if pa.types.is_decimal(kind) and kind.precision > 38:
            accepted = _ACCEPTED.get(column.name, _LABEL_ACCEPTED)
            raise FatalConnectorError(f"file collector: {path}: column {column.name}: type {kind} is not read "
                                      f"(accepted: {accepted})")
        fields.append(column.with_type(pa.decimal128(kind.precision, kind.scale)) if pa.types.is_decimal256(kind)
                      else column)
    return pa.schema(fields, schema.metadata)


def _normalised(frame: pl.DataFrame, path: str, fmt: str, scope_key: str, offset: int) -> pl.DataFrame:
    """``frame`` (the samples from the ``offset``-th of the file on) checked and normalised."""
    missing = [c for c in NEEDED if c not in frame.columns]
    if missing:
        raise FatalConnectorError(f"file collector: {path}: missing column(s) {', '.join(missing)}")
    refuse_nested(frame, path, fmt, offset)
    refuse_missing(frame, path, fmt, scope_key, offset)
    values, not_finite = _values(frame["value"], path)
    return frame.with_columns(
        pl.col("metric").cast(pl.String),
        _timestamps(frame, path, fmt, offset),
        values,
        not_finite.alias(NOT_FINITE),
        *(pl.col(c).cast(pl.String) for c in frame.columns if c not in NEEDED),
    )


def _timestamps(frame: pl.DataFrame, path: str, fmt: str, offset: int) -> pl.Expr:
    dtype = frame.schema["timestamp"]
    col = pl.col("timestamp")
    if dtype == pl.String:
        return pl.lit(_parse_timestamps(frame["timestamp"], f"{path}: ", fmt, offset)).alias("timestamp")
    if isinstance(dtype, pl.Datetime):
        col = col.dt.replace_time_zone("UTC") if dtype.time_zone is None else col.dt.convert_time_zone("UTC")
        return col.cast(schema.TIME_POLARS)
    raise FatalConnectorError(f"file collector: {path}: timestamp: unsupported type {dtype}")


#: The end of an ISO-8601 text that carries its offset (``...T10:00:00Z``, ``... 10:00+02:00``).
_AWARE = r"\d:\d{2}(?::\d{2}(?:[.,]\d+)?)?\s*(?:[Zz]|[+-]\d{2}(?::?\d{2})?)$"


def _parse_timestamps(text: pl.Series, path: str, fmt: str, offset: int) -> pl.Series:
    """ISO-8601 texts as UTC instants; naive ones are UTC, so a file may mix both forms.

    ``text`` holds the timestamps of the file's samples from the ``offset``-th on; ``path`` (with
    its ``': '``) begins every message.  Polars infers one format per column, so the texts with an
    offset and those without are parsed apart and put back in place.  A text that is no instant,
    and an instant past 9999-12-31 in UTC (no stage after this one can hold it), are refused naming
    the line (CSV) or row and the text.
    """
    out = pl.Series("timestamp", [None] * len(text), dtype=pl.Datetime("us", "UTC"))
    aware = text.str.contains(_AWARE).fill_null(False)
    for mask, zone in ((aware, "UTC"), (~aware & text.is_not_null(), None)):
        part = text.filter(mask)
        if part.is_empty():
            continue
        try:
            parsed = part.str.to_datetime(time_unit="us", time_zone=zone, strict=True)
        except pl.exceptions.PolarsError:
            row = mask.arg_true()[_first_unparsed(part, zone)]
            raise FatalConnectorError(f"file collector: {path}{place(fmt, offset + row)}: timestamp: not an "
                                      f"ISO-8601 instant: {text[row][:200]!r}") from None
        parsed = parsed if zone else parsed.dt.replace_time_zone("UTC")
        out = out.scatter(mask.arg_true(), parsed)
    late = (out.dt.year() > 9999).arg_true()
    if not late.is_empty():
        raise FatalConnectorError(f"file collector: {path}{place(fmt, offset + late[0])}: timestamp: after "
                                  f"9999-12-31 once in UTC: {text[late[0]][:200]!r}")
    return out


def _first_unparsed(part: pl.Series, zone: str | None) -> int:
    """The index of the first text of ``part`` (some of which Polars refused) that is no instant.

    Read leniently, a text that is no instant is null; when even that fails, Polars found no
    format for the first text (the one it infers the column's format from).
    """
    try:
        unread = part.str.to_datetime(time_unit="us", time_zone=zone, strict=False).is_null().arg_true()
    except pl.exceptions.PolarsError:
        return 0
    return int(unread[0]) if not unread.is_empty() else 0


def _values(values: pl.Series, path: str) -> tuple[pl.Series, pl.Series]:
    """Sample values as exact decimals (numbers via their shortest text, ``Decimal(str(x))``) and a mask.

    The mask says which are NaN or infinite (their decimal is null: a decimal column cannot hold them).
    """
    if values.dtype.is_integer() or isinstance(values.dtype, pl.Decimal):
        return values.cast(schema.QTY_POLARS), pl.repeat(False, len(values), eager=True)
    text = values.cast(pl.String)
    uniques = text.unique().drop_nulls()
    parsed: list[Decimal | None] = []
    not_finite = []
    for raw in uniques.to_list():
        try:
            number = Decimal(raw.strip())
            if not number.is_finite():
                not_finite.append(raw)
                parsed.append(None)
                continue
            parsed.append(quantize_qty(number))
        except (InvalidOperation, ValueError):
            raise FatalConnectorError(f"file collector: {path}: value: not a number: {raw!r}") from None
    decimals = text.replace_strict(uniques, pl.Series(parsed, dtype=schema.QTY_POLARS), default=None,
                                   return_dtype=schema.QTY_POLARS)
    return decimals, text.is_in(pl.Series(not_finite, dtype=pl.String).implode())
