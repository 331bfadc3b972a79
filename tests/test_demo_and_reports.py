"""``ratebeam demo`` on a fresh directory, and the report / state / rules commands on its result."""

from __future__ import annotations

import json
from decimal import Decimal

import polars as pl
import pytest
from pipeline_support import NOW, counters, ratebeam, stored_rows


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("demo") / "ratebeam-demo"
    done = ratebeam("demo", "--dir", str(workdir), "--now", NOW)  # the shipped dates, as the tests' workspaces
    assert done.returncode == 0, done.stderr
    return workdir, done.stdout


def _summary_table(stdout: str, title: str) -> list[list[str]]:
    """The body rows of the table printed under ``title`` (between the dashes and a blank line)."""
    lines = stdout.split(title, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    body = []
    for line in lines[start:]:
        if not line.strip():
            break
        body.append(line.split())
    return body


def test_demo_summary_equals_the_sum_of_the_stored_points(demo):
    workdir, stdout = demo
    rows = stored_rows(workdir / "ratebeam.yaml")
    per_scope_type = {
        (r["scope_id"], r["type"]): r["price"]
        for r in rows.group_by("scope_id", "type").agg(pl.col("price").sum()).to_dicts()
    }
    printed = {}
    for cells in _summary_table(stdout, "Cost per scope and type"):
        printed[(cells[0], cells[1])] = Decimal(cells[3])
    assert printed == per_scope_type
    total = Decimal(stdout.split("Total:", 1)[1].split()[0])
    assert total == sum(rows["price"].to_list(), Decimal(0)) > 0


def test_demo_again_rates_nothing_new(demo):
    workdir, stdout = demo
    before = stored_rows(workdir / "ratebeam.yaml")
    again = ratebeam("demo", "--dir", str(workdir), "--now", NOW)
    assert again.returncode == 0, again.stderr
    assert counters(again.stderr)["due"] == 0
    assert stored_rows(workdir / "ratebeam.yaml").equals(before)
    assert again.stdout.split("Cost per scope and type")[1] == stdout.split("Cost per scope and type")[1]


def test_report_summary_json_groupby_and_filters(demo):
    workdir, _ = demo
    config = str(workdir / "ratebeam.yaml")
    done = ratebeam("report", "summary", "-c", config, "--begin", "2026-01-01", "--end", "2026-02-01",
                    "--groupby", "type,time-d", "--filter", "project_id=globex", "--format", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    rows = stored_rows(workdir / "ratebeam.yaml").filter(pl.col("scope_id") == "globex")
    expected = {
        (r["type"], r["groupby.day_of_the_year"]): r["price"]
        for r in rows.group_by("type", "groupby.day_of_the_year").agg(pl.col("price").sum()).to_dicts()
    }
    got = {(r["type"], r["day_of_the_year"]): Decimal(r["rate"]) for r in result["results"]}
    assert got == expected
    assert result["total"] == len(expected) == 9  # 3 types x 3 days


def test_report_dataframes_in_cloudkitty_shape(demo):
    workdir, _ = demo
    done = ratebeam("report", "dataframes", "-c", str(workdir / "ratebeam.yaml"), "--begin", "2026-01-02",
                    "--end", "2026-01-02T01:00:00", "--filter", "project_id=globex", "--format", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["total"] == sum(len(points) for f in result["dataframes"] for points in f["usage"].values())
    (frame,) = result["dataframes"]
    assert frame["period"] == {"begin": "2026-01-02T00:00:00+00:00", "end": "2026-01-02T01:00:00+00:00"}
    point = frame["usage"]["ip.floating"][0]
    assert point["vol"] == {"unit": "ip", "qty": "1"}
    assert point["rating"] == {"price": "0.006"}
    assert point["groupby"]["project_id"] == "globex"


def test_rules_export_round_trips(demo, tmp_path):
    workdir, _ = demo
    config = str(workdir / "ratebeam.yaml")
    exported = tmp_path / "exported.json"
    assert ratebeam("rules", "export", "-c", config, str(exported)).returncode == 0
    again = tmp_path / "again.json"
    assert ratebeam("rules", "import", "-c", config, str(exported)).returncode == 0
    assert ratebeam("rules", "export", "-c", config, str(again)).returncode == 0
    assert json.loads(again.read_text()) == json.loads(exported.read_text())
    listing = ratebeam("rules", "list", "-c", config)
    assert listing.returncode == 0 and "m1.xlarge" in listing.stdout and "acme-data" in listing.stdout


def test_state_reset_rerates_from_the_given_period(demo):
    workdir, _ = demo
    config = str(workdir / "ratebeam.yaml")
    before = stored_rows(workdir / "ratebeam.yaml")
    done = ratebeam("state", "reset", "-c", config, "globex", "--from", "2026-01-03T00:00:00Z", "--yes")
    assert done.returncode == 0, done.stderr
    after_reset = stored_rows(workdir / "ratebeam.yaml")
    since = pl.datetime(2026, 1, 3, time_zone="UTC")
    gone = before.filter((pl.col("scope_id") == "globex") & (pl.col("begin") >= since))
    assert gone.height > 0
    assert after_reset.height == before.height - gone.height
    rerun = ratebeam("run", "-c", config, "--now", NOW)
    assert counters(rerun.stdout)["due"] == 24  # the reset period itself is re-rated (CloudKitty skips it)
    assert stored_rows(workdir / "ratebeam.yaml").equals(before)
    listing = ratebeam("state", "list", "-c", config)
    assert "globex" in listing.stdout and "2026-01-03T23:00:00+00:00" in listing.stdout


def test_inactive_scope_is_skipped(demo, tmp_path):
    workdir, _ = demo
    config = str(workdir / "ratebeam.yaml")
    assert ratebeam("state", "deactivate", "-c", config, "initech").returncode == 0
    rerun = ratebeam("run", "-c", config, "--now", "2026-01-04T06:00:00Z")
    assert "1 inactive" in rerun.stdout
    assert counters(rerun.stdout)["due"] == 3 * 4  # 4 new hours for the 3 active scopes
    assert ratebeam("state", "activate", "-c", config, "initech").returncode == 0
