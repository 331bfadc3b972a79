"""Scaling on Dask: the end-to-end cycle on FnApiRunner, on 1 Dask worker and on 2, in one run, same totals.

The data and configuration are ``bench_end_to_end.py``'s (the demo's metrics.yml and rules.json,
a Parquet usage file read by the file collector, the Delta store, SQLite state and leases; by
default 50 scopes × 24 hourly periods × 833 series, 999,600 points).  Each side rates every period
once with ``pipelines.cycle.run_cycle`` on a fresh database and store:

- FnApiRunner, in this process (the baseline);
- ratebeam's DaskRunner on a local cluster of 1, then 2, ``dask worker --nthreads 1`` processes
  (``pipelines.runners.dask_cluster``: what ``dask.yaml`` starts), the work items spread over 2
  partitions per worker, each DoFn set up once per partition (``setup: partition``, what the
  runner did before) and once per worker (``setup: worker``, the default).  Each cluster first
  rates a one-scope warm-up workspace, untimed, so the workers have imported ratebeam and Beam
  before the timed cycles.

Timed: ``load_rater`` + ``run_cycle`` (the median of ``--repeat`` runs).  Printed side by side:
seconds, points/s, the speed-up over 1 worker set up per partition, and the DoFn setups the
workers did during the timed cycles (read from each worker, ``dask_runner._setup_count``); every
side's stored totals per scope are compared exactly (decimals) and the run fails if any differs.
The machine's load average is printed before and after: run it on an idle machine.  The usage file, the store and the
SQLite database are on this machine's disk, which every worker shares here; on several hosts they
would be object storage and a database server (docs/dask.md).

    python bench/bench_dask_scaling.py [--scopes 50] [--periods 24] [--series 833] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from bench_end_to_end import START, add_data_arguments, configure, make_usage, stored_totals
from bench_kernel_vs_cloudkitty import points_per_second, print_table

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.pipelines.cycle import run_cycle
from ratebeam.pipelines.rating import load_rater
from ratebeam.pipelines.runners.dask_runner import _setup_count
from ratebeam.pipelines.runners.launch import DASK_RUNNER, dask_cluster

SETUPS = ("partition", "worker")


def cycle(config, periods: int, runner: str, options: list[str]) -> tuple[float, dict[str, int]]:
    """Wall-clock seconds of ``load_rater`` + ``run_cycle`` rating every period, and its figures."""
    engine = make_engine(config.database_url)
    try:
        wall = time.perf_counter()
        rater = load_rater(engine, config.metrics)
        report = run_cycle(config, rater, now=START + timedelta(hours=periods + 2), runner=runner,
                           extra_options=options)
        wall = time.perf_counter() - wall
    finally:
        engine.dispose()
    assert report.ok, report.failures[:3]
    return wall, report.counters


def measure(args: argparse.Namespace, root: Path, usage: Path, points: int, name: str, runner: str,
            options: list[str]) -> dict:
    """Median seconds of ``--repeat`` cycles on fresh workspaces, and the last one's stored totals."""
    runs = []
    for i in range(args.repeat):
        config = configure(root / f"{name}-{i}", usage, args.scopes, args.storage)
        seconds, counters = cycle(config, args.periods, runner, options)
        assert counters["points_written"] == points and counters["periods_committed"] == args.scopes * args.periods
        runs.append(seconds)
    return {"seconds": statistics.median(runs), "totals": stored_totals(config, args.periods)}


def setups(address: str) -> int:
    """The DoFn setups every worker of the cluster at ``address`` did so far."""
    from distributed import Client

    with Client(address, timeout=30) as client:
        return sum(client.run(_setup_count).values())


def on_dask(args: argparse.Namespace, root: Path, usage: Path, points: int, workers: int) -> dict[str, dict]:
    """``measure`` of each ``SETUPS`` on a local cluster of ``workers`` single-threaded workers, after a warm-up."""
    sides = {}
    with dask_cluster(workers) as address:
        options = [f"--dask_client_address={address}", f"--dask_npartitions={2 * workers}"]
        cycle(configure(root / f"warm-{workers}", usage, 1, args.storage), args.periods, DASK_RUNNER, options)
        for setup in SETUPS:
            before = setups(address)
            side = measure(args, root, usage, points, f"dask-{workers}-{setup}", DASK_RUNNER,
                           [*options, f"--dask_setup={setup}"])
            sides[f"Dask, {workers} worker(s), setup per {setup}"] = {**side, "setups": setups(address) - before}
    return sides


def cpu_model() -> str:
    """The processor's model name (Linux), else the machine type."""
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--repeat", type=int, default=1, help="runs per side (median)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ratebeam-bench-dask-") as tmp:
        root = Path(tmp)
        usage = root / "usage.parquet"
        points = make_usage(usage, args.scopes, args.periods, args.series)
        sides = {"FnApiRunner (in process)": measure(args, root, usage, points, "fnapi", "FnApiRunner", [])}
        for workers in (1, 2):
            sides.update(on_dask(args, root, usage, points, workers))
    totals = {name: side["totals"] for name, side in sides.items()}
    baseline = next(iter(totals.values()))
    if any(t != baseline for t in totals.values()) or len(baseline) != args.scopes:
        raise SystemExit(f"TOTALS DIFFER between the sides: { {n: sorted(t.items())[:2] for n, t in totals.items()} }")
    one = sides["Dask, 1 worker(s), setup per partition"]["seconds"]
    print(f"{points:,} points ({args.scopes} scopes x {args.periods} periods x {args.series} series), "
          f"--repeat {args.repeat}; {os.cpu_count()} CPUs ({cpu_model()}), load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} at the end")
    print_table(("side", "median s", "points/s", "vs 1 worker per partition", "DoFn setups"),
                [(name, f"{side['seconds']:.2f}", points_per_second(points, side["seconds"]),
                  f"{one / side['seconds']:.2f}x", str(side.get("setups", "-"))) for name, side in sides.items()])
    print(f"totals equal: yes, {len(baseline)} scopes, {sum(baseline.values()).normalize():f} on each side")


if __name__ == "__main__":
    main()
