"""``ratebeam run --metrics-file`` (node_exporter's textfile collector) and ``--pushgateway`` (a real one).

The demo workspace with globex's rules broken: the run commits some periods and fails globex's
frames.  The textfile holds the run's counters as the run's own JSON summary gives them, the
failed frames per scope, the dead letters left open and each scope's lag behind the wall clock
as the state table says, in the exposition format prometheus-client's own parser reads; the same
figures reach Debian's Pushgateway.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests
from pipeline_support import NOW, break_rules_of, ratebeam, setup_database, workspace
from prometheus_client.parser import text_string_to_metric_families
from servers import prometheus as servers_prometheus

from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.config import load_config


def samples(text: str, job: str | None = None) -> dict[str, float]:
    """``name{labels}`` → value; with ``job``, only that Pushgateway group's, its grouping labels dropped."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if job is not None and s.labels.get("job") != job:
                continue
            labels = {k: v for k, v in s.labels.items() if job is None or k not in ("job", "instance")}
            found[s.name + (json.dumps(labels, sort_keys=True) if labels else "")] = s.value
    return found


@pytest.fixture
def broken(tmp_path):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    break_rules_of(config)
    return config


def expected_lags(config, at: float) -> dict[str, float]:
    cfg = load_config(config)
    store = StateStore(make_engine(cfg.database_url), cfg.scope_key, cfg.fetcher.backend, cfg.collector.backend)
    now = datetime.fromtimestamp(at, UTC)
    return {s.scope: (now - s.last_processed - timedelta(seconds=cfg.period)).total_seconds()
            for s in store.list_states(active=True) if s.last_processed is not None}


def check_figures(found: dict[str, float], summary: dict, config, written_at: float) -> None:
    assert found["ratebeam_cycles"] == 1
    assert found["ratebeam_periods_planned"] == summary["periods"]["due"] > 0
    assert found["ratebeam_periods_committed"] == summary["periods"]["rated"] > 0
    assert found["ratebeam_points_written"] == summary["points"]["written"] > 0
    failed = [f["scope"] for f in summary["failures"]]
    assert failed and set(failed) == {"globex"}
    assert found['ratebeam_scope_failed_frames{"scope": "globex"}'] == len(failed)
    assert found['ratebeam_dead_letters_open{"kind": "frame"}'] == len(failed)
    assert found["ratebeam_run_exit_status"] == summary["exit_status"] == 1
    assert found["ratebeam_database_up"] == 1
    lags = expected_lags(config, written_at)
    assert lags
    for scope, lag in lags.items():
        assert found[f'ratebeam_scope_lag_seconds{{"scope": "{scope}"}}'] == pytest.approx(lag, abs=60)


def test_run_writes_its_figures_to_a_textfile_atomically(broken, tmp_path):
    collector_dir = tmp_path / "textfile_collector"
    collector_dir.mkdir()
    textfile = collector_dir / "ratebeam.prom"
    textfile.write_text("# the previous run's file\n")
    done = ratebeam("run", "-c", str(broken), "--now", NOW, "--json", "--metrics-file", str(textfile))
    written_at = time.time()
    assert done.returncode == 1, done.stderr  # globex failed
    assert sorted(p.name for p in collector_dir.iterdir()) == ["ratebeam.prom"]  # no temporary file left
    found = samples(textfile.read_text())
    check_figures(found, json.loads(done.stdout), broken, written_at)
    assert found["ratebeam_run_last_end_timestamp_seconds"] == pytest.approx(written_at, abs=120)


def test_run_refuses_a_metrics_file_it_cannot_write_in_one_line(broken, tmp_path):
    done = ratebeam("run", "-c", str(broken), "--now", NOW, "--quiet", "--metrics-file",
                    str(tmp_path / "no-such-dir" / "ratebeam.prom"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("ratebeam: --metrics-file ")


def test_run_pushes_its_figures_to_a_pushgateway(broken, tmp_path):
    with servers_prometheus.pushgateway(tmp_path) as gateway:
        done = ratebeam("run", "-c", str(broken), "--now", NOW, "--json", "--pushgateway", gateway.url)
        pushed_at = time.time()
        assert done.returncode == 1, done.stderr
        found = samples(requests.get(f"{gateway.url}/metrics", timeout=30).text, job="ratebeam_run")
    check_figures(found, json.loads(done.stdout), broken, pushed_at)


def test_json_logs_are_one_object_per_line(broken):
    """``RATEBEAM_LOG_FORMAT=json``: every log record of the run is one JSON object on its own line;
    the other stderr lines are the command's own messages (``ratebeam run: ...``), not log records."""
    done = ratebeam("run", "-c", str(broken), "--now", NOW, "--quiet", "--log-level", "INFO",
                    env={"RATEBEAM_LOG_FORMAT": "json"})
    assert done.returncode == 1, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    others = [line for line in done.stderr.splitlines() if line and not line.startswith("{")]
    assert records and all(set(r) >= {"time", "level", "logger", "message"} for r in records)
    assert any(r["level"] == "INFO" and r["logger"].startswith("ratebeam") for r in records)
    assert all(line.startswith(("ratebeam", "warning:")) for line in others), others
    refused = ratebeam("run", "-c", str(broken), "--now", NOW, "--quiet", env={"RATEBEAM_LOG_FORMAT": "xml"})
    assert refused.returncode == 2 and refused.stderr.startswith("ratebeam: environment: RATEBEAM_LOG_FORMAT: ")
