"""The file collector past ``spill_rows``: the same samples, from a local spill instead of memory.

Bounded memory must not change a single collected value: the spill is read a
scope and a window of periods at a time, from files whose labels differ, after chunked reads.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import fsspec
import polars as pl
import pytest
import yaml
from pipeline_support import run_cycle, setup_database, stored_rows, workspace

from ratebeam.connectors.collectors.file import collector as file_collector
from ratebeam.connectors.collectors.file import reading
from ratebeam.connectors.collectors.file.collector import FileCollector
from ratebeam.connectors.collectors.file.reading import read_chunks
from ratebeam.connectors.errors import FatalConnectorError, NoDataCollected
from ratebeam.pipelines.metrics_config import parse_metrics

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOURS = 9
METRICS = parse_metrics({"metrics": {
    "cpu": {"unit": "instance", "groupby": ["id"], "metadata": ["flavor_name", "os_distro"]},
    "disk": {"unit": "GiB", "factor": "1/1073741824", "groupby": ["id"], "extra_args": {"aggregation_method": "sum"}},
}}, "metrics.yml").metrics


def _usage(tmp_path) -> str:
    """Two Parquet files with different label columns, several samples per series and hour, a NaN."""
    folder = tmp_path / "usage"
    folder.mkdir()
    rows = []
    for hour in range(HOURS):
        for scope in ("p1", "p2", "p3"):
            for n in range(3):
                when = T0 + timedelta(hours=hour, minutes=10 * n)
                rows.append({"metric": "cpu", "timestamp": when, "value": float(hour * n + 1), "project_id": scope,
                             "id": f"vm-{scope}-{n}", "flavor_name": f"m1.{n}"})
                rows.append({"metric": "disk", "timestamp": when, "value": float(2**30 * (n + 1)),
                             "project_id": scope, "id": f"d-{scope}", "flavor_name": None})
    rows[7]["value"] = float("nan")
    first, second = pl.DataFrame(rows[: len(rows) // 2]), pl.DataFrame(rows[len(rows) // 2:])
    first.write_parquet(folder / "a.parquet", row_group_size=10)
    second.drop("flavor_name").with_columns(pl.lit("ubuntu").alias("os_distro")).write_parquet(folder / "b.parquet")
    return str(folder)


def _everything(collector: FileCollector) -> dict[tuple[str, datetime, str], object]:
    got: dict[tuple[str, datetime, str], object] = {}
    for scope in ("p1", "p2", "p3", "p4"):
        for hour in range(-1, HOURS + 1):
            begin = T0 + timedelta(hours=hour)
            for metric in METRICS:
                try:
                    got[scope, begin, metric.name] = collector.collect(scope, begin, begin + timedelta(hours=1), metric)
                except NoDataCollected:
                    got[scope, begin, metric.name] = None
    return got


def test_spilled_samples_are_collected_exactly_as_in_memory_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(file_collector, "WINDOW_PERIODS", 2)  # several windows of one scope
    monkeypatch.setattr(file_collector, "WINDOWS_KEPT", 3)  # windows dropped and prepared again
    monkeypatch.setattr(reading, "CHUNK_ROWS", 7)  # Parquet files read 7 rows at a time
    url = _usage(tmp_path)
    in_memory, spilled = FileCollector(url), FileCollector(url, spill_rows=5, spill_dir=str(tmp_path))
    try:
        expected, got = _everything(in_memory), _everything(spilled)
        assert not in_memory._loaded().spilled and spilled._loaded().spilled
    finally:
        spilled.close()
    assert sum(v is not None for v in expected.values()) == 3 * HOURS * 2
    assert got.keys() == expected.keys()
    for key, batch in expected.items():
        assert (got[key] is None) == (batch is None), key
        if batch is not None:
            assert pl.from_arrow(got[key]).sort(pl.all()).equals(pl.from_arrow(batch).sort(pl.all())), key


def test_the_spill_goes_with_the_collector_and_a_dead_process_spill_with_the_next(tmp_path):
    url = _usage(tmp_path)
    spills = tmp_path / "spills"
    spills.mkdir()
    orphan = spills / "ratebeam-spill-999999999-x"  # no such process
    mine = spills / f"ratebeam-spill-{os.getpid()}-y"  # a live process's spill stays
    for directory in (orphan, mine):
        directory.mkdir()
        (directory / "samples-0.parquet").write_bytes(b"x")
    collector = FileCollector(url, spill_rows=5, spill_dir=str(spills))
    collector._loaded()
    left = sorted(p.name for p in spills.iterdir())
    assert orphan.name not in left and mine.name in left and len(left) == 2
    collector.close()
    assert sorted(p.name for p in spills.iterdir()) == [mine.name]


def test_a_chunked_parquet_file_names_the_refused_sample_by_its_row(tmp_path):
    frame = pl.DataFrame({"metric": ["cpu"] * 6, "timestamp": ["2026-01-01T00:00:00Z"] * 6,
                          "value": [1] * 6, "project_id": ["p1", "p1", "p1", "p1", "", "p1"]})
    frame.write_parquet(tmp_path / "u.parquet")
    with fsspec.open("memory://rb-chunks/u.parquet", "wb") as fh:
        fh.write((tmp_path / "u.parquet").read_bytes())
    try:
        for fs, path in ((fsspec.filesystem("file"), str(tmp_path / "u.parquet")),
                         (fsspec.filesystem("memory"), "/rb-chunks/u.parquet")):  # Polars' reader, then Arrow's
            with pytest.raises(FatalConnectorError, match=r"u\.parquet: row 5: project_id: empty \(the scope key\)"):
                list(read_chunks(fs, path, "parquet", "project_id", chunk_rows=2))
    finally:
        fsspec.filesystem("memory").rm("/rb-chunks", recursive=True)


def test_a_parquet_file_reads_the_same_chunks_on_every_file_system(tmp_path):
    """Local files go through Polars' reader, a slice at a time; others (``memory://``, s3) through Arrow's."""
    frame = pl.DataFrame({
        "metric": ["cpu", "disk"] * 5, "timestamp": [T0 + timedelta(minutes=i) for i in range(10)],
        "value": [str(i / 4) for i in range(10)], "project_id": [f"p{i % 3}" for i in range(10)],
        "flavor_name": ["m1.tiny", None] * 5,
    })
    frame.write_parquet(tmp_path / "u.parquet", row_group_size=3)
    with fsspec.open("memory://rb-chunks/u.parquet", "wb") as fh:
        fh.write((tmp_path / "u.parquet").read_bytes())
    try:
        local = list(read_chunks(fsspec.filesystem("file"), str(tmp_path / "u.parquet"), "parquet", "project_id",
                                 chunk_rows=4))
        remote = list(read_chunks(fsspec.filesystem("memory"), "/rb-chunks/u.parquet", "parquet", "project_id",
                                  chunk_rows=4))
    finally:
        fsspec.filesystem("memory").rm("/rb-chunks", recursive=True)
    assert [c.height for c in local] == [c.height for c in remote] == [4, 4, 2]
    assert all(a.equals(b) for a, b in zip(local, remote, strict=True))
    assert pl.concat(local)["value"].cast(pl.String).to_list()[:3] == ["0.000000000000000000", "0.250000000000000000",
                                                                        "0.500000000000000000"]


def test_a_parquet_decimal256_column_of_38_digits_reads_alike_on_every_file_system(tmp_path):
    """Polars' own reader takes a 256-bit decimal of at most 38 digits; Arrow's batches are cast to
    128 bits first (Polars panicked converting them)."""
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    values = [decimal.Decimal("1.25"), decimal.Decimal("12345678901234567890.5")]
    pq.write_table(pa.table({"metric": ["cpu"] * 2, "timestamp": ["2026-01-01T00:00:00Z"] * 2,
                             "value": pa.array(values, type=pa.decimal256(38, 2)), "project_id": ["p1", "p2"],
                             "id": pa.array([decimal.Decimal("1.5"), None], type=pa.decimal256(30, 1))}),
                   tmp_path / "u.parquet")
    with fsspec.open("memory://rb-chunks/u.parquet", "wb") as fh:
        fh.write((tmp_path / "u.parquet").read_bytes())
    try:
        local = list(read_chunks(fsspec.filesystem("file"), str(tmp_path / "u.parquet"), "parquet", "project_id"))
        remote = list(read_chunks(fsspec.filesystem("memory"), "/rb-chunks/u.parquet", "parquet", "project_id"))
    finally:
        fsspec.filesystem("memory").rm("/rb-chunks", recursive=True)
    assert local[0].equals(remote[0])
    assert local[0]["value"].to_list() == values and local[0]["id"].to_list() == ["1.5", None]


def test_a_spilled_run_stores_what_an_in_memory_run_stores(tmp_path):
    """The demo rated with ``spill_rows: 100`` (of 1,550 samples): the same rows; the spill is gone after."""
    reference = workspace(tmp_path / "memory")
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    spilling = workspace(tmp_path / "spilled")
    doc = yaml.safe_load(spilling.read_text())
    doc["collector"].update(spill_rows=100, spill_dir=str(spill_dir))
    spilling.write_text(yaml.safe_dump(doc))
    for config in (reference, spilling):
        setup_database(config)
        done = run_cycle(config)
        assert done.returncode == 0, done.stderr
    rows = stored_rows(reference)
    assert rows.height > 0 and stored_rows(spilling).equals(rows)
    assert "spilling them to" in done.stderr  # the last run's: it did spill
    assert list(spill_dir.iterdir()) == []
