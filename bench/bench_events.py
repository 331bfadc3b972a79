"""Benchmark: the event stream (``ratebeam events serve`` on Prism) beside the polling cycle, on the same lifecycles.

What is built (not timed): ``--instances`` Nova instances over 10 tenants, each created (m1.small),
resized (m1.medium) 45 minutes later and deleted 2 h 20 after its create, creates spread over one
hour: three notifications each, published by a real oslo.messaging Notifier (tests/bus_support.py)
to a private RabbitMQ; the same lifecycles polled once a minute (one sample of 60 active seconds
per instance and minute, ``sum``) as a CSV usage file for the file collector.

What is timed:

* **events, throughput** — from the first publish to the moment the inbox has every lifecycle
  notification finished (its frame stored in the Delta table and committed): notifications per
  second through the whole streaming path (bus → SQL inbox → Beam on Prism → definitions →
  trigger instances in state → lifecycle usage → frames → rating → Delta → commit).
* **events, latency** — for ``--latency`` more lifecycles, one at a time once the stream is idle:
  from publishing the delete (with a later notification that moves event time past the period
  + ``fire_delay``, as the next notification of a busy cloud does) to its frame committed.  With
  ``wall_clock_lag`` event time would also move with the clock; ``fire_delay`` is the wait added.
* **polling** — ``ratebeam run`` (file collector, FnApiRunner) over the same lifecycles once every
  period is due: its run time, and the latency polling has by construction: a period is rated
  ``wait_periods`` periods after it ends (CloudKitty's semantics), by the next cycle.

Asserted: both sides store the same rated total.  Usage: ``.venv/bin/python bench/bench_events.py
[--instances 100] [--latency 2]`` (RATEBEAM_RC must hold prism; ~10 s at 100 instances and ~50 s at
500 on 2 cores).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import kombu
import sqlalchemy as sa
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bus_support import message, notifier, nova_instance, publish
from pipeline_support import ratebeam, stored_rows, workspace
from servers import prism, rabbitmq
from test_events_stream import RULES, Serving, engine_of, events_workspace, unfinished

from ratebeam.connectors.sql.models import EventFrame

DAY = datetime(2026, 3, 2, tzinfo=UTC)
TENANTS = 10
LIFETIME = timedelta(hours=2, minutes=20)
RESIZE = timedelta(minutes=45)
QUEUE = "bench-events"


def lifecycles(count: int, start: datetime) -> list[tuple[str, str, datetime, datetime, datetime]]:
    """(instance, tenant, created, resized, deleted) of ``count`` instances created over an hour from ``start``."""
    out = []
    for k in range(count):
        created = start + timedelta(seconds=(3600 * k) // max(count, 1))
        out.append((f"vm-{k:05d}", f"tenant-{k % TENANTS:02d}", created, created + RESIZE, created + LIFETIME))
    return out


def notifications(items) -> list[dict]:
    msgs = []
    for vm, tenant, created, resized, deleted in items:
        msgs.append(message("compute.instance.create.end", nova_instance(vm, tenant, "m1.small", created), created,
                            message_id=f"create-{vm}"))
        msgs.append(message("compute.instance.resize.confirm.end", nova_instance(vm, tenant, "m1.medium", resized),
                            resized, message_id=f"resize-{vm}"))
        msgs.append(message("compute.instance.delete.end", nova_instance(vm, tenant, "m1.medium", deleted), deleted,
                            message_id=f"delete-{vm}"))
    # In time order, as a cloud emits them: published instance by instance, the later creates would be
    # hours behind the deletes already read, past fire_delay, and rightly recorded late, not billed.
    return sorted(msgs, key=lambda m: (m["timestamp"], m["message_id"]))


def clock(at: datetime) -> dict:
    """A notification no lifecycle ends with (an instance created at ``at``): it moves event time to ``at``."""
    return message("compute.instance.create.end", nova_instance(f"clock-{at:%H%M}", "clock", "m1.small", at), at,
                   message_id=f"clock-{at.isoformat()}")


def polled_csv(path: Path, items) -> None:
    """The lifecycles as polling sees them: one sample a minute, 60 active seconds, with the flavor of that minute."""
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["metric", "timestamp", "value", "project_id", "instance_id", "flavor_name"])
        for vm, tenant, created, resized, deleted in items:
            minute = created
            while minute < deleted:
                flavor = "m1.small" if minute < resized else "m1.medium"
                writer.writerow(["instance", minute.strftime("%Y-%m-%dT%H:%M:%SZ"), 60, tenant, vm, flavor])
                minute += timedelta(minutes=1)


def frame_committed(config: Path, scope: str, begin: datetime) -> bool:
    engine = engine_of(config)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(EventFrame.points).where(
                EventFrame.scope == scope, EventFrame.period_begin == begin)).first() is not None
    finally:
        engine.dispose()


def consuming(url: str, queue: str) -> bool:
    """Whether the job reads ``queue`` already (its consumer is on the broker): the job has started."""
    with kombu.Connection(url.replace("rabbit://", "amqp://")) as conn:
        try:
            return conn.default_channel.queue_declare(queue, passive=True).consumer_count > 0
        except conn.channel_errors:  # not declared yet
            return False


def wait(condition, what: str, serving: Serving, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}: {serving.log()[-3000:]}")
        time.sleep(0.05)


def bench_events(root: Path, url: str, endpoint: str, items, latency: int) -> dict:
    config = events_workspace(root, url, QUEUE)
    serving = Serving(config, endpoint)
    try:
        wait(lambda: consuming(url, QUEUE), "the job to read the queue", serving)
        msgs = notifications(items)
        with notifier(url, "nova", "compute.host-1") as n:
            start = time.monotonic()
            for msg in msgs:
                publish(n, msg)
            published = time.monotonic() - start
            publish(n, clock(DAY + timedelta(hours=8)))
        wait(lambda: unfinished(config) == 1, "every lifecycle notification finished", serving)
        elapsed = time.monotonic() - start
        latencies = []
        for k in range(latency):
            created = DAY + timedelta(hours=10 + 4 * k)
            vm, tenant = f"lat-{k}", "tenant-lat"
            with notifier(url, "nova", "compute.host-1") as n:
                publish(n, message("compute.instance.create.end", nova_instance(vm, tenant, "m1.small", created),
                                   created, message_id=f"create-{vm}"))
                time.sleep(1.0)  # the stream is idle again before the end event
                t0 = time.monotonic()
                publish(n, message("compute.instance.delete.end", nova_instance(vm, tenant, "m1.small",
                                   created + timedelta(minutes=30)), created + timedelta(minutes=30),
                                   message_id=f"delete-{vm}"))
                publish(n, clock(created + timedelta(hours=3)))
            wait(lambda t=tenant, c=created: frame_committed(config, t, c.replace(minute=0)), "the end event's frame", serving)
            latencies.append(time.monotonic() - t0)
    finally:
        serving.stop()
    rows = stored_rows(config)
    lifecycle_rows = rows.filter(~rows["scope_id"].is_in(["tenant-lat", "clock"]))
    return {"messages": len(msgs), "published_s": published, "elapsed_s": elapsed,
            "latencies": latencies, "total": sum(lifecycle_rows["price"].to_list(), Decimal(0))}


def bench_polling(root: Path, items) -> dict:
    config = workspace(root)
    doc = yaml.safe_load(config.read_text())
    doc["collector"] = {"backend": "file", "url": "polled.csv"}
    doc["fetcher"] = {"backend": "source", "scopes": sorted({t for _, t, *_ in items})}
    doc["metrics"] = "metrics-events.yml"
    config.write_text(yaml.safe_dump(doc))
    (root / "metrics-events.yml").write_text(yaml.safe_dump({"metrics": {"instance": {
        "unit": "second", "groupby": ["instance_id", "flavor_name"], "extra_args": {"aggregation_method": "sum"}}}}))
    (root / "rules.json").write_text(__import__("json").dumps(RULES))
    polled_csv(root / "polled.csv", items)
    for args in (("db", "upgrade", "-c", str(config)), ("rules", "import", "-c", str(config), str(root / "rules.json"))):
        done = ratebeam(*args)
        assert done.returncode == 0, done.stderr
    now = (DAY + timedelta(hours=12)).isoformat()  # every period of the lifecycles is due (wait_periods after it)
    start = time.monotonic()
    done = ratebeam("run", "-c", str(config), "--now", now)
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-2000:]
    rows = stored_rows(config)
    return {"elapsed_s": elapsed, "total": sum(rows["price"].to_list(), Decimal(0)), "wait_periods": doc.get("wait_periods", 2),
            "period": doc.get("period", 3600)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--latency", type=int, default=2, help="single lifecycles timed for the latency")
    args = parser.parse_args()
    items = lifecycles(args.instances, DAY + timedelta(hours=3))
    with tempfile.TemporaryDirectory(prefix="bench-events-") as tmp, rabbitmq.running() as url, \
            prism.running() as endpoint:
        events = bench_events(Path(tmp) / "events", url, endpoint, items, args.latency)
        polling = bench_polling(Path(tmp) / "polling", items)
    n = events["messages"]
    lat = events["latencies"]
    print(f"{args.instances} lifecycles (create, resize, delete): {n} notifications, hourly periods, Prism LOOPBACK")
    print(f"{'side':>34}  {'seconds':>8}  {'notifications/s':>15}  {'end event -> stored row':>24}")
    print(f"{'-' * 34}  {'-' * 8}  {'-' * 15}  {'-' * 24}")
    print(f"{'events serve (bus to Delta)':>34}  {events['elapsed_s']:8.2f}  {n / events['elapsed_s']:15,.0f}  "
          f"{f'median {statistics.median(lat):.2f} s (max {max(lat):.2f})' if lat else '-':>24}")
    wait_h = polling["wait_periods"] * polling["period"] / 3600
    print(f"{'ratebeam run (file, FnApiRunner)':>34}  {polling['elapsed_s']:8.2f}  {'-':>15}  "
          f"{f'>= {wait_h:g} h + the next cycle':>24}")
    print(f"(publishing alone took {events['published_s']:.2f} s; polling rates a period only {polling['wait_periods']} "
          "periods after it ends)")
    same = events["total"] == polling["total"]
    print(f"rated totals equal: {'yes' if same else 'NO'}: events {events['total']}, polling {polling['total']}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
