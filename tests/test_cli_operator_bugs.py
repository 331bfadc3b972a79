"""The operator bugs found by trying every command on the demo workspace, one test (or more) each.

Dead letters that outlive their fix, ``gaps`` that cannot drive an alert, options silently lost,
exit statuses out of the grammar (0 ok, 1 something to look at, 2 refused input), refusals that do
not say where, and a demo whose data lay outside every default window.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from pipeline_support import (
    break_rules_of,
    fix_rules_of,
    ratebeam,
    run_cycle,
    setup_database,
    stored_rows,
    workspace,
)

from ratebeam.pipelines.cli import main
from ratebeam.pipelines.config import load_config

DEMO = ["--from", "2026-01-01T00:00:00Z", "--to", "2026-01-04T00:00:00Z"]
HOUR = timedelta(hours=1)


def _run(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        status = main(list(args))
    except SystemExit as exit:
        status = exit.code
    out, err = capsys.readouterr()
    return status, out, err


# ---- 2. a successful reprocess run closes the dead letters of the frames it re-rated ----

def test_a_reprocess_run_that_rerates_a_failed_frame_closes_its_dead_letter(copy, capsys):
    c = ["-c", str(copy)]
    window = ["--from", "2026-01-02T00:00:00Z", "--to", "2026-01-02T06:00:00Z"]
    break_rules_of(copy)
    assert main(["reprocess", "create", *c, "--scope", "globex", *window, "--reason", "try"]) == 0
    assert ratebeam("reprocess", "run", *c).returncode == 1  # globex's instance frames fail
    status, out, _ = _run(capsys, "failures", "list", *c, "--scope", "globex", "-f", "json")
    assert status == 0 and json.loads(out), "the failed frames are dead letters"
    assert _run(capsys, "gaps", *c, *window, "--scope", "globex", "--kind", "failed")[0] == 1
    fix_rules_of(copy)
    done = ratebeam("reprocess", "run", *c)
    assert done.returncode == 0, done.stderr
    status, out, _ = _run(capsys, "failures", "list", *c, "--scope", "globex", "-f", "json")
    assert json.loads(out) == []  # resolved by the reprocessing itself, not by a later `run`
    status, out, _ = _run(capsys, "gaps", *c, *window, "--scope", "globex", "--kind", "failed", "-f", "json")
    assert (status, json.loads(out)) == (0, [])


# ---- 3. gaps: a never-used type is no gap; --kind; exit 1 only when something is listed ----

def test_gaps_lists_empty_only_where_the_period_before_had_points(copy, capsys):
    status, out, _ = _run(capsys, "gaps", "-c", str(copy), *DEMO, "--kind", "empty", "-f", "json")
    gaps = json.loads(out)
    rows = stored_rows(copy).select("scope_id", "type", "begin").to_dicts()
    stored = {(r["scope_id"], r["type"], r["begin"]) for r in rows}
    types = load_config(copy).metrics.rating_types
    scopes = {s for s, _, _ in stored}
    start = datetime(2026, 1, 1, tzinfo=UTC)
    drops = {(s, t, start + i * HOUR) for s in scopes for t in types for i in range(1, 72)
             if (s, t, start + i * HOUR) not in stored and (s, t, start + (i - 1) * HOUR) in stored}
    assert {(g["scope"], g["type"], datetime.fromisoformat(g["period"])) for g in gaps} == drops
    assert status == (1 if drops else 0)
    never = {(s, t) for s in scopes for t in types} - {(s, t) for s, t, _ in stored}
    assert never, "the demo has a scope without some type (a project without floating IPs)"
    assert not [g for g in gaps if (g["scope"], g["type"]) in never]


def test_gaps_kind_filter_decides_the_exit_status(copy, capsys):
    c = ["gaps", "-c", str(copy), *DEMO]
    status, out, _ = _run(capsys, *c, "--kind", "failed", "--kind", "not_rated")
    assert status == 0 and out.splitlines()[-1].startswith("(0 gap(s)")
    status, out, _ = _run(capsys, *c, "--kind", "empty", "-f", "json")
    assert {g["gap"] for g in json.loads(out)} <= {"empty"}
    assert _run(capsys, *c, "--kind", "nosuch")[0] == 2


# ---- 4. no option silently lost ----

def test_summary_groupby_repeated_keeps_every_key(copy, capsys):
    status, out, _ = _run(capsys, "report", "summary", "-c", str(copy), "--from", "2026-01-01",
                          "--groupby", "type", "--groupby", "project_id", "-f", "json")
    rows = json.loads(out)["results"]
    assert status == 0 and rows
    assert all({"type", "project_id"} <= set(row) for row in rows)
    assert len({(r["type"], r["project_id"]) for r in rows}) == len(rows)


def test_summary_never_adds_qty_of_different_units(copy, capsys):
    c = ["report", "summary", "-c", str(copy), "--from", "2026-01-01", "-f", "json"]
    by_type = json.loads(_run(capsys, *c, "--groupby", "type")[1])["results"]
    status, out, _ = _run(capsys, *c)
    rows = json.loads(out)["results"]
    units = {m.rating_type: m.unit for m in load_config(copy).metrics.metrics}
    assert status == 0 and len({units[r["type"]] for r in by_type}) > 1
    assert {r["unit"] for r in rows} == {units[r["type"]] for r in by_type}  # one row per unit
    for row in rows:
        same_unit = [r for r in by_type if units[r["type"]] == row["unit"]]
        assert Decimal(str(row["qty"])) == sum(Decimal(str(r["qty"])) for r in same_unit)


def test_dataframes_of_an_unknown_type_warn_in_one_line_and_exit_0(copy, capsys):
    status, out, err = _run(capsys, "report", "dataframes", "-c", str(copy), "--from", "2026-01-01",
                            "--type", "nosuchtype")
    assert status == 0 and "(0 of 0 point(s))" in out
    assert len(err.strip().splitlines()) == 1 and "--type nosuchtype: no stored point" in err


# ---- 5. confirmations and exit statuses ----

def test_state_reset_needs_yes(copy, capsys):
    c = ["-c", str(copy)]
    before = _run(capsys, "state", "list", *c, "-f", "json")[1]
    status, _, err = _run(capsys, "state", "reset", "globex", "--from", "2026-01-02T00:00:00Z", *c)
    assert status == 2 and "add --yes" in err and len(err.strip().splitlines()) == 1
    assert _run(capsys, "state", "list", *c, "-f", "json")[1] == before
    assert _run(capsys, "state", "reset", "globex", "--from", "2026-01-02T00:00:00Z", "--yes", *c)[0] == 0
    assert _run(capsys, "state", "list", *c, "-f", "json")[1] != before


def test_unlocking_an_unknown_scope_is_refused_as_resetting_it(copy, capsys):
    c = ["-c", str(copy)]
    status, _, err = _run(capsys, "state", "unlock", "nosuch", *c)
    assert status == 2 and "nosuch" in err
    assert _run(capsys, "state", "reset", "nosuch", "--from", "2026-01-02T00:00:00Z", "--yes", *c)[0] == 2
    assert _run(capsys, "state", "unlock", "globex", *c)[0] == 0


def test_explain_without_a_stored_point_is_refused_input(copy, capsys):
    status, _, err = _run(capsys, "report", "explain", "-c", str(copy), "--scope", "nosuch", "--type", "instance",
                          "--from", "2026-01-02T00:00:00Z")
    assert status == 2 and "no stored point" in err and len(err.strip().splitlines()) == 1


# ---- 9. --scope in the reports; CloudKitty's k:v filters ----

def test_reports_take_scope_and_colon_filters(copy, capsys):
    c = ["report", "summary", "-c", str(copy), "--from", "2026-01-01", "--groupby", "project_id", "-f", "json"]
    by_scope = json.loads(_run(capsys, *c, "--scope", "globex")[1])["results"]
    by_colon = json.loads(_run(capsys, *c, "--filter", "project_id:globex")[1])["results"]
    by_equals = json.loads(_run(capsys, *c, "--filter", "project_id=globex")[1])["results"]
    assert by_scope == by_colon == by_equals and {r["project_id"] for r in by_scope} == {"globex"}
    status, out, _ = _run(capsys, "report", "dataframes", "-c", str(copy), "--from", "2026-01-01", "--scope",
                          "initech", "-f", "json")
    frames = json.loads(out)["dataframes"]
    assert status == 0 and frames
    assert {p["groupby"]["project_id"] for f in frames for ps in f["usage"].values() for p in ps} == {"initech"}


# ---- 8. -f everywhere: run, failures show, hashmap show as an object ----

def test_failures_show_takes_csv(tmp_path, capsys):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    break_rules_of(config)
    assert run_cycle(config).returncode == 1
    letters = json.loads(_run(capsys, "failures", "list", "-c", str(config), "-f", "json")[1])
    assert letters
    status, out, _ = _run(capsys, "failures", "show", str(letters[0]["id"]), "-c", str(config), "-f", "csv")
    assert status == 0 and out.splitlines()[0].startswith("id,scope,period")


# ---- 11. rate --usage refusals name the line and the key ----

@pytest.mark.parametrize(("text", "where"), [
    ('{"type": "instance", "qty": 1}\n{"type": "instance", "qty": NaN}\n', "line 2 column 29: qty"),
    ('{"type": "instance", "qty": 1}\n{"type": "instance", "qty": 1, "desc": {"os": "\\ud800"}}\n',
     "line 2 column 47: desc.os"),
    ('{"type": "instance", "qty": -Infinity}\n', "line 1 column 29: qty"),
])
def test_rate_refusals_of_nan_and_lone_surrogates_name_the_line_and_key(tmp_path, capsys, text, where):
    usage = tmp_path / "bad.jsonl"
    usage.write_text(text)
    rules = tmp_path / "rules.json"
    rules.write_text('{"services": []}')
    status, _, err = _run(capsys, "rate", "--rules", str(rules), "--usage", str(usage))
    assert status == 2 and f"bad.jsonl: {where}: invalid JSON" in err, err
    assert len(err.strip().splitlines()) == 1


# ---- 10. the demo's data end now: every command works there without dates ----

def test_the_demo_data_end_now_and_commands_need_no_dates(tmp_path):
    demo = tmp_path / "demo"
    done = ratebeam("demo", "--dir", str(demo))
    assert done.returncode == 0, done.stderr
    assert "2026-01-01" not in done.stdout  # the hints give no dates
    c = ["-c", str(demo / "ratebeam.yaml")]
    summary = ratebeam("report", "summary", *c, "-f", "json")
    assert summary.returncode == 0 and json.loads(summary.stdout)["results"], summary.stderr
    frames = ratebeam("report", "dataframes", *c, "--scope", "globex", "--limit", "5", "-f", "json")
    assert frames.returncode == 0 and json.loads(frames.stdout)["dataframes"]
    run = ratebeam("run", *c, "-f", "json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["periods"]["rated"] <= 4 * 2  # at most the hours since the demo, per scope
    gaps = ratebeam("gaps", *c, "--kind", "failed", "--kind", "not_rated")
    assert gaps.returncode == 0, gaps.stdout + gaps.stderr
