"""Parquet storage through fsspec, a file per slice (local path, ``memory://``, ``s3://``).

The embedded store before ``delta`` became the default (docs/storage-layout.md): kept for workspaces
that say ``backend: parquet`` and for any fsspec URL delta-rs cannot write (``memory://``).

Layout: ``<root>/type=<type>/scope=<scope>/<period begin %Y%m%dT%H%M%SZ>.parquet``, type and scope
percent-encoded (``a/b`` -> ``a%2Fb``, so no scope can leave the root).  There is exactly one file per
(scope, period begin, type): ``write`` replaces the file of every slice it receives, which makes a
rerun idempotent.  A file is written whole to a temporary name in ``<root>/.staging/`` and renamed
over the old one (on object stores and ``memory://`` a single put is already atomic), so a reader
or a crash never sees half a file.  A writer killed between the two leaves its temporary file: the
next write of that slice removes it (its name starts with a hash of the slice's path, so a write
lists only the small staging folder, never a slice folder holding every period), and so does
``compact`` once it is older than the retention; ``debris`` lists them (``storage info`` counts
them).  Files keep the batch's exact decimal and UTC timestamp types.

Queries first prune by path (type, scope, period begin), then read the remaining files in chunks,
union their label columns (a column absent from a file is null = key absent) and filter, sort or
aggregate each chunk with Polars, so memory is bounded by a chunk, not by the store.

Delivery guarantee: a ``write`` that returned has replaced its slices (effectively-once per slice).
Points are not de-duplicated inside a slice: two points with the same groupby are both kept.
"""

from __future__ import annotations

import errno
import hashlib
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any
from urllib.parse import unquote

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError
from ratebeam.connectors.extras import url_to_fs
from ratebeam.connectors.storage.base import (
    RetrieveResult,
    Selection,
    StorageBackend,
    StorageCapabilities,
    TotalQuery,
    TotalResult,
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
from ratebeam.connectors.storage.parquet.layout import StoredFile, ceil_second, quote_segment, stamp
from ratebeam.connectors.storage.parquet.tables import (
    Chunk,
    aggregate,
    canonical,
    encode,
    points_table,
    split_slices,
    without_absent_labels,
)
from ratebeam.failpoints import failpoint
from ratebeam.transforms.schema import (
    PRICE,
    QTY,
)

#: Protocols whose single put replaces an object atomically (no temp file + rename needed).
_ATOMIC_PUT = frozenset({"memory", "s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss"})
#: Slices written concurrently by one ``write``.
_WRITE_THREADS = 8
#: Rows read, filtered and aggregated together: bounds the memory of a query.
_CHUNK_ROWS = 1_000_000
#: Files fetched by one ``cat`` (concurrent on object stores).
_FILES_PER_READ = 256
_FILE_NAME = re.compile(r"^(\d{8}T\d{6}Z)\.parquet$")
#: The folder (under the root) where files are written before they are renamed into place.
_STAGING = ".staging"
#: A temporary file older than this is no write in flight: ``compact`` removes it (by default).
RETENTION_HOURS = 1


class ParquetStorage(StorageBackend):
    """Rated points as one Parquet file per (scope, period, type) under an fsspec URL."""

    capabilities = StorageCapabilities(
        name="parquet",
        exact_decimals=True,
        supports_delete=True,
        supports_custom_fields=False,
        supports_compact=True,
        stores_lineage=True,
        idempotence=(
            "one file per (scope, period, type); a rewrite replaces it atomically (a reader sees its old "
            "or its new points); a period's types are separate files, so while a period is re-rated a "
            "reader may see some types new and others still old, or a stale type until its delete"
        ),
    )

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        """``url``: any fsspec URL or local path; ``storage_options``: passed to the filesystem."""
        self.url = url
        try:
            self._fs, root = url_to_fs(url, "parquet storage: url", **dict(storage_options or {}))
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

    def check(self) -> None:
        """The root is not a file (a directory is made there on the first write)."""
        with _io("check the root directory"):
            if not self._atomic_put and self._fs.isfile(self._root):
                raise FatalConnectorError(f"parquet storage: url {self.url!r} is a file, not a directory")

    def init(self) -> None:
        """Create the root directory (a no-op on object stores)."""
        with _io("create the root directory"):
            if not self._atomic_put:
                self._fs.makedirs(self._root or "/", exist_ok=True)

    def check_readable(self) -> None:
        """Refuse a root directory (or object-store prefix) that does not exist: never written to."""
        with _io("look for the root directory"):
            exists = self._fs.exists(self._root or "/")
        if not exists:
            raise FatalConnectorError(
                f"parquet storage: {self.url!r} does not exist (no run ever wrote there: check the storage url)"
            )

    # -- write -------------------------------------------------------------------------------------

    def write(self, rated: pa.Table | pa.RecordBatch) -> int:
        """Replace the file of every (scope, begin, type) slice of ``rated``; return the points stored."""
        if isinstance(rated, pa.RecordBatch):
            rated = pa.Table.from_batches([rated])
        table = canonical(rated)
        if table.num_rows == 0:
            return 0
        slices = list(split_slices(table))
        paths = [self._path(*key) for key, _ in slices]  # refuse bad keys before writing anything
        parts = [part for _, part in slices]
        with _io("write"):
            if self._atomic_put:  # one call: concurrent puts on async filesystems (s3fs, gcsfs)
                self._fs.pipe({path: encode(part) for path, part in zip(paths, parts, strict=True)})
                return table.num_rows
            self._sweep(paths)
            if len(parts) == 1:
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
        return f"{self._root}/type={quote_segment(type_)}/scope={quote_segment(scope)}/{stamp(begin)}.parquet"

    def _put(self, path: str, table: pa.Table) -> None:
        """Write ``table`` as the whole file ``path``, never visible half-written."""
        if self._atomic_put:
            self._fs.pipe_file(path, encode(table))
        else:
            self._replace(path, table)

    def _replace(self, path: str, table: pa.Table) -> None:
        """Write to a temporary name in the staging folder, then rename over ``path``."""
        data = encode(table)
        temporary = f"{self._staged(path)}{uuid.uuid4().hex}.tmp"
        try:
            self._fs.pipe_file(temporary, data)
        except FileNotFoundError:  # the first write under this root
            self._fs.makedirs(f"{self._root}/{_STAGING}", exist_ok=True)
            self._fs.pipe_file(temporary, data)
        failpoint("parquet-rename")
        try:
            try:
                self._fs.mv(temporary, path)
            except FileNotFoundError:  # first slice of this type and scope
                self._fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
                self._fs.mv(temporary, path)
        except BaseException:
            with suppress(FileNotFoundError):
                self._fs.rm_file(temporary)
            raise

    def _staged(self, path: str) -> str:
        """The start of the temporary names of ``path`` (fixed length: a long scope id still fits)."""
        return f"{self._root}/{_STAGING}/{hashlib.sha256(path.encode()).hexdigest()[:32]}."

    def _sweep(self, paths: list[str]) -> None:
        """Remove what killed writers of these slices left in the staging folder (one listing)."""
        try:
            staged = self._fs.ls(f"{self._root}/{_STAGING}", detail=False)
        except FileNotFoundError:
            return
        prefixes = tuple(self._staged(path) for path in paths)
        self._remove([p for p in staged if p.startswith(prefixes)])

    # -- maintenance -------------------------------------------------------------------------------

    def debris(self) -> list[str]:
        """Temporary files of writes killed before their rename (or still in flight).

        This version's are in the staging folder, older versions' beside their file (``.<file>.<hex>.tmp``).
        """
        if self._atomic_put:
            return []
        with _io("list temporary files"):
            paths = self._fs.find(self._root)
        return sorted(p for p in paths if p.endswith(".tmp") and (
            p.startswith(f"{self._root}/{_STAGING}/") or p.rsplit("/", 1)[-1].startswith(".")))

    def compact(self, retention_hours: int | None = None) -> dict[str, int]:
        """Remove temporary files older than ``retention_hours`` (one file per slice: nothing to merge)."""
        hours = RETENTION_HOURS if retention_hours is None else retention_hours
        cutoff = time.time() - hours * 3600
        stale = []
        with _io("remove temporary files"):
            for path in self.debris():
                modified = self._fs.info(path).get("mtime")
                if modified is not None and float(modified) <= cutoff:
                    stale.append(path)
            self._remove(stale)
        files = len(self._list(select(None), None, None))
        return {"files_before": files, "files_after": files, "vacuumed": len(stale)}

    # -- queries -----------------------------------------------------------------------------------

    def _retrieve(
        self, begin: datetime, end: datetime, selection: Selection, offset: int, limit: int
    ) -> RetrieveResult:
        """The points of ``[begin, end]`` matching the filters, ordered (begin, scope, type, labels)."""
        files = self._list(selection, stamp(ceil_second(begin)), stamp(ceil_second(end)))
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
        return RetrieveResult(total, points_table(page))

    def _total(self, query: TotalQuery, begin: datetime, end: datetime, selection: Selection) -> TotalResult:
        """Exact sums of qty and price (``rate``) per group, computed chunk by chunk then merged."""
        keys = total_keys(query.groupby)
        files = self._list(selection, stamp(ceil_second(begin)), stamp(ceil_second(end)))
        aliases = group_aliases(keys)
        groups = [pl.col(alias) for alias in aliases.values()]
        partials = []
        for chunk in self._chunks(files):
            frame = chunk.frame
            matched = frame.lazy().filter(predicate(frame.columns, selection, begin, end))
            sums = [pl.col(QTY).sum().alias("qty"), pl.col(PRICE).sum().alias("rate"), pl.len().alias("n")]
            partials.append(aggregate(matched, group_exprs(keys, aliases, frame.columns), sums).collect())
        if partials:
            sums = [pl.col("qty").sum(), pl.col("rate").sum(), pl.col("n").sum()]
            merged = aggregate(pl.concat(partials).lazy(), groups, sums).filter(pl.col("n") > 0)
            rows = (merged.sort(groups) if groups else merged).collect()
        else:
            rows = pl.DataFrame()
        page = rows.slice(query.offset, query.limit).to_dicts() if rows.height else []
        return TotalResult(rows.height, total_rows(page, keys, aliases, ["qty", "rate"], begin, end))

    def _delete(self, begin: datetime | None, end: datetime | None, selection: Selection) -> None:
        """Remove matching points of ``[begin, end)`` (open bounds when None); rewrite partial files."""
        low = None if begin is None else stamp(ceil_second(begin))
        high = None if end is None else stamp(ceil_second(end))
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
                        self._put(file.path, without_absent_labels(kept))
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

    def _list(self, selection: Selection, low: str | None, high: str | None) -> list[StoredFile]:
        """Stored files whose path matches the selection and ``low <= begin stamp < high``."""
        with _io("list files"):
            if selection.types is None and selection.scopes is None:
                prefixes = [self._root]
            else:
                if selection.types is None:
                    type_dirs = self._subdirs(self._root, "type=")
                else:
                    type_dirs = [f"{self._root}/type={quote_segment(t)}" for t in sorted(selection.types)]
                if selection.scopes is None:
                    prefixes = type_dirs
                else:
                    scopes = [f"scope={quote_segment(s)}" for s in sorted(selection.scopes)]
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

    def _parse(self, path: str) -> StoredFile | None:
        """The keys of a stored file from its path; None for anything else (temporary files...)."""
        parts = path[len(self._root) + 1 :].split("/")
        if len(parts) != 3 or not parts[0].startswith("type=") or not parts[1].startswith("scope="):
            return None
        name = _FILE_NAME.match(parts[2])
        if name is None:
            return None
        return StoredFile(path, unquote(parts[0][5:]), unquote(parts[1][6:]), name.group(1))

    def _chunks(self, files: list[StoredFile]) -> Iterator[Chunk]:
        """The files' contents, in order, about ``_CHUNK_ROWS`` rows at a time.

        A file removed since it was listed is skipped (a concurrent delete or rewrite).
        """
        kept: list[StoredFile] = []
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
                    yield Chunk(kept, tables)
                    kept, tables, rows = [], [], 0
        if kept:
            yield Chunk(kept, tables)


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
