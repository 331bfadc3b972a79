"""Benchmark: a whole rating cycle from a real Prometheus, batched collection (the default) vs per scope.

What is built (not timed): ``--scopes`` scopes × ``--periods`` hours of one-minute samples of the
three metrics of the Prometheus pipeline tests (``tests/test_prometheus_pipeline.py``: instances by
flavor and OS, volume bytes, a network counter through ``rate()``; per scope 2 instances, 1 volume,
1 interface), backfilled with ``promtool`` into a private Prometheus 2.42 started as the tests start
theirs (``tests/servers/prometheus.py``).

What is timed, per mode and repeat (the modes alternate): one cycle in-process, the one ``ratebeam
run`` runs (``run_cycle``: the scopes from the ``source`` fetcher, plan, collect from Prometheus,
convert, rate with the tests' hashmap rules, write to the embedded store, commit), on a fresh
workspace (SQLite state and rules, an empty store) at the end of the history + 1 h: every scope ×
period is due.  Modes: ``batched: false`` (the baseline: CloudKitty's one query per scope × period ×
metric) and the collector's default (one query per period × metric for all scopes).

Counted: Prometheus HTTP requests, by ratebeam (``ratebeam/prometheus_requests``, the figure the run
summary prints) and by the server (its ``prometheus_http_requests_total`` for ``/api/v1/query``, read
from ``/metrics`` before and after): the two must agree.  Asserted: no failed frame, every frame
committed, and the same stored rows in every run of both modes.

Usage: ``.venv/bin/python bench/bench_prometheus_cycle.py [--scopes 50] [--periods 24] [--repeat 3]
[--storage delta]`` (about 2 minutes at the default size on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import polars as pl
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipeline_support import stored_rows
from servers.prometheus import GIB, START, PrometheusServer, Series, backfilled
from test_prometheus_pipeline import FLAVOR_COST, METRICS, prepare, workspace

from ratebeam.pipelines.cycle import run_cycle

#: The per-scope baseline first, then the default; (label, the collector's ``batched`` key).
MODES = (("per scope (batched: false)", False), ("batched (default)", None))
SAMPLES_PER_HOUR = 60


def scope_ids(scopes: int) -> list[str]:
    return [f"project-{i:03d}" for i in range(scopes)]


def bench_series(scopes: int, periods: int) -> tuple[Series, ...]:
    """Per scope: 2 instances (flavors priced by the tests' rules), 1 volume, 1 network counter."""
    samples = periods * SAMPLES_PER_HOUR
    flavors = sorted(FLAVOR_COST)
    out: list[Series] = []
    for i, scope in enumerate(scope_ids(scopes)):
        out += [Series("ratebeam_instance_up", "gauge",
                       {"project_id": scope, "id": f"{scope}-vm{n}", "flavor_name": flavors[(i + n) % len(flavors)],
                        "os_distro": "linux"}, (1.0,) * samples) for n in range(2)]
        out.append(Series("ratebeam_volume_bytes", "gauge", {"project_id": scope, "id": f"{scope}-vol", "volume_type": "ssd"},
                          tuple(float(GIB * (1 + (i + k // SAMPLES_PER_HOUR) % 50)) for k in range(samples))))
        out.append(Series("ratebeam_net_bytes", "counter", {"project_id": scope, "interface": "eth0"},
                          tuple(1000.0 + 60.0 * (i + 1) * k for k in range(samples))))
    return tuple(out)


def cycle(root: Path, server: PrometheusServer, scopes: int, periods: int, batched: bool | None,
          storage: str) -> tuple[float, int, int, pl.DataFrame]:
    """One fresh workspace and cycle: (seconds, ratebeam's requests, the server's, stored rows)."""
    path = workspace(root, server.api, batched=batched, fetcher={"backend": "source", "scopes": scope_ids(scopes)})
    doc = json.loads(path.read_text())
    doc["storage"] = {"backends": [{"backend": storage, "url": "rated"}]}
    path.write_text(json.dumps(doc))
    now = START + timedelta(hours=periods + 1)  # wait_periods 1: hours 0 .. periods-1 are due
    with contextlib.redirect_stdout(io.StringIO()):  # "enabled the hashmap rating module ..."
        config, rater = prepare(path)
    before = server.queries_answered()
    began = time.perf_counter()
    report = run_cycle(config, rater, now=now)
    elapsed = time.perf_counter() - began
    served = server.queries_answered() - before
    assert report.ok, report.failures[:3]
    assert report.counters["periods_committed"] == scopes * periods, report.counters
    return elapsed, report.counters["prometheus_requests"], served, stored_rows(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scopes", type=int, default=50)
    parser.add_argument("--periods", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--storage", choices=("delta", "parquet"), default="delta",
                        help="the embedded store (default: delta)")
    args = parser.parse_args()
    series = bench_series(args.scopes, args.periods)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "prometheus").mkdir()
        with backfilled(root / "prometheus", series) as server:
            build = requests.get(f"{server.api}/status/buildinfo", timeout=30).json()["data"]["version"]
            print(f"Prometheus {build} at {server.url}: {args.scopes} scopes x {args.periods} periods x "
                  f"{len(METRICS)} metrics, {len(series) * args.periods * SAMPLES_PER_HOUR:,} samples; "
                  f"{args.storage} store; median of {args.repeat}; load average {os.getloadavg()[0]:.1f} "
                  f"on {os.cpu_count()} cores")
            runs: dict[str, list[tuple[float, int, int]]] = {label: [] for label, _ in MODES}
            reference = None
            for i in range(args.repeat):
                for label, batched in MODES:
                    seconds, counted, served, rows = cycle(root / f"{i}-{batched}", server, args.scopes,
                                                           args.periods, batched, args.storage)
                    assert counted == served, (label, counted, served)
                    reference = rows if reference is None else reference
                    assert rows.equals(reference), f"{label}: stored rows differ from the first run's"
                    runs[label].append((seconds, counted, served))
    print(f"{'mode':<28} {'requests':>9} {'server':>8} {'median s':>9} {'stored rows':>12}")
    medians = {}
    for label, results in runs.items():
        seconds = statistics.median(r[0] for r in results)
        counted = statistics.median(r[1] for r in results)
        served = statistics.median(r[2] for r in results)
        medians[label] = (seconds, counted)
        print(f"{label:<28} {counted:>9,.0f} {served:>8,.0f} {seconds:>9.2f} {reference.height:>12,}")
    (slow_s, slow_n), (fast_s, fast_n) = medians.values()
    print(f"ratio per scope / batched: {slow_n / fast_n:.1f}x requests, {slow_s / fast_s:.2f}x wall time")


if __name__ == "__main__":
    main()
