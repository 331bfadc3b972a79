"""InfluxDB write throughput (points/s) next to the Parquet backend's, same batch, same run.

Starts a private influxd (Debian's 1.6.7, the v1 API; ``--api 2``: the 1.8.x v2-API build) on a
free 127.0.0.1 port through ``tests/servers/influxdb.py``, builds one rated batch (scopes ×
hourly periods × series, CloudKitty's time keys, 2 metadata labels), then per repeat writes it
into a fresh InfluxDB database and into a fresh Parquet directory; prints medians and the ratio.
The InfluxDB figure includes the vectorized line-protocol build (shown apart too), the
already-stored-slices query and 5000-line HTTP writes.

    python bench/bench_influxdb_write.py [--scopes 20] [--periods 24] [--series 200] [--repeat 3] [--api 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from servers.influxdb import running

from ratebeam.connectors.storage.influxdb.backend import InfluxDBStorage
from ratebeam.connectors.storage.influxdb.config import InfluxConnection
from ratebeam.connectors.storage.influxdb.lineprotocol import lines, precision_of
from ratebeam.connectors.storage.parquet.backend import ParquetStorage
from ratebeam.transforms.schema import PRICE_POLARS, QTY_POLARS, usage_schema

START = datetime(2026, 1, 1, tzinfo=UTC)
FLAVORS = ["m1.tiny", "m1.small", "m1.medium", "m1.large"]


def rated_batch(scopes: int, periods: int, series: int) -> pa.Table:
    """scopes × periods × series instance points with CloudKitty's groupby and two metadata labels."""
    grid = (
        pl.DataFrame({"s": range(scopes)})
        .join(pl.DataFrame({"h": range(periods)}), how="cross")
        .join(pl.DataFrame({"n": range(series)}), how="cross")
    )
    begin = pl.lit(START) + pl.duration(hours=pl.col("h"))
    frame = grid.select(
        ("project-" + pl.col("s").cast(pl.String)).alias("scope_id"),
        pl.lit("instance").alias("type"),
        begin.dt.cast_time_unit("us").alias("begin"),
        (begin + pl.duration(hours=1)).dt.cast_time_unit("us").alias("end"),
        pl.lit(1).cast(QTY_POLARS).alias("qty"),
        ((pl.col("n") % 7 + 1).cast(pl.String) + ".125").cast(PRICE_POLARS).alias("price"),
        pl.lit("instance").alias("unit"),
        ("project-" + pl.col("s").cast(pl.String)).alias("groupby.project_id"),
        ("vm-" + pl.col("s").cast(pl.String) + "-" + pl.col("n").cast(pl.String)).alias("groupby.id"),
        pl.lit(pl.Series(FLAVORS)).get(pl.col("n") % len(FLAVORS)).alias("groupby.flavor_name"),
        begin.dt.strftime("%U").alias("groupby.week_of_the_year"),
        begin.dt.ordinal_day().cast(pl.String).alias("groupby.day_of_the_year"),
        begin.dt.month().cast(pl.String).alias("groupby.month"),
        begin.dt.year().cast(pl.String).alias("groupby.year"),
        pl.lit("ubuntu").alias("metadata.os_distro"),
        (pl.col("n") % 8 + 1).cast(pl.String).alias("metadata.vcpus"),
    )
    groupby = [c.split(".", 1)[1] for c in frame.columns if c.startswith("groupby.")]
    metadata = [c.split(".", 1)[1] for c in frame.columns if c.startswith("metadata.")]
    return frame.to_arrow().cast(usage_schema(groupby, metadata))


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scopes", type=int, default=20)
    parser.add_argument("--periods", type=int, default=24)
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--api", type=int, choices=(1, 2), default=1)
    args = parser.parse_args()
    batch = rated_batch(args.scopes, args.periods, args.series)
    points = batch.num_rows
    frame = pl.from_arrow(batch)
    build = [timed(lambda: lines(frame, precision_of(frame))) for _ in range(args.repeat)]
    influx_s, rewrite_s, parquet_s = [], [], []
    with running(f"v{args.api}") as server, tempfile.TemporaryDirectory() as tmp:
        print(f"influxd {server.version} at {server.url} (API v{args.api}); {points:,} points per write")
        for _ in range(args.repeat):
            database = f"bench_{uuid.uuid4().hex[:8]}"
            if args.api == 1:
                connection = InfluxConnection(url=server.url, database=database)
            else:
                requests.post(f"{server.url}/query", data={"q": f'CREATE DATABASE "{database}"'}, timeout=30)
                connection = InfluxConnection(
                    url=server.url, version=2, bucket=f"{database}/autogen", token="x:x"
                )
            influx = InfluxDBStorage.from_config(connection)
            influx.init()
            influx_s.append(timed(lambda: influx.write(batch)))  # noqa: B023
            rewrite_s.append(timed(lambda: influx.write(batch)))  # noqa: B023 - replaces every slice
            influx.close()
            parquet = ParquetStorage(str(Path(tmp) / uuid.uuid4().hex))
            parquet.init()
            parquet_s.append(timed(lambda: parquet.write(batch)))  # noqa: B023
            parquet.close()
    rows = [
        ("parquet write (baseline)", parquet_s),
        (f"influxdb v{args.api} write", influx_s),
        (f"influxdb v{args.api} rewrite (delete+write)", rewrite_s),
        ("  of which line protocol build", build),
    ]
    print(f"{'backend':<42} {'median s':>9} {'points/s':>12}")
    for name, seconds in rows:
        median = statistics.median(seconds)
        print(f"{name:<42} {median:>9.3f} {points / median:>12,.0f}")
    ratio = statistics.median(parquet_s) / statistics.median(influx_s)
    print(f"ratio influxdb / parquet throughput: {ratio:.3f}x")


if __name__ == "__main__":
    main()
