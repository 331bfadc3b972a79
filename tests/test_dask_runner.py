"""The Dask runner on a real dask.distributed cluster stores exactly the rows FnApiRunner stores.

The session's cluster (``tests/servers/dask_cluster.py``) is a ``dask scheduler`` and two
``dask worker --nthreads 1`` processes on 127.0.0.1: every DoFn runs in a worker process, never in
ratebeam's.  Compared row by row with FnApiRunner (money exact, ``pipeline_support.stored_rows``):
a cycle over the file collector and over Prometheus (with the same run figures, which on Dask come
from the graph's tallies alone), a backfill, and a reprocessing schedule made by ``rules diff
--apply``.  The demo runs on the local cluster ratebeam starts itself (``dask.yaml``).  Faults: a
worker SIGKILLed in the middle of a run, an unreachable scheduler, a missing extra; something
else than a scheduler at its address (an HTTP server, the scheduler's own dashboard port); a
worker SIGKILLed at random, after the first Delta write and after the last one, each run then
printing FnApiRunner's figures field by field (``--json``); a worker frozen by SIGSTOP, the job
cancelled after the stall limit and the rerun converging.

Times measured on a shared 2-core machine (load average 12, other work running): the HTTP and
dashboard cases 25-35 s each (a ratebeam process, the 5 s handshake limit), each worker-kill case
50-80 s (its own cluster, a worker started after the kill), the stall case about 110 s (10 s
stall limit, then a rerun), the FnApiRunner reference of those 20 s once per module.
"""

from __future__ import annotations

import http.server
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import apache_beam as beam
import psutil
import pytest
from pipeline_support import NOW, RATEBEAM, stored_rows, workspace
from servers import dask_cluster as servers_dask
from servers import prometheus as servers_prometheus
from test_prometheus_pipeline import NOW as PROMETHEUS_NOW
from test_prometheus_pipeline import prepare
from test_prometheus_pipeline import workspace as prometheus_workspace
from test_rules_diff import RANGE, proposed_rules

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.pipelines.cli import main
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.cycle import CycleReport, run_cycle
from ratebeam.pipelines.demo import DEMO_NOW
from ratebeam.pipelines.rating import load_rater
from ratebeam.pipelines.runners.launch import DASK_RUNNER, RunnerUnavailable

#: Tallies that count bundles, not work (as ``tests/test_portable_runners.py`` says).
BUNDLING = {"rating_batches"}
dask_cluster = servers_dask.dask_cluster
prometheus_server = servers_prometheus.prometheus_server


def _states(config: Path, capsys) -> str:
    capsys.readouterr()
    assert main(["state", "list", "-c", str(config)]) == 0
    return capsys.readouterr().out


def _dask_processes() -> set[int]:
    """The pids of the dask schedulers and workers running on this machine."""
    return {p.pid for p in psutil.process_iter(["cmdline"])
            if any("distributed.cli.dask_" in part for part in p.info["cmdline"] or [])}


def _cycles(configs: dict[str, Path], now, address: str) -> dict[str, CycleReport]:
    """One cycle of each prepared workspace: ``fnapi`` on FnApiRunner, ``dask`` on the cluster at ``address``."""
    runs = {"fnapi": ("FnApiRunner", []), "dask": (DASK_RUNNER, [f"--dask_client_address={address}"])}
    reports = {}
    for name, (runner, options) in runs.items():
        config = load_config(configs[name])
        engine = make_engine(config.database_url)
        rater = load_rater(engine, config.metrics)
        engine.dispose()
        reports[name] = run_cycle(config, rater, now=now, runner=runner, extra_options=options)
    return reports


def _same_rows_and_figures(configs: dict[str, Path], reports: dict[str, CycleReport]) -> None:
    assert reports["dask"].ok and reports["fnapi"].ok
    # Every figure of the summary, the exit status and the 'blocked' decision come from the graph;
    # only how many rating batches the work was cut into depends on the runner's bundles.
    figures = {name: {k: v for k, v in r.counters.items() if k not in BUNDLING} for name, r in reports.items()}
    assert figures["dask"] == figures["fnapi"]
    assert reports["dask"].counters["points_written"] > 0
    rows = {name: stored_rows(path) for name, path in configs.items()}
    assert rows["dask"].height > 0 and rows["dask"].equals(rows["fnapi"])


def _set_up(config: Path) -> Path:
    """``db upgrade`` and ``rules import`` of the workspace, in this process (``pipeline_support.setup_database``)."""
    assert main(["db", "upgrade", "-c", str(config)]) == 0
    assert main(["rules", "import", "-c", str(config), str(config.parent / "rules.json")]) == 0
    return config


def test_a_file_collector_cycle_stores_the_rows_and_figures_of_fnapirunner(dask_cluster, tmp_path):
    configs = {name: _set_up(workspace(tmp_path / name)) for name in ("fnapi", "dask")}
    reports = _cycles(configs, DEMO_NOW, dask_cluster.address)
    _same_rows_and_figures(configs, reports)
    assert reports["dask"].counters["periods_committed"] == 288


def test_a_prometheus_cycle_stores_the_rows_and_figures_of_fnapirunner(prometheus_server, dask_cluster, tmp_path):
    configs = {name: prometheus_workspace(tmp_path / name, prometheus_server.api) for name in ("fnapi", "dask")}
    for config in configs.values():
        prepare(config)  # db upgrade, the rules
    reports = _cycles(configs, PROMETHEUS_NOW, dask_cluster.address)
    _same_rows_and_figures(configs, reports)
    assert reports["dask"].counters["prometheus_requests"] > 1


def test_a_backfill_stores_the_rows_of_fnapirunner(rated, dask_cluster, tmp_path, capsys):
    config = _set_up(workspace(tmp_path / "ws"))
    assert main(["backfill", "-c", str(config), "--from", "2026-01-01T00:00", "--to", "2026-01-04T00:00", "--now", NOW,
                 "--chunk", "24", "--runner-config", str(dask_cluster.runner_config(tmp_path))]) == 0
    assert stored_rows(config).equals(stored_rows(rated))
    assert _states(config, capsys) == _states(rated, capsys)


def test_rules_diff_apply_then_reprocessing_stores_the_rows_of_fnapirunner(copy, dask_cluster, tmp_path, capsys):
    """``rules diff --apply`` schedules the changed cells; reprocessing them on Dask and on FnApiRunner
    (each on a copy of the rated demo) stores the same rows, the proposed rules' prices."""
    copies = {"dask": copy, "fnapi": tmp_path / "fnapi" / "ratebeam.yaml"}
    shutil.copytree(copy.parent, copies["fnapi"].parent)
    runners = {"dask": ["--runner-config", str(dask_cluster.runner_config(tmp_path))], "fnapi": []}
    before = stored_rows(copy)
    for name, config in copies.items():
        assert main(["rules", "diff", "-c", str(config), str(proposed_rules(config)), *RANGE, "--apply",
                     "--reason", "m1.small"]) == 0
        assert "schedule(s) created" in capsys.readouterr().err
        assert main(["reprocess", "run", "-c", str(config), *runners[name]]) == 0
    rows = {name: stored_rows(config) for name, config in copies.items()}
    assert not rows["dask"].equals(before) and rows["dask"].equals(rows["fnapi"])


def test_a_worker_killed_mid_run_loses_nothing_and_stores_nothing_twice(rated, tmp_path, capsys):
    """The only worker SIGKILLs itself at its second write (a failpoint); a worker started after it
    takes over, Dask recomputes what was lost, and the run completes with the clean rows."""
    config = _set_up(workspace(tmp_path / "ws"))
    try:
        cluster = servers_dask.running(0)
        with cluster as private:
            victim = private.start_worker("victim", {"RATEBEAM_FAILPOINT": "write:2"})
            private.wait_for_workers(1)
            run = subprocess.Popen([*RATEBEAM, "run", "-c", str(config), "--now", NOW, "--runner-config",
                                    str(private.runner_config(tmp_path))],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert victim.wait(timeout=240) == -9  # killed in the middle of the run
            assert run.poll() is None  # the run waits for a worker
            with private.worker("rescue"):
                out, err = run.communicate(timeout=240)
    except servers_dask.DaskUnavailable as exc:
        pytest.fail(str(exc))
    assert run.returncode == 0, err
    assert "288 committed" in out
    assert stored_rows(config).equals(stored_rows(rated))  # every point once, none missing
    assert _states(config, capsys) == _states(rated, capsys)
    assert main(["run", "-c", str(config), "--now", NOW]) == 0  # the rerun: nothing left to do
    assert "0 due, 0 committed" in capsys.readouterr().out
    assert stored_rows(config).equals(stored_rows(rated))


def test_the_demo_on_the_local_cluster_ratebeam_starts_and_stops(rated, tmp_path, capsys):
    before = _dask_processes()
    assert main(["demo", "--dir", str(tmp_path / "demo"), "--runner-config", "dask.yaml", "--now", NOW]) == 0
    assert "Total: 83.0748" in capsys.readouterr().out
    assert stored_rows(tmp_path / "demo" / "ratebeam.yaml").equals(stored_rows(rated))
    assert _dask_processes() <= before  # its scheduler and workers are gone with the run


def test_an_unreachable_scheduler_is_one_line_and_exit_2(copy, tmp_path, capsys):
    runner = tmp_path / "away.yaml"
    runner.write_text(f"runner: DaskRunner\ndask: {{scheduler: 'tcp://127.0.0.1:{servers_dask.free_port()}'}}\n")
    capsys.readouterr()
    assert main(["run", "-c", str(copy), "--now", NOW, "--runner-config", str(runner)]) == 2
    said = capsys.readouterr().err
    assert said.strip().count("\n") == 0 and "the Dask scheduler does not answer at 127.0.0.1:" in said


def test_serve_refuses_dask_in_one_line(copy, capsys):
    capsys.readouterr()
    assert main(["serve", "-c", str(copy), "--runner-config", "dask.yaml"]) == 2
    said = capsys.readouterr().err
    assert said.strip().count("\n") == 0 and "Dask is a batch engine" in said


def test_a_transform_the_translation_lacks_is_refused_before_any_task(dask_cluster):
    pipeline = beam.Pipeline(runner=DASK_RUNNER, argv=[f"--dask_client_address={dask_cluster.address}"])
    side = pipeline | "Side" >> beam.Create([1])
    pipeline | beam.Create([1, 2]) | beam.Map(lambda x, s: x + s[0], beam.pvalue.AsList(side))
    with pytest.raises(RunnerUnavailable, match="takes a side input, which the Dask runner does not pass"):
        pipeline.run()


def test_dask_yaml_is_installed_with_ratebeam(tmp_path):
    from ratebeam.pipelines.runners.config import load_runner_config

    config = load_runner_config("dask.yaml")
    assert config.runner == "DaskRunner" and config.dask is not None and config.dask.scheduler is None
    shutil.copy(Path(__file__).parents[1] / "runner_configs" / "dask.yaml", tmp_path / "d.yaml")
    (tmp_path / "d.yaml").write_text((tmp_path / "d.yaml").read_text().replace("  workers: 2", "  workers: 2\n"
                                                                               "  scheduler: tcp://h:8786"))
    with pytest.raises(Exception, match="workers is the size of the local cluster"):
        load_runner_config(tmp_path / "d.yaml")


# --- a scheduler address where something else answers -------------------------------------------

@pytest.fixture
def http_server() -> Iterator[str]:
    """A real HTTP server (Python's) on a free 127.0.0.1 port, for the block; yields ``host:port``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("listener", ["an HTTP server", "the scheduler's dashboard port"])
def test_something_else_than_a_scheduler_at_the_address_is_one_line_and_exit_2(listener, request, copy, tmp_path):
    """The TCP connect succeeds there; Dask's handshake does not: one line naming the address and what
    answered, exit 2, after the configured ``connect_timeout`` (a hang would end at the subprocess timeout)."""
    endpoint = (request.getfixturevalue("http_server") if listener == "an HTTP server"
                else request.getfixturevalue("dask_cluster").dashboard)
    runner = tmp_path / "wrong.yaml"
    runner.write_text(f"runner: DaskRunner\ndask: {{scheduler: 'tcp://{endpoint}', connect_timeout: 5}}\n")
    done = subprocess.run([*RATEBEAM, "run", "-c", str(copy), "--now", NOW, "--runner-config", str(runner)],
                          capture_output=True, text=True, timeout=240)
    said = done.stderr.strip()
    assert done.returncode == 2, said
    assert said.count("\n") == 0, said
    assert f"ratebeam: no Dask scheduler at tcp://{endpoint}: an HTTP server answers there (HTTP/" in said
    assert "no Dask handshake within 5 s" in said


# --- a worker killed: the figures stay FnApiRunner's --------------------------------------------

#: Periods per scope rated by one run in the kill and stall cases (4 scopes: 24 frames, cheap).
CAP = 6
#: The stall limit of the runs a worker is killed in: a run that hangs ends with the watch's line
#: naming what runs and who holds what it waits for, well before the test's timeout.
STALL_SECONDS = 120


def _small(root: Path) -> Path:
    return _set_up(workspace(root, max_periods_per_run=CAP))


def _run_json(config: Path, *options: str, timeout: float = 300) -> tuple[int, dict, str]:
    done = subprocess.run([*RATEBEAM, "run", "-c", str(config), "--now", NOW, "--json", *options],
                          capture_output=True, text=True, timeout=timeout)
    summary = json.loads(done.stdout) if done.stdout.strip() else {}
    summary.pop("run_id", None)
    return done.returncode, summary, done.stderr


@pytest.fixture(scope="module")
def fnapi_reference(tmp_path_factory) -> tuple[dict, Path]:
    """A capped run on FnApiRunner: its ``--json`` summary (less the run id) and its workspace."""
    config = _small(tmp_path_factory.mktemp("fnapi") / "ws")
    status, summary, err = _run_json(config)
    assert status == 0, err
    assert summary["periods"]["rated"] == summary["periods"]["due"] > 0
    return summary, config


def _leases(config: Path) -> int:
    """How many scope leases are held in the workspace's SQLite database now."""
    with sqlite3.connect(config.parent / "ratebeam.db") as db:
        return db.execute("SELECT count(*) FROM ratebeam_scope_leases").fetchone()[0]


def _wait_for_leases(config: Path, run: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while _leases(config) == 0 and run.poll() is None:
        assert time.monotonic() < deadline, "the run never took a lease"
        time.sleep(0.05)


@pytest.mark.parametrize("moment", ["at random", "after the first Delta write", "after the last Delta write"])
def test_a_killed_worker_leaves_the_figures_of_fnapirunner(moment, fnapi_reference, tmp_path, capsys):
    """A real ``dask worker`` is SIGKILLed; Dask recomputes what it held on another worker, against a
    state that may have moved on (scopes committed); the run still prints FnApiRunner's figures.

    At random: two workers from the start, the victim killed from outside a random moment (seed
    printed) after the first lease.  After the first Delta write (``write:2``) and after the last
    (``commit:4``: the 4th scope's state commit, every write done, three scopes committed): the
    victim is the only worker, kills itself there, and a second one started then recomputes it all.
    """
    reference, clean = fnapi_reference
    config = _small(tmp_path / "ws")
    failpoint = {"after the first Delta write": "write:2", "after the last Delta write": "commit:4"}.get(moment)
    try:
        with servers_dask.running(0) as private:
            victim = private.start_worker("victim", {"RATEBEAM_FAILPOINT": failpoint} if failpoint else {})
            rescue = None if failpoint else private.start_worker("rescue")
            private.wait_for_workers(1 if failpoint else 2)
            run = subprocess.Popen([*RATEBEAM, "run", "-c", str(config), "--now", NOW, "--json", "--runner-config",
                                    str(private.runner_config(tmp_path, stall_seconds=STALL_SECONDS))],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                if failpoint:
                    assert victim.wait(timeout=240) == -signal.SIGKILL  # it killed itself at the failpoint
                    rescue = private.start_worker("rescue")
                else:
                    seed = int(os.environ.get("RATEBEAM_KILL_SEED") or random.randrange(10**6))
                    print(f"kill seed {seed} (RATEBEAM_KILL_SEED={seed} replays it)")
                    _wait_for_leases(config, run)
                    time.sleep(random.Random(seed).uniform(0, 4))
                    victim.kill()
                out, err = run.communicate(timeout=300)
            finally:
                if run.poll() is None:
                    run.kill()
                if rescue is not None:
                    servers_dask.stop(rescue)
                servers_dask.stop(victim)
    except servers_dask.DaskUnavailable as exc:
        pytest.fail(str(exc))
    assert run.returncode == 0, err
    summary = json.loads(out)
    summary.pop("run_id")
    for field in reference:
        assert summary[field] == reference[field], field
    assert stored_rows(config).equals(stored_rows(clean))
    capsys.readouterr()
    assert main(["run", "-c", str(config), "--now", NOW]) == 0  # the rerun starts where the state moved: the next CAP
    due = reference["periods"]["due"]
    assert f"periods: {due} due, {due} committed" in capsys.readouterr().out


# --- a frozen worker: the job is cancelled, the rerun converges ---------------------------------

def test_a_worker_frozen_by_sigstop_stalls_the_job_which_is_cancelled_and_the_rerun_converges(
        fnapi_reference, tmp_path):
    """The only worker is frozen (SIGSTOP) once the run holds its leases; after ``stall_seconds`` of no
    progress the launcher cancels the job, gives the leases back and exits 1 in one line naming the
    worker; the worker thawed (SIGCONT), a rerun stores FnApiRunner's rows with its figures."""
    reference, clean = fnapi_reference
    config = _small(tmp_path / "ws")
    try:
        with servers_dask.running(0) as private:
            frozen = private.start_worker("frozen")
            private.wait_for_workers(1)
            runner = tmp_path / "stall.yaml"
            runner.write_text(f"runner: DaskRunner\ndask: {{scheduler: '{private.address}', stall_seconds: 10}}\n")
            run = subprocess.Popen([*RATEBEAM, "run", "-c", str(config), "--now", NOW, "--runner-config", str(runner)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                _wait_for_leases(config, run)
                os.kill(frozen.pid, signal.SIGSTOP)
                _, err = run.communicate(timeout=240)
                assert run.returncode == 1, err
                line = err.strip().splitlines()[-1]
                assert line.startswith("ratebeam: the Dask job stalled: no progress for ") and "cancelled" in line
                assert "tcp://127.0.0.1:" in line  # the frozen worker, by its address
                assert _leases(config) == 0  # given back: no other run waits for them
            finally:
                os.kill(frozen.pid, signal.SIGCONT)
                if run.poll() is None:
                    run.kill()
            status, summary, err = _run_json(config, "--runner-config", str(private.runner_config(tmp_path)))
            servers_dask.stop(frozen)
    except servers_dask.DaskUnavailable as exc:
        pytest.fail(str(exc))
    assert status == 0, err
    assert summary == reference
    assert stored_rows(config).equals(stored_rows(clean))


def test_a_worker_frozen_while_it_holds_results_stalls_the_fetch_instead_of_hanging_it(tmp_path):
    """The results are computed; their only worker is frozen before the launcher fetches them.

    ``Client.gather`` alone waits forever there (the frozen worker accepts the connection and never
    answers): the launcher's fetch is watched, and ends after the stall limit naming the holder.
    """
    from dask import bag
    from distributed import Client

    from ratebeam.pipelines.runners.dask_runner import _release_job
    from ratebeam.pipelines.runners.dask_watch import DaskJob, DaskJobStalled, Watch

    with servers_dask.running(0) as private:
        frozen = private.start_worker("holder")
        private.wait_for_workers(1)
        client = Client(private.address, timeout=30)
        try:
            job = DaskJob(client, "ratebeam-test-fetch", Watch(client, "ratebeam-test-fetch", stall_seconds=3), _release_job)
            futures = client.compute([bag.from_sequence(range(10), npartitions=2)], optimize_graph=False)
            job.wait(futures)
            holder = next(iter(client.who_has(futures).values()))[0]
            os.kill(frozen.pid, signal.SIGSTOP)
            started = time.monotonic()
            with pytest.raises(DaskJobStalled) as stalled:
                job.fetch(futures)
            assert time.monotonic() - started < 60
            assert f"fetching results held by {holder}" in str(stalled.value)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
            client.close(timeout=10)
            servers_dask.stop(frozen)
