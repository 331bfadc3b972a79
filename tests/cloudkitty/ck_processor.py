"""Time CloudKitty 25.0.0's own processor path on usage points: the reference of the end-to-end bench.

Runs INSIDE CloudKitty's virtual environment (``tests/cloudkitty/setup_venv.sh``), like
``ck_rate.py``, whose rules loader and exact-decimal SQLite schema it reuses (it imports it).

What runs is CloudKitty's own code, as ``cloudkitty-processor`` runs it for each scope
(``CloudKittyProcessor.process_scope``): an ``orchestrator.Worker`` is built for the scope (it loads
the enabled rating modules for the tenant: ``hashmap``, enabled here, and ``noop``, always on, plus
metrics.yml) and ``Worker.run()`` processes every due period, each one as
``do_execute_scope_processing``: ``refresh_rating_rules`` (``reload_config`` of every module for the
period), collection of every metric in the worker's thread pool (``Worker._collect`` →
``collector.retrieve`` → the Prometheus collector's ``fetch_all``: ``build_query``, the HTTP call,
``_format_data`` and ``_create_data_point`` per series), ``execute_measurements_rating`` (the
``DataFrame``, a deep copy and ``process`` per module), ``persist_rating_data`` (``as_dict``, the
``skip_datapoints_expression`` per point, ``DataFrame.from_dict``, then ``storage.push``) and the
scope's state update.  Its database is ``ck_rate``'s in-memory SQLite (CloudKitty's hashmap, module
and scope-state tables; oslo.db's per-check-in eventlet sleep off, as ck_rate says), so every rules
reload and state query is a real query, without a network.  Not run: the processor's fetcher, its
tooz lock per scope, and its sleep between cycles.

Stubbed, and excluded from the time:
- Prometheus' HTTP answer: the collector's client (``_conn``) returns the parsed JSON answer of each
  instant query (``{"status": "success", "data": {"result": [{"metric": labels, "value": [t, qty]}]}}``),
  prepared before the scope is timed from the usage points of that scope.  The points are already
  converted (``bench/converted_usage.py``: ratebeam's collection and metrics.yml conversion), so the
  metrics given to CloudKitty keep their names, units, groupby and metadata but have ``factor: 1``,
  ``offset: 0`` and ``mutate: NONE``: CloudKitty still runs its conversion code, on values that need none.
- The storage driver: ``push`` receives the frame and adds its points and prices up; the time spent
  in it is subtracted.
- The clock: ``tzutils.localized_now`` returns ``--now``, so ``Worker.run()`` stops after the last
  period that is due then, as in the ratebeam cycle it is compared with.

Timed: per scope, from the ``Worker`` construction to the end of its ``run()``, summed over the
scopes.  Not timed: interpreter start, CloudKitty's import, loading the rules, reading the usage file
and preparing the answers.

Usage::

    ck_processor.py RULES METRICS USAGE --now ISO [--period 3600] [--max-points N]

``USAGE`` is interchange usage JSONL sorted by scope (whole scopes are taken until ``--max-points``
would be passed, at least one).  Prints one JSON object: points, frames, scopes, seconds (wall
clock) and cpu_seconds (the process's CPU time, all threads: what a shared machine does not
inflate), total and totals per scope (exact decimals as strings).  Exit 3 when a scope's worker
raised or a period was not pushed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Context, Decimal
from pathlib import Path
from typing import Any

import ck_rate  # configures CloudKitty's options and its database; see ck_rate's docstring
import yaml
from cloudkitty import collector as ck_collector
from cloudkitty import orchestrator
from cloudkitty.db import api as ck_db_api
from cloudkitty.db.sqlalchemy import models as ck_models
from cloudkitty.rating.pyscripts.db.sqlalchemy import models as pyscripts_models
from cloudkitty.storage_state import models as state_models
from cloudkitty.utils import tz as tzutils
from oslo_config import cfg

EXIT_FAILED = 3
_WIDE = Context(prec=200)
_EMPTY = {"status": "success", "data": {"resultType": "vector", "result": []}}


class PrometheusAnswers:
    """Stands for the collector's Prometheus client: the parsed answer of each instant query.

    An answer is handed over once and forgotten, as a parsed HTTP answer would be.
    """

    def __init__(self) -> None:
        self.answers: dict[tuple[str, datetime], dict[str, Any]] = {}

    def get_instant(self, query: str, time: str | None = None, timeout: str | None = None) -> dict[str, Any]:
        return self.answers.pop((query, datetime.fromisoformat(time)), _EMPTY)


def clock() -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds of the process), to subtract from a later reading."""
    return time.perf_counter(), time.process_time()


class CountingStorage:
    """Stands for the storage driver: counts what ``push`` receives, and the time spent doing so."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self.frames: dict[str, int] = {}
        self.points: dict[str, int] = {}
        self.totals: dict[str, Decimal] = {}

    def push(self, dataframes: list[Any], scope_id: str | None = None) -> None:
        wall, cpu = clock()
        total = self.totals.get(scope_id, Decimal(0))
        count = 0
        for frame in dataframes:
            for _, point in frame.iterpoints():
                total = _WIDE.add(total, point.price)
                count += 1
        self.totals[scope_id] = total
        self.points[scope_id] = self.points.get(scope_id, 0) + count
        self.frames[scope_id] = self.frames.get(scope_id, 0) + len(dataframes)
        self.seconds += time.perf_counter() - wall
        self.cpu_seconds += time.process_time() - cpu


def converted_metrics(metrics_yml: Path, out: Path) -> None:
    """``metrics_yml`` with an identity conversion: the usage points given are converted already."""
    doc = yaml.safe_load(metrics_yml.read_text())
    for entry in doc["metrics"].values():
        for metric in entry if isinstance(entry, list) else [entry]:
            metric.update(factor=1, offset=0, mutate="NONE")
            metric.pop("mutate_map", None)
    out.write_text(yaml.safe_dump(doc))


def prepare_database() -> None:
    """CloudKitty's module-state, scope-state and pyscripts tables beside ck_rate's; hashmap enabled."""
    for base in (ck_models.Base, state_models.Base, pyscripts_models.Base):
        base.metadata.create_all(ck_rate.ENGINE)
    ck_db_api.get_instance().get_module_info().set_state("hashmap", True)


def scopes_of(usage: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(scope, its points) for each run of consecutive lines of one scope."""
    with usage.open(encoding="utf-8") as lines:
        records = (json.loads(line) for line in lines if line.strip())
        for scope, points in itertools.groupby(records, key=lambda p: p["scope"]):
            yield scope, list(points)


def answers_for(collector: Any, scope: str, points: list[dict[str, Any]], period: int) -> dict:
    """The Prometheus answer of every query the scope's worker will make, keyed as the stub looks it up."""
    key_of = {conf.get("alt_name", key): key for key, conf in collector.conf.items()}
    scope_key = cfg.CONF.collect.scope_key
    answers: dict[tuple[str, datetime], dict[str, Any]] = {}
    for point in points:
        metric = key_of[point["type"]]
        conf = collector.conf[metric]
        begin = datetime.fromisoformat(point["begin"]).astimezone(UTC)
        end = begin + timedelta(seconds=period)
        query = collector.build_query(collector.conf, metric, begin, end, scope_key, scope,
                                      conf["groupby"], conf["metadata"])
        labels = {k: v for k, v in {**point.get("groupby", {}), **point.get("metadata", {})}.items() if v != ""}
        answer = answers.setdefault((query, end), {"status": "success",
                                                   "data": {"resultType": "vector", "result": []}})
        answer["data"]["result"].append({"metric": labels, "value": [end.timestamp(), point["qty"]]})
    return answers


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run every scope's worker (module docstring) and return the JSON stats."""
    collector = ck_collector.get_collector()
    prometheus = collector._conn = PrometheusAnswers()
    storage = CountingStorage()
    seconds, cpu_seconds, points, failed = 0.0, 0.0, 0, []
    for scope, scope_points in scopes_of(args.usage):
        if args.max_points and points and points + len(scope_points) > args.max_points:
            break
        prometheus.answers = answers_for(collector, scope, scope_points, args.period)
        points += len(scope_points)
        pushed, pushed_cpu = storage.seconds, storage.cpu_seconds
        wall, cpu = clock()
        try:
            orchestrator.Worker(collector, storage, scope, 0).run()
        except Exception as exc:  # CloudKitty logs and retries later; here the measure is void
            failed.append(f"{scope}: {type(exc).__name__}: {exc}")
        seconds += time.perf_counter() - wall - (storage.seconds - pushed)
        cpu_seconds += time.process_time() - cpu - (storage.cpu_seconds - pushed_cpu)
        frames = {p["begin"] for p in scope_points}
        if prometheus.answers:
            failed.append(f"{scope}: {len(prometheus.answers)} prepared answer(s) never asked for")
        if storage.frames.get(scope, 0) != len(frames) or storage.points.get(scope, 0) != len(scope_points):
            failed.append(f"{scope}: {len(frames)} periods of {len(scope_points)} points collected, "
                          f"{storage.frames.get(scope, 0)} frames of {storage.points.get(scope, 0)} points pushed")
    total = Decimal(0)
    for scope_total in storage.totals.values():
        total = _WIDE.add(total, scope_total)
    return {
        "points": sum(storage.points.values()), "points_read": points, "frames": sum(storage.frames.values()),
        "scopes": len(storage.frames), "seconds": seconds, "cpu_seconds": cpu_seconds,
        "push_seconds_excluded": storage.seconds,
        "total": format(total, "f"), "totals": {s: format(t, "f") for s, t in storage.totals.items()},
        "failed": failed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rules", type=Path)
    parser.add_argument("metrics", type=Path)
    parser.add_argument("usage", type=Path)
    parser.add_argument("--now", required=True, help="CloudKitty's clock (ISO-8601)")
    parser.add_argument("--period", type=int, default=3600)
    parser.add_argument("--max-points", type=int, default=0, help="whole scopes up to this many points (0: all)")
    args = parser.parse_args(argv)

    ck_rate.load_rules(args.rules)
    prepare_database()
    now = datetime.fromisoformat(args.now).astimezone(tzutils._LOCAL_TZ)
    tzutils.localized_now = lambda: now
    cfg.CONF.set_override("collector", "prometheus", "collect")
    cfg.CONF.set_override("period", args.period, "collect")
    with tempfile.TemporaryDirectory(prefix="ck-processor-") as tmp:  # each Worker reads metrics.yml
        metrics = Path(tmp) / "metrics.yml"
        converted_metrics(args.metrics, metrics)
        cfg.CONF.set_override("metrics_conf", str(metrics), "collect")
        stats = measure(args)
    print(json.dumps(stats))
    return EXIT_FAILED if stats["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
