"""The notification source on the real test RabbitMQ, fed by a real oslo.messaging Notifier.

Nova, Cinder and Neutron shaped notifications (payloads: tests/events_support.py, from seed 002's
*Notification Examples* and the projects' own notifiers) go through oslo.messaging's v2 and v1
envelopes to ratebeam's durable queue; the inbox keeps each ``message_id`` once, unreadable
messages become dead letters with their reason, and nothing is acknowledged before it is recorded.
"""

from __future__ import annotations

import json
import zlib
from datetime import UTC, datetime, timedelta

import kombu
import pytest
import sqlalchemy as sa
from bus_support import cinder_volume, message, neutron_floatingip, notifier, nova_instance, publish
from events_support import nova_versioned_payload
from servers.rabbitmq import rabbitmq_url  # noqa: F401  (session fixture)

from ratebeam.connectors.notifications.client import NotificationConsumer
from ratebeam.connectors.notifications.config import NotificationSourceConfig
from ratebeam.connectors.notifications.envelope import Rejected, parse
from ratebeam.connectors.notifications.inbox import CONSUMER_STALE, RECHECK_SECONDS, Inbox
from ratebeam.connectors.sql.dead_letters import message_dead_letters
from ratebeam.connectors.sql.migrations import make_engine, upgrade
from ratebeam.connectors.sql.models import EventConsumer, EventInbox

T = datetime(2026, 1, 5, 10, 20, tzinfo=UTC)


@pytest.fixture
def inbox(tmp_path):
    url = f"sqlite:///{tmp_path / 'ratebeam.db'}"
    upgrade(make_engine(url))
    box = Inbox(url)
    yield box
    box.engine.dispose()


def source(url: str, queue: str, **options) -> NotificationSourceConfig:
    return NotificationSourceConfig(transport_url=url, queue=queue, exchanges=("nova", "cinder", "neutron"), **options)


def drain_all(box: Inbox, consumer: NotificationConsumer):
    total = [0, 0, 0]
    while True:
        got = box.drain(consumer, wait=1.0)
        if not (got.new + got.duplicates + got.rejected):
            return total
        total = [total[0] + got.new, total[1] + got.duplicates, total[2] + got.rejected]


def raw_publish(url: str, exchange: str, body: str) -> None:
    """A message that did not come from oslo.messaging (a broken publisher)."""
    with kombu.Connection(url.replace("rabbit://", "amqp://")) as conn:
        producer = conn.Producer()
        producer.publish(body, exchange=kombu.Exchange(exchange, type="topic", durable=False),
                         routing_key="notifications.info", content_type="application/json")


def test_v2_and_v1_envelopes_are_recorded_once_and_unreadable_messages_are_dead_letters(rabbitmq_url, inbox):  # noqa: F811
    consumer = NotificationConsumer(source(rabbitmq_url, "rb-source-1"))
    consumer.receive(0.1)  # declares the durable queue and its bindings
    sent = {
        "nova": message("compute.instance.create.end", nova_instance("vm-1", "t1", "m1.small", T), T),
        "cinder": message("volume.create.end", cinder_volume("vol-1", "t1", 20, T), T, publisher_id="volume.host-1"),
        "neutron": message("floatingip.create.end", neutron_floatingip("ip-1", "t1"), T, publisher_id="network.host-1"),
    }
    for exchange, driver in (("nova", "messagingv2"), ("cinder", "messaging"), ("neutron", "messagingv2")):
        with notifier(rabbitmq_url, exchange, sent[exchange]["publisher_id"], driver) as n:
            publish(n, sent[exchange], {"request_id": "req-1", "project_id": "t1"})
            publish(n, sent[exchange], {"request_id": "req-1", "project_id": "t1"})  # every message twice
    raw_publish(rabbitmq_url, "nova", "{not json")
    raw_publish(rabbitmq_url, "nova", json.dumps({"oslo.version": "2.0", "oslo.message": json.dumps(
        {"event_type": "compute.instance.create.end", "payload": {}, "timestamp": str(T)})}))
    raw_publish(rabbitmq_url, "nova", "{not json")  # the same unreadable body again: one row, two failures

    assert drain_all(inbox, consumer) == [3, 3, 3]
    consumer.close()
    with inbox.engine.connect() as conn:
        rows = {r.message_id: r for r in conn.execute(sa.select(EventInbox))}
    assert set(rows) == {m["message_id"] for m in sent.values()}
    nova = rows[sent["nova"]["message_id"]]
    assert (nova.event_type, nova.publisher_id, nova.priority, nova.generated) == (
        "compute.instance.create.end", "compute.host-1", "INFO", T)
    body = json.loads(nova.body)
    assert body["payload"]["instance_type"] == "m1.small" and body["ctxt"]["request_id"] == "req-1"
    letters = {(r.reason.split(":")[0], r.failures) for r in message_dead_letters(inbox.engine)}
    assert letters == {("not JSON", 2), ("message_id", 1)}

    again = NotificationConsumer(source(rabbitmq_url, "rb-source-1"))
    assert again.receive(0.5) == []  # all acknowledged
    again.close()


def test_nothing_is_acknowledged_before_it_is_recorded(rabbitmq_url, inbox):  # noqa: F811
    """A consumer that dies between receiving and recording loses nothing: the broker delivers again."""
    config = source(rabbitmq_url, "rb-source-2")
    first = NotificationConsumer(config)
    first.receive(0.1)
    with notifier(rabbitmq_url, "nova", "compute.host-1") as n:
        for k in range(5):
            publish(n, message("compute.instance.create.end", nova_instance(f"vm-{k}", "t1", "m1.small", T), T))
    received = []
    while len(received) < 5:
        received = first.receive(1.0)
    first.close()  # no ack: as if the process died before its inbox transaction
    second = NotificationConsumer(config)
    assert drain_all(inbox, second) == [5, 0, 0]
    second.close()


def test_nova_versioned_notifications_come_on_their_own_topic_which_the_default_topics_take(rabbitmq_url, inbox):  # noqa: F811
    """Nova with ``notification_format = versioned`` publishes on ``versioned_notifications`` (exchange ``nova``).

    Payload: Nova's ``doc/notification_samples/instance-create-end.json`` (InstanceCreatePayload),
    built by ``events_support.nova_versioned_payload``.  A queue bound to ``notifications`` only
    does not get it.
    """
    default = NotificationConsumer(source(rabbitmq_url, "rb-source-3"))
    legacy_only = NotificationConsumer(source(rabbitmq_url, "rb-source-4", topics=("notifications",)))
    default.receive(0.1)
    legacy_only.receive(0.1)
    sent = message("instance.create.end", nova_versioned_payload("instance.create.end", "vm-9", tenant="t1"), T,
                   publisher_id="nova-compute:host-1")
    with notifier(rabbitmq_url, "nova", "nova-compute:host-1", topic="versioned_notifications") as n:
        publish(n, sent)
    assert drain_all(inbox, default) == [1, 0, 0]
    default.close()
    assert legacy_only.receive(0.5) == []
    legacy_only.close()
    with inbox.engine.connect() as conn:
        (row,) = conn.execute(sa.select(EventInbox))
    assert (row.message_id, row.event_type, row.publisher_id) == (sent["message_id"], "instance.create.end",
                                                                  "nova-compute:host-1")
    assert json.loads(row.body)["payload"]["nova_object.data"]["uuid"] == "vm-9"


def test_parse_names_what_is_wrong():
    assert parse(b"[1]") == Rejected("not a JSON object: list")
    assert parse(json.dumps({"oslo.version": "3.0", "oslo.message": "{}"})).reason.startswith("unknown envelope")
    bad_time = parse(json.dumps({"message_id": "m", "event_type": "e", "timestamp": "yesterday"}))
    assert bad_time.reason.startswith("timestamp: ") and "yesterday" in bad_time.reason and bad_time.message_id == "m"
    ok = parse(json.dumps({"message_id": "m", "event_type": "e", "timestamp": "2012-03-12 17:01:29.899834",
                           "_context_request_id": "req-9", "payload": {"a": 1}}))
    assert ok.timestamp == datetime(2012, 3, 12, 17, 1, 29, 899834, tzinfo=UTC) and ok.ctxt == {"request_id": "req-9"}


def _envelope(msg: dict, ctxt: dict) -> bytes:
    """oslo.messaging's v2 envelope of ``msg`` (what its ``messagingv2`` driver puts on the wire)."""
    inner = {**msg, **{f"_context_{k}": v for k, v in ctxt.items()}}
    return json.dumps({"oslo.version": "2.0", "oslo.message": json.dumps(inner)}).encode()


def test_taken_notifications_equal_those_read_back_whether_this_inbox_recorded_them_or_not(tmp_path):
    """The inbox hands on the notifications it recorded as parsed from the bus (no body read back, no
    second parse); they equal, field by field, what another job's inbox reads back from the rows —
    floats, nested payloads and the context included — and the rows of another shard are not kept."""
    url = f"sqlite:///{tmp_path / 'ratebeam.db'}"
    upgrade(make_engine(url))
    payload = nova_instance("vm-1", "t1", "m1.small", T) | {"disk_gb": 1.5, "nested": {"a": [1, 2.25, None]}}
    bodies = [_envelope(message("compute.instance.create.end", payload | {"instance_id": f"vm-{i}"}, T),
                        {"request_id": f"req-{i}", "project_id": f"t{i % 2}"}) for i in range(6)]
    recorder, reader = Inbox(url), Inbox(url)
    try:
        assert recorder.record([(b, parse(b)) for b in bodies]).new == 6
        assert len(recorder._recorded) == 6
        mine, read_back = recorder.take("run-a", 10), reader.take("run-b", 10)
        assert not recorder._recorded  # handed on, not kept
        assert [n.message_id for n in mine] == [n.message_id for n in read_back]
        assert mine == read_back and mine == sorted(mine, key=lambda n: (n.timestamp, n.message_id))
    finally:
        recorder.engine.dispose()
        reader.engine.dispose()
    sharded = Inbox(url, scope_of=lambda n: str(n.ctxt.get("project_id")), shard=(1, 2))
    try:
        more = [_envelope(message("compute.instance.delete.end", payload, T), {"project_id": p}) for p in ("a", "b", "c")]
        sharded.record([(b, parse(b)) for b in more])
        kept = {n.ctxt["project_id"] for n in sharded._recorded.values()}
        assert kept == {p for p in ("a", "b", "c") if zlib.crc32(p.encode()) % 2 == 1}
    finally:
        sharded.engine.dispose()


def test_an_unsharded_job_in_hand_takes_its_own_rows_without_a_query_and_reads_the_others_at_the_recheck(
        tmp_path, monkeypatch):
    """Once a read found fewer rows than asked (every unread row in hand), the inbox records its rows as read
    by that job and ``take`` hands them on, oldest first, without reading the table; rows another process
    recorded meanwhile are read at the next recheck, merged in time order; a new run reads every unfinished
    row again, the ones handed on included."""
    url = f"sqlite:///{tmp_path / 'ratebeam.db'}"
    upgrade(make_engine(url))
    payload = nova_instance("vm-1", "t1", "m1.small", T)

    def bodies(name: str, minutes: list[int]) -> list[bytes]:
        return [_envelope(message("compute.instance.create.end", payload | {"instance_id": f"{name}-{m}"},
                                  T + timedelta(minutes=m), message_id=f"{name}-{m}"), {}) for m in minutes]

    clock = [1000.0]
    monkeypatch.setattr("ratebeam.connectors.notifications.inbox.time.monotonic", lambda: clock[0])
    job, other = Inbox(url), Inbox(url)
    queries: list[str] = []
    sa.event.listen(job.engine, "before_cursor_execute", lambda *args: queries.append(args[2]))
    try:
        job.record([(b, parse(b)) for b in bodies("a", [5, 1])])
        assert [n.message_id for n in job.take("run-1", 10)] == ["a-1", "a-5"]  # read: all in hand now
        other.record([(b, parse(b)) for b in bodies("o", [2])])  # another process (a job being replaced)
        job.record([(b, parse(b)) for b in bodies("b", [9, 3])])
        queries.clear()
        assert [n.message_id for n in job.take("run-1", 10)] == ["b-3", "b-9"]  # handed on: no query
        assert not [q for q in queries if "ratebeam_event_inbox" in q and q.lstrip().upper().startswith("SELECT")]
        job.record([(b, parse(b)) for b in bodies("c", [0])])
        clock[0] += RECHECK_SECONDS
        assert [n.message_id for n in job.take("run-1", 10)] == ["c-0", "o-2"]  # the recheck reads the table
        assert job.take("run-1", 10) == []
        with job.engine.connect() as conn:
            read = dict(conn.execute(sa.select(EventInbox.message_id, EventInbox.emitted_run)).all())
        assert read == dict.fromkeys(["a-1", "a-5", "b-3", "b-9", "c-0", "o-2"], "run-1")
        again = job.take("run-2", 10)  # a new run (a restart) reads every unfinished row
        assert [n.message_id for n in again] == ["c-0", "a-1", "o-2", "b-3", "a-5", "b-9"]
    finally:
        job.engine.dispose()
        other.engine.dispose()


def test_the_shard_jobs_bound_is_the_earliest_holding_time_of_the_live_jobs(tmp_path):
    """``Inbox.consumers_low``: each sharded job's row (its holding time, its heartbeat); the bound is the
    earliest holding time among the rows with a fresh heartbeat.  A job that holds nothing (``None``: its
    poll found the queue drained) does not bound; a job silent for ``CONSUMER_STALE`` no longer does
    (its connection closed, the broker gave its messages back); ``leave`` removes a job's row."""
    url = f"sqlite:///{tmp_path / 'ratebeam.db'}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    zero, one = Inbox(url, shard=(0, 2)), Inbox(url, shard=(1, 2))
    t0 = datetime(2026, 3, 2, 12, tzinfo=UTC)
    early, late = datetime(2026, 3, 2, 9, tzinfo=UTC), datetime(2026, 3, 2, 10, tzinfo=UTC)
    try:
        assert zero.consumers_low("run-0", late, t0) == late
        assert one.consumers_low("run-1", early, t0) == early
        assert zero.consumers_low("run-0", None, t0 + timedelta(seconds=1)) == early  # run-1 still holds
        assert one.consumers_low("run-1", None, t0 + timedelta(seconds=2)) is None  # nobody holds anything
        assert one.consumers_low("run-1", early, t0 + timedelta(seconds=3)) == early
        silent = t0 + timedelta(seconds=3) + CONSUMER_STALE + timedelta(seconds=1)
        assert zero.consumers_low("run-0", late, silent) == late  # run-1 has been silent: dead
        one.leave("run-1")
        with zero.engine.connect() as conn:
            assert conn.execute(sa.select(EventConsumer.run_id, EventConsumer.shard)).all() == [("run-0", "0/2")]
    finally:
        zero.engine.dispose()
        one.engine.dispose()
