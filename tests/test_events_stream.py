"""``ratebeam events serve`` on Prism, fed by real oslo.messaging Notifiers through the test RabbitMQ.

The notifications (tests/bus_support.py: Nova's payloads from seed 002's *Notification Examples*,
Cinder's ``_usage_from_volume``, Neutron's floating IP resource) tell the issue's worked example —
instance vm-1 created 10:20 (m1.small), resized 11:05 (m1.medium), deleted 12:40, hourly periods —
and a volume and a floating IP beside it, each message published twice, the resize before the
create (out of order, within the triggers' 1 h ``fire_delay``), an unreadable message, and a later
instance whose create moves event time on (the source's watermark follows the notifications; the
wall clock is off: ``wall_clock_lag: null``).  Once vm-1 is billed a straggler comes (a resize of
vm-1 at 12:10): counted late, recorded, not billed.

Two jobs-worth of scenarios, one Prism job server, one broker for the session:

* the clean run: stored rows and prices equal the hand computation below, every notification
  finished, the duplicates stored once, the dead letter and the late event recorded with reasons;
* a run whose job is SIGKILLed mid-stream (after its first frame is stored) and started again:
  the stored rows equal the clean run's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
import sqlalchemy as sa
import yaml
from bus_support import cinder_volume, message, neutron_floatingip, notifier, nova_instance, publish
from package_support import REPO
from pipeline_support import RATEBEAM, setup_database, stored_rows, workspace
from servers.rabbitmq import rabbitmq_url  # noqa: F401  (session fixture)
from test_notifications_source import raw_publish
from test_serve_faults import pool_workers

from ratebeam.connectors.sql.dead_letters import message_dead_letters
from ratebeam.connectors.sql.migrations import make_engine
from ratebeam.connectors.sql.models import EventDiscrepancy, EventFrame, EventInbox
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.runners.launch import worker_pool

pytest_plugins = ["servers.prism"]  # the prism_endpoint session fixture

DAY = "2026-03-02"
TENANT = "t-1"
#: Per-second prices (the lifecycle's quantity is exact seconds; docs/events.md).
RULES = {
    "groups": ["compute", "storage", "network"],
    "services": [
        {"name": "instance", "fields": [{"name": "flavor_name", "mappings": [
            {"value": "m1.small", "type": "flat", "cost": "0.0000125", "group": "compute"},
            {"value": "m1.medium", "type": "flat", "cost": "0.000025", "group": "compute"},
            {"value": "m1.large", "type": "flat", "cost": "0.00005", "group": "compute"}]}]},
        {"name": "volume.size", "mappings": [{"type": "flat", "cost": "0.0000001", "group": "storage"}]},
        {"name": "ip.floating", "mappings": [{"type": "flat", "cost": "0.000002", "group": "network"}]},
    ],
}
#: The hand computation: (type, period begin, flavor or '', quantity) and its price (qty × cost).
EXPECTED = [
    ("instance", "10:00", "m1.small", 2400, Decimal("0.03")),      # 10:20-11:00
    ("instance", "11:00", "m1.small", 300, Decimal("0.00375")),     # 11:00-11:05
    ("instance", "11:00", "m1.medium", 3300, Decimal("0.0825")),    # 11:05-12:00
    ("instance", "12:00", "m1.medium", 2400, Decimal("0.06")),      # 12:00-12:40
    ("volume.size", "10:00", "", 1800 * 20, Decimal("0.0036")),    # 20 GB, 10:30-11:00
    ("volume.size", "11:00", "", 1800 * 20, Decimal("0.0036")),    # 11:00-11:30
    ("ip.floating", "10:00", "", 2400, Decimal("0.0048")),         # 10:10-10:50
]


def at(hhmm: str) -> datetime:
    return datetime.fromisoformat(f"{DAY}T{hhmm}").replace(tzinfo=UTC)


def lifecycle_messages() -> list[tuple[str, str, dict]]:
    """(exchange, oslo driver, message) in publishing order (the resize before the create)."""
    def nova(event_type, hhmm, vm="vm-1", flavor="m1.small", tenant=TENANT, **extra):
        return ("nova", "messagingv2", message(event_type, nova_instance(vm, tenant, flavor, at(hhmm), **extra), at(hhmm),
                                               message_id=f"{event_type}-{vm}-{hhmm}"))

    def cinder(event_type, hhmm):
        return ("cinder", "messaging", message(event_type, cinder_volume("vol-1", TENANT, 20, at(hhmm)), at(hhmm),
                                               message_id=f"{event_type}-vol-1-{hhmm}", publisher_id="volume.host-1"))

    def neutron(event_type, hhmm, payload):
        return ("neutron", "messagingv2", message(event_type, payload, at(hhmm), message_id=f"{event_type}-ip-1-{hhmm}",
                                                  publisher_id="network.host-1"))

    return [
        nova("compute.instance.resize.confirm.end", "11:05", flavor="m1.medium"),
        nova("compute.instance.create.end", "10:20"),
        cinder("volume.create.end", "10:30"),
        neutron("floatingip.create.end", "10:10", neutron_floatingip("ip-1", TENANT)),
        neutron("floatingip.delete.end", "10:50", {"floatingip_id": "ip-1"}),
        cinder("volume.delete.end", "11:30"),
        nova("compute.instance.delete.end", "12:40", flavor="m1.medium", deleted_at=f"{DAY} 12:40:00"),
        AUDIT,
    ]


#: Moves event time to 15:30: every period of an open instance up to 14:00 closes (+ 1 h fire_delay), the next not.
CLOCK = ("nova", "messagingv2", message("compute.instance.create.end", nova_instance("vm-2", "t-2", "m1.small",
                                        at("15:30")), at("15:30"), message_id="clock-vm-2"))
AUDIT_TENANT = "t-3"
#: Nova's hourly audit of vm-3, whose create the stream never saw (launched 10:30, before the audit period):
#: billed from the audit period's beginning, 11:00, while it lives; the missed start is a stored discrepancy.
AUDIT = ("nova", "messagingv2", message(
    "compute.instance.exists",
    nova_instance("vm-3", AUDIT_TENANT, "m1.small", at("10:30"), audit_period_beginning=f"{DAY} 11:00:00",
                  audit_period_ending=f"{DAY} 12:00:00"),
    at("12:05"), message_id="exists-vm-3-12:05"))
#: vm-3's rows: one hour of m1.small in each period closed by 15:30 (11:00, 12:00, 13:00).
AUDITED = [("instance", hhmm, "m1.small", 3600, Decimal("0.045")) for hhmm in ("11:00", "12:00", "13:00")]
STRAGGLER = ("nova", "messagingv2", message("compute.instance.resize.confirm.end",
                                            nova_instance("vm-1", TENANT, "m1.large", at("12:10")), at("12:10"),
                                            message_id="straggler-vm-1"))


def send(url: str, items: list[tuple[str, str, dict]], times: int = 1) -> None:
    for exchange, driver, msg in items:
        with notifier(url, exchange, msg["publisher_id"], driver) as n:
            for _ in range(times):
                publish(n, msg, {"request_id": f"req-{msg['message_id'][:12]}", "project_id": TENANT})


def events_workspace(root: Path, url: str, queue: str) -> Path:
    config = workspace(root)
    doc = yaml.safe_load(config.read_text())
    doc["events"] = {
        "source": {"transport_url": url, "exchanges": ["nova", "cinder", "neutron"], "queue": queue,
                   "poll_seconds": 0.2, "wall_clock_lag": None},
        "triggers": str(triggers_file(root)),
    }
    config.write_text(yaml.safe_dump(doc))
    (root / "rules.json").write_text(json.dumps(RULES))
    setup_database(config)
    return config


def triggers_file(root: Path) -> Path:
    """The shipped triggers with a fire_delay of 1 h (out-of-order arrivals of up to an hour are in time)."""
    from importlib import resources

    shipped = yaml.safe_load((resources.files("ratebeam.pipelines.events") / "data" / "triggers.yaml").read_text())
    for trigger in shipped:
        trigger["fire_delay"] = "1h"
    path = root / "triggers.yaml"
    path.write_text(yaml.safe_dump(shipped))
    return path


class Serving:
    """``ratebeam events serve`` on Prism (LOOPBACK) as a subprocess (``options``: more of its own), its log in the
    workspace (``serve-<n>.log``)."""

    def __init__(self, config: Path, endpoint: str, *options: str, runner_config: Path | None = None) -> None:
        self.path = config.parent / f"serve-{len(list(config.parent.glob('serve-*.log')))}.log"
        runner = (["--runner-config", str(runner_config)] if runner_config is not None else
                  ["--runner", "PortableRunner", f"--option=--job_endpoint={endpoint}",
                   "--option=--environment_type=LOOPBACK"])
        with self.path.open("w") as out:
            self.proc = subprocess.Popen(
                [*RATEBEAM, "-v", "events", "serve", "-c", str(config), *runner, *options],
                stdout=subprocess.DEVNULL, stderr=out, text=True)

    def log(self) -> str:
        """The log so far, without the debug lines (the counters at each poll)."""
        return "".join(line for line in self.path.read_text().splitlines(keepends=True) if " DEBUG " not in line)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=120)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)


def engine_of(config: Path):
    return make_engine(load_config(config, metrics=False).database_url)


def wait_for(condition: Callable[[], bool], what: str, serving: Serving, config: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert serving.proc.poll() is None, f"events serve ended ({serving.proc.returncode}): {serving.log()[-6000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {state_of(config)}\n{serving.log()[-6000:]}"
        time.sleep(0.2)


def state_of(config: Path) -> str:
    """The inbox and the stored frames, for a failure's message."""
    engine = engine_of(config)
    try:
        with engine.connect() as conn:
            inbox = conn.execute(sa.select(EventInbox.message_id, EventInbox.finish_period, EventInbox.finished_at,
                                           EventInbox.late_at)).all()
            frames = conn.execute(sa.select(EventFrame.scope, EventFrame.period_begin)).all()
    finally:
        engine.dispose()
    return f"inbox {inbox}\nframes {frames}"


def unfinished(config: Path, prefix: str = "") -> int:
    engine = engine_of(config)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(EventInbox).where(
                EventInbox.finished_at.is_(None), EventInbox.message_id.like(f"{prefix}%"))).scalar_one()
    finally:
        engine.dispose()


def late(config: Path) -> list[tuple[str, str]]:
    """(message id, reason) of the notifications recorded late."""
    engine = engine_of(config)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.select(EventInbox.message_id, EventInbox.late_reason)
                                                   .where(EventInbox.late_at.is_not(None)))]
    finally:
        engine.dispose()


def read_by_the_job(config: Path) -> int:
    """How many notifications of the inbox a job has read."""
    engine = engine_of(config)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(EventInbox).where(
                EventInbox.emitted_run.is_not(None))).scalar_one()
    finally:
        engine.dispose()


def frames_stored(config: Path) -> int:
    engine = engine_of(config)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(EventFrame)).scalar_one()
    finally:
        engine.dispose()


def lifecycle_done(config: Path) -> bool:
    """Every notification of the worked example finished, vm-3's three periods stored (it and the clock stay open)."""
    return (frames_stored(config) >= 6 and unfinished(config) == 2 and unfinished(config, "clock") == 1
            and unfinished(config, "exists-vm-3") == 1)


def check_hand_computation(rows: pl.DataFrame) -> None:
    def table(scope: str) -> list[tuple]:
        return sorted(
            (r["type"], r["begin"].strftime("%H:%M"), r.get("groupby.flavor_name") or r.get("metadata.flavor_name") or "",
             Decimal(r["qty"]), Decimal(r["price"]))
            for r in rows.filter(pl.col("scope_id") == scope).iter_rows(named=True))

    def want(expected: list[tuple]) -> list[tuple]:
        return sorted((t, begin, flavor, Decimal(qty), price) for t, begin, flavor, qty, price in expected)

    assert table(TENANT) == want(EXPECTED)
    assert table(AUDIT_TENANT) == want(AUDITED)
    assert sum(rows.filter(pl.col("scope_id") == TENANT)["price"].to_list(), Decimal(0)) == Decimal("0.18825")
    assert set(rows["scope_id"].to_list()) == {TENANT, AUDIT_TENANT}


def discrepancies(config: Path) -> list[tuple[str, str, str, str]]:
    """(scope, instance, kind, message id) of the stored discrepancies."""
    engine = engine_of(config)
    try:
        with engine.connect() as conn:
            return sorted(tuple(r) for r in conn.execute(sa.select(
                EventDiscrepancy.scope, EventDiscrepancy.instance_key, EventDiscrepancy.kind, EventDiscrepancy.message_id)))
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory, rabbitmq_url, prism_endpoint):  # noqa: F811
    """The clean run's workspace (stopped) and its log."""
    config = events_workspace(tmp_path_factory.mktemp("clean"), rabbitmq_url, "rb-events-clean")
    serving = Serving(config, prism_endpoint)
    try:
        wait_for(lambda: "events serve: run" in serving.log(), "the job to start", serving, config)
        # In two parts, the second once the job has read the first: a scope's events then reach its
        # state in two bundles, which must add up (they did not when the key coder was Python's own).
        first, rest = lifecycle_messages()[:4], lifecycle_messages()[4:]
        send(rabbitmq_url, first, times=2)  # every message twice
        wait_for(lambda: read_by_the_job(config) == len(first), "the first part to be read", serving, config)
        send(rabbitmq_url, rest, times=2)
        raw_publish(rabbitmq_url, "nova", "{not json")
        send(rabbitmq_url, [CLOCK])
        wait_for(lambda: lifecycle_done(config), "the worked example to be stored", serving, config)
        send(rabbitmq_url, [STRAGGLER])
        wait_for(lambda: late(config) != [], "the straggler to be recorded late", serving, config)
    finally:
        code = serving.stop()
    assert code == 0, serving.log()
    return config, serving.log()


def test_the_worked_example_is_stored_as_computed_by_hand(clean_run):
    config, _ = clean_run
    check_hand_computation(stored_rows(config))


def test_the_audit_bills_an_instance_whose_start_was_missed_and_the_gap_is_stored_once(clean_run):
    config, log = clean_run
    assert discrepancies(config) == [(AUDIT_TENANT, "vm-3", "start_not_seen", "exists-vm-3-12:05")]
    assert log.count("(start_not_seen)") == 1  # found again at every period close, logged when new


def test_duplicates_are_stored_once_and_the_unreadable_message_is_a_dead_letter(clean_run):
    config, log = clean_run
    engine = engine_of(config)
    try:
        with engine.connect() as conn:
            inbox = conn.execute(sa.select(EventInbox.message_id)).scalars().all()
        letters = message_dead_letters(engine)
    finally:
        engine.dispose()
    assert len(inbox) == len(set(inbox)) == len(lifecycle_messages()) + 2  # + the clock and the straggler
    assert [(r.reason.split(":")[0], r.failures) for r in letters] == [("not JSON", 1)]


def test_the_straggler_is_late_recorded_and_not_billed(clean_run):
    config, log = clean_run
    [(message_id, reason)] = late(config)
    assert message_id == "straggler-vm-1"
    assert "fire_delay" in reason or "already fired" in reason, reason
    assert "late event straggler-vm-1" in log
    assert unfinished(config, "straggler") == 0  # recorded: the reprocessing job finds it there
    assert "m1.large" not in str(stored_rows(config).to_dicts())


def test_the_shipped_scopes_worker_config_runs_the_scope_step_in_a_second_worker_and_stores_the_same_rows(
        tmp_path, rabbitmq_url, prism_endpoint):  # noqa: F811
    """``runner_configs/prism-events.yaml`` (the scope step with resource hints of its own) against the test Prism
    and a worker pool of ratebeam's launcher: the pool starts two worker processes, the rows are the hand
    computation's."""
    config = events_workspace(tmp_path / "ws", rabbitmq_url, "rb-events-two-workers")
    shipped = yaml.safe_load((REPO / "runner_configs" / "prism-events.yaml").read_text())
    assert shipped["resource_hints"] == {"Scopes": {"cpu_count": 1}}
    with worker_pool(tmp_path / "pool.log") as pool:
        runner = tmp_path / "runner.yaml"
        runner.write_text(yaml.safe_dump({**shipped, "prism": {"endpoint": prism_endpoint},
                                          "environment": {"type": "EXTERNAL", "endpoint": pool}}))
        serving = Serving(config, prism_endpoint, runner_config=runner)
        try:
            wait_for(lambda: "events serve: run" in serving.log(), "the job to start", serving, config)
            send(rabbitmq_url, [*lifecycle_messages(), CLOCK])
            wait_for(lambda: lifecycle_done(config), "the worked example to be stored", serving, config)
        finally:
            code = serving.stop()
        assert code == 0 and "Traceback" not in serving.log(), serving.log()
        assert (tmp_path / "pool.log").read_text().count("Starting worker with command") == 2
    check_hand_computation(stored_rows(config))


def test_a_frozen_scope_worker_stalls_the_job_which_is_cancelled_and_started_again(
        tmp_path, rabbitmq_url, prism_endpoint):  # noqa: F811
    """The scope step's own worker (``prism-events.yaml``) frozen by SIGSTOP: the source goes on polling,
    but the batches it emits are never taken, and Prism keeps the job RUNNING.  After ``--stall-timeout``
    the launcher cancels it (``ops.watchdog``: ``scope_batches_applied`` behind ``scope_batches_emitted``)
    and starts a new job on new workers, which reads the inbox again: the hand computation is stored."""
    config = events_workspace(tmp_path / "ws", rabbitmq_url, "rb-events-frozen-worker")
    shipped = yaml.safe_load((REPO / "runner_configs" / "prism-events.yaml").read_text())
    pool_log = tmp_path / "pool.log"
    with worker_pool(pool_log) as pool:
        runner = tmp_path / "runner.yaml"
        runner.write_text(yaml.safe_dump({**shipped, "prism": {"endpoint": prism_endpoint},
                                          "environment": {"type": "EXTERNAL", "endpoint": pool}}))
        serving = Serving(config, prism_endpoint, "--stall-timeout", "15", runner_config=runner)
        frozen = None
        try:
            wait_for(lambda: pool_log.read_text().count("Starting worker with command") == 2, "two workers",
                     serving, config)
            (frozen,) = [pid for pid in pool_workers(pool.rsplit(":", 1)[1]) if b"resource_hints" in _cmdline(pid)]
            os.kill(frozen, signal.SIGSTOP)
            send(rabbitmq_url, [*lifecycle_messages(), CLOCK])
            wait_for(lambda: lifecycle_done(config), "the restarted job to store the example", serving, config,
                     timeout=240)
        finally:
            code = serving.stop()
            if frozen is not None:
                with contextlib.suppress(ProcessLookupError):  # the pool stops the worker of a cancelled job
                    os.kill(frozen, signal.SIGKILL)
        log = serving.log()
        assert code == 0, log
        assert "ratebeam_scope_batches_applied has not moved for" in log, log
        assert "ended STALLED: starting it again" in log, log
        assert pool_log.read_text().count("Starting worker with command") == 4  # two per job
    check_hand_computation(stored_rows(config))


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_a_job_killed_mid_stream_and_started_again_stores_the_clean_runs_rows(clean_run, tmp_path, rabbitmq_url,  # noqa: F811
                                                                               prism_endpoint):
    clean_config, _ = clean_run
    config = events_workspace(tmp_path / "ws", rabbitmq_url, "rb-events-crash")
    messages = lifecycle_messages()
    first = Serving(config, prism_endpoint)
    try:
        wait_for(lambda: "events serve: run" in first.log(), "the job to start", first, config)
        send(rabbitmq_url, messages, times=2)
        wait_for(lambda: frames_stored(config) >= 1, "a first frame stored", first, config)
    finally:
        first.kill()  # mid-stream: the loopback worker dies with it
    assert unfinished(config) > 0
    send(rabbitmq_url, [CLOCK])  # published while no job runs: the durable queue keeps it
    again = Serving(config, prism_endpoint)
    try:
        wait_for(lambda: lifecycle_done(config), "the restarted job to finish the example", again, config)
    finally:
        assert again.stop() == 0, again.log()
    assert stored_rows(config).equals(stored_rows(clean_config))
    assert discrepancies(config) == discrepancies(clean_config)
