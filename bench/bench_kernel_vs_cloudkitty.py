"""Benchmark: ratebeam's hashmap kernel against CloudKitty 25.0.0's own hashmap module.

Why: ratebeam exists to rate far more points per second than CloudKitty's per-point loop, and to
load the rules in a few bulk statements instead of CloudKitty's per-frame reload.  This prints both,
measured on the same input: one rule set (3 services, a 20-value flavor field with tenant overrides,
thresholds, 3 groups, a validity window) and usage of 10k / 100k / 1M points in 100 frames
(20 scopes x 5 hourly periods).

What is timed:
- CloudKitty (``tests/cloudkitty/ck_rate.py`` in its own venv): for every frame, the
  ``reload_config(period begin)`` of the scope's ``HashMap`` and ``process(frame)``, as its
  orchestrator does; reading the files and building DataPoints is not timed.  One run per size.
- ratebeam: ``ratebeam.transforms.hashmap.rate(usage, rules)`` (``--lineage``: with each point's rule
  ids, as a cycle rates) on the frame read by
  ``ratebeam.pipelines.interchange`` (reading not timed), rule compilation included (its cache is
  cleared before every repeat); the median of ``--repeats`` runs.
- SQL statements to load the rules: CloudKitty's counted with a SQLAlchemy ``before_cursor_execute``
  event while rating (it reloads per frame); ratebeam's while ``connectors.sql.rules_repository.
  load_rules`` reads the same rules from a SQLite database (once per run).

Both sides' totals are compared, so a benchmark on wrong prices shows.  Usage:
``.venv/bin/python bench/bench_kernel_vs_cloudkitty.py [--sizes 10000,100000,1000000] [--repeats 5]
[--ck-max-points N]`` (CloudKitty is measured up to N points and extrapolated linearly beyond, which
the table then says).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_RC = Path(os.environ.get("RATEBEAM_RC", ".rc"))
CK_PYTHON = (_RC if _RC.is_absolute() else REPO / _RC) / "cloudkitty-venv" / "bin" / "python"
CK_RATE = REPO / "tests" / "cloudkitty" / "ck_rate.py"

SCOPES = [f"t{n:02d}" for n in range(20)]
BEGINS = [datetime(2024, 3, 1, tzinfo=UTC) + timedelta(hours=h) for h in range(5)]
FLAVORS = [f"m{n}.size" for n in range(1, 21)]
OS = ("linux", "windows", "rhel")
VCPUS = ("1", "2", "4", "8", "16")
VOLUME_TYPES = ("hdd", "ssd", "nvme")


def rules_document() -> dict[str, Any]:
    """3 services, 3 groups, a 20-value flavor field with tenant overrides, thresholds, a window."""
    flavors = [{"value": f, "type": "flat", "cost": str(Decimal("0.0125") * (i + 1)), "group": "compute"}
               for i, f in enumerate(FLAVORS)]
    for t, tenant in enumerate(SCOPES[:5]):
        flavors += [{"value": FLAVORS[(t * 3 + k) % 20], "type": "flat", "cost": str(Decimal("0.011") * (k + 1)),
                     "group": "compute", "tenant_id": tenant} for k in range(5)]
    return {
        "groups": ["compute", "license", "storage"],
        "services": [
            {"name": "instance", "fields": [
                {"name": "flavor_name", "mappings": flavors},
                {"name": "os_distro", "mappings": [
                    {"value": "windows", "type": "rate", "cost": "1.25", "group": "compute"},
                    {"value": "windows", "type": "flat", "cost": "0.04", "group": "license"},
                    {"value": "rhel", "type": "flat", "cost": "0.03", "group": "license",
                     "start": "2024-03-01T02:00:00Z"},
                ]},
                {"name": "vcpus", "thresholds": [
                    {"level": "4", "type": "flat", "cost": "0.005", "group": "license"},
                    {"level": "8", "type": "flat", "cost": "0.01", "group": "license"},
                    {"level": "8", "type": "flat", "cost": "0.0075", "group": "license", "tenant_id": "t00"},
                    {"level": "16", "type": "rate", "cost": "1.2", "group": "license"},
                ]},
            ]},
            {"name": "volume.size",
             "mappings": [{"type": "flat", "cost": "0.0002", "group": "storage"}],
             "thresholds": [{"level": "100", "type": "rate", "cost": "0.9", "group": "storage"},
                            {"level": "1000", "type": "rate", "cost": "0.8", "group": "storage"}],
             "fields": [{"name": "volume_type", "mappings": [
                 {"value": "ssd", "type": "rate", "cost": "2", "group": "storage"},
                 {"value": "nvme", "type": "rate", "cost": "3", "group": "storage", "tenant_id": "t01"},
             ]}]},
            {"name": "ip.floating",
             "mappings": [{"type": "flat", "cost": "0.005"}],
             "thresholds": [{"level": "0", "type": "flat", "cost": "0.01"}]},
        ],
    }


def usage_lines(points: int, seed: int = 42) -> list[str]:
    """``points`` usage points spread evenly over 20 scopes x 5 periods (100 frames)."""
    rng = random.Random(seed)
    lines = []
    for n in range(points):
        scope = SCOPES[n % len(SCOPES)]
        begin = BEGINS[(n // len(SCOPES)) % len(BEGINS)]
        r = rng.random()
        groupby = {"project_id": scope, "id": f"r{rng.randrange(5000)}"}
        metadata: dict[str, str] = {}
        if r < 0.5:
            kind, qty = "instance", "1"
            groupby["flavor_name"] = rng.choice(FLAVORS)
            metadata = {"os_distro": rng.choice(OS), "vcpus": rng.choice(VCPUS)}
        elif r < 0.8:
            kind, qty = "volume.size", str(rng.randrange(1, 3000))
            metadata = {"volume_type": rng.choice(VOLUME_TYPES)}
        elif r < 0.95:
            kind, qty = "ip.floating", "1"
        else:
            kind, qty = "network.bw", f"{rng.randrange(10**6)}.{rng.randrange(1000):03d}"
        lines.append(json.dumps({"type": kind, "qty": qty, "begin": begin.isoformat(),
                                 "end": (begin + timedelta(hours=1)).isoformat(),
                                 "groupby": groupby, "metadata": metadata}))
    return lines


# --- CloudKitty ----------------------------------------------------------------------------------


def cloudkitty(rules: Path, usage: Path, workdir: Path, repeats: int) -> dict[str, Any]:
    """CloudKitty's median rating time over ``repeats`` runs, its statement counts and total price."""
    runs = [_cloudkitty_once(rules, usage, workdir) for _ in range(repeats)]
    seconds = statistics.median(r["rating_seconds"] for r in runs)
    return {**runs[0], "rating_seconds": seconds, "repeats": repeats}


def _cloudkitty_once(rules: Path, usage: Path, workdir: Path) -> dict[str, Any]:
    stats = workdir / "ck_stats.json"
    out = workdir / "ck_rated.jsonl"
    with out.open("w") as sink:
        proc = subprocess.run([str(CK_PYTHON), str(CK_RATE), str(rules), str(usage), "--stats", str(stats)],
                              stdout=sink, stderr=subprocess.PIPE, text=True, check=False)
    if proc.returncode not in (0, 3):
        raise SystemExit(f"ck_rate.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    [result] = json.loads(stats.read_text())
    with out.open("rb") as rated:
        rated.seek(max(0, out.stat().st_size - 4096))
        result["total"] = Decimal(json.loads(rated.read().splitlines()[-1])["summary"]["total"])
    return result


# --- ratebeam ------------------------------------------------------------------------------------


def ratebeam(rules: Path, usage: Path, repeats: int, lineage: bool = False) -> dict[str, Any]:
    """Median kernel time over ``repeats`` runs on the frame ratebeam's reader builds.

    ``lineage``: the kernel also yields each point's rule ids, as in a cycle (``docs/lineage.md``).
    """
    from ratebeam.pipelines.interchange import read_rules, read_usage
    from ratebeam.transforms import hashmap
    from ratebeam.transforms.schema import PRICE

    rule_set = read_rules(rules)
    frame = read_usage(usage)
    times = []
    outcome = None
    for _ in range(repeats):
        hashmap.compile_rules.cache_clear()
        gc.collect()
        started = time.perf_counter()
        outcome = hashmap.rate(frame, rule_set, lineage=lineage)
        times.append(time.perf_counter() - started)
    assert outcome is not None
    total = sum(outcome.rated.get_column(PRICE).to_list(), Decimal(0))
    return {"seconds": statistics.median(times), "total": total, "failures": len(outcome.failures),
            "rules": rule_set}


def ratebeam_load_statements(rule_set: Any, workdir: Path) -> tuple[int, str]:
    """Statements ``rules_repository.load_rules`` issues to read the rule set back from SQLite."""
    try:
        from ratebeam.connectors.sql.migrations import make_engine, upgrade
        from ratebeam.connectors.sql.rules_repository import count_statements, load_rules, replace_rules
    except ImportError as exc:
        return 0, f"ratebeam.connectors.sql.rules_repository unavailable ({exc}): counted 0"
    engine = make_engine(f"sqlite:///{workdir / 'ratebeam_rules.db'}")
    try:
        upgrade(engine)
        replace_rules(engine, rule_set)
        with count_statements(engine) as counter:
            loaded = load_rules(engine)
    finally:
        engine.dispose()
    same = "same rules read back" if _always(loaded) == _always(rule_set) else "rules read back DIFFER"
    return counter.count, same


def _always(rule_set: Any) -> Any:
    """The rule set with every "valid since always" start spelled None (the file says 1970-01-01)."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    mappings = tuple(dataclasses.replace(m, start=None) if m.start is not None and m.start <= epoch else m
                     for m in rule_set.mappings)
    return dataclasses.replace(rule_set, mappings=mappings)


# --- report --------------------------------------------------------------------------------------


def points_per_second(points: int, seconds: float) -> str:
    """``points / seconds`` as text with thousands separators (``-`` for no time)."""
    return f"{points / seconds:,.0f}" if seconds > 0 else "-"


def extrapolated(seconds: float, measured_points: int, points: int) -> float:
    """The seconds for ``points``, linearly from ``seconds`` measured on ``measured_points``."""
    return seconds * points / measured_points


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Right-aligned columns under a dashed rule."""
    table = [header, *rows]
    widths = [max(len(str(r[c])) for r in table) for c in range(len(header))]
    for n, row in enumerate(table):
        print("  ".join(str(v).rjust(w) for v, w in zip(row, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ratebeam kernel vs CloudKitty hashmap throughput")
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ck-repeats", type=int, default=3, help="CloudKitty runs per size below 1M (median)")
    parser.add_argument("--ck-max-points", type=int, default=0,
                        help="measure CloudKitty up to this many points, extrapolate above (0: always measure)")
    parser.add_argument("--lineage", action="store_true",
                        help="time the kernel with lineage (each point's rule ids), as a cycle rates")
    args = parser.parse_args(argv)
    if not CK_PYTHON.exists():
        raise SystemExit(f"CloudKitty venv missing ({CK_PYTHON}): run bash tests/cloudkitty/setup_venv.sh")
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    ck_measured: dict[int, dict[str, Any]] = {}
    sql_ck: dict[str, Any] = {}
    sql_rb: tuple[int, str] = (0, "not measured")
    with tempfile.TemporaryDirectory(prefix="ratebeam-bench-") as tmp:
        workdir = Path(tmp)
        rules = workdir / "rules.json"
        rules.write_text(json.dumps(rules_document(), indent=1))
        for size in sizes:
            usage = workdir / f"usage_{size}.jsonl"
            usage.write_text("\n".join(usage_lines(size)) + "\n")
            rb = ratebeam(rules, usage, args.repeats if size < 1_000_000 else max(1, min(args.repeats, 3)),
                          args.lineage)
            if sql_rb[1] == "not measured":
                sql_rb = ratebeam_load_statements(rb["rules"], workdir)
            if args.ck_max_points and size > args.ck_max_points and ck_measured:
                base_size = max(ck_measured)
                base = ck_measured[base_size]
                ck = {**base, "rating_seconds": extrapolated(base["rating_seconds"], base_size, size), "total": None,
                      "extrapolated_from": base_size}
            else:
                ck = ck_measured[size] = cloudkitty(rules, usage, workdir, 1 if size >= 1_000_000 else
                                                    args.ck_repeats)
                sql_ck = ck
            usage.unlink()
            agree = "n/a" if ck["total"] is None else ("yes" if ck["total"] == rb["total"] else
                                                        f"NO ({ck['total']} vs {rb['total']})")
            rows.append((size, ck, rb, agree))
            print(f"... {size} points done", file=sys.stderr, flush=True)
    print()
    print("Hashmap rating throughput: ratebeam kernel vs CloudKitty 25.0.0 (same rules, same usage, "
          "100 frames = 20 scopes x 5 periods)")
    header = ("points", "CloudKitty s", "CloudKitty pts/s", "ratebeam s (median)", "ratebeam pts/s",
              "speed-up", "totals equal")
    table = []
    for size, ck, rb, agree in rows:
        ck_s = f"{ck['rating_seconds']:.3f}" + (f" (extrapolated from {ck['extrapolated_from']:,})"
                                                 if "extrapolated_from" in ck else "")
        table.append((f"{size:,}", ck_s, points_per_second(size, ck["rating_seconds"]), f"{rb['seconds']:.4f}",
                      points_per_second(size, rb["seconds"]), f"{ck['rating_seconds'] / rb['seconds']:,.1f}x",
                      agree))
    print_table(header, table)
    print(f"(ratebeam: median of {args.repeats} runs, 3 at most for 1M points, rule compilation included; "
          f"CloudKitty: median of {args.ck_repeats} runs, 1 for 1M points, HashMap per scope + reload_config "
          "per frame + process)")
    print()
    print("SQL statements to load the rules")
    low, high = sql_ck.get("reload_statements_min", 0), sql_ck.get("reload_statements_max", 0)
    print(f"  CloudKitty: {low}-{high} per reload_config (one scope, one period; more for scopes with tenant "
          f"rules), {sql_ck.get('rating_statements', 0):,} in total for {sql_ck.get('frames', 0)} frames "
          f"({len(SCOPES)} HashMap constructions included)")
    print(f"  ratebeam:   {sql_rb[0]} for all scopes and periods, once per run ({sql_rb[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
