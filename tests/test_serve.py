"""``ratebeam serve`` on Prism: N ticks store what N bounded ``ratebeam run`` cycles store, row for row.

The clock is simulated (``--now`` and ``--step``: tick k rates up to T0 + k × 6 h) and the cap of
4 periods per scope and cycle makes every tick's work depend on its own ``now``, so the comparison
is tick by tick, not only "everything got rated in the end".  The demo workspace: file usage,
Parquet storage, SQLite state.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import polars as pl
import pytest
import requests
from pipeline_support import RATEBEAM, counters, ratebeam, setup_database, stored_rows, workspace
from prometheus_client.parser import text_string_to_metric_families
from servers import free_port
from servers import prometheus as servers_prometheus

from ratebeam.connectors.sql.dead_letters import DeadLetterStore
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.cli import main
from ratebeam.pipelines.config import load_config

pytest_plugins = ["servers.prism"]  # the prism_endpoint session fixture
prometheus_server = servers_prometheus.prometheus_server  # the session fixture

T0 = datetime.fromisoformat("2026-01-01T06:00:00+00:00")
STEP = 6 * 3600
TICKS = 5
SETTINGS = {"max_periods_per_run": 4, "lease_seconds": 3}
INTERVAL = "5"  # wall seconds between ticks: more than a tick takes, so ticks never overlap


def states(config) -> dict[str, str]:
    cfg = load_config(config)
    store = StateStore(make_engine(cfg.database_url), cfg.scope_key, "source", "file")
    return {s.scope: s.last_processed.isoformat() for s in store.list_states()}


def leases(config) -> list:
    cfg = load_config(config)
    return StateStore(make_engine(cfg.database_url), cfg.scope_key, "source", "file").leases()


class Reference(NamedTuple):
    """What TICKS bounded runs store and commit; ``after[k]``: the state after run k."""

    rows: pl.DataFrame
    state: dict[str, str]
    after: list[dict[str, str]]


@pytest.fixture(scope="module")
def bounded(tmp_path_factory) -> Reference:
    """The reference: TICKS bounded runs at T0, T0 + 6 h, ..."""
    config = workspace(tmp_path_factory.mktemp("bounded"), **SETTINGS)
    setup_database(config)
    after = []
    for k in range(TICKS):
        done = ratebeam("run", "-c", str(config), "--now", (T0 + timedelta(seconds=k * STEP)).isoformat())
        assert done.returncode == 0, done.stderr
        after.append(states(config))
    return Reference(stored_rows(config), states(config), after)


def serve_args(config, endpoint: str, first: int = 0, ticks: int = TICKS, interval: str = INTERVAL,
               start: datetime = T0, step: int = STEP) -> list[str]:
    """``serve`` on Prism (LOOPBACK) in simulated time: tick k (from ``first``) rates up to ``start + k × step``."""
    return ["serve", "-c", str(config), "--runner", "PortableRunner", f"--option=--job_endpoint={endpoint}",
            "--option=--environment_type=LOOPBACK", "--interval", interval,
            "--now", (start + timedelta(seconds=first * step)).isoformat(), "--step", str(step), "--ticks", str(ticks)]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class Serving:
    """``serve`` as a subprocess whose stderr lines are collected as they come."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen([*RATEBEAM, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def wait(self, timeout: float = 600) -> str:
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=30)
        return "".join(self.lines)


def serve_until_tick_2_plans(config, endpoint: str) -> tuple[subprocess.Popen, list[str]]:
    """``serve`` started, returned once tick 2 has planned (leased) its periods, with its log so far."""
    proc = subprocess.Popen([*RATEBEAM, *serve_args(config, endpoint)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    log = []
    deadline = time.monotonic() + 300
    for line in proc.stderr:  # tick 2 plans the periods from 08:00
        log.append(line)
        if "period(s) due from 2026-01-01T08:00:00" in line or time.monotonic() > deadline:
            break
    assert any("due from 2026-01-01T08:00:00" in line for line in log), "".join(log)[-3000:]
    return proc, log


def test_serve_help_names_its_options():
    done = ratebeam("serve", "--help")
    assert done.returncode == 0
    for option in ("--runner-config", "--interval", "--now", "--step", "--ticks", "--metrics-port"):
        assert option in done.stdout


def test_serve_refuses_the_in_memory_runner_in_one_line(tmp_path):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    done = ratebeam("serve", "-c", str(config), "--ticks", "1")
    assert done.returncode == 2, done.stderr
    assert "ratebeam: serve needs a runner that runs unbounded sources" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_says_at_start_that_a_zero_factor_bills_nothing(tmp_path):
    """For the service: ``run`` says it in each summary; ``serve`` has none, so it
    says it once at start, before the runner (here refused) is even looked at."""
    config = workspace(tmp_path / "ws")
    metrics = config.parent / "metrics.yml"
    metrics.write_text(metrics.read_text().replace("mutate: NUMBOOL", "mutate: NUMBOOL\n    factor: 0", 1))
    setup_database(config)
    done = ratebeam("serve", "-c", str(config), "--ticks", "1")
    assert done.returncode == 2, done.stderr
    assert (f"warning: {metrics}: openstack_nova_server_status (instance): factor is 0: every instance quantity "
            "is its offset (0), whatever was collected") in done.stderr.splitlines(), done.stderr


def test_serve_reads_a_runner_config_with_runner_options_as_run_does(tmp_path):
    """``runner_options`` (the shipped Flink files and flink-k8s.yaml have them) survive ``serve``'s
    ``--option`` merge: the run stops only where the Flink job server jar is missing, in one line."""
    config = workspace(tmp_path / "ws")
    setup_database(config)
    runner = tmp_path / "flink.yaml"
    runner.write_text(json.dumps({"runner": "FlinkRunner", "runner_options": ["--checkpointing_interval=60000"],
                                  "options": ["--flink_master=[local]", "--flink_job_server_jar=/nonexistent.jar"]}))
    for command in (["run"], ["serve", "--ticks", "1", "--option=--parallelism=2"]):
        done = ratebeam(*command, "-c", str(config), "--runner-config", str(runner))
        lines = [line for line in done.stderr.splitlines() if line.startswith("ratebeam: ")]
        assert done.returncode == 2, done.stderr[-3000:]
        assert len(lines) == 1 and "FlinkRunner cannot get Beam's Flink job server jar" in lines[0], done.stderr
        assert "Traceback" not in done.stderr


def test_five_ticks_store_what_five_bounded_runs_store(tmp_path, bounded, prism_endpoint):
    rows, state = bounded.rows, bounded.state
    config = workspace(tmp_path / "ws", **SETTINGS)
    setup_database(config)
    done = ratebeam(*serve_args(config, prism_endpoint), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert states(config) == state
    assert stored_rows(config).equals(rows)
    assert state["globex"] == "2026-01-01T19:00:00+00:00"  # 5 ticks x at most 4 periods


def test_a_job_killed_mid_tick_and_started_again_stores_the_same(tmp_path, bounded, prism_endpoint):
    """SIGKILL the whole job (launcher and its loopback worker) while tick 2 works; its leases
    expire lease_seconds after its last heartbeat; ``serve`` started again from tick 2 catches up."""
    rows, state = bounded.rows, bounded.state
    config = workspace(tmp_path / "ws", **SETTINGS)
    setup_database(config)
    proc, log = serve_until_tick_2_plans(config, prism_endpoint)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert max(states(config).values()) <= "2026-01-01T11:00:00+00:00"  # tick 2 not (all) committed
    time.sleep(float(SETTINGS["lease_seconds"]) + 1)  # the dead job's leases expire
    again = ratebeam(*serve_args(config, prism_endpoint, first=2, ticks=TICKS - 2), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert states(config) == state
    assert stored_rows(config).equals(rows)


def test_sigterm_mid_tick_finishes_the_tick_releases_its_leases_and_exits_0(tmp_path, bounded, prism_endpoint):
    """SIGTERM while tick 2 works: tick 2 commits, no lease is left, exit 0; a later ``serve`` of the
    remaining ticks ends where the bounded runs end."""
    config = workspace(tmp_path / "ws", **SETTINGS)
    setup_database(config)
    proc, log = serve_until_tick_2_plans(config, prism_endpoint)
    assert leases(config), "tick 2 holds its leases while it works"
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 0, "".join(log)[-2000:] + rest[-3000:]
    assert "SIGTERM: stopping after the current tick" in rest
    assert "ratebeam serve: stopped after 1 job(s)" in rest
    assert leases(config) == []
    assert states(config) == bounded.after[2]  # tick 2 finished, tick 3 never started
    again = ratebeam(*serve_args(config, prism_endpoint, first=3, ticks=TICKS - 3), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert states(config) == bounded.state
    assert stored_rows(config).equals(bounded.rows)


def test_wall_clock_ticks_store_what_bounded_runs_store(tmp_path, bounded, prism_endpoint):
    """``serve`` on the wall clock (no ``--now``): 3 ticks, one at start, then one every interval.

    The state is first moved to 03:00 by one bounded run at T0, so each tick (whatever its exact
    instant, months after the data) rates the next 4 periods of every scope: 3 ticks end where 3
    more bounded runs end, row for row.
    """
    reference = workspace(tmp_path / "bounded", **SETTINGS)
    setup_database(reference)
    later = datetime.now(UTC).isoformat()
    for now in (T0.isoformat(), later, later, later):
        done = ratebeam("run", "-c", str(reference), "--now", now)
        assert done.returncode == 0, done.stderr
    assert set(states(reference).values()) == {"2026-01-01T15:00:00+00:00"}

    config = workspace(tmp_path / "ws", **SETTINGS)
    setup_database(config)
    assert ratebeam("run", "-c", str(config), "--now", T0.isoformat()).returncode == 0
    simulated = serve_args(config, prism_endpoint, ticks=3, interval="8")
    at = simulated.index("--now")
    done = ratebeam(*simulated[:at], *simulated[at + 4:], timeout=600)  # without --now and --step
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ratebeam serve: stopped after 1 job(s)" in done.stderr
    assert done.stderr.count("fetched 4 scope(s)") == 3, done.stderr[-3000:]  # one fetch per tick
    assert states(config) == states(reference)
    assert stored_rows(config).equals(stored_rows(reference))


def cheaper_small(config) -> Path:
    """The workspace's rules with m1.small at 0.05 instead of 0.02 an hour (acme-web and globex run one)."""
    rules = (config.parent / "rules.json").read_text()
    changed = rules.replace('"m1.small", "type": "flat", "cost": "0.02"', '"m1.small", "type": "flat", "cost": "0.05"')
    assert changed != rules
    path = config.parent / "changed-rules.json"
    path.write_text(changed)
    return path


def test_rules_changed_between_two_ticks_rate_the_next_tick(tmp_path, bounded, prism_endpoint):
    """Rules imported while ``serve`` runs, after tick 0 committed and before tick 1 plans: tick 1
    on rates with them, as bounded run 1 on does after the same import (rules are read per tick)."""
    reference = workspace(tmp_path / "bounded", **SETTINGS)
    setup_database(reference)
    for k in range(TICKS):
        if k == 1:
            assert main(["rules", "import", "-c", str(reference), str(cheaper_small(reference))]) == 0
        done = ratebeam("run", "-c", str(reference), "--now", (T0 + timedelta(seconds=k * STEP)).isoformat())
        assert done.returncode == 0, done.stderr
    expected = stored_rows(reference)
    assert not expected.equals(bounded.rows)  # the change shows in what ticks 1.. store

    config = workspace(tmp_path / "ws", **SETTINGS)
    setup_database(config)
    changed = cheaper_small(config)
    serving = Serving(serve_args(config, prism_endpoint, interval="10"))
    wait_for(lambda: states(config) == bounded.after[0], "tick 0 to commit")
    assert main(["rules", "import", "-c", str(config), str(changed)]) == 0
    assert serving.count("period(s) due from 2026-01-01T04:00:00") == 0, "tick 1 planned before the import"
    log = serving.wait()
    assert serving.proc.returncode == 0, log[-3000:]
    assert states(config) == bounded.state
    served = stored_rows(config)
    stale = served.join(expected, on=served.columns, how="anti", nulls_equal=True)
    assert served.equals(expected), f"rated with other rules: {sorted(set(stale['begin'].to_list()))}"


def break_globex(config) -> None:
    """A tenant threshold on a text field: globex's frames with an instance fail at rating (`cloudkitty/rating/hash/__init__.py:193-199`)."""
    rules = json.loads((config.parent / "rules.json").read_text())
    rules["services"][0]["fields"][1]["thresholds"] = [
        {"level": "1", "type": "flat", "cost": "1", "group": "license", "tenant_id": "globex"}]
    broken = config.parent / "broken-rules.json"
    broken.write_text(json.dumps(rules))
    assert ratebeam("rules", "import", "-c", str(config), str(broken)).returncode == 0


def scrape(port: int) -> dict[str, float] | None:
    """The samples of ``/metrics`` as ``name{labels}`` → value (prometheus-client's own parser)."""
    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    except requests.RequestException:  # not listening yet, or gone
        return None
    return {sample.name + json.dumps(sample.labels, sort_keys=True) * bool(sample.labels): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_metrics_endpoint_serves_the_counters_failures_and_lag_of_the_ticks(tmp_path, prism_endpoint):
    """``serve --metrics-port`` scraped while 4 ticks run (globex failing from tick 2 on): between
    ticks k and k + 1 it serves the sums of k + 1 bounded runs' counters and failed frames, and the
    lag of the oldest due period of their state behind the wall clock; the failed frames are the
    run's dead letters."""
    ticks = 4
    reference = workspace(tmp_path / "bounded", **SETTINGS)
    setup_database(reference)
    break_globex(reference)
    sums, after = [], []  # after bounded run k: its counters and globex's failed frames summed; the state
    total = {"due": 0, "committed": 0, "rated": 0, "written": 0, "failed": 0}
    failed_frames = set()  # a frame failing again in a later run is one dead letter (with its count)
    for k in range(ticks):
        done = ratebeam("run", "-c", str(reference), "--now", (T0 + timedelta(seconds=k * STEP)).isoformat())
        lines = [line.split()[3] for line in done.stdout.splitlines() if line.startswith("  scope globex ")]
        failed, failed_frames = len(lines), failed_frames | set(lines)
        total = {name: value + {**counters(done.stdout), "failed": failed}[name] for name, value in total.items()}
        sums.append(total)
        after.append(states(reference))
    assert total["failed"] > 0 and total["committed"] > 0

    config = workspace(tmp_path / "ws", **SETTINGS)
    setup_database(config)
    break_globex(config)
    port = free_port()
    proc = subprocess.Popen([*RATEBEAM, *serve_args(config, prism_endpoint, ticks=ticks), "--metrics-port", str(port),
                             "--metrics-host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    scrapes: list[tuple[float, dict[str, float]]] = []

    def scraper() -> None:
        while proc.poll() is None:
            found = scrape(port)
            if found:
                scrapes.append((time.time(), found))
            time.sleep(0.2)

    thread = threading.Thread(target=scraper)
    thread.start()
    _, log = proc.communicate(timeout=600)
    thread.join()
    assert proc.returncode == 0, log[-3000:]
    assert stored_rows(config).equals(stored_rows(reference)) and states(config) == states(reference)
    (run_id,) = {line.split("serve: run ")[1].split(",")[0] for line in log.splitlines() if "serve: run " in line}
    assert len(DeadLetterStore(load_config(config).database_url).for_run(run_id)) == len(failed_frames)

    # The last tick's figures may come as the job ends; ticks 0..2 each have a quiet time after their commit.
    for k in range(ticks - 1):
        plateau = [(when, found) for when, found in scrapes
                   if found["ratebeam_periods_committed"] == sums[k]["committed"]
                   and found["ratebeam_periods_planned"] == sums[k]["due"]]
        assert plateau, (k, sums[k], [found["ratebeam_periods_committed"] for _, found in scrapes])
        _, found = plateau[-1]
        assert found["ratebeam_points_rated"] == sums[k]["rated"]
        assert found["ratebeam_points_written"] == sums[k]["written"]
        assert found["ratebeam_frames_failed_rate"] == sums[k]["failed"]
        assert found.get('ratebeam_scope_failed_frames{"scope": "globex"}', 0) == sums[k]["failed"]
        # The counters are polled (every second) and the lag is read at scrape time: the plateau's
        # last scrapes may come after the next tick has committed, so some scrape of it must match.
        oldest = min(datetime.fromisoformat(s) for s in after[k].values()) + timedelta(hours=1)
        lags = [(found["ratebeam_oldest_due_period_lag_seconds"], when - oldest.timestamp()) for when, found in plateau]
        assert any(served == pytest.approx(expected, abs=5) for served, expected in lags), (k, lags)
    assert sums[2]["failed"] > 0  # globex failed by tick 2: a per-scope figure was served


def test_serve_from_prometheus_batched_by_default_stores_what_a_per_scope_run_stores(
        tmp_path, prometheus_server, prism_endpoint):
    """The Prometheus collector's default batched stage (its GroupByKeys inside each tick's window) in
    the streaming pipeline: ticks at 03:00 and 06:00 rate the periods 00:00-01:00 then 02:00-04:00,
    and store what one bounded ``batched: false`` run at 06:00 stores."""
    from test_prometheus_pipeline import NOW, run
    from test_prometheus_pipeline import workspace as prometheus_workspace

    per_scope = prometheus_workspace(tmp_path / "per-scope", prometheus_server.api, batched=False)
    assert run(per_scope, NOW).ok
    config = prometheus_workspace(tmp_path / "serve", prometheus_server.api)
    setup_database(config)
    step = 3 * 3600
    before = prometheus_server.queries_answered()
    done = ratebeam("serve", "-c", str(config), "--runner", "PortableRunner", f"--option=--job_endpoint={prism_endpoint}",
                    "--option=--environment_type=LOOPBACK", "--interval", INTERVAL,
                    "--now", (NOW - timedelta(seconds=step)).isoformat(), "--step", str(step), "--ticks", "2",
                    timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert stored_rows(config).equals(stored_rows(per_scope))
    # per tick: the fetcher's query, then one per period x metric (2 then 3 periods, 3 metrics); counted
    # by the server (per scope, it would be 2 + 5 scopes x 5 periods x 3 metrics = 77)
    assert prometheus_server.queries_answered() - before == 2 + (2 + 3) * 3
