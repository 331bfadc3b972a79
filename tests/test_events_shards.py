"""Sharded event-stream jobs: two ``events serve --shard K/2`` on one PostgreSQL inbox and one queue.

Real RabbitMQ, PostgreSQL and Prism.  A backlog of Nova lifecycles of eight tenants (queued before
the jobs start, older than ``wall_clock_lag``: the catch-up path, default configuration) is published
once to two queues bound to the same exchange: one read by a single unsharded job on its own
database, the other shared by the two shard jobs.  Shard 1's job is SIGKILLed once it has read part
of its rows and started again.  The shard jobs together store exactly the single job's rows (row by
row, every column) and the hand computation, and every notification was read only by jobs of its
scope's shard (its ``emitted_run`` is a run of that shard).
"""

from __future__ import annotations

import re
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from bus_support import publish_many
from pipeline_support import stored_rows
from servers.rabbitmq import rabbitmq_url  # noqa: F401  (session fixture)
from test_events_catch_up import (
    TENANTS,
    done_or_late,
    events_config,
    hand_computation,
    lives,
    notifications,
    recorded,
    stored,
)
from test_events_stream import Serving, engine_of, late, wait_for

from ratebeam.connectors.notifications.inbox import scope_hash
from ratebeam.connectors.sql.models import EventInbox

pytest_plugins = ["servers.prism"]  # the prism_endpoint session fixture


def read_by_shard(config: Path, index: int) -> int:
    """How many notifications of shard ``index`` of 2 a job has read."""
    engine = engine_of(config)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(EventInbox).where(
                EventInbox.emitted_run.is_not(None), EventInbox.scope_hash % 2 == index)).scalar_one()
    finally:
        engine.dispose()


def runs_of(serving: Serving) -> dict[str, int]:
    """run id → shard index, from a sharded job's log."""
    return {run: int(index) for run, index in re.findall(r"events serve: run (\w+), .*shard (\d)/2", serving.log())}


def test_two_shard_jobs_store_exactly_the_rows_of_one_job_and_a_killed_one_converges(
        tmp_path, rabbitmq_url, prism_endpoint, pg_db_url):  # noqa: F811
    assert {scope_hash(t) % 2 for t in TENANTS} == {0, 1}  # both shards have scopes
    single = events_config(tmp_path / "single", rabbitmq_url, "rb-single")
    sharded = events_config(tmp_path / "sharded", rabbitmq_url, "rb-sharded", database_url=pg_db_url)
    first = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    items = lives(160, first, 9, lambda k: 1500 + 17 * (k % 90))
    publish_many(rabbitmq_url, [m for _, m in notifications(items)])

    jobs = [Serving(single, prism_endpoint), Serving(sharded, prism_endpoint, "--shard", "0/2"),
            Serving(sharded, prism_endpoint, "--shard", "1/2")]
    restarted = None
    try:
        wait_for(lambda: read_by_shard(sharded, 1) > 0, "shard 1 to read", jobs[2], sharded)
        jobs[2].kill()  # mid-stream, what it read not yet stored
        restarted = Serving(sharded, prism_endpoint, "--shard", "1/2")
        for serving, config in ((jobs[0], single), (jobs[1], sharded), (restarted, sharded)):
            wait_for(lambda c=config: done_or_late(c, 2 * len(items)), "the backlog to be billed", serving, config, timeout=900)
    finally:
        codes = [s.stop() for s in (jobs[0], jobs[1], *([restarted] if restarted else []))]
    assert codes == [0] * len(codes)
    assert late(single) == [] and late(sharded) == []
    assert stored(single) == hand_computation(items, 3600)
    assert stored(sharded) == stored(single)
    assert stored_rows(sharded).equals(stored_rows(single))  # row by row, every column
    shard_of_run = {**runs_of(jobs[1]), **runs_of(jobs[2]), **runs_of(restarted)}
    engine = engine_of(sharded)
    try:
        with engine.connect() as conn:
            read = conn.execute(sa.select(EventInbox.scope, EventInbox.scope_hash, EventInbox.emitted_run)).all()
    finally:
        engine.dispose()
    assert len(read) == 2 * len(items)
    assert all(scope in TENANTS and hashed == scope_hash(scope) for scope, hashed, _ in read)
    assert all(shard_of_run[run] == hashed % 2 for _, hashed, run in read)  # read by its shard's jobs only


def test_a_shard_job_holding_delivered_messages_holds_the_other_jobs_event_time(
        tmp_path, rabbitmq_url, prism_endpoint, pg_db_url):  # noqa: F811
    """One shard job is frozen (SIGSTOP) while the broker has delivered it a prefetch window it has not
    recorded; the other job drains the rest of the queue meanwhile.  Its event time must wait for the
    frozen job's window (``Inbox.consumers_low``): before that bound, its watermark ran to the end of the
    backlog and the frozen job's older notifications of its shard were recorded late when it woke."""
    sharded = events_config(tmp_path / "sharded", rabbitmq_url, "rb-held", database_url=pg_db_url, prefetch=20)
    first = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)
    items = lives(600, first, 15, lambda k: 1500 + 17 * (k % 90))
    messages = [m for _, m in notifications(items)]
    publish_many(rabbitmq_url, messages)
    holder = Serving(sharded, prism_endpoint, "--shard", "1/2")
    other = None
    try:
        wait_for(lambda: read_by_shard(sharded, 1) > 0, "shard 1 to read", holder, sharded)
        holder.proc.send_signal(signal.SIGSTOP)  # holding the window the broker delivered after its last poll
        other = Serving(sharded, prism_endpoint, "--shard", "0/2")
        wait_for(lambda: recorded(sharded) == settled(sharded), "shard 0 to drain the queue", other, sharded,
                 timeout=300)
        held = len(messages) - recorded(sharded)
        print(f"held by the frozen job: {held} of {len(messages)}")
        assert held > 0  # the frozen job really held messages nobody else could record
        time.sleep(5)  # shard 0 goes on polling: its event time must not pass the held window
        holder.proc.send_signal(signal.SIGCONT)
        for serving in (holder, other):
            wait_for(lambda: done_or_late(sharded, len(messages)), "the backlog to be billed", serving, sharded,
                     timeout=900)
    finally:
        holder.proc.send_signal(signal.SIGCONT)
        codes = [s.stop() for s in (holder, *([other] if other else []))]
    assert codes == [0] * len(codes)
    assert late(sharded) == []
    assert stored(sharded) == hand_computation(items, 3600)


def settled(config: Path) -> int:
    """The inbox's row count once it stops growing for two seconds."""
    count = recorded(config)
    while True:
        time.sleep(2)
        now = recorded(config)
        if now == count:
            return now
        count = now
