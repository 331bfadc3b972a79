"""``ratebeam run``'s summary is its result: on stdout (the log stays on stderr), or one JSON
object for a scheduler, or nothing with ``--quiet``."""

from __future__ import annotations

import json

from pipeline_support import NOW, break_rules_of, counters, ratebeam, setup_database, workspace


def test_summary_on_stdout_log_on_stderr(tmp_path):
    config = workspace(tmp_path / "ws", max_periods_per_run=10)
    setup_database(config)
    done = ratebeam("run", "-c", str(config), "--now", NOW)
    assert done.returncode == 0, done.stderr
    assert counters(done.stdout) == {"due": 40, "committed": 40, "rated": counters(done.stdout)["rated"],
                                     "written": counters(done.stdout)["written"]}
    assert done.stdout.splitlines()[0].startswith("scopes: 4 fetched, 4 rated")
    assert "periods:" not in done.stderr and "ratebeam run: rating due periods" in done.stderr
    assert "capped this run: 248 more period(s) are due" in done.stderr  # a warning: with the log


def test_json_summary_is_one_object_for_schedulers(tmp_path):
    config = workspace(tmp_path / "ws", max_periods_per_run=10)
    setup_database(config)
    done = ratebeam("run", "-c", str(config), "--now", NOW, "--json")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    summary = json.loads(line)
    assert summary["exit_status"] == 0 and summary["ok"] is True
    assert summary["periods"] == {"due": 40, "rated": 40, "left_by_cap": 248}
    assert summary["points"]["collected"] == summary["points"]["written"] > 0
    assert summary["scopes"]["rated"] == 4 and summary["failures"] == [] and summary["skipped_leases"] == []


def test_json_summary_lists_failed_frames_and_the_exit_status(tmp_path):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    break_rules_of(config)
    done = ratebeam("run", "-c", str(config), "--now", NOW, "--json")
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout)
    assert summary["exit_status"] == 1 and summary["ok"] is False
    assert summary["failures"] and {f["scope"] for f in summary["failures"]} == {"globex"}
    assert all(f["stage"] == "rate" and "os_distro" in f["reason"] for f in summary["failures"])


def test_quiet_prints_no_summary(tmp_path):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    done = ratebeam("run", "-c", str(config), "--now", NOW, "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    again = ratebeam("run", "-c", str(config), "--now", NOW)
    assert counters(again.stdout)["due"] == 0  # the quiet run did rate everything


def test_json_summary_names_the_leases_that_skipped_scopes(copy):
    from datetime import UTC, datetime

    from ratebeam.connectors.sql.engine import make_engine
    from ratebeam.connectors.sql.lease_owner import make_owner
    from ratebeam.connectors.sql.state_store import StateStore
    from ratebeam.pipelines.config import load_config

    cfg = load_config(copy)
    store = StateStore(make_engine(cfg.database_url), cfg.scope_key, cfg.fetcher.backend, cfg.collector.backend)
    owner = make_owner("alive")  # this process's: a live run on this host, waited for
    assert store.acquire("globex", owner, 3600, datetime.now(UTC))
    store.engine.dispose()
    done = ratebeam("run", "-c", str(copy), "--now", NOW, "--json")
    summary = json.loads(done.stdout)
    assert summary["scopes"]["skipped_leased_elsewhere"] == 1
    (lease,) = summary["skipped_leases"]
    assert lease["scope"] == "globex" and lease["owner"] == owner and lease["expires_at"]
    assert summary["exit_status"] == done.returncode


def test_a_zero_factor_is_taken_with_a_warning_in_the_summary(tmp_path, capsys):
    """``factor: 0`` is valid (CloudKitty takes it) but bills nothing of the metric:
    the run says so in its summary, text and JSON."""
    from hardening_support import one_sample
    from hardening_support import run as run_in_process

    from ratebeam.pipelines.cli import main

    ws = one_sample(tmp_path / "ws")
    metrics = ws / "metrics.yml"
    metrics.write_text(metrics.read_text().replace("mutate: NUMBOOL", "mutate: NUMBOOL\n    factor: 0", 1))
    status, printed = run_in_process(ws, capsys, "2026-01-01T04:00:00Z")
    assert status == 0, printed
    warning = (f"warning: {ws / 'metrics.yml'}: openstack_nova_server_status (instance): factor is 0: every "
               "instance quantity is its offset (0), whatever was collected")
    assert warning in printed.splitlines(), printed
    capsys.readouterr()
    assert main(["run", "-c", str(ws / "ratebeam.yaml"), "--now", "2026-01-01T06:00:00Z", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == [warning.removeprefix("warning: ")]
