"""Delta Lake storage (``deltalake``): the embedded default's table format, local or on object stores.

All rated points are one Delta table at ``url``: Parquet data files plus ``_delta_log``, the ordered
list of commits saying which files make each version.  A ``write`` replaces its (scope, period,
type) slices in ONE commit (``mode="overwrite"`` with a predicate naming exactly those slices:
delta-rs removes the rows the predicate matches and adds the new file in the same log entry), so a
reader, or a crash at any moment, sees the old slices or the new ones, never both and never none.
Two runs on different scopes commit optimistically; a commit that lost the race to another one is
retried against the new version (``_COMMIT_ATTEMPTS``).

Files are per write (a bundle of slices), not per slice; past ``compact_files`` data files a write
compacts the table, and ``compact()`` (``ratebeam storage compact``) does it on demand, then
vacuums superseded files and crash debris older than ``retention_hours`` (files a killed writer
left, never referenced by a commit).  Columns keep the batch's exact ``decimal128`` and UTC
timestamp types; label columns are added to the table schema as they appear (absent = null).

Queries read one snapshot (one version) with Polars, pushing the selection down to file statistics
and row groups, and finish with the same selection/grouping code as every backend.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, SchemaMismatchError, TableNotFoundError

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError
from ratebeam.connectors.storage.base import (
    RetrieveResult,
    Selection,
    StorageBackend,
    StorageCapabilities,
    TotalQuery,
    TotalResult,
    total_keys,
)
from ratebeam.connectors.storage.delta import maintenance, predicates
from ratebeam.connectors.storage.frame_selection import (
    group_aliases,
    group_exprs,
    predicate,
    retrieve_order,
    total_rows,
)
from ratebeam.connectors.storage.parquet.tables import aggregate, canonical, points_table
from ratebeam.transforms.schema import PRICE, QTY, usage_schema

#: Commits retried when another writer committed first (each retry re-reads the new version).
_COMMIT_ATTEMPTS = 30
#: Data files a compaction aims at (fewer, larger files: a month of points in a few hundred files).
TARGET_FILE_BYTES = 128 * 1024 * 1024
#: Table properties: a checkpoint every 50 commits keeps opening the table fast; old log entries
#: (kept for time travel only) are removed after a day.
_TABLE_CONFIG = {"delta.checkpointInterval": "50", "delta.logRetentionDuration": "interval 1 days"}

T = TypeVar("T")


class DeltaStorage(StorageBackend):
    """Rated points as one Delta Lake table under a path or object-store URL."""

    capabilities = StorageCapabilities(
        name="delta",
        exact_decimals=True,
        supports_delete=True,
        supports_custom_fields=False,
        supports_compact=True,
        rewrite="atomic",
        stores_lineage=True,
        idempotence=(
            "one Delta table; a write replaces all its (scope, period, type) slices in one commit "
            "(a reader sees the write's old or new points, never both, never none); stale types of "
            "a re-rated period are removed by the next commit"
        ),
    )

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, str] | None = None,
        compact_files: int = 256,
        retention_hours: int = 1,
    ) -> None:
        """``url``: a path or ``s3://``/``gs://``/``az://`` URL; ``storage_options``: delta-rs keys."""
        self.url = url
        self._options = dict(storage_options or {})
        self.compact_files = compact_files
        self.retention_hours = retention_hours
        self._local = len(urlsplit(url).scheme) <= 1 or url.startswith("file://")
        self._table: DeltaTable | None = None

    @classmethod
    def from_config(cls, config: Any) -> DeltaStorage:
        """Build from a ``DeltaStorageConfig`` (or any object with ``url``)."""
        return cls(
            config.url,
            getattr(config, "storage_options", None),
            getattr(config, "compact_files", 256),
            getattr(config, "retention_hours", 1),
        )

    def check(self) -> None:
        """A local root must not be a file."""
        if self._local and Path(self._path()).is_file():
            raise FatalConnectorError(f"delta storage: url {self.url!r} is a file, not a directory")

    def init(self) -> None:
        """Create the table (core columns only; labels are added by the writes) unless it exists."""
        self.check()
        if self._local:
            Path(self._path()).mkdir(parents=True, exist_ok=True)
        with _errors("create the table"):
            _retry(lambda: DeltaTable.create(
                self.url, usage_schema((), ()), mode="ignore", configuration=_TABLE_CONFIG,
                storage_options=self._options or None,
            ))

    def check_readable(self) -> None:
        """Refuse a URL holding no Delta table (no run ever wrote there)."""
        with _errors("look for the table"):
            exists = DeltaTable.is_deltatable(self.url, self._options or None)
        if not exists:
            raise FatalConnectorError(
                f"delta storage: {self.url!r} holds no Delta table (no run ever wrote there: check the storage url)"
            )

    def close(self) -> None:
        """Forget the open table (delta-rs holds no connection)."""
        self._table = None

    def _path(self) -> str:
        return self.url.removeprefix("file://")

    def _open(self) -> DeltaTable | None:
        """The table at its latest version, or None when none was ever created."""
        with _errors("open the table"):
            try:
                if self._table is None:
                    self._table = DeltaTable(self.url, storage_options=self._options or None)
                else:
                    self._table.update_incremental()
            except TableNotFoundError:
                return None
        return self._table

    # -- write -------------------------------------------------------------------------------------

    def write(self, rated: pa.Table | pa.RecordBatch) -> int:
        """Replace every (scope, begin, type) slice of ``rated`` in one commit; return the points stored."""
        if isinstance(rated, pa.RecordBatch):
            rated = pa.Table.from_batches([rated])
        table = canonical(rated, "delta")
        if table.num_rows == 0:
            return 0

        def commit() -> None:
            target = self._open()
            if target is not None and not predicates.may_hold(pa.table(target.get_add_actions(flatten=True)), table):
                # No file can hold these slices (new periods or scopes): nothing to replace.  Safe
                # against a concurrent writer because only the scope's lease holder writes its slices.
                write_deltalake(target, table, mode="append", schema_mode="merge", storage_options=self._options or None)
                return
            write_deltalake(
                target or self.url, table, mode="overwrite", predicate=predicates.slices(table), schema_mode="merge",
                configuration=None if target else _TABLE_CONFIG, storage_options=self._options or None,
            )

        with _errors("write"):
            _retry(commit, self._refresh)
        if self.compact_files and len(self._files()) > self.compact_files:
            self.compact()
        return table.num_rows

    def _refresh(self) -> None:
        """After a lost commit race: read the winner's version before trying again."""
        self._table = None

    def _files(self) -> list[str]:
        table = self._open()
        return [] if table is None else table.file_uris()

    # -- maintenance -------------------------------------------------------------------------------

    def compact(self, retention_hours: int | None = None) -> dict[str, int]:
        """Rewrite small data files into large ones, then vacuum what is older than the retention.

        Returns counts: data files before and after, files vacuumed (superseded or debris).
        """
        table = self._open()
        if table is None:
            return {"files_before": 0, "files_after": 0, "vacuumed": 0}
        hours = self.retention_hours if retention_hours is None else retention_hours
        with _errors("compact"):
            before = len(table.file_uris())
            # Others kept committing: compaction is only an optimisation, the next one catches up.
            with suppress(RetriableConnectorError):
                _retry(lambda: self._table_or_fail().optimize.compact(target_size=TARGET_FILE_BYTES), self._refresh)
            vacuumed = maintenance.vacuum(self._table_or_fail(), self.url, hours)
            return {"files_before": before, "files_after": len(self._files()), "vacuumed": vacuumed}

    def debris(self) -> list[str]:
        """Files under the table that no version references and no commit will (a killed writer's)."""
        table = self._open()
        return [] if table is None else maintenance.debris(table, self.url)

    def _table_or_fail(self) -> DeltaTable:
        table = self._open()
        if table is None:
            raise FatalConnectorError(f"delta storage: {self.url!r} holds no Delta table")
        return table

    # -- queries -----------------------------------------------------------------------------------

    def _scan(self) -> tuple[pl.LazyFrame, list[str]] | None:
        """One snapshot of the table as a lazy frame and its columns (None: no table yet)."""
        table = self._open()
        if table is None:
            return None
        with _errors("read"):
            frame = pl.scan_delta(table)
            return frame, frame.collect_schema().names()

    def _retrieve(
        self, begin: datetime, end: datetime, selection: Selection, offset: int, limit: int
    ) -> RetrieveResult:
        """The points of ``[begin, end]`` matching the filters, ordered (begin, scope, type, labels)."""
        scan = self._scan()
        if scan is None:
            return RetrieveResult(0, usage_schema((), ()).empty_table())
        frame, columns = scan
        matched = frame.filter(predicate(columns, selection, begin, end))
        with _errors("read"):
            total, page = pl.collect_all([
                matched.select(pl.len()),
                # Polars counts rows in 32 bits: a larger limit means "the rest".
                matched.sort(retrieve_order(columns)).slice(offset, limit if limit < 1 << 32 else None),
            ])
        return RetrieveResult(int(total.item()), points_table([page]))

    def _total(self, query: TotalQuery, begin: datetime, end: datetime, selection: Selection) -> TotalResult:
        """Exact sums of qty and price (``rate``) per group, in one query over one snapshot."""
        scan = self._scan()
        if scan is None:
            return TotalResult(0, [])
        frame, columns = scan
        keys = total_keys(query.groupby)
        aliases = group_aliases(keys)
        groups = [pl.col(alias) for alias in aliases.values()]
        matched = frame.filter(predicate(columns, selection, begin, end))
        sums = [pl.col(QTY).sum().alias("qty"), pl.col(PRICE).sum().alias("rate"), pl.len().alias("n")]
        grouped = aggregate(matched, group_exprs(keys, aliases, columns), sums).filter(pl.col("n") > 0)
        with _errors("read"):
            # Streaming: memory follows the number of groups, not of points (a month is ~40M rows).
            rows = (grouped.sort(groups) if groups else grouped).collect(engine="streaming")
        page = rows.slice(query.offset, query.limit).to_dicts() if rows.height else []
        return TotalResult(rows.height, total_rows(page, keys, aliases, ["qty", "rate"], begin, end))

    def _delete(self, begin: datetime | None, end: datetime | None, selection: Selection) -> None:
        """Remove matching points of ``[begin, end)`` in one commit (files rewritten without them)."""
        table = self._open()
        if table is None:
            return
        columns = set(pa.schema(table.schema()).names)
        where = predicates.deletion(begin, end, selection, columns)
        if where is None:
            return
        with _errors("delete"):
            _retry(lambda: self._table_or_fail().delete(where), self._refresh)


def _retry(action: Callable[[], T], refresh: Callable[[], None] | None = None) -> T:
    """``action``, again (after ``refresh``) while another writer's commit wins the race."""
    for attempt in range(_COMMIT_ATTEMPTS):
        try:
            return action()
        except CommitFailedError as exc:
            if attempt == _COMMIT_ATTEMPTS - 1:
                raise RetriableConnectorError(
                    f"delta storage: commit lost {_COMMIT_ATTEMPTS} races to other writers: {exc}"
                ) from exc
            if refresh is not None:
                refresh()
            time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
    raise AssertionError("unreachable")


@contextmanager
def _errors(what: str) -> Iterator[None]:
    """delta-rs errors as connector errors: a schema or protocol mismatch is fatal, I/O retriable."""
    try:
        yield
    except (FatalConnectorError, RetriableConnectorError):
        raise
    except (SchemaMismatchError, PermissionError, NotADirectoryError) as exc:
        raise FatalConnectorError(f"delta storage: cannot {what}: {exc}") from exc
    except (DeltaError, OSError) as exc:
        raise RetriableConnectorError(f"delta storage: cannot {what}: {exc}") from exc
