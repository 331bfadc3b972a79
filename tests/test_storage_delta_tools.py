"""The Delta store is readable with the usual tools, each reading the whole store in one call
(the README shows the same one-liners): Polars, pyarrow.dataset and DuckDB give
the points ratebeam's own ``retrieve`` gives, with exact decimals and UTC timestamps."""

from __future__ import annotations

from decimal import Decimal

import duckdb
import polars as pl
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from storage_conformance import HOUR, JANUARY, T0, point, rated_table, sample

from ratebeam.connectors.storage.delta.backend import DeltaStorage


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("tools") / "rated")
    backend = DeltaStorage(url, compact_files=0)
    backend.init()
    backend.write(rated_table(sample()))
    backend.write(rated_table([point("p1", "instance", T0, "0.1", "0.00000000000000000001")]))  # a rewrite
    backend.write(rated_table([point("p3", "disk", T0 + HOUR, "2", "0.3", groupby={"zone": "z1"})]))
    expected = backend.retrieve(*JANUARY, limit=10_000).points
    backend.close()
    return url, expected


def _sum(values) -> Decimal:
    return sum((Decimal(str(v)) for v in values), Decimal(0))


def test_polars_scan_delta(store):
    url, expected = store
    frame = pl.scan_delta(url).collect()
    assert frame.height == expected.num_rows
    assert frame.schema["price"] == pl.Decimal(38, 20) and frame.schema["begin"] == pl.Datetime("us", "UTC")
    assert _sum(frame["price"].to_list()) == _sum(expected["price"].to_pylist())


def test_pyarrow_dataset(store):
    url, expected = store
    table = DeltaTable(url).to_pyarrow_dataset().to_table()
    assert table.num_rows == expected.num_rows
    assert pc.sum(table["price"]).as_py() == pc.sum(expected["price"]).as_py()
    assert str(table.schema.field("begin").type) == "timestamp[us, tz=UTC]"


def test_duckdb(store):
    url, expected = store
    files = DeltaTable(url).file_uris()  # the current version's files (delta_scan needs the delta extension)
    rows, price = duckdb.sql(f"SELECT count(*), sum(price) FROM read_parquet({files!r}, union_by_name=true)").fetchall()[0]
    assert rows == expected.num_rows
    assert Decimal(price) == _sum(expected["price"].to_pylist())
