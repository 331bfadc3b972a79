"""End-to-end benchmark: file collector → rate → Parquet through the real pipeline (DirectRunner).

50 scopes × 24 hourly periods × ~830 series (~1M points), three metrics, the demo's rules.  The
same cycle runs twice in one process run: with ratebeam's re-batching (frames concatenated into
``rebatch_rows``-row batches before rating) and with per-frame rating (``rebatch_rows: 1``, the
granularity CloudKitty rates at) as the baseline; it prints points/s for both and the ratio.

    python bench/bench_end_to_end.py [--scopes 50] [--periods 24] [--series 833] [--repeat 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import yaml

from ratebeam.connectors.sql import rules_repository
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.migrations import upgrade
from ratebeam.pipelines.commands.rules import enable_hashmap_if_unset
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.cycle import run_cycle
from ratebeam.pipelines.demo import prepare
from ratebeam.pipelines.interchange import read_rules
from ratebeam.pipelines.rating import load_rater

START = datetime(2026, 1, 1, tzinfo=UTC)
FLAVORS = ["m1.tiny", "m1.small", "m1.medium", "m1.large", "m1.xlarge"]
DISTROS = ["ubuntu", "rhel", "windows", "cirros"]


def make_usage(path: Path, scopes: int, periods: int, series: int) -> int:
    """One sample per series per hour: 70% instances, 20% volumes, 10% floating IPs."""
    n_inst, n_vol = int(series * 0.7), int(series * 0.2)
    n_ip = series - n_inst - n_vol
    scope_ids = [f"project-{i:03d}" for i in range(scopes)]
    hours = [START + timedelta(hours=h, minutes=30) for h in range(periods)]
    grid = pl.DataFrame({"project_id": scope_ids}).join(pl.DataFrame({"timestamp": hours}), how="cross")

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


def run_once(workdir: Path, usage: Path, scopes: int, periods: int, rebatch_rows: int) -> tuple[float, dict]:
    config_path = prepare(workdir)
    doc = yaml.safe_load(config_path.read_text())
    doc["collector"]["url"] = str(usage)
    doc["fetcher"]["scopes"] = [f"project-{i:03d}" for i in range(scopes)]
    doc["rebatch_rows"] = rebatch_rows
    config_path.write_text(yaml.safe_dump(doc))
    config = load_config(config_path)
    engine = make_engine(config.database_url)
    upgrade(engine)
    rules_repository.replace_rules(engine, read_rules(workdir / "rules.json"))
    enable_hashmap_if_unset(engine)
    rater = load_rater(engine, config.metrics)
    now = START + timedelta(hours=periods + 2)
    began = time.perf_counter()
    report = run_cycle(config, rater, now=now)
    elapsed = time.perf_counter() - began
    assert report.ok, report.failures[:3]
    assert report.counters.get("periods_committed") == scopes * periods, report.counters
    return elapsed, report.counters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scopes", type=int, default=50)
    parser.add_argument("--periods", type=int, default=24)
    parser.add_argument("--series", type=int, default=833)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--rebatch-rows", type=int, default=50_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        usage = root / "usage.parquet"
        points = make_usage(usage, args.scopes, args.periods, args.series)
        print(f"usage: {points} points, {args.scopes} scopes x {args.periods} periods x 3 metrics")
        results = {}
        for label, rows in (("ratebeam (re-batched)", args.rebatch_rows), ("per-frame rating (baseline)", 1)):
            times = []
            for i in range(args.repeat):
                elapsed, counters = run_once(root / f"{rows}-{i}", usage, args.scopes, args.periods, rows)
                assert counters["points_written"] == points, counters
                times.append(elapsed)
            results[label] = statistics.median(times)
        print(f"{'pipeline':<30} {'median s':>10} {'points/s':>12}")
        for label, seconds in results.items():
            print(f"{label:<30} {seconds:>10.2f} {points / seconds:>12,.0f}")
        fast, slow = results.values()
        print(f"ratio re-batched / per-frame: {slow / fast:.2f}x")


if __name__ == "__main__":
    main()
