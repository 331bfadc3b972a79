"""Reading usage files: which files a URL names, and their samples checked and normalised.

Why chunks: a usage export can be larger than the memory a worker should use, so a Parquet file is
read a bounded number of rows at a time (``read_chunks``); the collector keeps or spills them
(``spill``).  Errors are ``FatalConnectorError`` naming the file and the place in it.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import IO

import fsspec
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ratebeam.connectors.collectors.file.checks import NEEDED, refuse_missing, refuse_nested
from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.extras import url_to_fs
from ratebeam.transforms import schema
from ratebeam.transforms.frames import to_frame
from ratebeam.transforms.schema import quantize_qty

FORMATS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
#: Column marking the samples whose value is NaN or infinite (no sample; counted when collected).
NOT_FINITE = "__not_finite"
#: Rows of a Parquet usage file read at a time.
CHUNK_ROWS = 262_144


def list_files(url: str, fmt: str = "auto") -> tuple[fsspec.AbstractFileSystem, list[tuple[str, str]]]:
    """The (path, format) of every usage file under ``url`` (a file, a directory or a glob)."""
    fs, path = url_to_fs(url, "collector.url")
    if any(ch in path for ch in "*?["):
        paths = sorted(fs.glob(path))
    elif fs.isdir(path):
        paths = sorted(p for p in fs.find(path) if _format(p, "auto"))
    elif fs.exists(path):
        paths = [path]
    else:
        raise FatalConnectorError(f"file collector: {url!r} does not exist")
    found = [(p, _format(p, fmt)) for p in paths]
    unknown = [p for p, f in found if f is None]
    if unknown:
        raise FatalConnectorError(f"file collector: unknown file format for {unknown[0]!r} (use .parquet, .csv or .jsonl)")
    if not found:
        raise FatalConnectorError(f"file collector: no usage file under {url!r}")
    return fs, found  # type: ignore[return-value]


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
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FatalConnectorError(f"file collector: {path}: cannot read as {fmt}: {reason}") from None
    yield _normalised(frame, path, fmt, scope_key, 0)


def _parquet_chunks(fs: fsspec.AbstractFileSystem, path: str, fh: IO[bytes],
                    rows: int) -> Iterator[tuple[int, pl.DataFrame]]:
    """(offset, samples) of a Parquet file, ``rows`` at a time.

    A local file is read by Polars' own reader, a slice at a time (it reads only the row groups a
    slice needs): 7x faster than Arrow's reader then a conversion to Polars, which stays for other
    file systems (``memory://``, s3fs...), whose open file is what Polars would get.
    """
    parquet = pq.ParquetFile(fh)  # reads the footer: refuses a file that is not Parquet
    if "file" in fs.protocol:
        scan = pl.scan_parquet(path)
        for offset in range(0, parquet.metadata.num_rows, rows):
            yield offset, scan.slice(offset, rows).collect()
        return
    offset = 0
    for batch in parquet.iter_batches(batch_size=rows):
        yield offset, to_frame(batch)
        offset += batch.num_rows


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
        _timestamps(frame, path),
        values,
        not_finite.alias(NOT_FINITE),
        *(pl.col(c).cast(pl.String) for c in frame.columns if c not in NEEDED),
    )


def _timestamps(frame: pl.DataFrame, path: str) -> pl.Expr:
    dtype = frame.schema["timestamp"]
    col = pl.col("timestamp")
    if dtype == pl.String:
        return pl.lit(_parse_timestamps(frame["timestamp"], path)).alias("timestamp")
    if isinstance(dtype, pl.Datetime):
        col = col.dt.replace_time_zone("UTC") if dtype.time_zone is None else col.dt.convert_time_zone("UTC")
        return col.cast(schema.TIME_POLARS)
    raise FatalConnectorError(f"file collector: {path}: timestamp: unsupported type {dtype}")


#: The end of an ISO-8601 text that carries its offset (``...T10:00:00Z``, ``... 10:00+02:00``).
_AWARE = r"\d:\d{2}(?::\d{2}(?:[.,]\d+)?)?\s*(?:[Zz]|[+-]\d{2}(?::?\d{2})?)$"


def _parse_timestamps(text: pl.Series, path: str) -> pl.Series:
    """ISO-8601 texts as UTC instants; naive ones are UTC, so a file may mix both forms.

    Polars infers one format per column, so the texts with an offset and those without are parsed
    apart and put back in place.  An instant past 9999-12-31 in UTC is refused: no stage after
    this one (Python's datetime, the storages) can hold it.
    """
    out = pl.Series("timestamp", [None] * len(text), dtype=pl.Datetime("us", "UTC"))
    aware = text.str.contains(_AWARE).fill_null(False)
    for mask, zone in ((aware, "UTC"), (~aware & text.is_not_null(), None)):
        part = text.filter(mask)
        if part.is_empty():
            continue
        try:
            parsed = part.str.to_datetime(time_unit="us", time_zone=zone, strict=True)
        except pl.exceptions.PolarsError as exc:
            reason = str(exc).strip().splitlines()[0]
            raise FatalConnectorError(f"file collector: {path}: timestamp: not ISO-8601 ({reason})") from None
        parsed = parsed if zone else parsed.dt.replace_time_zone("UTC")
        out = out.scatter(mask.arg_true(), parsed)
    late = text.filter(out.dt.year() > 9999)
    if not late.is_empty():
        raise FatalConnectorError(f"file collector: {path}: timestamp: after 9999-12-31 once in UTC: {late[0]!r}")
    return out


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
