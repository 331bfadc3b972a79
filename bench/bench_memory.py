"""Peak memory of one run as its usage grows: the file collector spilling vs holding every sample.

Each size is a ``ratebeam`` cycle (``run_cycle`` on FnApiRunner, file collector → rating → Delta,
the data shape of ``bench_end_to_end.py``: 3 metrics, one sample per series per hour, one Parquet
usage file) over more scopes and more periods.  Each run is its own process, so its peak RSS
(``ru_maxrss``) is its own; side by side in one run:

- ``spill`` — the default: up to ``spill_rows`` samples in memory (default 1,000,000), the rest
  spilled to local Parquet and prepared one scope × a week of periods at a time;
- ``in memory`` — the baseline, the collector as it was before (``spill_rows`` past every size):
  every sample held and every period prepared at once.

Wall-clock seconds are printed too (the spill's cost); stored totals of both are compared exactly.

    python bench/bench_memory.py [--sizes 25x24,50x48,100x48,200x48] [--series 833] [--spill-rows 1000000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import yaml
from bench_end_to_end import START, configure, make_usage, stored_totals
from bench_kernel_vs_cloudkitty import print_table

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.cycle import run_cycle
from ratebeam.pipelines.rating import load_rater

UNBOUNDED = 10**12


def child(workdir: Path, usage: Path, scopes: int, periods: int, spill_rows: int) -> None:
    """One run in this process; prints its seconds, peak RSS and stored total as JSON."""
    config = configure(workdir, usage, scopes, "delta")
    path = workdir / "ratebeam.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["collector"]["spill_rows"] = spill_rows
    doc["collector"]["spill_dir"] = str(workdir)
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    engine = make_engine(config.database_url)
    try:
        wall = time.perf_counter()
        report = run_cycle(config, load_rater(engine, config.metrics), now=START + timedelta(hours=periods + 2))
        wall = time.perf_counter() - wall
    finally:
        engine.dispose()
    assert report.ok and report.counters.get("periods_committed") == scopes * periods, report.counters
    total = sum(stored_totals(config, periods).values())
    print(json.dumps({"seconds": wall, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "points": report.counters["points_written"], "total": str(total)}))


def measure(root: Path, usage: Path, scopes: int, periods: int, spill_rows: int, name: str) -> dict:
    workdir = root / name
    workdir.mkdir()
    command = [sys.executable, __file__, "--child", str(workdir), str(usage), str(scopes), str(periods),
               str(spill_rows)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="25x24,50x48,100x48,200x48", help="scopes x hourly periods, comma-separated")
    parser.add_argument("--series", type=int, default=833)
    parser.add_argument("--spill-rows", type=int, default=1_000_000)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        workdir, usage, scopes, periods, spill_rows = args.child
        child(Path(workdir), Path(usage), int(scopes), int(periods), int(spill_rows))
        return
    rows = []
    for size in args.sizes.split(","):
        scopes, periods = (int(x) for x in size.split("x"))
        with tempfile.TemporaryDirectory(prefix="ratebeam-bench-memory-") as tmp:
            root = Path(tmp)
            usage = root / "usage.parquet"
            points = make_usage(usage, scopes, periods, args.series)
            print(f"{scopes} scopes x {periods} periods x {args.series} series: {points:,} points", flush=True)
            spill = measure(root, usage, scopes, periods, args.spill_rows, "spill")
            held = measure(root, usage, scopes, periods, UNBOUNDED, "memory")
        if spill["total"] != held["total"] or spill["points"] != held["points"] != points:
            raise SystemExit(f"RESULTS DIFFER at {size}: {spill} vs {held}")
        rows.append((f"{points:,}", f"{scopes} x {periods}", f"{spill['peak_rss_mb']:,.0f}",
                     f"{held['peak_rss_mb']:,.0f}", f"{spill['seconds']:.1f}", f"{held['seconds']:.1f}"))
    print()
    print_table(("points", "scopes x periods", "spill RSS MB", "in memory RSS MB", "spill s", "in memory s"), rows)
    print(f"(spill: spill_rows {args.spill_rows:,}; in memory: every sample held, the collector before the spill; "
          "stored totals equal at every size)")


if __name__ == "__main__":
    main()
