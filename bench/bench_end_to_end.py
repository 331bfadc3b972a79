"""End-to-end benchmark: ratebeam's cycle against CloudKitty 25.0.0's own processor path, same points.

Usage samples: 50 scopes × 24 hourly periods × 833 series (999,600 points by default), three metrics
(instances by flavor and OS, volumes by type, floating IPs), one sample per series per hour, in one
Parquet file; the demo's metrics.yml and rules.json on both sides.

What is timed:
- ratebeam: ``load_rater`` (the rules from its SQLite database) and ``pipelines.cycle.run_cycle``
  (FnApiRunner, in process): scopes, planning and leases in SQLite, the file collector reading the
  Parquet file, conversion, rating, writing to the embedded store (``--storage delta|parquet``) and the
  state commits.  Not timed: building the config, database and rules, and reading the totals back.
  The median of ``--repeat`` runs, each on a fresh database and store.
- CloudKitty (``tests/cloudkitty/ck_processor.py`` in its own venv; its docstring has the detail): per
  scope, an ``orchestrator.Worker`` built and ``run()`` over every due period — rules reloaded per
  period, collection through its Prometheus collector's code with the HTTP answer stubbed, the
  ``DataFrame`` and ``DataPoint`` building, ``hashmap`` and ``noop`` processing, ``persist_rating_data``
  to a stub storage driver (its own time subtracted), the scope's state update; in-memory SQLite.
  CloudKitty has no file collector: it is given the points ratebeam's collector and metrics.yml
  conversion produce (``converted_usage.py``), as the parsed answers of Prometheus queries, so reading
  usage costs it nothing here, as storing does (ratebeam's time includes both: the asymmetry favours
  CloudKitty).  One worker process: ``cloudkitty-processor`` runs ``max_workers``
  (CPU count) of them on different scopes.  With ``--ck-max-points N`` it rates the first whole scopes
  up to N points and its time is extrapolated linearly to all points, which the table says.

Printed for each side: median wall-clock seconds and points/s, and the same in CPU time (the
process's, all threads: ratebeam's Polars threads count, and other users of a shared machine do not);
the ratio of the two sides in each.  Both sides' totals are compared per scope, exactly (decimals):
the run fails if they differ.

    python bench/bench_end_to_end.py [--scopes 50] [--periods 24] [--series 833] [--storage delta]
        [--repeat 1] [--ck-repeat 1] [--ck-max-points N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import polars as pl
import yaml
from bench_kernel_vs_cloudkitty import CK_PYTHON, REPO, extrapolated, points_per_second, print_table
from converted_usage import write_converted_usage

from ratebeam.connectors.registry import make_backend
from ratebeam.connectors.sql import rules_repository
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.migrations import upgrade
from ratebeam.connectors.storage.base import TotalQuery
from ratebeam.pipelines.commands.rules import enable_hashmap_if_unset
from ratebeam.pipelines.config import RatebeamConfig, load_config
from ratebeam.pipelines.cycle import run_cycle
from ratebeam.pipelines.demo import prepare
from ratebeam.pipelines.interchange import read_rules
from ratebeam.pipelines.rating import load_rater

CK_PROCESSOR = REPO / "tests" / "cloudkitty" / "ck_processor.py"
START = datetime(2026, 1, 1, tzinfo=UTC)
FLAVORS = ["m1.tiny", "m1.small", "m1.medium", "m1.large", "m1.xlarge"]
DISTROS = ["ubuntu", "rhel", "windows", "cirros"]


def scope_ids(scopes: int) -> list[str]:
    return [f"project-{i:03d}" for i in range(scopes)]


def make_usage(path: Path, scopes: int, periods: int, series: int) -> int:
    """One sample per series per hour: 70% instances, 20% volumes, 10% floating IPs."""
    n_inst, n_vol = int(series * 0.7), int(series * 0.2)
    n_ip = series - n_inst - n_vol
    hours = [START + timedelta(hours=h, minutes=30) for h in range(periods)]
    grid = pl.DataFrame({"project_id": scope_ids(scopes)}).join(pl.DataFrame({"timestamp": hours}), how="cross")

    def block(metric: str, count: int, value: pl.Expr, labels: dict[str, pl.Expr]) -> pl.DataFrame:
        idx = pl.DataFrame({"n": list(range(count))})
        return grid.join(idx, how="cross").select(
            pl.lit(metric).alias("metric"),
            pl.col("timestamp").dt.replace_time_zone("UTC"),
            value.alias("value"),
            pl.col("project_id"),
            (pl.lit(metric[:3] + "-") + pl.col("project_id") + "-" + pl.col("n").cast(pl.String)).alias("id"),
            *(expr.alias(name) for name, expr in labels.items()),
        )

    frames = [
        block("openstack_nova_server_status", n_inst, pl.lit(1),
              {"flavor_name": pl.lit(pl.Series(FLAVORS)).get(pl.col("n") % len(FLAVORS)),
               "os_distro": pl.lit(pl.Series(DISTROS)).get(pl.col("n") % len(DISTROS))}),
        block("openstack_cinder_volume_size_bytes", n_vol, (pl.col("n") % 50 + 1) * 10 * 1073741824,
              {"volume_type": pl.when(pl.col("n") % 3 == 0).then(pl.lit("ssd")).otherwise(pl.lit("hdd"))}),
        block("openstack_neutron_floating_ip", n_ip, pl.lit(1), {}),
    ]
    usage = pl.concat(frames, how="diagonal_relaxed")
    usage.write_parquet(path)
    return usage.height


# --- ratebeam ------------------------------------------------------------------------------------


def configure(workdir: Path, usage: Path, scopes: int, storage: str) -> RatebeamConfig:
    """The demo's configuration, metrics and rules, on the bench's usage file and scopes, rules imported."""
    config_path = prepare(workdir)
    doc = yaml.safe_load(config_path.read_text())
    doc["collector"]["url"] = str(usage)
    doc["fetcher"]["scopes"] = scope_ids(scopes)
    doc["storage"] = {"backends": [{"backend": storage, "url": "rated"}]}
    config_path.write_text(yaml.safe_dump(doc))
    config = load_config(config_path)
    engine = make_engine(config.database_url)
    try:
        upgrade(engine)
        rules_repository.replace_rules(engine, read_rules(workdir / "rules.json"))
        enable_hashmap_if_unset(engine)
    finally:
        engine.dispose()
    return config


def ratebeam_once(config: RatebeamConfig, scopes: int, periods: int) -> tuple[float, float, dict[str, int]]:
    """Wall-clock and CPU seconds of ``load_rater`` + ``run_cycle`` rating every period, and its counters."""
    now = START + timedelta(hours=periods + 2)
    engine = make_engine(config.database_url)
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        rater = load_rater(engine, config.metrics)
        report = run_cycle(config, rater, now=now)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        engine.dispose()
    assert report.ok, report.failures[:3]
    assert report.counters.get("periods_committed") == scopes * periods, report.counters
    return wall, cpu, report.counters


def stored_totals(config: RatebeamConfig, periods: int) -> dict[str, Decimal]:
    """The stored price per scope, read back from the store."""
    backend = make_backend(config.storage[0], config.scope_key)
    backend.init()
    try:
        result = backend.total(TotalQuery(groupby=(config.scope_key,), begin=START,
                                          end=START + timedelta(hours=periods), limit=1_000_000))
    finally:
        backend.close()
    totals = {row[config.scope_key]: row["rate"] for row in result.results}
    bad = [v for v in totals.values() if not isinstance(v, Decimal)]
    assert not bad, f"the store's totals are not decimals: {bad[:3]!r}"
    return totals


# --- CloudKitty ----------------------------------------------------------------------------------


def cloudkitty_once(workdir: Path, points_file: Path, periods: int, max_points: int) -> dict[str, Any]:
    """One ``ck_processor.py`` run in CloudKitty's venv: its JSON stats."""
    now = START + timedelta(hours=periods + 2)
    command = [str(CK_PYTHON), str(CK_PROCESSOR), str(workdir / "rules.json"), str(workdir / "metrics.yml"),
               str(points_file), "--now", now.isoformat(), "--max-points", str(max_points)]
    proc = subprocess.run(command, capture_output=True, text=True, check=False, env={**os.environ, "TZ": "UTC"})
    if proc.returncode != 0:
        raise SystemExit(f"ck_processor.py failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def compare_totals(ratebeam: dict[str, Decimal], cloudkitty: dict[str, str]) -> str:
    """``yes (...)`` when CloudKitty's total of every scope it rated equals ratebeam's; else exit."""
    differ = {s: (ratebeam.get(s), Decimal(t)) for s, t in cloudkitty.items() if ratebeam.get(s) != Decimal(t)}
    if differ or not cloudkitty:
        raise SystemExit(f"TOTALS DIFFER (scope: ratebeam, CloudKitty): {sorted(differ.items())[:5]}"
                         if differ else "CloudKitty rated no scope")
    with localcontext(prec=200):
        total = sum((ratebeam[s] for s in cloudkitty), Decimal(0))
    return f"yes: {len(cloudkitty)} of {len(ratebeam)} scopes, {total.normalize():f} on each side"


# --- report --------------------------------------------------------------------------------------


def measure_ratebeam(args: argparse.Namespace, root: Path, usage: Path, points: int) -> dict[str, Any]:
    """Median wall-clock and CPU seconds of ``--repeat`` cycles, the last run's config and stored totals."""
    runs = []
    for i in range(args.repeat):
        config = configure(root / f"rb-{i}", usage, args.scopes, args.storage)
        wall, cpu, counters = ratebeam_once(config, args.scopes, args.periods)
        assert counters["points_written"] == points, counters
        runs.append((wall, cpu))
    return {"seconds": statistics.median(w for w, _ in runs), "cpu_seconds": statistics.median(c for _, c in runs),
            "config": config, "totals": stored_totals(config, args.periods)}


def measure_cloudkitty(args: argparse.Namespace, root: Path, config: RatebeamConfig, points: int) -> dict[str, Any]:
    """Median seconds of ``--ck-repeat`` ck_processor runs on ratebeam's converted points (extrapolated if asked)."""
    points_file = root / "usage-points.jsonl"
    begins = [START + timedelta(hours=h) for h in range(args.periods)]
    converted = write_converted_usage(config, scope_ids(args.scopes), begins, points_file)
    assert converted == points, (converted, points)
    runs = [cloudkitty_once(root / "rb-0", points_file, args.periods, args.ck_max_points)
            for _ in range(args.ck_repeat)]
    ck = runs[0]
    assert all(r["totals"] == ck["totals"] for r in runs), "CloudKitty's runs disagree"
    for key in ("seconds", "cpu_seconds"):
        ck[key] = extrapolated(statistics.median(r[key] for r in runs), ck["points"], points)
    return ck


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The usage's shape and the store: the options of every bench that rates this bench's data."""
    parser.add_argument("--scopes", type=int, default=50)
    parser.add_argument("--periods", type=int, default=24)
    parser.add_argument("--series", type=int, default=833)
    parser.add_argument("--storage", choices=("delta", "parquet"), default="delta")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--repeat", type=int, default=1, help="ratebeam runs (median)")
    parser.add_argument("--ck-repeat", type=int, default=1, help="CloudKitty runs (median)")
    parser.add_argument("--ck-max-points", type=int, default=0,
                        help="CloudKitty rates whole scopes up to N points, extrapolated to all (0: all points)")
    args = parser.parse_args()
    if not CK_PYTHON.exists():
        raise SystemExit(f"CloudKitty venv missing ({CK_PYTHON}): run bash tests/cloudkitty/setup_venv.sh")
    with tempfile.TemporaryDirectory(prefix="ratebeam-bench-") as tmp:
        root = Path(tmp)
        usage = root / "usage.parquet"
        points = make_usage(usage, args.scopes, args.periods, args.series)
        print(f"usage: {points:,} points, {args.scopes} scopes x {args.periods} periods x {args.series} series "
              f"(3 metrics); ratebeam store: {args.storage}", flush=True)
        rb = measure_ratebeam(args, root, usage, points)
        ck = measure_cloudkitty(args, root, rb["config"], points)
        agree = compare_totals(rb["totals"], ck["totals"])

    label = "CloudKitty 25.0.0 processor path"
    if ck["points"] != points:
        label += f" (extrapolated from {ck['points']:,} points)"
    print()
    print_table(("side", "median s", "points/s", "CPU s", "points/CPU s"), [
        (f"ratebeam end to end ({args.storage})", f"{rb['seconds']:.2f}", points_per_second(points, rb["seconds"]),
         f"{rb['cpu_seconds']:.2f}", points_per_second(points, rb["cpu_seconds"])),
        (label, f"{ck['seconds']:.2f}", points_per_second(points, ck["seconds"]),
         f"{ck['cpu_seconds']:.2f}", points_per_second(points, ck["cpu_seconds"])),
    ])
    print(f"ratio ratebeam / CloudKitty: {ck['seconds'] / rb['seconds']:.1f}x in points/s "
          f"({ck['cpu_seconds'] / rb['cpu_seconds']:.1f}x in points per CPU second)")
    print(f"totals equal: {agree}")
    print(f"(ratebeam: median of {args.repeat} run(s); CloudKitty: median of {args.ck_repeat} run(s), one worker "
          f"process, {ck['frames']:,} frames, storage push stubbed ({ck['push_seconds_excluded']:.2f} s excluded); "
          "CPU s: the process's CPU time, all threads)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
