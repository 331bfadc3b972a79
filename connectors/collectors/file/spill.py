"""Where the file collector keeps the samples it read: in memory up to ``spill_rows``, else spilled.

Why: the usage files of a long run (a month of backfill, a thousand scopes) can be far larger than
the memory a worker should use.  Held in memory, a run's peak RSS grew with its usage (2.4 GB at 4M
samples); spilled, it is bounded by ``spill_rows`` and the reading chunk, whatever the run's size
(``bench/bench_memory.py``).  Small runs stay in memory, where one vectorised pass per
metric prepares every period at once.

The spill is local Parquet in a private temporary directory: each chunk is sorted by (scope,
timestamp) and written in row groups of ``SPILL_ROW_GROUP`` rows; the row groups' scope and
timestamp ranges are kept (``_RowGroup``), so reading one scope's window of periods reads only
the row groups that may hold it.  One file per column set (usage files may carry different
labels).  The directory goes with the collector (``close``, or the process's exit), and the spill
directories that killed processes left behind are removed by the next spill in the same parent.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from ratebeam.connectors.collectors.file.checks import NEEDED
from ratebeam.connectors.collectors.file.reading import NOT_FINITE

#: Rows per row group of the spill: small enough that a scope's read skips the others.
SPILL_ROW_GROUP = 16_384
_PREFIX = "ratebeam-spill-"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class _RowGroup:
    """One row group of a spill file: its number and the ranges of scope ids and timestamps (µs) it holds."""

    number: int
    scopes: tuple[str, str]
    micros: tuple[int, int]

    def may_hold(self, scope_id: str, low: int, high: int) -> bool:
        """Whether rows of ``scope_id`` with a timestamp in ``[low, high)`` (µs) may be in it."""
        return self.scopes[0] <= scope_id <= self.scopes[1] and self.micros[0] < high and self.micros[1] >= low


class Samples:
    """The normalised samples of a run's usage files, by metric (in memory) or by scope (spilled)."""

    def __init__(self, scope_key: str, spill_rows: int, spill_dir: str | None = None) -> None:
        self._scope_key = scope_key
        self._spill_rows = spill_rows
        self._spill_dir = spill_dir
        self._pending: list[pl.DataFrame] = []
        self._pending_rows = 0
        self._in_memory: pl.DataFrame | None = None
        self._writers: dict[tuple[tuple[str, str], ...], pq.ParquetWriter] = {}
        self._files: list[str] = []
        self._spilled: list[tuple[pq.ParquetFile, list[_RowGroup]]] = []
        self._directory: str | None = None
        self._cleanup: weakref.finalize | None = None

    @property
    def spilled(self) -> bool:
        """Whether the samples went to the spill (read them by scope), or stay in memory (by metric)."""
        return self._directory is not None

    def add(self, chunk: pl.DataFrame) -> None:
        """Keep one chunk of normalised samples (spilling them all once they pass ``spill_rows``)."""
        if chunk.is_empty():
            return
        if not self.spilled and self._pending_rows + chunk.height <= self._spill_rows:
            self._pending.append(chunk)
            self._pending_rows += chunk.height
            return
        if not self.spilled:
            self._open_spill()
            for held in self._pending:
                self._write(held)
            self._pending, self._pending_rows = [], 0
        self._write(chunk)

    def finish(self) -> None:
        """Every chunk was added: index the spill's row groups, or keep the samples in memory as one frame."""
        self._close_writers()
        self._spilled = [self._indexed(path) for path in self._files]
        if self._pending:
            self._in_memory = pl.concat(self._pending, how="diagonal_relaxed")  # the chunks, not copied
            self._pending, self._pending_rows = [], 0

    def of_metric(self, metric: str) -> pl.DataFrame | None:
        """Every sample of ``metric`` (samples in memory only).

        Filtered when asked (once per metric: the collector keeps what it prepares from them), which
        costs a fifth of splitting every sample by metric up front.
        """
        if self._in_memory is None:
            return None
        found = self._in_memory.filter(pl.col("metric") == metric)
        return None if found.is_empty() else found

    def of_scope(self, scope_id: str, begin: datetime, end: datetime) -> pl.DataFrame | None:
        """The samples (of every metric) of one scope in ``[begin, end)``, read from the spill.

        Only the row groups that may hold them are read: a read costs the scope's rows, not the spill's.
        """
        low, high = _micros(begin), _micros(end)
        wanted = (pl.col(self._scope_key) == scope_id) & (pl.col("timestamp") >= begin) & (pl.col("timestamp") < end)
        parts: list[pl.DataFrame] = []
        for source, groups in self._spilled:
            numbers = [g.number for g in groups if g.may_hold(scope_id, low, high)]
            if numbers:
                parts.append(pl.DataFrame(source.read_row_groups(numbers)).filter(wanted))
        found = pl.concat(parts, how="diagonal_relaxed") if parts else None
        return found if found is not None and not found.is_empty() else None

    def close(self) -> None:
        """Remove the spill (idempotent)."""
        self._close_writers()
        for source, _groups in self._spilled:
            source.close()
        self._spilled = []
        if self._cleanup is not None:
            self._cleanup()

    def _close_writers(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def _open_spill(self) -> None:
        parent = self._spill_dir or tempfile.gettempdir()
        _remove_orphans(Path(parent))
        self._directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=parent)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._directory, True)
        LOG.info("file collector: more than %d samples (spill_rows): spilling them to %s", self._spill_rows,
                 self._directory)

    def _write(self, chunk: pl.DataFrame) -> None:
        labels = sorted(c for c in chunk.columns if c not in (*NEEDED, NOT_FINITE, self._scope_key))
        ordered = chunk.select(self._scope_key, "timestamp", "metric", "value", NOT_FINITE, *labels)
        table = ordered.sort(self._scope_key, "timestamp").to_arrow()
        key = tuple((f.name, str(f.type)) for f in table.schema)
        writer = self._writers.get(key)
        if writer is None:
            assert self._directory is not None
            path = os.path.join(self._directory, f"samples-{len(self._files)}.parquet")
            writer = self._writers[key] = pq.ParquetWriter(path, table.schema, compression="lz4")
            self._files.append(path)
        writer.write_table(table, row_group_size=SPILL_ROW_GROUP)

    def _indexed(self, path: str) -> tuple[pq.ParquetFile, list[_RowGroup]]:
        """A spill file opened, with the scope and timestamp ranges of its row groups (columns 0 and 1)."""
        source = pq.ParquetFile(path)
        groups = []
        for number in range(source.metadata.num_row_groups):
            group = source.metadata.row_group(number)
            scopes, stamps = group.column(0).statistics, group.column(1).statistics
            groups.append(_RowGroup(number, (scopes.min, scopes.max), (stamps.min_raw, stamps.max_raw)))
        return source, groups


def _micros(when: datetime) -> int:
    """``when`` as the spill's timestamps are stored: microseconds since the epoch."""
    return (when - _EPOCH) // timedelta(microseconds=1)


def _remove_orphans(parent: Path) -> None:
    """Remove the spill directories of processes that no longer run (a killed worker leaves its own)."""
    for directory in parent.glob(f"{_PREFIX}*"):
        pid = directory.name.removeprefix(_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
