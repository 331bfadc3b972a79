"""Parquet storage through fsspec: the embedded default backend (local path, ``memory://``, ``s3://``).

Layout: ``<root>/type=<type>/scope=<scope>/<period begin %Y%m%dT%H%M%SZ>.parquet``, type and scope
percent-encoded (``a/b`` -> ``a%2Fb``, so no scope can leave the root).  There is exactly one file per
(scope, period begin, type): ``write`` replaces the file of every slice it receives, which makes a
rerun idempotent.  A file is written whole to a temporary name in its directory and renamed over the
old one (on object stores and ``memory://`` a single put is already atomic), so a reader or a crash
never sees half a file.  Files keep the batch's exact decimal and UTC timestamp types.

Queries first prune by path (type, scope, period begin), then read the remaining files in chunks,
union their label columns (a column absent from a file is null = key absent) and filter, sort or
aggregate each chunk with Polars, so memory is bounded by a chunk, not by the store.

Delivery guarantee: a ``write`` that returned has replaced its slices (effectively-once per slice).
Points are not de-duplicated inside a slice: two points with the same groupby are both kept.
"""

from __future__ import annotations

import errno
import re
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, unquote

import fsspec
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError
from ratebeam.connectors.storage.base import (
    FilterValue,
    RetrieveResult,
    Selection,
    StorageBackend,
    StorageCapabilities,
    TotalQuery,
    TotalResult,
    default_bounds,
    reject_custom_fields,
    select,
    total_keys,
)
from ratebeam.connectors.storage.frame_selection import (
    group_aliases,
    group_exprs,
    labels_match,
    predicate,
    retrieve_order,
    total_rows,
)
from ratebeam.transforms.periods import require_aware
from ratebeam.transforms.schema import (
    BEGIN,
    CORE_COLUMNS,
    END,
    GROUPBY_PREFIX,
    METADATA_PREFIX,
    PRICE,
    QTY,
    SCOPE,
    TYPE,
    usage_schema,
)

#: Protocols whose single put replaces an object atomically (no temp file + rename needed).
_ATOMIC_PUT = frozenset({"memory", "s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss"})
#: Slices written concurrently by one ``write``.
_WRITE_THREADS = 8
#: Rows read, filtered and aggregated together: bounds the memory of a query.
_CHUNK_ROWS = 1_000_000
#: Files fetched by one ``cat`` (concurrent on object stores).
_FILES_PER_READ = 256
#: Slices at least this long are dictionary-encoded and compressed (repeated scope, type and labels
#: shrink a lot); below it the per-file cost of dictionary pages and codecs outweighs the saving.
_LARGE_SLICE_ROWS = 1024
_SLICE_KEYS = (TYPE, SCOPE, BEGIN)
_FILE_NAME = re.compile(r"^(\d{8}T\d{6}Z)\.parquet$")
_CORE_TYPES = {f.name: f.type for f in usage_schema((), ())}


@dataclass(frozen=True, slots=True)
class _File:
    """One stored slice, as its path says: no need to open it to know its keys."""

    path: str
    type: str
    scope: str
    #: period begin as ``%Y%m%dT%H%M%SZ``: sorts like the time.
    stamp: str


class ParquetStorage(StorageBackend):
    """Rated points as one Parquet file per (scope, period, type) under an fsspec URL."""

    capabilities = StorageCapabilities(
        name="parquet",
        exact_decimals=True,
        supports_delete=True,
        supports_custom_fields=False,
        idempotence="one file per (scope, period, type); a rewrite replaces it atomically",
    )

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        """``url``: any fsspec URL or local path; ``storage_options``: passed to the filesystem."""
        self.url = url
        try:
            self._fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except ImportError as exc:
            raise FatalConnectorError(
                f"parquet storage: url {url!r} needs a filesystem package that is not installed "
                f"({exc}); for s3:// install ratebeam[s3]"
            ) from exc
        except ValueError as exc:
            raise FatalConnectorError(f"parquet storage: url {url!r}: {exc}") from exc
        self._root = root.rstrip("/")
        protocols = self._fs.protocol if isinstance(self._fs.protocol, tuple) else (self._fs.protocol,)
        self._atomic_put = bool(_ATOMIC_PUT.intersection(protocols))
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def from_config(cls, config: Any) -> ParquetStorage:
        """Build from a config object with ``url`` and, optionally, ``storage_options``."""
        return cls(config.url, getattr(config, "storage_options", None))

    def init(self) -> None:
        """Create the root directory (a no-op on object stores)."""
        with _io("create the root directory"):
            if not self._atomic_put:
                self._fs.makedirs(self._root or "/", exist_ok=True)

    # -- write -------------------------------------------------------------------------------------

    def write(self, rated: pa.Table | pa.RecordBatch) -> int:
        """Replace the file of every (scope, begin, type) slice of ``rated``; return the points stored."""
        if isinstance(rated, pa.RecordBatch):
            rated = pa.Table.from_batches([rated])
        table = _canonical(rated)
        if table.num_rows == 0:
            return 0
        slices = list(_slices(table))
        paths = [self._path(*key) for key, _ in slices]  # refuse bad keys before writing anything
        parts = [part for _, part in slices]
        with _io("write"):
            if self._atomic_put:  # one call: concurrent puts on async filesystems (s3fs, gcsfs)
                self._fs.pipe({path: _encode(part) for path, part in zip(paths, parts, strict=True)})
            elif len(parts) == 1:
                self._replace(paths[0], parts[0])
            else:  # creating a file is latency-bound (0.5-2 ms on a journaled disk): overlap them
                list(self._pool().map(self._replace, paths, parts))
        return table.num_rows

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(_WRITE_THREADS, thread_name_prefix="ratebeam-parquet")
        return self._executor

    def close(self) -> None:
        """Stop the writer threads."""
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def _path(self, type_: str, scope: str, begin: datetime) -> str:
        if begin.microsecond:
            raise FatalConnectorError(
                f"parquet storage: period begin {begin.isoformat()} of scope {scope!r}, type {type_!r} "
                "has a fraction of a second; periods start on whole seconds"
            )
        return f"{self._root}/type={_quote(type_)}/scope={_quote(scope)}/{_stamp(begin)}.parquet"

    def _put(self, path: str, table: pa.Table) -> None:
        """Write ``table`` as the whole file ``path``, never visible half-written."""
        if self._atomic_put:
            self._fs.pipe_file(path, _encode(table))
        else:
            self._replace(path, table)

    def _replace(self, path: str, table: pa.Table) -> None:
        """Write to a temporary name in the same directory, then rename over ``path``."""
        data = _encode(table)
        directory, name = path.rsplit("/", 1)
        temporary = f"{directory}/.{name}.{uuid.uuid4().hex}.tmp"
        try:
            self._fs.pipe_file(temporary, data)
        except FileNotFoundError:  # first slice of this type and scope
            self._fs.makedirs(directory, exist_ok=True)
            self._fs.pipe_file(temporary, data)
        try:
            self._fs.mv(temporary, path)
        except BaseException:
            self._fs.rm_file(temporary)
            raise

    # -- queries -----------------------------------------------------------------------------------

    def retrieve(
        self,
        begin: datetime | None = None,
        end: datetime | None = None,
        filters: dict[str, FilterValue] | None = None,
        metric_types: tuple[str, ...] | list[str] = (),
        offset: int = 0,
        limit: int = 1000,
    ) -> RetrieveResult:
        """The points of ``[begin, end]`` matching the filters, ordered (begin, scope, type, labels)."""
        begin, end = default_bounds(begin, end)
        selection = select(filters, metric_types)
        files = self._list(selection, _stamp(_ceil_second(begin)), _stamp(_ceil_second(end)))
        # Files in (begin, scope, type) order: rows of two files never interleave in the global
        # order, so only the files the page overlaps need sorting (by their labels).
        files.sort(key=lambda f: (f.stamp, f.scope, f.type))
        total, page, stop = 0, [], offset + limit
        for chunk in self._chunks(files):
            mask = chunk.mask(predicate(chunk.frame.columns, selection, begin, end))
            hits = chunk.hits(mask)
            after = total + np.cumsum(hits)  # matched rows up to and including each file
            before = after - hits
            overlap = np.flatnonzero((hits > 0) & (after > offset) & (before < stop))
            if overlap.size:
                first, last = overlap[0], overlap[-1]
                rows = chunk.rows(first, last)
                matched = chunk.frame[rows].filter(pl.Series(mask[rows]))
                matched = matched.sort(retrieve_order(matched.columns))
                skip = max(offset - before[first], 0)
                page.append(matched.slice(skip, min(stop, after[last]) - before[first] - skip))
            total += int(hits.sum())
        return RetrieveResult(total, _points(page))

    def total(self, query: TotalQuery) -> TotalResult:
        """Exact sums of qty and price (``rate``) per group, computed chunk by chunk then merged."""
        reject_custom_fields(self.capabilities, query)
        begin, end = default_bounds(query.begin, query.end)
        selection = select(query.filters, query.metric_types)
        keys = total_keys(query.groupby)
        files = self._list(selection, _stamp(_ceil_second(begin)), _stamp(_ceil_second(end)))
        aliases = group_aliases(keys)
        groups = [pl.col(alias) for alias in aliases.values()]
        partials = []
        for chunk in self._chunks(files):
            frame = chunk.frame
            matched = frame.lazy().filter(predicate(frame.columns, selection, begin, end))
            sums = [pl.col(QTY).sum().alias("qty"), pl.col(PRICE).sum().alias("rate"), pl.len().alias("n")]
            partials.append(_aggregate(matched, group_exprs(keys, aliases, frame.columns), sums).collect())
        if partials:
            sums = [pl.col("qty").sum(), pl.col("rate").sum(), pl.col("n").sum()]
            merged = _aggregate(pl.concat(partials).lazy(), groups, sums).filter(pl.col("n") > 0)
            rows = (merged.sort(groups) if groups else merged).collect()
        else:
            rows = pl.DataFrame()
        page = rows.slice(query.offset, query.limit).to_dicts() if rows.height else []
        return TotalResult(rows.height, total_rows(page, keys, aliases, ["qty", "rate"], begin, end))

    def delete(
        self,
        begin: datetime | None = None,
        end: datetime | None = None,
        filters: dict[str, FilterValue] | None = None,
    ) -> None:
        """Remove matching points of ``[begin, end)`` (open bounds when None); rewrite partial files."""
        selection = select(filters)
        low = None if begin is None else _stamp(_ceil_second(require_aware(begin, "begin")))
        high = None if end is None else _stamp(_ceil_second(require_aware(end, "end")))
        files = self._list(selection, low, high)
        with _io("delete"):
            if not selection.labels:  # type, scope and begin are all in the path
                self._remove([f.path for f in files])
                return
            doomed = []
            for chunk in self._chunks(files):
                mask = chunk.mask(labels_match(chunk.frame.columns, selection))
                hits = chunk.hits(mask)
                for i, file in enumerate(chunk.files):
                    if hits[i] == chunk.sizes[i]:
                        doomed.append(file.path)
                    elif hits[i]:
                        kept = chunk.tables[i].filter(pa.array(~mask[chunk.rows(i, i)]))
                        self._put(file.path, _without_absent_labels(kept))
            self._remove(doomed)

    def _remove(self, paths: list[str]) -> None:
        if not paths:
            return
        try:
            self._fs.rm(paths)
        except FileNotFoundError:  # removed meanwhile by someone else: remove the rest one by one
            for path in paths:
                try:
                    self._fs.rm_file(path)
                except FileNotFoundError:
                    continue

    # -- files -------------------------------------------------------------------------------------

    def _list(self, selection: Selection, low: str | None, high: str | None) -> list[_File]:
        """Stored files whose path matches the selection and ``low <= begin stamp < high``."""
        if selection.empty:
            return []
        with _io("list files"):
            if selection.types is None and selection.scopes is None:
                prefixes = [self._root]
            else:
                if selection.types is None:
                    type_dirs = self._subdirs(self._root, "type=")
                else:
                    type_dirs = [f"{self._root}/type={_quote(t)}" for t in sorted(selection.types)]
                if selection.scopes is None:
                    prefixes = type_dirs
                else:
                    scopes = [f"scope={_quote(s)}" for s in sorted(selection.scopes)]
                    prefixes = [f"{d}/{s}" for d in type_dirs for s in scopes]
            paths = [path for prefix in prefixes for path in self._fs.find(prefix)]
        files = []
        for path in paths:
            file = self._parse(path)
            if (
                file is not None
                and (low is None or file.stamp >= low)
                and (high is None or file.stamp < high)
                and (selection.types is None or file.type in selection.types)
                and (selection.scopes is None or file.scope in selection.scopes)
            ):
                files.append(file)
        return files

    def _subdirs(self, directory: str, prefix: str) -> list[str]:
        try:
            entries = self._fs.ls(directory, detail=False)
        except FileNotFoundError:
            return []
        return [e.rstrip("/") for e in entries if e.rstrip("/").rsplit("/", 1)[-1].startswith(prefix)]

    def _parse(self, path: str) -> _File | None:
        """The keys of a stored file from its path; None for anything else (temporary files...)."""
        parts = path[len(self._root) + 1 :].split("/")
        if len(parts) != 3 or not parts[0].startswith("type=") or not parts[1].startswith("scope="):
            return None
        name = _FILE_NAME.match(parts[2])
        if name is None:
            return None
        return _File(path, unquote(parts[0][5:]), unquote(parts[1][6:]), name.group(1))

    def _chunks(self, files: list[_File]) -> Iterator[_Chunk]:
        """The files' contents, in order, about ``_CHUNK_ROWS`` rows at a time.

        A file removed since it was listed is skipped (a concurrent delete or rewrite).
        """
        kept: list[_File] = []
        tables: list[pa.Table] = []
        rows = 0
        for start in range(0, len(files), _FILES_PER_READ):
            part = files[start : start + _FILES_PER_READ]
            with _io("read"):
                blobs = self._fs.cat([f.path for f in part], on_error="return")
            for file in part:
                blob = blobs.get(file.path, FileNotFoundError(file.path))
                if isinstance(blob, FileNotFoundError):
                    continue
                if isinstance(blob, BaseException):
                    with _io(f"read {file.path}"):
                        raise blob
                try:
                    table = pq.ParquetFile(pa.BufferReader(blob)).read(use_threads=False)
                except (pa.ArrowInvalid, OSError) as exc:
                    raise FatalConnectorError(
                        f"parquet storage: {file.path}: not a readable file: {exc}"
                    ) from exc
                kept.append(file)
                tables.append(table)
                rows += table.num_rows
                if rows >= _CHUNK_ROWS:
                    yield _Chunk(kept, tables)
                    kept, tables, rows = [], [], 0
        if kept:
            yield _Chunk(kept, tables)


class _Chunk:
    """Files read together: their tables, and all their rows as one Polars frame.

    Files with the same columns are concatenated first (unifying a schema per file is slow), so in
    ``frame`` the rows of file ``i`` are ``starts[i]`` to ``starts[i] + sizes[i]``, not in file order.
    """

    def __init__(self, files: list[_File], tables: list[pa.Table]) -> None:
        self.files = files
        self.tables = tables
        same: dict[tuple[str, ...], list[int]] = {}
        for i, table in enumerate(tables):
            same.setdefault(tuple(table.column_names), []).append(i)
        layout = np.array([i for group in same.values() for i in group])
        self.sizes = np.array([t.num_rows for t in tables])
        self.starts = np.empty(len(tables), dtype=np.int64)
        self.starts[layout] = np.cumsum(self.sizes[layout]) - self.sizes[layout]
        self._owner = np.repeat(layout, self.sizes[layout])  # file of each frame row
        parts = [_concat([tables[i] for i in group]) for group in same.values()]
        union = parts[0] if len(parts) == 1 else _concat(parts)
        self.frame = pl.from_arrow(union.combine_chunks())

    def rows(self, first: int, last: int) -> np.ndarray:
        """Frame row numbers of files ``first`` to ``last`` (included), in file order."""
        return np.concatenate(
            [np.arange(self.starts[i], self.starts[i] + self.sizes[i]) for i in range(first, last + 1)]
        )

    def mask(self, predicate: pl.Expr) -> np.ndarray:
        """``predicate`` on every frame row, as booleans (a literal is broadcast)."""
        return self.frame.with_columns(predicate.alias("__mask"))["__mask"].to_numpy()

    def hits(self, mask: np.ndarray) -> np.ndarray:
        """How many rows of each file ``mask`` selects."""
        return np.bincount(self._owner, weights=mask, minlength=len(self.files)).astype(np.int64)


# -- Arrow / Polars helpers ------------------------------------------------------------------------

_SECOND = timedelta(seconds=1)


def _quote(value: str) -> str:
    """A path segment for ``value``: every byte but ``[A-Za-z0-9_.~-]`` percent-encoded."""
    return quote(value, safe="")


def _stamp(moment: datetime) -> str:
    """``%Y%m%dT%H%M%SZ`` in UTC, zero-padded so that stamps sort like times."""
    t = moment.astimezone(UTC)
    return f"{t.year:04d}{t.month:02d}{t.day:02d}T{t.hour:02d}{t.minute:02d}{t.second:02d}Z"


def _ceil_second(moment: datetime) -> datetime:
    """The first whole second at or after ``moment``: ``file begin < moment`` iff ``stamp < stamp(this)``."""
    return moment if not moment.microsecond else moment.replace(microsecond=0) + _SECOND


def _is_label(name: str) -> bool:
    return name.startswith((GROUPBY_PREFIX, METADATA_PREFIX))


def _canonical(table: pa.Table) -> pa.Table:
    """``table`` with the batch types (core columns, string labels), or a clear error.

    Other columns (e.g. ``point_id``) are kept as they are.
    """
    missing = [c for c in CORE_COLUMNS if c not in table.column_names]
    if missing:
        raise FatalConnectorError(f"parquet storage: rated batch lacks column(s) {', '.join(missing)}")
    columns = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        target = _CORE_TYPES.get(name) or (pa.string() if _is_label(name) else column.type)
        kind = column.type
        if name in (QTY, PRICE) and not (pa.types.is_decimal(kind) or pa.types.is_integer(kind)):
            raise FatalConnectorError(f"parquet storage: column {name!r} is {kind}, not an exact decimal")
        if name in (BEGIN, END) and not (pa.types.is_timestamp(kind) and kind.tz):
            raise FatalConnectorError(f"parquet storage: column {name!r} is {kind}, not an aware timestamp")
        if kind != target:
            try:
                column = column.cast(target)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
                raise FatalConnectorError(
                    f"parquet storage: column {name!r} ({kind}) -> {target}: {exc}"
                ) from exc
        if name in _CORE_TYPES and column.null_count:
            raise FatalConnectorError(
                f"parquet storage: column {name!r} has {column.null_count} null value(s)"
            )
        columns.append(column)
    out = pa.table(columns, names=table.column_names)
    if out.num_rows and pc.any(pc.less_equal(out[END], out[BEGIN])).as_py():
        raise FatalConnectorError("parquet storage: a point's period end is not after its begin")
    return out


def _slices(table: pa.Table) -> Iterator[tuple[tuple[str, str, datetime], pa.Table]]:
    """The (type, scope, begin) slices of ``table``: zero-copy when each slice is contiguous."""
    keys = table.select(_SLICE_KEYS)
    starts = _run_starts(keys)
    firsts = keys.take(starts)
    if firsts.group_by(list(_SLICE_KEYS)).aggregate([]).num_rows != len(starts):  # interleaved slices
        table = table.take(pc.sort_indices(keys, sort_keys=[(k, "ascending") for k in _SLICE_KEYS]))
        keys = table.select(_SLICE_KEYS)
        starts = _run_starts(keys)
        firsts = keys.take(starts)
    ends = [*starts[1:].tolist(), table.num_rows]
    with_nulls = [
        n for n, c in zip(table.column_names, table.columns, strict=True) if _is_label(n) and c.null_count
    ]
    for row, start, stop in zip(firsts.to_pylist(), starts.tolist(), ends, strict=True):
        part = table.slice(start, stop - start)
        yield (row[TYPE], row[SCOPE], row[BEGIN]), _without_absent_labels(part, with_nulls)


def _without_absent_labels(table: pa.Table, candidates: list[str] | None = None) -> pa.Table:
    """``table`` without the label columns (among ``candidates``) that are null on every row.

    Such a column says no point has the key; leaving it out of the file means the same and keeps
    files of a type to the keys they use.
    """
    if candidates is None:
        candidates = [name for name in table.column_names if _is_label(name)]
    absent = [name for name in candidates if table[name].null_count == table.num_rows]
    return table.drop_columns(absent) if absent else table


def _run_starts(keys: pa.Table) -> np.ndarray:
    """Row numbers where any key differs from the previous row (row 0 included)."""
    n = keys.num_rows
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for column in keys.columns:
        differs = pc.not_equal(column.slice(1), column.slice(0, n - 1))
        change[1:] |= differs.to_numpy()
    return np.flatnonzero(change)


def _encode(table: pa.Table) -> bytes:
    """One Parquet file (no statistics: files are always read whole)."""
    large = table.num_rows >= _LARGE_SLICE_ROWS
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        compression="snappy" if large else "none",
        use_dictionary=large,
        write_statistics=False,
        store_schema=False,
    )
    return sink.getvalue().to_pybytes()


def _concat(tables: list[pa.Table]) -> pa.Table:
    """Concatenate, unifying columns and types only when the fast path refuses."""
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid:
        return pa.concat_tables(tables, promote_options="permissive")


def _aggregate(frame: pl.LazyFrame, groups: list[pl.Expr], sums: list[pl.Expr]) -> pl.LazyFrame:
    """``sums`` per group, or over the whole frame without groups (one row, ``n`` may be 0)."""
    return frame.group_by(groups).agg(sums) if groups else frame.select(sums)


def _points(pages: list[pl.DataFrame]) -> pa.Table:
    """The retrieved page as a rated table: core columns, then the labels present, sorted."""
    if not pages:
        return usage_schema((), ()).empty_table()
    frame = pl.concat(pages, how="diagonal_relaxed")
    present = [c for c in frame.columns if not _is_label(c) or frame[c].null_count() < frame.height]
    labels = sorted(c for c in present if c.startswith(GROUPBY_PREFIX))
    labels += sorted(c for c in present if c.startswith(METADATA_PREFIX))
    others = [c for c in present if c not in CORE_COLUMNS and not _is_label(c)]
    return _canonical(frame.select([*CORE_COLUMNS, *labels, *others]).to_arrow())


@contextmanager
def _io(what: str) -> Iterator[None]:
    """Filesystem errors as connector errors: what a retry cannot fix is fatal, the rest retriable."""
    try:
        yield
    except (PermissionError, IsADirectoryError, NotADirectoryError) as exc:
        raise FatalConnectorError(f"parquet storage: cannot {what}: {exc}") from exc
    except OSError as exc:
        if exc.errno in (errno.ENAMETOOLONG, errno.EROFS):  # e.g. a scope id too long for a file name
            raise FatalConnectorError(f"parquet storage: cannot {what}: {exc}") from exc
        raise RetriableConnectorError(f"parquet storage: cannot {what}: {exc}") from exc
