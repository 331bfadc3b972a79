"""Benchmark: the event stream (``ratebeam events serve`` on Prism) beside the polling cycle, on the same lifecycles.

What is built (not timed): ``--instances`` Nova instances spread over ``--tenants`` tenants (a
comma list runs each, side by side: ``--tenants 1,10`` is one tenant holding them all, then ten),
each created (m1.small), resized (m1.medium) 45 minutes later and deleted 2 h 20 after its create,
creates spread over one hour: three notifications each, in time order as a cloud emits them; with
``--exists``, Nova's hourly audit too — one ``compute.instance.exists`` (audit period: the hour
before) for every instance alive at each hour's end.  The same lifecycles polled every
``--poll-minutes`` (one sample of that many active seconds per instance, ``sum``) are a CSV usage
file for the file collector.

How the notifications reach the bus (``--publish``):

* ``preload`` (default): every notification is on the queue before the job starts, published as
  oslo.messaging's v2 envelope with kombu (what a Notifier puts on the wire, at the broker's rate:
  the Notifier itself publishes ~700/s here).  The figure is the consumer's: from the moment the
  job's consumer is on the queue (Prism's job start excluded) to the last lifecycle notification
  finished — what draining a backlog after an outage costs.
* ``notifier``: the job runs first and a real oslo.messaging Notifier publishes (tests/bus_support.py):
  the real-bus figure, bound by the publisher.

What is timed:

* **notifications/s** through the whole path: bus → SQL inbox → Beam on Prism → definitions →
  trigger instances in state → lifecycle usage → frames → rating → Delta → inbox finished;
* **latency** — for ``--latency`` more lifecycles, one at a time once the stream is idle: from
  publishing the delete (with a later notification that moves event time past the period +
  ``fire_delay``, as the next notification of a busy cloud does) to its frame committed;
* **peak RSS** of the job: the launcher (the LOOPBACK SDK worker runs inside it) and its children,
  plus Prism (a Prism job server of its own per run, so its peak is this run's);
* **CPU seconds** used during the drain by the job's processes and by Prism: steadier than the
  wall time on a shared machine, and they say which side a change took work from; the job's are
  also printed by process (the launcher, the source's and the scope step's SDK workers);
* **polling** — ``ratebeam run`` (file collector, FnApiRunner) over the same lifecycles once every
  period is due: its run time, and the latency polling has by construction (a period is rated
  ``wait_periods`` periods after it ends, by the next cycle).

Checked (the run fails otherwise): every run stores the polling cycle's rated total, nothing is
recorded late, and with ``--exists`` the audit is reconciled (no discrepancy stored).

``--shards N`` runs N ``events serve --shard K/N`` jobs side by side on the one queue and one
PostgreSQL inbox (``--database postgresql``), each with a clock notification in one of its scopes
(each shard's job keeps its own event time): the figure is the N jobs' together, their peak RSS
summed; on this 2-core machine it says what N processes add beside one (Prism shared).

``--environment external`` runs the SDK worker in a pool process of its own (a runner config with
``environment: {type: EXTERNAL}``) instead of inside the job's process (LOOPBACK);
``--environment scopes-worker`` runs the shipped ``runner_configs/prism-events.yaml`` (the scope step
in a second worker process) against the bench's Prism.

``--profile DIR`` samples the job with py-spy (``pip install py-spy``; not a ratebeam dependency)
from the job's start to its last notification finished and prints where the time goes, per step
(``DIR/profile-<tenants>.txt`` keeps the collapsed stacks for a flame graph).

Usage: ``.venv/bin/python bench/bench_events.py --instances 10000 --tenants 1,10 --exists`` (RATEBEAM_RC
must hold prism and RabbitMQ; ``--database postgresql`` puts the inbox in the test PostgreSQL cluster).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import kombu
import sqlalchemy as sa
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bus_support import message, notifier, nova_instance, publish
from pipeline_support import RATEBEAM, ratebeam, setup_database, stored_rows, workspace
from servers import postgres, prism, rabbitmq
from test_events_stream import RULES, triggers_file

from ratebeam.connectors.notifications.client import NotificationConsumer
from ratebeam.connectors.notifications.inbox import scope_hash
from ratebeam.connectors.sql.models import EventDiscrepancy, EventFrame, EventInbox
from ratebeam.pipelines.config import load_config

DAY = datetime(2026, 3, 2, tzinfo=UTC)
LIFETIME = timedelta(hours=2, minutes=20)
RESIZE = timedelta(minutes=45)
HOUR = timedelta(hours=1)
QUEUE = "bench-events"
#: Where the clock notification puts event time once the lifecycles are published: past every frame's close.
CLOCK_AT = DAY + timedelta(hours=8)
#: The shipped runner config with the scope step in a worker process of its own (``--environment scopes-worker``).
SCOPES_WORKER = Path(__file__).resolve().parents[1] / "runner_configs" / "prism-events.yaml"


@dataclass(frozen=True)
class Lifecycle:
    """One instance: its tenant and the instants of its create, resize and delete."""

    vm: str
    tenant: str
    created: datetime
    resized: datetime
    deleted: datetime

    def flavor_at(self, when: datetime) -> str:
        return "m1.small" if when < self.resized else "m1.medium"

    def flavor_before(self, when: datetime) -> str:
        """The flavor in the instant before ``when`` (an audit period's last flavor)."""
        return "m1.small" if when <= self.resized else "m1.medium"


def lifecycles(count: int, tenants: int, start: datetime) -> list[Lifecycle]:
    """``count`` instances over ``tenants`` tenants, created over an hour from ``start``."""
    out = []
    for k in range(count):
        created = start + timedelta(seconds=(3600 * k) // max(count, 1))
        out.append(Lifecycle(f"vm-{k:05d}", f"tenant-{k % tenants:02d}", created, created + RESIZE, created + LIFETIME))
    return out


def notifications(items: list[Lifecycle], exists: bool) -> list[dict]:
    """The oslo messages of the lifecycles (and the hourly audit), in time order as a cloud emits them."""
    msgs = []
    for lc in items:
        msgs.append(message("compute.instance.create.end", nova_instance(lc.vm, lc.tenant, "m1.small", lc.created),
                            lc.created, message_id=f"create-{lc.vm}"))
        msgs.append(message("compute.instance.resize.confirm.end",
                            nova_instance(lc.vm, lc.tenant, "m1.medium", lc.resized), lc.resized,
                            message_id=f"resize-{lc.vm}"))
        msgs.append(message("compute.instance.delete.end", nova_instance(lc.vm, lc.tenant, "m1.medium", lc.deleted),
                            lc.deleted, message_id=f"delete-{lc.vm}"))
    if exists:
        msgs += audit(items)
    # In time order: published instance by instance, the later creates would be hours behind the
    # deletes already read, past fire_delay, and rightly recorded late, not billed.
    return sorted(msgs, key=lambda m: (m["timestamp"], m["message_id"]))


def audit(items: list[Lifecycle]) -> list[dict]:
    """Nova's hourly ``compute.instance.exists`` for each instance alive at an hour's end (audit: that hour).

    Sent over the first five minutes after the hour, as Nova's audit task walks its instances; the
    flavor is the instance's at the audit period's end, as the stream has it, so nothing disagrees.
    """
    msgs = []
    for k, lc in enumerate(items):
        end = lc.created.replace(minute=0, second=0) + HOUR
        while end < lc.deleted:
            sent = end + timedelta(seconds=(300 * k) // max(len(items), 1))
            payload = nova_instance(lc.vm, lc.tenant, lc.flavor_before(end), sent, launched_at=_oslo(lc.created),
                                    audit_period_beginning=_oslo(end - HOUR), audit_period_ending=_oslo(end))
            msgs.append(message("compute.instance.exists", payload, sent, message_id=f"exists-{lc.vm}-{end:%H}"))
            end += HOUR
    return msgs


def _oslo(when: datetime) -> str:
    return str(when.replace(tzinfo=None))


def clock(at: datetime, tenant: str = "clock") -> dict:
    """A notification no lifecycle ends with (an instance created at ``at``): it moves event time to ``at``."""
    return message("compute.instance.create.end", nova_instance(f"clock-{at:%H%M}", tenant, "m1.small", at), at,
                   message_id=f"clock-{tenant}-{at.isoformat()}")


def clock_tenants(shards: int) -> list[str]:
    """One clock tenant per shard (each shard's job keeps its own event time): ``clock`` when unsharded."""
    if shards == 1:
        return ["clock"]
    found: dict[int, str] = {}
    for j in range(1000):
        found.setdefault(scope_hash(f"clock-{j}") % shards, f"clock-{j}")
    return [found[k] for k in range(shards)]


def polled_csv(path: Path, items: list[Lifecycle], minutes: int) -> None:
    """The lifecycles as polling sees them: one sample per ``minutes``, that many active seconds, the flavor then."""
    step = timedelta(minutes=minutes)
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["metric", "timestamp", "value", "project_id", "instance_id", "flavor_name"])
        for lc in items:
            sample = lc.created
            while sample < lc.deleted:
                writer.writerow(["instance", sample.strftime("%Y-%m-%dT%H:%M:%SZ"), int(step.total_seconds()),
                                 lc.tenant, lc.vm, lc.flavor_at(sample)])
                sample += step


# ------------------------------------------------------------------------------------------- the bus


def amqp(url: str) -> str:
    return url.replace("rabbit://", "amqp://")


def preload(url: str, msgs: list[dict]) -> float:
    """Publish ``msgs`` as oslo.messaging's v2 envelope (what a Notifier sends) with kombu; returns the seconds."""
    exchange = kombu.Exchange("nova", type="topic", durable=False)
    start = time.monotonic()
    with kombu.Connection(amqp(url)) as conn:
        producer = conn.Producer(serializer=None)
        for msg in msgs:
            inner = {**msg, "_context_request_id": f"req-{msg['message_id'][:8]}"}
            body = json.dumps({"oslo.version": "2.0", "oslo.message": json.dumps(inner)})
            producer.publish(body, exchange=exchange, routing_key="notifications.info",
                             content_type="application/json", content_encoding="utf-8")
    return time.monotonic() - start


def consuming(url: str, queue: str, jobs: int = 1) -> bool:
    """Whether ``jobs`` jobs read ``queue`` (their consumers are on the broker): they have started."""
    with kombu.Connection(amqp(url)) as conn:
        try:
            return conn.default_channel.queue_declare(queue, passive=True).consumer_count >= jobs
        except conn.channel_errors:  # not declared yet
            return False


# ---------------------------------------------------------------------------------------------- the job


class Job:
    """``ratebeam events serve`` on Prism as a subprocess (its SDK worker LOOPBACK or in a pool process; one
    shard's job when ``shard`` is (K, N)); its log beside the config."""

    def __init__(self, config: Path, endpoint: str, shard: tuple[int, int] = (0, 1), environment: str = "loopback",
                 ) -> None:
        self.config = config
        self.shard = shard
        self.log_path = config.parent / f"serve-{shard[0]}.log"
        sharding = ["--shard", f"{shard[0]}/{shard[1]}"] if shard[1] > 1 else []
        if environment == "loopback":
            runner = ["--runner", "PortableRunner", f"--option=--job_endpoint={endpoint}",
                      "--option=--environment_type=LOOPBACK"]
        else:  # SDK workers in processes of their own (a local pool ratebeam starts), not the launcher's
            settings = yaml.safe_load(SCOPES_WORKER.read_text()) if environment == "scopes-worker" else {
                "runner": "PortableRunner", "environment": {"type": "EXTERNAL"}}
            path = config.parent / f"runner-{shard[0]}.yaml"
            path.write_text(yaml.safe_dump({**settings, "prism": {"endpoint": endpoint}}))
            runner = ["--runner-config", str(path)]
        with self.log_path.open("w") as out:
            self.proc = subprocess.Popen(
                [*RATEBEAM, "events", "serve", "-c", str(config), *sharding, *runner],
                stdout=subprocess.DEVNULL, stderr=out, text=True)
        self.engine = sa.create_engine(load_config(config, metrics=False).database_url)

    def wait(self, condition: Callable[[], bool], what: str, timeout: float, others: Sequence[Job] = ()) -> None:
        """Until ``condition``; fails when this job's process or one of ``others`` (the other shards) ends first."""
        deadline = time.monotonic() + timeout
        while not condition():
            for job in (self, *others):
                if job.proc.poll() is not None:
                    raise SystemExit(f"events serve (shard {job.shard[0]}) ended ({job.proc.returncode}): "
                                     f"{job.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}: {self.log()[-3000:]}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def inbox(self) -> tuple[int, int, int]:
        """(rows, unfinished rows, rows recorded late) of the inbox."""
        with self.engine.connect() as conn:
            total, finished, late = conn.execute(sa.select(
                sa.func.count(), sa.func.count(EventInbox.finished_at), sa.func.count(EventInbox.late_at))).one()
        return int(total), int(total) - int(finished), int(late)

    def frame_committed(self, scope: str, begin: datetime) -> bool:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(EventFrame.points).where(
                EventFrame.scope == scope, EventFrame.period_begin == begin)).first() is not None

    def discrepancies(self) -> Counter[str]:
        with self.engine.connect() as conn:
            return Counter(conn.execute(sa.select(EventDiscrepancy.kind)).scalars())

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.engine.dispose()


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += children.get(current, [])
    return out


def process_role(pid: int) -> str:
    """What a process of a job is, from its command line: the launcher, the pool, or an SDK worker and its environment.

    With ``prism-events.yaml`` the worker of the default environment runs the source, rating, writing and
    committing, and the one of the environment with resource hints runs the scope step.
    """
    try:
        command = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return "ended"
    if "worker_id=" in command:
        return "scope worker" if "resource_hints" in command else "source worker"
    return "worker pool" if "worker_pool_main" in command else "launcher"


def listening_pid(port: int) -> int | None:
    """The process listening on 127.0.0.1:``port`` (Prism's job server), from /proc/net/tcp and the fds."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return int(entry.name)
        except OSError:
            continue
    return None


def cpu_seconds(pids: list[int]) -> float:
    """The CPU time (user + system) the processes used so far, in seconds (from /proc)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return total / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pids: list[int]) -> float:
    """The sum of each process's peak resident set (VmHWM), in MiB: the job's peak, bounded from above."""
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return total / 1024


@contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy samples ``pid`` and its subprocesses for the block (nothing when ``out`` is None)."""
    if out is None:
        yield
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise SystemExit("--profile needs py-spy: pip install py-spy")
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "--rate", "50",
                             "--format", "raw", "--output", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


#: Steps of the stream, by the function a sample's stack passes through (first match from the leaf up).
STEPS = (
    ("source: inbox record (bus → SQL)", "record (connectors/notifications/inbox.py"),
    ("source: bus receive (kombu)", "receive (connectors/notifications/client.py"),
    ("source: inbox read (take)", "take (connectors/notifications/inbox.py"),
    ("source: poll (other)", "process (pipelines/events/source.py"),
    ("match: definitions", "convert (transforms/events/definitions.py"),
    ("match: triggers + grouping", "process (pipelines/events/match.py"),
    ("scope: lifecycle usage", "lifecycle_usage"),
    ("scope: timer (due instances, frames)", "on_due (pipelines/events/scope.py"),
    ("scope: events into state", "process (pipelines/events/scope.py"),
    ("rating", "flush (transforms/rate_dofn.py"),
    ("write (Delta)", "_write (connectors/storage/write_transform.py"),
    ("commit (inbox finished)", "process (pipelines/events/graph.py"),
    ("Beam: state and data channel", "apache_beam/runners/worker/"),
    ("Beam: coders", "apache_beam/coders/"),
)


def profile_summary(path: Path) -> list[tuple[str, float]]:
    """The share of the busy samples in each step of ``STEPS`` (py-spy's collapsed stacks, root first)."""
    counts: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            counts[step_of(stack.split(";"))] += int(count)
    total = sum(counts.values())
    return [(name, n / total) for name, n in counts.most_common()] if total else []


def step_of(frames: list[str]) -> str:
    """The deepest ratebeam step a stack is in; else the Beam part it is in; else ``other``."""
    deepest = None
    for frame in frames:
        for name, marker in STEPS:
            if marker in frame and not name.startswith("Beam"):
                deepest = name
    if deepest is not None:
        return deepest
    return next((name for name, marker in STEPS if any(marker in f for f in frames)), "other")


# --------------------------------------------------------------------------------------- the two sides


@dataclass
class EventsRun:
    tenants: int
    messages: int
    published_s: float
    elapsed_s: float
    latencies: list[float]
    total: Decimal
    peak_rss_mb: float
    #: CPU seconds during the drain: the jobs' processes (launcher, SDK workers), Prism.
    cpu_jobs_s: float
    cpu_prism_s: float
    #: The jobs' CPU seconds by process (``process_role``), summed over the jobs; and the broker's.
    cpu_by_process: dict[str, float]
    late: int
    discrepancies: Counter[str]
    profile: list[tuple[str, float]]


def events_workspace(root: Path, url: str, database_url: str, prefetch: int) -> Path:
    config = workspace(root, database_url)
    doc = yaml.safe_load(config.read_text())
    doc["events"] = {
        "source": {"transport_url": url, "exchanges": ["nova"], "queue": QUEUE, "poll_seconds": 0.2,
                   "wall_clock_lag": None, "prefetch": prefetch},
        "triggers": str(triggers_file(root)),
    }
    config.write_text(yaml.safe_dump(doc))
    (root / "rules.json").write_text(json.dumps(RULES))
    setup_database(config)
    return config


def bench_events(root: Path, url: str, database_url: str, items: list[Lifecycle], args: argparse.Namespace,
                 tenants: int) -> EventsRun:
    config = events_workspace(root, url, database_url, args.prefetch)
    clocks = clock_tenants(args.shards)
    msgs = notifications(items, args.exists) + [clock(CLOCK_AT, tenant) for tenant in clocks]
    timeout = 300 + len(msgs) / 20
    profile = None if args.profile is None else args.profile / f"profile-{tenants}.txt"
    with prism.running() as endpoint:
        prism_pid = listening_pid(int(endpoint.rsplit(":", 1)[1]))
        published = 0.0
        if args.publish == "preload":
            NotificationConsumer(load_config(config, metrics=False).events.source).declare()
            published = preload(url, msgs)
        jobs = [Job(config, endpoint, (k, args.shards), args.environment) for k in range(args.shards)]
        job = jobs[0]  # the inbox, the frames and the stored rows are shared: any job's view of them
        try:
            job.wait(lambda: consuming(url, QUEUE, len(jobs)), "the jobs to read the queue", timeout=300, others=jobs[1:])
            prism_pids = [prism_pid] if prism_pid else []
            broker_pid = listening_pid(int(url.rstrip("/").rsplit(":", 1)[1]))  # rabbit://…@127.0.0.1:<port>/
            broker_pids = [broker_pid] if broker_pid else []
            cpu_before = {p: cpu_seconds([p]) for p in
                          [*(p for j in jobs for p in descendants(j.proc.pid)), *prism_pids, *broker_pids]}
            with profiled(job.proc.pid, profile):
                start = time.monotonic()
                if args.publish == "notifier":
                    with notifier(url, "nova", "compute.host-1") as n:
                        for msg in msgs:
                            publish(n, msg)
                    published = time.monotonic() - start
                job.wait(lambda: job.inbox()[:2] == (len(msgs), len(clocks)), "every lifecycle notification finished",
                         timeout, others=jobs[1:])
                elapsed = time.monotonic() - start
            # a worker process the pool starts during the drain counts whole
            job_pids = [p for j in jobs for p in descendants(j.proc.pid)]
            by_process: Counter[str] = Counter()
            for pid in job_pids:
                by_process[process_role(pid)] += cpu_seconds([pid]) - cpu_before.get(pid, 0.0)
            cpu_jobs = sum(by_process.values())
            by_process["RabbitMQ (not in the job's)"] = sum(cpu_seconds([p]) - cpu_before[p] for p in broker_pids)
            cpu_prism = sum(cpu_seconds([p]) - cpu_before[p] for p in prism_pids)
            latencies = [latency(job, url, k) for k in range(args.latency)]
            rss = peak_rss_mb([*(p for j in jobs for p in descendants(j.proc.pid)), *([prism_pid] if prism_pid else [])])
            late = job.inbox()[2]
            found = job.discrepancies()
        finally:
            for each in jobs:
                each.stop()
    rows = stored_rows(config)
    lifecycle_rows = rows.filter(rows["scope_id"].str.starts_with("tenant-") & (rows["scope_id"] != "tenant-lat"))
    return EventsRun(tenants, len(msgs) - len(clocks), published, elapsed, latencies,
                     sum(lifecycle_rows["price"].to_list(), Decimal(0)), rss, cpu_jobs, cpu_prism, dict(by_process), late, found,
                     profile_summary(profile) if profile is not None and profile.exists() else [])


def latency(job: Job, url: str, k: int) -> float:
    """One lifecycle on an idle stream: seconds from publishing its delete (and a later clock) to its frame stored."""
    created = DAY + timedelta(hours=10 + 4 * k)
    vm, tenant = f"lat-{k}", "tenant-lat"
    with notifier(url, "nova", "compute.host-1") as n:
        publish(n, message("compute.instance.create.end", nova_instance(vm, tenant, "m1.small", created), created,
                           message_id=f"create-{vm}"))
        time.sleep(1.0)  # the stream is idle again before the end event
        start = time.monotonic()
        deleted = created + timedelta(minutes=30)
        publish(n, message("compute.instance.delete.end", nova_instance(vm, tenant, "m1.small", deleted), deleted,
                           message_id=f"delete-{vm}"))
        publish(n, clock(created + timedelta(hours=3), tenant))  # in its scope: in its shard
    job.wait(lambda: job.frame_committed(tenant, created.replace(minute=0)), "the end event's frame", timeout=300)
    return time.monotonic() - start


def bench_polling(root: Path, items: list[Lifecycle], minutes: int) -> dict:
    config = workspace(root)
    doc = yaml.safe_load(config.read_text())
    doc["collector"] = {"backend": "file", "url": "polled.csv"}
    doc["fetcher"] = {"backend": "source", "scopes": sorted({lc.tenant for lc in items})}
    doc["metrics"] = "metrics-events.yml"
    config.write_text(yaml.safe_dump(doc))
    (root / "metrics-events.yml").write_text(yaml.safe_dump({"metrics": {"instance": {
        "unit": "second", "groupby": ["instance_id", "flavor_name"], "extra_args": {"aggregation_method": "sum"}}}}))
    (root / "rules.json").write_text(json.dumps(RULES))
    polled_csv(root / "polled.csv", items, minutes)
    setup_database(config)
    now = (DAY + timedelta(hours=12)).isoformat()  # every period of the lifecycles is due (wait_periods after it)
    start = time.monotonic()
    done = ratebeam("run", "-c", str(config), "--now", now, timeout=3600)
    elapsed = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"ratebeam run failed: {done.stderr[-2000:]}")
    rows = stored_rows(config)
    return {"elapsed_s": elapsed, "total": sum(rows["price"].to_list(), Decimal(0)),
            "wait_periods": doc.get("wait_periods", 2), "period": doc.get("period", 3600)}


@contextmanager
def database(kind: str) -> Iterator[str]:
    """A fresh database URL: a database of the test PostgreSQL cluster, or ``''`` (the workspace's SQLite)."""
    if kind == "sqlite":
        yield ""
        return
    cluster = postgres.Cluster(postgres.rc_dir())
    cluster.join()
    name = f"ratebeam_bench_{uuid.uuid4().hex[:8]}"
    try:
        with postgres._connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        yield f"postgresql+psycopg://{postgres.USER}@{postgres.HOST}:{postgres.PORT}/{name}"
    finally:
        with postgres._connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cluster.leave()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--tenants", default="10", help="tenants the instances spread over; a comma list runs each")
    parser.add_argument("--exists", action="store_true", help="add Nova's hourly compute.instance.exists audit")
    parser.add_argument("--publish", choices=("preload", "notifier"), default="preload")
    parser.add_argument("--prefetch", type=int, default=500, help="events.source.prefetch")
    parser.add_argument("--latency", type=int, default=2, help="single lifecycles timed for the latency")
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite",
                        help="the inbox's database: the workspace's SQLite file, or a database of the test PostgreSQL")
    parser.add_argument("--poll-minutes", type=int, default=1, choices=(1, 5, 15), help="the polling side's sample step")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy the job; collapsed stacks in this directory")
    parser.add_argument("--environment", choices=("loopback", "external", "scopes-worker"), default="loopback",
                        help="the SDK worker inside the job's process (LOOPBACK), in a pool process of its own, "
                             "or two: runner_configs/prism-events.yaml")
    parser.add_argument("--shards", type=int, default=1,
                        help="events serve --shard K/N jobs run side by side on one queue (needs --database postgresql)")
    args = parser.parse_args()
    if args.shards > 1 and args.database != "postgresql":
        parser.error("--shards needs --database postgresql: the shard jobs share one inbox")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    tenant_counts = [int(t) for t in args.tenants.split(",")]
    start = DAY + timedelta(hours=3)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-events-") as tmp, rabbitmq.running() as url:
        for tenants in tenant_counts:
            with database(args.database) as database_url:
                runs.append(bench_events(Path(tmp) / f"events-{tenants}", url, database_url,
                                         lifecycles(args.instances, tenants, start), args, tenants))
        polling = bench_polling(Path(tmp) / "polling", lifecycles(args.instances, tenant_counts[0], start),
                                args.poll_minutes)
    report(args, runs, polling)


def report(args: argparse.Namespace, runs: list[EventsRun], polling: dict) -> None:
    load = Path("/proc/loadavg").read_text().split()[:3]
    kinds = "create, resize, delete" + (", hourly exists" if args.exists else "")
    print(f"{args.instances} instances ({kinds}): {runs[0].messages} notifications, hourly periods, Prism, "
          f"{args.database}, publish={args.publish}, prefetch {args.prefetch}, SDK worker {args.environment}"
          f"{f', {args.shards} shard jobs' if args.shards > 1 else ''}; load average {' '.join(load)} "
          f"on {os.cpu_count()} CPUs")
    print(f"{'side':>38}  {'seconds':>8}  {'notifications/s':>15}  {'end event -> stored row':>24}  {'peak RSS':>9}"
          f"  {'CPU s job / Prism':>17}")
    print(f"{'-' * 38}  {'-' * 8}  {'-' * 15}  {'-' * 24}  {'-' * 9}  {'-' * 17}")
    for run in runs:
        lat = run.latencies
        shown = f"median {statistics.median(lat):.2f} s (max {max(lat):.2f})" if lat else "-"
        print(f"{f'events serve, {run.tenants} tenant(s)':>38}  {run.elapsed_s:8.2f}  "
              f"{run.messages / run.elapsed_s:15,.0f}  {shown:>24}  {run.peak_rss_mb:6.0f} MB"
              f"  {f'{run.cpu_jobs_s:.1f} / {run.cpu_prism_s:.1f}':>17}")
    wait_h = polling["wait_periods"] * polling["period"] / 3600
    for run in runs:
        shown = ", ".join(f"{role} {cpu:.1f}" for role, cpu in sorted(run.cpu_by_process.items()) if cpu >= 0.05)
        print(f"{'':>38}  CPU s by process ({run.tenants} tenant(s)): {shown}")
    print(f"{'ratebeam run (file, FnApiRunner)':>38}  {polling['elapsed_s']:8.2f}  {'-':>15}  "
          f"{f'>= {wait_h:g} h + the next cycle':>24}  {'-':>9}")
    if len(runs) > 1:
        slowest, fastest = max(r.elapsed_s for r in runs), min(r.elapsed_s for r in runs)
        print(f"slowest / fastest tenant split: {slowest / fastest:.2f}x")
    print(f"(publishing took {', '.join(f'{r.published_s:.2f}' for r in runs)} s; polling rates a period only "
          f"{polling['wait_periods']} periods after it ends)")
    for run in runs:
        if run.profile:
            print(f"profile, {run.tenants} tenant(s) (share of the busy samples):")
            for name, share in run.profile:
                print(f"  {share:6.1%}  {name}")
    failed = []
    for run in runs:
        if run.total != polling["total"]:
            failed.append(f"{run.tenants} tenant(s): rated total {run.total} != polling {polling['total']}")
        if run.late:
            failed.append(f"{run.tenants} tenant(s): {run.late} notification(s) recorded late")
        if args.exists and run.discrepancies:
            failed.append(f"{run.tenants} tenant(s): audit not reconciled: {dict(run.discrepancies)}")
    print(f"rated totals equal: {'yes' if not failed else 'NO'}: polling {polling['total']}, events "
          f"{', '.join(str(r.total) for r in runs)}" + ("; audit reconciled (no discrepancy)" if args.exists else ""))
    if failed:
        raise SystemExit("; ".join(failed))


if __name__ == "__main__":
    main()
