"""Benchmark: ``ratebeam rules diff`` on a month of stored points, against re-rating them with CloudKitty.

Why: a price change is only safe when its money effect is known first.  ratebeam answers from the
stored points (one read of the store, the rating kernel run twice); without it a CloudKitty user
learns the effect only by reprocessing the range with the new rules and comparing totals, i.e. at
least one full re-rating pass over the same points.  This prints both for the same number of points.

What is built (not timed): a Parquet store written by ratebeam's own backend (``<root>/type=/scope=/
<begin>.parquet``) with ``--points`` points spread over ``--scopes`` scopes x ``--periods`` hourly
periods (a month by default) and 4 types, priced with the rules of ``bench_kernel_vs_cloudkitty``
(3 services, a 20-value field with tenant overrides, thresholds, 3 groups, a validity window); a
SQLite database holding those rules.  The proposed rules double one flavor's price.

What is timed:
- ratebeam: the whole ``ratebeam rules diff PROPOSED.json -f json`` command in-process (config,
  database, reading every stored point, both re-ratings, the comparison, the JSON output); and its
  two parts on their own (``read_stored``, ``money_diff``).
- CloudKitty 25.0.0 (``tests/cloudkitty/ck_rate.py`` in its venv, as ``bench_kernel_vs_cloudkitty``):
  its hashmap rating of ``--ck-points`` points (per frame: ``reload_config`` + ``process``),
  extrapolated linearly to ``--points``: the rating pass alone of the reprocessing a user would
  otherwise run (collection and storage not counted, so a lower bound).

Usage: ``.venv/bin/python bench/bench_rules_diff.py [--points 10000000] [--scopes 10] [--periods 720]
[--ck-points 100000]`` (a few minutes for 10M points on 2 cores; building the store is most of it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import numpy as np
import polars as pl
from bench_kernel_vs_cloudkitty import (
    CK_PYTHON,
    FLAVORS,
    OS,
    VCPUS,
    VOLUME_TYPES,
    cloudkitty,
    rules_document,
    usage_lines,
)

from ratebeam.transforms.schema import PRICE_POLARS, QTY_POLARS, TIME_POLARS

START = datetime(2024, 3, 1, tzinfo=UTC)
TYPES = ("instance", "volume.size", "ip.floating", "network.bw")
#: Share of each type in ``TYPES`` order (as ``bench_kernel_vs_cloudkitty.usage_lines``).
SHARES = (0.5, 0.3, 0.15, 0.05)
#: Points written per ``write`` call (each call writes one file per (type, scope, period) slice).
WRITE_BATCH = 500_000


def stored_points(points: int, scopes: int, periods: int, seed: int = 7) -> pl.DataFrame:
    """``points`` usage points (price 0), vectorized: scope and period round-robin, labels at random."""
    rng = np.random.default_rng(seed)
    n = np.arange(points)
    kind = rng.choice(len(TYPES), size=points, p=SHARES)
    begin = pl.Series([START + timedelta(hours=h) for h in range(periods)], dtype=TIME_POLARS)
    frame = pl.DataFrame({
        "scope_id": pl.Series([f"t{s:02d}" for s in range(scopes)]).gather(n % scopes),
        "type": pl.Series(TYPES).gather(kind),
        "begin": begin.gather((n // scopes) % periods),
        "qty_int": np.where(kind == 1, rng.integers(1, 3000, size=points), 1),
        "flavor": pl.Series(FLAVORS).gather(rng.integers(0, len(FLAVORS), size=points)),
        "os": pl.Series(OS).gather(rng.integers(0, len(OS), size=points)),
        "vcpus": pl.Series(VCPUS).gather(rng.integers(0, len(VCPUS), size=points)),
        "vtype": pl.Series(VOLUME_TYPES).gather(rng.integers(0, len(VOLUME_TYPES), size=points)),
        "rid": rng.integers(0, 5000, size=points),
    })
    instance, volume = pl.col("type") == "instance", pl.col("type") == "volume.size"
    return frame.select(
        "scope_id", "type", "begin",
        (pl.col("begin") + pl.duration(hours=1)).alias("end"),
        pl.col("qty_int").cast(QTY_POLARS).alias("qty"),
        pl.lit(0).cast(PRICE_POLARS).alias("price"),
        pl.lit("unit").alias("unit"),
        pl.col("scope_id").alias("groupby.project_id"),
        pl.format("r{}", "rid").alias("groupby.id"),
        pl.when(instance).then("flavor").alias("groupby.flavor_name"),
        pl.when(instance).then("os").alias("metadata.os_distro"),
        pl.when(instance).then("vcpus").alias("metadata.vcpus"),
        pl.when(volume).then("vtype").alias("metadata.volume_type"),
    )


def proposed_document() -> dict:
    """The bench rules with the first flavor's price doubled."""
    document = rules_document()
    mappings = document["services"][0]["fields"][0]["mappings"]
    mappings[0] = {**mappings[0], "cost": str(2 * Decimal(mappings[0]["cost"]))}
    return document


def build_workspace(root: Path, points: int, scopes: int, periods: int) -> tuple[Path, float]:
    """ratebeam.yaml, the rules database and the rated Parquet store; (config, store size in MB)."""
    from ratebeam.connectors.sql.migrations import make_engine, upgrade
    from ratebeam.connectors.sql.rules_repository import replace_rules, set_module_state
    from ratebeam.connectors.storage.parquet.backend import ParquetStorage
    from ratebeam.pipelines.interchange import read_rules
    from ratebeam.transforms.hashmap import rate

    (root / "rules.json").write_text(json.dumps(rules_document()))
    (root / "proposed.json").write_text(json.dumps(proposed_document()))
    rules = read_rules(root / "rules.json")
    engine = make_engine(f"sqlite:///{root / 'ratebeam.db'}")
    upgrade(engine)
    replace_rules(engine, rules)
    set_module_state(engine, "hashmap", enabled=True)
    engine.dispose()
    (root / "metrics.yml").write_text("metrics: {}\n")
    (root / "ratebeam.yaml").write_text(
        "collector: {backend: file, url: usage.csv}\ndatabase_url: sqlite:///ratebeam.db\n"
        "fetcher: {backend: source, scopes: [t00]}\nmetrics: metrics.yml\nperiod: 3600\nscope_key: project_id\n"
        "storage: {backends: [{backend: parquet, url: rated}]}\n")
    storage = ParquetStorage(str(root / "rated"))
    storage.init()
    usage = stored_points(points, scopes, periods).sort("begin")
    written = 0
    # A write replaces whole (scope, period, type) slices: each batch holds whole periods.
    per_batch = max(1, WRITE_BATCH * periods // points)
    for first in range(0, periods, per_batch):
        low, high = START + timedelta(hours=first), START + timedelta(hours=first + per_batch)
        part = usage.filter(pl.col("begin").is_between(low, high, closed="left"))
        written += storage.write(rate(part, rules).rated.to_arrow())
        print(f"... {written:,} points stored", file=sys.stderr, flush=True)
    storage.close()
    size = sum(f.stat().st_size for f in (root / "rated").rglob("*.parquet")) / 1e6
    return root / "ratebeam.yaml", size


def time_diff(config: Path, begin: str, end: str) -> tuple[float, dict]:
    """Wall time of the whole ``rules diff`` command, and its JSON answer."""
    from ratebeam.pipelines.cli import main

    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        status = main(["rules", "diff", "-c", str(config), str(config.parent / "proposed.json"),
                       "--from", begin, "--to", end, "-f", "json"])
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"rules diff exited {status}")
    return seconds, json.loads(out.getvalue())


def time_parts(config: Path, begin: datetime, end: datetime) -> tuple[int, float, float]:
    """(points read, seconds to read them, seconds of both re-ratings and the comparison)."""
    import dataclasses

    from ratebeam.connectors.sql.migrations import make_engine
    from ratebeam.pipelines.commands.rules_diff import read_stored
    from ratebeam.pipelines.config import load_config
    from ratebeam.pipelines.interchange import read_rules
    from ratebeam.pipelines.rating import load_rater
    from ratebeam.transforms.metric_defs import MetricsConfig
    from ratebeam.transforms.money_diff import money_diff

    loaded = load_config(config, metrics=False)
    engine = make_engine(loaded.database_url)
    current = load_rater(engine, MetricsConfig(metrics=()))
    engine.dispose()
    proposed = dataclasses.replace(current, rules=read_rules(config.parent / "proposed.json"))
    started = time.perf_counter()
    stored = read_stored(loaded, None, begin, end, [])
    read = time.perf_counter() - started
    started = time.perf_counter()
    money_diff(stored, current(), proposed())
    return stored.height, read, time.perf_counter() - started


def cloudkitty_rate(points: int, workdir: Path) -> float:
    """CloudKitty's hashmap points/s on ``points`` points of the same rules (100 frames)."""
    rules, usage = workdir / "rules.json", workdir / "ck_usage.jsonl"
    usage.write_text("\n".join(usage_lines(points)) + "\n")
    seconds = cloudkitty(rules, usage, workdir, 1)["rating_seconds"]
    usage.unlink()
    return points / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="rules diff on stored points vs a CloudKitty re-rating pass")
    parser.add_argument("--points", type=int, default=10_000_000)
    parser.add_argument("--scopes", type=int, default=10)
    parser.add_argument("--periods", type=int, default=720, help="hourly periods (720: a 30-day month)")
    parser.add_argument("--ck-points", type=int, default=100_000, help="CloudKitty is measured on this many points "
                        "(in 100 frames: about as many points per frame as the default store)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ratebeam-bench-diff-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        config, size = build_workspace(root, args.points, args.scopes, args.periods)
        built = time.perf_counter() - started
        last = START + timedelta(hours=args.periods)
        wall, document = time_diff(config, START.isoformat(), last.isoformat())
        read_points, read_s, diff_s = time_parts(config, START, last)
        ck_rate = cloudkitty_rate(args.ck_points, root) if CK_PYTHON.exists() else None
    if read_points != args.points:
        raise SystemExit(f"read {read_points} points, stored {args.points}")
    difference = sum((Decimal(r["difference"]) for r in document["totals"]), Decimal(0))
    print()
    print(f"rules diff on a stored month: {args.points:,} points, {args.scopes} scopes x {args.periods} hourly "
          f"periods x {len(TYPES)} types, Parquet store {size:,.0f} MB ({args.scopes * args.periods * len(TYPES):,} "
          f"files; built in {built:.0f} s, not timed)")
    rows = [("what", "seconds", "points/s"),
            ("ratebeam rules diff (whole command)", f"{wall:.1f}", f"{args.points / wall:,.0f}"),
            ("  of which: read the stored points", f"{read_s:.1f}", f"{args.points / read_s:,.0f}"),
            ("  of which: re-rate twice + compare", f"{diff_s:.1f}", f"{args.points / diff_s:,.0f}")]
    if ck_rate is not None:
        ck_seconds = args.points / ck_rate
        rows.append((f"CloudKitty re-rating pass (extrapolated from {args.ck_points:,})", f"{ck_seconds:.0f}",
                     f"{ck_rate:,.0f}"))
    else:
        rows.append((f"CloudKitty: venv missing ({CK_PYTHON})", "-", "-"))
    widths = [max(len(r[c]) for r in rows) for c in range(3)]
    for n, row in enumerate(rows):
        print("  ".join(v.ljust(w) if c == 0 else v.rjust(w) for c, (v, w) in enumerate(zip(row, widths,
                                                                                            strict=True))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    if ck_rate is not None:
        print(f"speed-up: {args.points / ck_rate / wall:,.0f}x (CloudKitty's pass excludes collection and storage)")
    print(f"changed cells: {len(document['changed_cells']):,}; total difference {difference}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
