"""The event stream catching up on a backlog: nothing late, nothing lost, nothing billed twice.

Real RabbitMQ, real Prism, ``ratebeam events serve`` as a subprocess (``test_events_stream.Serving``).
The notifications are Nova's legacy ``compute.instance.create.end`` / ``delete.end``
(``tests/bus_support.py``: seed 002's payload keys), in oslo.messaging's v2 envelope.

* **Down longer than ``wall_clock_lag``** (the default configuration: lag 600 s, prefetch 500,
  fire_delay 5 min): hundreds of lifecycles whose notifications were published in real time over an
  hour that ended more than ``wall_clock_lag`` ago are on the queue when the job starts — more than
  one prefetch window of them.  Nothing is late and the stored rows are the hand computation (each
  instance's seconds in each hour, times its flavor's price).  Before the catch-up rule the first
  poll moved event time to the wall clock minus the lag and every notification read after it was
  late: deletes lost, instances billed as running.
* **SIGTERM while notifications are published**, the job down longer than the lag while they go on,
  then started again on the backlog: its rows equal, row by row, those of a job on a second queue
  bound to the same exchanges that ran throughout, and the hand computation (short periods and lags
  here, so that real-time notifications close their periods within the test).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import sqlalchemy as sa
import yaml
from bus_support import message, nova_instance, publish_many
from pipeline_support import setup_database, stored_rows, workspace
from servers.rabbitmq import rabbitmq_url  # noqa: F401  (session fixture)
from test_events_stream import RULES, Serving, engine_of, late, unfinished, wait_for

from ratebeam.connectors.notifications.client import NotificationConsumer
from ratebeam.connectors.sql.models import EventInbox
from ratebeam.pipelines.config import load_config

pytest_plugins = ["servers.prism"]  # the prism_endpoint session fixture

#: Per-second prices of the flavors (test_events_stream.RULES).
PRICES = {"m1.small": Decimal("0.0000125"), "m1.medium": Decimal("0.000025")}
TENANTS = [f"tenant-{k}" for k in range(8)]


@dataclass(frozen=True)
class Life:
    """One instance: created and deleted at these instants (UTC, whole seconds)."""

    instance: str
    tenant: str
    flavor: str
    created: datetime
    deleted: datetime


def lives(count: int, first: datetime, step: float, length: Callable[[int], float]) -> list[Life]:
    """``count`` instances created ``step`` seconds apart from ``first``, instance k living ``length(k)`` s."""
    out = []
    for k in range(count):
        created = first + timedelta(seconds=round(k * step))
        out.append(Life(f"vm-{k:04d}", TENANTS[k % len(TENANTS)], "m1.small" if k % 3 else "m1.medium", created,
                        created + timedelta(seconds=round(length(k)))))
    return out


def notifications(items: list[Life]) -> list[tuple[datetime, tuple[str, dict]]]:
    """(instant, (exchange, message)) of every create and delete, in time order (as published in real time)."""
    out = []
    for life in items:
        payload = nova_instance(life.instance, life.tenant, life.flavor, life.created)
        out.append((life.created, ("nova", message("compute.instance.create.end", payload, life.created,
                                                   message_id=f"create-{life.instance}"))))
        gone = {**payload, "deleted_at": str(life.deleted.replace(tzinfo=None)), "state": "deleted"}
        out.append((life.deleted, ("nova", message("compute.instance.delete.end", gone, life.deleted,
                                                   message_id=f"delete-{life.instance}"))))
    return sorted(out, key=lambda item: (item[0], item[1][1]["message_id"]))


def hand_computation(items: list[Life], period: int) -> list[tuple]:
    """(scope, period begin, instance, flavor, seconds, price): each instance's seconds in each period."""
    rows = []
    for life in items:
        begin = datetime.fromtimestamp(life.created.timestamp() // period * period, UTC)
        while begin < life.deleted:
            end = begin + timedelta(seconds=period)
            seconds = int((min(end, life.deleted) - max(begin, life.created)).total_seconds())
            rows.append((life.tenant, begin, life.instance, life.flavor, Decimal(seconds),
                         Decimal(seconds) * PRICES[life.flavor]))
            begin = end
    return sorted(rows)


def stored(config: Path) -> list[tuple]:
    """The stored rows in :func:`hand_computation`'s shape."""
    frame = stored_rows(config)
    if frame.is_empty():
        return []
    return sorted((r["scope_id"], r["begin"], r["groupby.instance_id"], r["groupby.flavor_name"], Decimal(r["qty"]),
                   Decimal(r["price"])) for r in frame.iter_rows(named=True))


def events_config(root: Path, url: str, queue: str, database_url: str | None = None, **source: object) -> Path:
    """A workspace whose events section is the default but for the bus (and ``source``'s keys)."""
    import json

    config = workspace(root, database_url)
    doc = yaml.safe_load(config.read_text())
    doc["events"] = {"source": {"transport_url": url, "exchanges": ["nova"], "queue": queue, **source}}
    config.write_text(yaml.safe_dump(doc))
    (root / "rules.json").write_text(json.dumps(RULES))
    setup_database(config)
    events = load_config(config, metrics=False).events
    assert events is not None and events.source is not None
    NotificationConsumer(events.source).declare()  # as `events serve` does first: the queue keeps what comes
    return config


def done_or_late(config: Path, count: int) -> bool:
    """The ``count`` notifications recorded and finished (every instance deleted: every one billed), or one late."""
    return (recorded(config) == count and unfinished(config) == 0) or bool(late(config))


def recorded(config: Path) -> int:
    """How many notifications the inbox holds."""
    engine = engine_of(config)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(EventInbox)).scalar_one()
    finally:
        engine.dispose()


def test_a_backlog_older_than_the_wall_clock_lag_is_billed_in_full_after_a_long_outage(tmp_path, rabbitmq_url,  # noqa: F811
                                                                                        prism_endpoint):
    config = events_config(tmp_path / "ws", rabbitmq_url, "rb-catch-up")
    assert load_config(config, metrics=False).events.source.wall_clock_lag == 600  # the default configuration
    now = datetime.now(UTC)
    first = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    # 320 instances created 5 s apart over 27 min, living 30-51 min: every one deleted before
    # first + 2 h, so every period is closed (+ fire_delay) once event time reaches now - 600 s.
    items = lives(320, first, 5, lambda k: 1800 + 13 * (k % 100))
    messages = notifications(items)
    assert len(messages) > 500  # more than one prefetch window
    assert messages[-1][0] < now - timedelta(seconds=600)  # the job has been down longer than the lag
    publish_many(rabbitmq_url, [m for _, m in messages])
    serving = Serving(config, prism_endpoint)
    try:
        wait_for(lambda: done_or_late(config, len(messages)), "the backlog to be billed", serving, config,
                 timeout=900)
    finally:
        code = serving.stop()
    assert code == 0, serving.log()
    assert late(config) == []
    assert stored(config) == hand_computation(items, 3600)


def test_a_job_stopped_while_notifications_come_and_started_on_the_backlog_stores_the_rows_of_one_never_stopped(
        tmp_path, rabbitmq_url, prism_endpoint):  # noqa: F811
    # Real-time notifications close their periods within the test: 60 s periods, 10 s fire_delay and lag.
    fast = {"wall_clock_lag": 10, "poll_seconds": 0.5}
    steady_config = events_config(tmp_path / "steady", rabbitmq_url, "rb-steady", **fast)
    stopped_config = events_config(tmp_path / "stopped", rabbitmq_url, "rb-stopped", **fast)
    for config in (steady_config, stopped_config):
        doc = yaml.safe_load(config.read_text())
        doc["period"] = 60
        shipped = yaml.safe_load((Path(__file__).parents[1] / "pipelines" / "events" / "data" / "triggers.yaml")
                                 .read_text())
        for trigger in shipped:
            trigger["fire_delay"] = 10
        (config.parent / "triggers.yaml").write_text(yaml.safe_dump(shipped))
        doc["events"]["triggers"] = "triggers.yaml"
        config.write_text(yaml.safe_dump(doc))
    steady = Serving(steady_config, prism_endpoint)
    stopped = Serving(stopped_config, prism_endpoint)
    published: list[Life] = []
    try:
        for serving, config in ((steady, steady_config), (stopped, stopped_config)):
            wait_for(lambda s=serving: "events serve: run" in s.log(), "the job to start", serving, config)
        start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
        items = lives(120, start, 0.5, lambda k: 20 + (k * 7) % 70)  # creates over 60 s, lives of 20-90 s
        schedule = notifications(items)
        sender = threading.Thread(target=_publish_in_real_time, args=(rabbitmq_url, schedule))
        sender.start()
        time.sleep(25)
        assert stopped.stop() == 0, stopped.log()  # mid-stream: notifications keep coming to its queue
        time.sleep(20)  # down for longer than wall_clock_lag
        stopped = Serving(stopped_config, prism_endpoint)
        sender.join()
        published = items
        for serving, config in ((steady, steady_config), (stopped, stopped_config)):
            wait_for(lambda c=config: done_or_late(c, len(schedule)), "every lifecycle to be billed", serving, config,
                     timeout=600)
    finally:
        codes = [s.stop() for s in (steady, stopped)]
    assert codes == [0, 0], steady.log() + stopped.log()
    assert late(steady_config) == [] and late(stopped_config) == []
    expected = hand_computation(published, 60)
    assert stored(steady_config) == expected
    assert stored_rows(stopped_config).equals(stored_rows(steady_config))  # row by row, every column


def _publish_in_real_time(url: str, schedule: list[tuple[datetime, tuple[str, dict]]]) -> None:
    """Each notification when its time comes (a cloud's services publishing as things happen)."""
    for when, item in schedule:
        delay = (when - datetime.now(UTC)).total_seconds()
        if delay > 0:
            time.sleep(delay)
        publish_many(url, [item])

