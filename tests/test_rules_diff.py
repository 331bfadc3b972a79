"""``rules diff``: the money a rule change makes, checked against two full runs, and ``--apply``.

The reference is not the diff's own arithmetic: it is the demo rated twice from scratch, once with
each rule set (``run`` with the current rules: stored totals A; a clean workspace with the proposed
rules imported and rated: totals B).  The diff must say B - A per scope and type, and the cells it
calls changed must be exactly those whose stored points differ between the two runs.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from pipeline_support import parquet_workspace, ratebeam, rated_once, stored_rows
from reprocess_support import job_store, reference, t

from ratebeam.pipelines.cli import main

RANGE = ["--from", "2026-01-01T00:00", "--to", "2026-01-05T00:00"]


def proposed_rules(config: Path) -> Path:
    """The demo's rules with m1.small from 0.02 to 0.05 an hour (``reprocess_support.change_rules``'s change)."""
    proposed = config.parent / "proposed.json"
    text = (config.parent / "rules.json").read_text()
    changed = text.replace('"m1.small", "type": "flat", "cost": "0.02"', '"m1.small", "type": "flat", "cost": "0.05"')
    assert changed != text
    proposed.write_text(changed)
    return proposed


def diff_json(config: Path, rules: Path, capsys, *extra: str) -> dict:
    capsys.readouterr()
    assert main(["rules", "diff", "-c", str(config), str(rules), *RANGE, "-f", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def totals(rows: pl.DataFrame) -> dict[tuple[str, str], Decimal]:
    summed = rows.group_by("scope_id", "type").agg(pl.col("price").sum())
    return {(s, ty): p for s, ty, p in summed.iter_rows()}


def cells_that_differ(a: pl.DataFrame, b: pl.DataFrame) -> set[tuple[str, datetime, str]]:
    keys = ["scope_id", "begin", "type"]
    differ = a.join(b, on=[c for c in a.columns if c != "point_id"], how="anti", nulls_equal=True)
    return {tuple(row) for row in differ.select(keys).unique().iter_rows()}


@pytest.fixture(scope="module")
def proposed_run(tmp_path_factory) -> pl.DataFrame:
    """The rows a clean demo workspace stores once the proposed rules are imported and rated."""
    return reference(tmp_path_factory.mktemp("proposed") / "ws")


def test_the_difference_is_what_two_full_runs_with_each_rule_set_store(copy, proposed_run, capsys):
    before = stored_rows(copy)
    document = diff_json(copy, proposed_rules(copy), capsys)
    assert stored_rows(copy).equals(before)  # writes nothing

    clean = proposed_run
    a, b = totals(before), totals(clean)
    assert set(a) == set(b) == {(r["scope_id"], r["type"]) for r in document["totals"]}
    for row in document["totals"]:
        key = (row["scope_id"], row["type"])
        assert Decimal(row["current"]) == a[key]  # the current rules re-rate the stored points exactly
        assert Decimal(row["proposed"]) == b[key]
        assert Decimal(row["difference"]) == b[key] - a[key]
    moved = {(r["scope_id"], r["type"]): Decimal(r["difference"]) for r in document["totals"]
             if Decimal(r["difference"])}
    assert moved == {("acme-web", "instance"): Decimal("2.58"), ("globex", "instance"): Decimal("1.47")}

    changed = {(c["scope_id"], t(c["begin"][:19]), c["type"]) for c in document["changed_cells"]}
    assert changed == cells_that_differ(clean, before)
    assert document["failed_frames"] == {"current": 0, "proposed": 0}


@pytest.fixture(scope="module")
def parquet_rated(tmp_path_factory) -> Path:
    """The demo rated into the ``parquet`` backend: one file per (scope, period, type) slice, so a
    slice that no job rewrote keeps its file's modification time."""
    return rated_once(parquet_workspace(tmp_path_factory.mktemp("parquet-rated") / "ws"))


@pytest.fixture
def parquet_copy(parquet_rated: Path, tmp_path: Path) -> Path:
    """A private copy of ``parquet_rated``; returns its ratebeam.yaml."""
    shutil.copytree(parquet_rated.parent, tmp_path / "ws")
    return tmp_path / "ws" / "ratebeam.yaml"


def test_apply_schedules_exactly_the_changed_cells_and_reprocessing_gives_the_proposed_run(parquet_copy, proposed_run,
                                                                                          capsys):
    copy = parquet_copy
    rules = proposed_rules(copy)
    changed = {(c["scope_id"], t(c["begin"][:19])) for c in diff_json(copy, rules, capsys)["changed_cells"]}
    files = {p: p.stat().st_mtime_ns for p in (copy.parent / "rated").rglob("*.parquet")}

    capsys.readouterr()
    assert main(["rules", "diff", "-c", str(copy), str(rules), *RANGE, "--apply", "--reason", "m1.small"]) == 0
    said = capsys.readouterr().err
    store = job_store(copy)
    schedules = store.schedules()
    assert f"{len(schedules)} schedule(s) created" in said
    period = 3600
    scheduled = {(s.scope, datetime.fromtimestamp(moment, s.start.tzinfo))
                 for s in schedules
                 for moment in range(int(s.start.timestamp()), int(s.last.timestamp()) + 1, period)}
    assert scheduled == changed  # no unchanged period, none missing
    assert {s.reason for s in schedules} == {"m1.small"}
    # Contiguous changed periods of a scope are one schedule.
    assert len(schedules) == len({s.scope for s in schedules})
    store.engine.dispose()

    done = ratebeam("reprocess", "run", "-c", str(copy))
    assert done.returncode == 0, done.stderr
    assert stored_rows(copy).equals(proposed_run)
    untouched = [p for p, mtime in files.items()
                 if (p.parent.name[len("scope="):], _stamp(p.stem)) not in changed]
    assert untouched and all(p.stat().st_mtime_ns == files[p] for p in untouched)
    assert diff_json(copy, rules, capsys)["changed_cells"] == []  # the rules are the database's now


def _stamp(name: str) -> datetime:
    return datetime.strptime(name, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


def test_apply_without_any_change_says_so_and_schedules_nothing(copy, capsys):
    capsys.readouterr()
    assert main(["rules", "diff", "-c", str(copy), str(copy.parent / "rules.json"), *RANGE, "--apply"]) == 0
    captured = capsys.readouterr()
    assert "0 changed cell(s)" in captured.out
    assert "no stored cell changes: nothing was scheduled" in captured.err
    store = job_store(copy)
    assert store.schedules() == []
    store.engine.dispose()


def test_apply_refused_by_a_reprocessing_check_changes_nothing(copy, capsys):
    assert main(["reprocess", "create", "-c", str(copy), "--scope", "globex", "--from", "2026-01-02T00:00",
                 "--to", "2026-01-02T02:00", "--reason", "already planned"]) == 0
    rules = proposed_rules(copy)
    capsys.readouterr()
    assert main(["rules", "diff", "-c", str(copy), str(rules), *RANGE, "--apply"]) == 2
    assert "already has schedule 1" in capsys.readouterr().err
    store = job_store(copy)
    assert len(store.schedules()) == 1
    store.engine.dispose()
    assert diff_json(copy, rules, capsys)["changed_cells"]  # the proposed rules were not imported


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.json"], "missing.json: cannot read"),
        (["bad.json"], "invalid JSON"),
        (["rules.json", "--from", "2026-01-03T00:00", "--to", "2026-01-02T00:00"], "--to: must be after --from"),
        (["rules.json", "--scope", "nobody"], "--scope: no such scope (it has no state: never rated): 'nobody'"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(copy, args, message, capsys):
    (copy.parent / "bad.json").write_text("{nope")
    capsys.readouterr()
    assert main(["rules", "diff", "-c", str(copy), str(copy.parent / args[0]), *args[1:], "--apply"]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert len(captured.err.strip().splitlines()) == 1 and not captured.out
    store = job_store(copy)
    assert store.schedules() == []  # --apply did nothing
    store.engine.dispose()
