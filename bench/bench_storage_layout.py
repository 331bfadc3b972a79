"""Scale of the embedded store: a simulated month, Delta table vs today's file-per-slice Parquet.

Builds ``--scopes`` × ``--periods`` hourly periods × ``--types`` types × ``--series`` series per
(scope, type) points (CloudKitty's time keys and a flavor label, exact decimals), writes them into
each layout the way a backfill does (one scope at a time, ``--batch`` rows per write), then
measures: write throughput, files on disk (data and log), for Delta a ``compact`` + vacuum,
``report summary`` grouped by scope,type over the month, one scope's month of points, and the
peak RSS.  Each layout runs in its own process so its peak RSS is its own.  The size is printed;
the default is the largest month-like size today's layout finishes in a few minutes here.

    python bench/bench_storage_layout.py [--scopes 20] [--periods 744] [--types 6] [--series 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa

from ratebeam.connectors.storage.base import TotalQuery
from ratebeam.pipelines.config import RatebeamConfig
from ratebeam.transforms.schema import PRICE_ARROW, QTY_ARROW, TIME_ARROW, usage_schema

START = datetime(2026, 1, 1, tzinfo=UTC)
GROUPBY = ("day_of_the_year", "flavor_name", "id", "month", "project_id", "week_of_the_year", "year")


def scope_table(scope: str, periods: int, types: int, series: int) -> pa.Table:
    """One scope's month: every (period, type, series) point, period-major like a backfill."""
    n = periods * types * series
    period = np.repeat(np.arange(periods), types * series)
    kind = np.tile(np.repeat(np.arange(types), series), periods)
    ident = np.tile(np.arange(series), periods * types)
    begins = np.datetime64(START.replace(tzinfo=None), "us") + period.astype("timedelta64[h]")
    stamps = [START + timedelta(hours=int(h)) for h in range(periods)]
    day = np.array([str(s.timetuple().tm_yday) for s in stamps])[period]
    week = np.array([s.strftime("%U") for s in stamps])[period]
    qty = pa.array([Decimal(int(i % 7) + 1) for i in range(series)], QTY_ARROW).take(pa.array(ident))
    prices = pa.array([Decimal(f"0.0{k + 1}") for k in range(types)], PRICE_ARROW).take(pa.array(kind))
    columns = {
        "scope_id": pa.array([scope] * n),
        "type": pa.array(np.array([f"type{k}" for k in range(types)])[kind]),
        "begin": pa.array(begins, TIME_ARROW),
        "end": pa.array(begins + np.timedelta64(1, "h"), TIME_ARROW),
        "qty": qty,
        "price": prices,
        "unit": pa.array(["unit"] * n),
        "groupby.day_of_the_year": pa.array(day),
        "groupby.flavor_name": pa.array(np.array(["m1.small", "m1.large"])[ident % 2]),
        "groupby.id": pa.array(np.char.add(f"{scope}-r", ident.astype(str))),
        "groupby.month": pa.array(["1"] * n),
        "groupby.project_id": pa.array([scope] * n),
        "groupby.week_of_the_year": pa.array(week),
        "groupby.year": pa.array(["2026"] * n),
    }
    return pa.table(columns, schema=usage_schema(GROUPBY, ()))


def make(layout: str, root: str):
    if layout == "delta":
        from ratebeam.connectors.storage.delta.backend import DeltaStorage

        return DeltaStorage(root, compact_files=0)
    from ratebeam.connectors.storage.parquet.backend import ParquetStorage

    return ParquetStorage(root)


def files_on_disk(root: Path) -> tuple[int, int]:
    """(data files, log and other files)."""
    files = [p for p in root.rglob("*") if p.is_file()]
    log = sum("_delta_log" in p.parts for p in files)
    return len(files) - log, log


def run_layout(layout: str, args: argparse.Namespace) -> dict:
    """Write, compact, query one layout in a temporary directory (removed after)."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{layout}-") as tmp:
        return _measure(layout, Path(tmp) / "rated", args)


def _measure(layout: str, root: Path, args: argparse.Namespace) -> dict:
    backend = make(layout, str(root))
    backend.init()
    scopes = [f"scope-{i:04d}" for i in range(args.scopes)]
    points, write_s = 0, 0.0
    for scope in scopes:
        table = scope_table(scope, args.periods, args.types, args.series)
        for start in range(0, table.num_rows, args.batch):
            batch = table.slice(start, args.batch)
            began = time.perf_counter()
            points += backend.write(batch)
            write_s += time.perf_counter() - began
    out = {"layout": layout, "points": points, "write_s": write_s, "files": files_on_disk(root)}
    if layout == "delta":
        began = time.perf_counter()
        backend.compact(retention_hours=0)
        out["compact_s"] = time.perf_counter() - began
        out["files_compacted"] = files_on_disk(root)
    end = START + timedelta(hours=args.periods)
    began = time.perf_counter()
    summary = backend.total(TotalQuery(groupby=("project_id", "type"), begin=START, end=end, limit=10**6))
    out["summary_s"] = time.perf_counter() - began
    out["summary_rows"] = summary.total
    out["summary_rate"] = str(sum(r["rate"] for r in summary.results))
    began = time.perf_counter()
    month = backend.retrieve(START, end, filters={"scope_id": scopes[len(scopes) // 2]}, limit=10**8)
    out["scope_month_s"] = time.perf_counter() - began
    out["scope_month_rows"] = month.total
    backend.close()
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scopes", type=int, default=20)
    parser.add_argument("--periods", type=int, default=744)
    parser.add_argument("--types", type=int, default=6)
    parser.add_argument("--series", type=int, default=8)
    parser.add_argument("--batch", type=int, default=RatebeamConfig.model_fields["rebatch_rows"].default,
                        help="rows per write (default: ratebeam's rebatch_rows)")
    parser.add_argument("--layouts", default="delta,parquet")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_layout(args.child, args)))
        return
    total = args.scopes * args.periods * args.types * args.series
    print(f"size: {args.scopes} scopes x {args.periods} hourly periods x {args.types} types x "
          f"{args.series} series = {total:,} points, {args.scopes * args.periods * args.types:,} slices; "
          f"writes of {args.batch:,} rows")
    results = []
    for layout in args.layouts.split(","):
        child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", layout],
                               capture_output=True, text=True, check=True)
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    assert len({r["summary_rate"] for r in results}) == 1, "the layouts disagree on the month's total"
    assert len({r["scope_month_rows"] for r in results}) == 1
    header = f"{'layout':<22}{'write s':>9}{'points/s':>11}{'data files':>12}{'log files':>10}" \
             f"{'summary s':>11}{'1 scope s':>11}{'peak RSS MB':>13}"
    print(header)
    for r in results:
        data, log = r.get("files_compacted", r["files"])
        name = "delta (compacted)" if r["layout"] == "delta" else "parquet (today)"
        print(f"{name:<22}{r['write_s']:>9.1f}{r['points'] / r['write_s']:>11,.0f}{data:>12,}{log:>10,}"
              f"{r['summary_s']:>11.2f}{r['scope_month_s']:>11.2f}{r['peak_rss_mb']:>13,.0f}")
        if "compact_s" in r:
            print(f"  delta before compaction: {r['files'][0]:,} data files, {r['files'][1]:,} log files; "
                  f"compact + vacuum {r['compact_s']:.1f} s")
    print(f"month total (both layouts): {results[0]['summary_rate']} over {results[0]['summary_rows']} "
          f"(scope, type) rows; one scope's month: {results[0]['scope_month_rows']:,} points")


if __name__ == "__main__":
    main()
