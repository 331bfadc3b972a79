"""No window without data: a backend sampled while a reprocessing job re-rates it.

The demo is rated, the m1.small price changed and two resources dropped, then every scope's whole
range is re-rated by ``ratebeam reprocess run --chunk 8`` in a subprocess (9 rounds per scope)
while a thread reads the backend through its public ``retrieve`` again and again.  "Old" is what
the backend held before the job, "new" what it holds after it; each sample is classified per
(scope, period, type) slice and per (scope, period):

* Parquet (``rewrite="atomic"``): a slice is always exactly its old or its new points, and a
  period that has points before and after is never seen empty.  Across the types of one period a
  reader may see some slices old and others new while one write lands (one file per slice, stale
  types removed just after the write): counted, allowed, and said by the capability and README.
* InfluxDB (``rewrite="delete_then_write"``): a slice may be seen empty (deleted, not yet
  written) or partly written, never with old and new points together; the longest empty window
  (an upper bound: between the samples that saw the slice full around it) is printed and bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
from pipeline_support import delta_workspace, parquet_workspace, ratebeam, run_cycle, setup_database
from reprocess_support import change_rules, drop_resources, influx_workspace
from servers import influxdb as influx_servers

from ratebeam.connectors.storage.base import StorageBackend
from ratebeam.connectors.storage.delta.backend import DeltaStorage
from ratebeam.connectors.storage.influxdb.backend import InfluxDBStorage
from ratebeam.connectors.storage.influxdb.config import InfluxConnection
from ratebeam.connectors.storage.parquet.backend import ParquetStorage

_influx_servers = influx_servers._influx_servers
influx_v1 = influx_servers.influx_v1

BEGIN, END = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 5, tzinfo=UTC)
#: The columns that identify a point and its rating: a changed price or a dropped resource shows.
_ROW = ("scope_id", "begin", "type", "qty", "price")
#: An InfluxDB slice is deleted then written by one ``write`` call: a reader's empty window is far below this.
_INFLUX_MAX_EMPTY_SECONDS = 5.0

Slice = tuple[str, datetime, str]


def _slices(points: pl.DataFrame) -> dict[Slice, frozenset[str]]:
    """Each (scope, begin, type) slice's points, as the set of their identifying rows."""
    if points.height == 0:
        return {}
    extra = sorted(c for c in points.columns if c.startswith(("groupby", "metadata")))
    rows = points.select(*_ROW, *(pl.col(c).cast(pl.String) for c in extra))
    out: dict[Slice, set[str]] = {}
    for row in rows.iter_rows():
        out.setdefault((row[0], row[1], row[2]), set()).add(repr(row))
    return {key: frozenset(value) for key, value in out.items()}


def _read(backend: StorageBackend) -> dict[Slice, frozenset[str]]:
    frame = pl.from_arrow(backend.retrieve(BEGIN, END, limit=1_000_000).points)
    assert isinstance(frame, pl.DataFrame)
    return _slices(frame)


@dataclass
class Seen:
    """What the samples showed, per kind, with one example each."""

    samples: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    examples: dict[str, object] = field(default_factory=dict)
    #: Longest time a slice was empty, seconds: at most the time between the samples that saw it
    #: full just before and just after (a sample is about one ``retrieve`` long).
    longest_empty: float = 0.0
    #: Samples taken mid-job: some changed slice already new while another is still old.
    midway: int = 0

    def add(self, kind: str, example: object) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        self.examples.setdefault(kind, example)


def _slice_kind(seen: frozenset[str], old: frozenset[str], new: frozenset[str]) -> str:
    if seen == new:
        return "new"
    if seen == old:
        return "old"
    if not seen:
        return "empty"
    if seen & (old - new) and seen & (new - old):
        return "mix"
    return "partial new" if seen <= new else "partial old" if seen <= old else "foreign"


def classify(samples: list[tuple[float, dict[Slice, frozenset[str]]]], old: dict, new: dict) -> Seen:
    """Every sample's slices and periods against the old and the new store."""
    result = Seen(samples=len(samples))
    keys = set(old) | set(new)
    periods: dict[tuple[str, datetime], set[Slice]] = {}
    for key in keys:
        periods.setdefault(key[:2], set()).add(key)
    last_full: dict[Slice, float] = {}
    emptied: set[Slice] = set()
    none: frozenset[str] = frozenset()
    changed = {k for k in keys if old.get(k) != new.get(k)}
    for moment, got in samples:
        states = {_slice_kind(got.get(k, none), old.get(k, none), new.get(k, none)) for k in changed}
        result.midway += {"old", "new"} <= states
        for key in keys:
            o, n, s = old.get(key, none), new.get(key, none), got.get(key, none)
            kind = _slice_kind(s, o, n)
            if kind not in ("old", "new"):
                result.add(kind, key)
            if kind == "empty":
                emptied.add(key)
            else:
                if key in emptied:  # bounded by the samples that saw it full on either side
                    result.longest_empty = max(result.longest_empty, moment - last_full.get(key, samples[0][0]))
                    emptied.discard(key)
                last_full[key] = moment
        for period, members in periods.items():
            if not any(got.get(k) for k in members):
                result.add("period empty", period)
            kinds = {_slice_kind(got.get(k, none), old.get(k, none), new.get(k, none))
                     for k in members if k in changed}
            if {"old", "new"} <= kinds:
                result.add("period types old and new", period)
    return result


def sample_while(job: Callable[[], object], read: Callable[[], dict]) -> tuple[object, list]:
    """Run ``job`` while a thread calls ``read`` back to back; its result and the timed samples."""
    samples: list[tuple[float, dict]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                samples.append((time.monotonic(), read()))
            except BaseException as exc:  # surfaced in the test, never swallowed
                errors.append(exc)
                return

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        outcome = job()
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    return outcome, samples


def _reprocess_everything(config: Path) -> None:
    """Change the rules and the usage, schedule every scope's whole range (what the job re-rates)."""
    change_rules(config)
    drop_resources(config)
    done = ratebeam("reprocess", "create", "-c", str(config), "--all", "--from", "2026-01-01T00:00:00",
                    "--to", "2026-01-04T00:00:00", "--reason", "m1.small price fix")
    assert done.returncode == 0, done.stderr


def _run_job(config: Path) -> Callable[[], object]:
    def job() -> object:
        done = ratebeam("reprocess", "run", "-c", str(config), "--chunk", "8")
        assert done.returncode == 0, done.stderr
        return done

    return job


def _observe(config: Path, backend: StorageBackend) -> tuple[Seen, dict, dict]:
    old = _read(backend)
    _reprocess_everything(config)
    _, samples = sample_while(_run_job(config), lambda: _read(backend))
    new = _read(backend)
    assert old != new  # the job re-rated something: the samples watched a real rewrite
    assert any(key not in new for key in old)  # a whole type of a period went (a stale slice removed)
    seen = classify(samples, old, new)
    assert seen.midway >= 3, seen  # the reader really read while the job was rewriting
    return seen, old, new


def _atomic_samples(config: Path, make: Callable[[str], StorageBackend]) -> Seen:
    """Rate the workspace, then sample its store (built by ``make`` from its path) during the job."""
    setup_database(config)
    assert run_cycle(config).returncode == 0
    backend = make(str(config.parent / "rated"))
    assert backend.capabilities.rewrite == "atomic"
    try:
        seen, _, _ = _observe(config, backend)
    finally:
        backend.close()
    print(f"{backend.capabilities.name}: {seen}")
    assert "mix" not in seen.kinds, seen
    assert "empty" not in seen.kinds, seen
    assert "period empty" not in seen.kinds, seen
    return seen


def test_parquet_readers_see_every_slice_old_or_new_and_no_period_empty(tmp_path):
    seen = _atomic_samples(parquet_workspace(tmp_path / "ws", lease_seconds=2), ParquetStorage)
    # Whatever a slice was, it was its old or its new points (the atomic rename of one file).
    assert seen.kinds.keys() <= {"period types old and new"}, seen


def test_delta_readers_see_every_slice_old_or_new_and_no_period_empty(tmp_path):
    # One commit replaces all the slices of a write: each sample reads one table version.
    seen = _atomic_samples(delta_workspace(tmp_path / "ws", lease_seconds=2), DeltaStorage)
    assert seen.kinds.keys() <= {"period types old and new"}, seen


def test_influxdb_readers_never_see_old_and_new_together_and_its_empty_window_is_short(influx_v1, tmp_path):
    config, database = influx_workspace(tmp_path / "ws", influx_v1.url)
    assert run_cycle(config).returncode == 0
    backend = InfluxDBStorage(InfluxConnection(url=influx_v1.url, database=database))
    assert backend.capabilities.rewrite == "delete_then_write"
    assert "empty" in backend.capabilities.idempotence  # the capability says a reader may find it empty
    try:
        seen, _, _ = _observe(config, backend)
    finally:
        backend.close()
    print(f"influxdb: {seen}")
    assert "mix" not in seen.kinds, seen  # the old slice is deleted before the new one is written
    assert seen.kinds.keys() <= {"empty", "partial new", "period empty", "period types old and new"}, seen
    assert seen.longest_empty < _INFLUX_MAX_EMPTY_SECONDS, seen

