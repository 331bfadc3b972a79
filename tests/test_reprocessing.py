"""Reprocessing schedules end to end: the demo (file collector) into Parquet, through the CLI.

The reference for "exactly the data of a clean reprocessing" is a fresh workspace rated from
scratch with the same (changed) rules and usage: inside the reprocessed ranges the stored rows must
equal it, outside them (other periods, other scopes) they must equal the rows stored before.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
import yaml
from pipeline_support import ratebeam, run_cycle, stored_rows
from reprocess_support import (
    RANGES,
    SHORT_LEASES,
    change_rules,
    job_store,
    outside,
    reference,
    schedule_both_after_a_change,
    t,
    within,
)

from ratebeam.connectors.sql.state_store import StateStore
from ratebeam.pipelines.cli import main


def list_json(config: Path, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["reprocess", "list", "-c", str(config), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


# --- the schedules: ratebeam's and CloudKitty's, both processed by `ratebeam run` ----------------------


def test_schedules_from_ratebeam_and_from_cloudkittys_api_are_both_processed_by_run(copy, tmp_path, capsys):
    before = stored_rows(copy)
    schedule_both_after_a_change(copy)
    last = RANGES["globex"][1]
    assert {(s["scope"], s["status"]) for s in list_json(copy, capsys)} == {("globex", "pending"),
                                                                             ("acme-web", "pending")}

    done = run_cycle(copy)  # nothing due in the regular cycle; the schedules run after it
    assert done.returncode == 0, done.stderr
    assert "reprocess: 9/9 period(s) done" in done.stderr

    after = stored_rows(copy)
    clean = reference(tmp_path / "ref", usage=True)
    assert within(after, RANGES).equals(within(clean, RANGES))
    assert outside(after, RANGES).equals(outside(before, RANGES))  # other periods and scopes untouched
    assert not within(after, RANGES).equals(within(before, RANGES))  # the new price is there
    # The end period once (CloudKitty stores it twice), the gone floating IP gone, one instance fewer.
    end = after.filter((pl.col("scope_id") == "globex") & (pl.col("begin") == t(last)))
    assert end.height == within(clean, {"globex": (last, last)}).height
    gone = after.filter((pl.col("scope_id") == "globex") & (pl.col("begin") == t("2026-01-02T03:00:00")))
    assert sorted(gone["type"].to_list()) == ["instance", "volume.size"]
    listed = list_json(copy, capsys)
    assert {s["status"] for s in listed} == {"finished"}
    hour = 3600  # the list's end is excluded, as every end of the command line; current is the last period done
    assert all(datetime.fromisoformat(s["end"]).timestamp() - datetime.fromisoformat(s["current"]).timestamp() == hour
               for s in listed)


# --- resumable after SIGKILL ---------------------------------------------------------------------------------


@pytest.mark.parametrize("failpoint", ["job-commit:6", "write:5"])
def test_a_job_killed_mid_way_resumes_and_ends_with_the_clean_reprocessing(rated, tmp_path, failpoint):
    config = tmp_path / "ws" / "ratebeam.yaml"
    shutil.copytree(rated.parent, config.parent)
    doc = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**doc, **SHORT_LEASES}))
    before = stored_rows(config)
    change_rules(config)
    assert main(["reprocess", "create", "-c", str(config), "--all", "--from", "2026-01-01T00:00",
                 "--to", "2026-01-04T00:00", "--reason", "new prices"]) == 0

    crashed = ratebeam("reprocess", "run", "-c", str(config), "--chunk", "8",
                       env={"RATEBEAM_FAILPOINT": failpoint})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    store = job_store(config)
    progress = [j.current for j in store.schedules()]
    if failpoint.startswith("job-commit"):  # round 1 committed (4 scopes), then 1 of round 2
        assert sorted(p for p in progress if p) == [t("2026-01-01T07:00:00")] * 3 + [t("2026-01-01T15:00:00")]
    assert not all(j.finished for j in store.schedules())

    time.sleep(2.5)  # the killed job's leases expire
    rerun = ratebeam("reprocess", "run", "-c", str(config), "--chunk", "8")
    assert rerun.returncode == 0, rerun.stderr
    assert all(j.finished for j in store.schedules())
    after = stored_rows(config)
    clean = reference(tmp_path / "ref")
    assert after.height == clean.height  # no period stored twice, the end period included
    assert after.equals(clean)
    assert not after.equals(before)
    store.engine.dispose()


# --- leases: a job never writes a scope a regular run holds --------------------------------------------------


def test_a_scope_leased_by_another_run_is_left_for_the_next_job_run(copy):
    assert main(["reprocess", "create", "-c", str(copy), "--scope", "initech", "--from", "2026-01-03T00:00",
                 "--to", "2026-01-03T02:00", "--reason", "lease test"]) == 0
    store = job_store(copy)
    states = StateStore(store.engine, "project_id", "source", "file")
    assert states.acquire("initech", "someone-else", 600, datetime.now(UTC)) is not None
    busy = ratebeam("reprocess", "run", "-c", str(copy))
    assert busy.returncode == 1
    assert "1 scope(s) skipped: another run holds their lease" in busy.stderr
    assert store.schedules()[0].current is None
    states.release("initech", "someone-else")
    done = ratebeam("reprocess", "run", "-c", str(copy))
    assert done.returncode == 0, done.stderr
    assert store.schedules()[0].finished
    store.engine.dispose()


# --- CloudKitty's checks, with clear errors (exit 2) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scope", "globex", "--from", "2026-01-02T01:00", "--to", "2026-01-02T00:00"], "must be after --from"),
        (["--scope", "globex", "--from", "2026-01-02T00:30", "--to", "2026-01-02T02:00"],
         "a valid window near it is 2026-01-02T00:00:00+00:00 .. 2026-01-02T02:00:00+00:00"),
        (["--scope", "nope", "--from", "2026-01-02T00:00", "--to", "2026-01-02T02:00"], "nope have no active state"),
        (["--scope", "globex", "--from", "2026-01-03T00:00", "--to", "2026-01-04T01:00"],
         "after its last processed period (2026-01-03T23:00:00+00:00)"),
        (["--scope", "globex", "--from", "2026-01-01T03:00", "--to", "2026-01-01T05:00"], "already has schedule 1"),
        (["--scope", "globex", "--from", "2026-01-01T05:00", "--to", "2026-01-01T06:00"], "already has schedule 1"),
        (["--all", "--from", "2026-01-02T00:00", "--to", "2026-01-02T02:00", "--reason", "  "], "must not be blank"),
    ],
)
def test_create_refuses_what_cloudkittys_api_refuses(copy, capsys, args, message):
    assert main(["reprocess", "create", "-c", str(copy), "--scope", "globex", "--from", "2026-01-01T00:00",
                 "--to", "2026-01-01T06:00", "--reason", "first"]) == 0
    capsys.readouterr()
    reason = [] if "--reason" in args else ["--reason", "r"]
    assert main(["reprocess", "create", "-c", str(copy), *args, *reason]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert len(list_json(copy, capsys)) == 1  # nothing was scheduled


def test_a_deactivated_scope_is_not_scheduled_and_all_takes_the_active_ones(copy, capsys):
    assert main(["state", "deactivate", "-c", str(copy), "initech"]) == 0
    assert main(["reprocess", "create", "-c", str(copy), "--scope", "initech", "--from", "2026-01-01T00:00",
                 "--to", "2026-01-01T01:00", "--reason", "r"]) == 2
    assert main(["reprocess", "create", "-c", str(copy), "--all", "--from", "2026-01-01T00:00",
                 "--to", "2026-01-01T01:00", "--reason", "r"]) == 0
    assert sorted(s["scope"] for s in list_json(copy, capsys)) == ["acme-data", "acme-web", "globex"]


def test_cancel_by_id_and_by_scope(copy, capsys):
    for scope in ("globex", "initech"):
        assert main(["reprocess", "create", "-c", str(copy), "--scope", scope, "--from", "2026-01-01T00:00",
                     "--to", "2026-01-01T06:00", "--reason", "r"]) == 0
    capsys.readouterr()
    assert main(["reprocess", "list", "-c", str(copy), "--scope", "initech"]) == 0
    listed = capsys.readouterr().out
    assert "initech" in listed and "globex" not in listed
    assert main(["reprocess", "cancel", "-c", str(copy), "1"]) == 0
    assert [s["scope"] for s in list_json(copy, capsys)] == ["initech"]
    assert main(["reprocess", "cancel", "-c", str(copy), "--scope", "initech"]) == 0
    assert list_json(copy, capsys) == []
    assert main(["reprocess", "cancel", "-c", str(copy), "7"]) == 2
    assert "no unfinished schedule matches" in capsys.readouterr().err


# --- rules valid at each period's begin ----------------------------------------------------------------------


def test_each_period_is_re_rated_with_the_rules_valid_at_its_begin(copy, tmp_path):
    before = stored_rows(copy)
    rules = copy.parent / "rules.json"
    old = '{"value": "m1.small", "type": "flat", "cost": "0.02", "group": "compute"}'
    assert old in rules.read_text()
    rules.write_text(rules.read_text().replace(old, (
        '{"value": "m1.small", "type": "flat", "cost": "0.02", "group": "compute", "end": "2026-01-02T02:00:00Z"},'
        '{"value": "m1.small", "type": "flat", "cost": "0.05", "group": "compute", "start": "2026-01-02T02:00:00Z"}')))
    assert ratebeam("rules", "import", "-c", str(copy), str(rules)).returncode == 0
    assert main(["reprocess", "create", "-c", str(copy), "--scope", "globex", "--from", "2026-01-02T00:00",
                 "--to", "2026-01-02T06:00", "--reason", "price change at 02:00"]) == 0
    done = ratebeam("reprocess", "run", "-c", str(copy))
    assert done.returncode == 0, done.stderr
    after = stored_rows(copy)
    clean = reference(tmp_path / "ref")  # m1.small at 0.05 everywhere
    old_prices = {"globex": ("2026-01-02T00:00:00", "2026-01-02T01:00:00")}
    new_prices = {"globex": ("2026-01-02T02:00:00", "2026-01-02T05:00:00")}
    assert within(after, old_prices).equals(within(before, old_prices))
    assert within(after, new_prices).equals(within(clean, new_prices))
    assert not within(after, new_prices).equals(within(before, new_prices))
