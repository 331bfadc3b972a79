"""``ratebeam gaps``: the cells (scope, metric, period) collected empty, failed or not yet rated,
checked against what storage really holds; exit 1 when there is a gap, 0 when none."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from pipeline_support import break_rules_of, run_cycle, setup_database, stored_rows, workspace

from ratebeam.pipelines.cli import main
from ratebeam.pipelines.config import load_config

DEMO = ["--from", "2026-01-01T00:00:00Z", "--to", "2026-01-04T00:00:00Z"]
HOUR = timedelta(hours=1)


def _gaps(config, capsys, *window: str, fmt: str = "json") -> tuple[int, list[dict]]:
    status = main(["gaps", "-c", str(config), *window, "--format", fmt])
    out = capsys.readouterr().out
    return status, json.loads(out) if fmt == "json" else out


def _cells(config) -> tuple[set[tuple[str, str, datetime]], set[tuple[str, str, datetime]]]:
    """Every (scope, type, period) of the demo's three days, and those storage holds a point of."""
    types = load_config(config).metrics.rating_types
    rows = stored_rows(config)
    stored = {(r["scope_id"], r["type"], r["begin"]) for r in rows.select("scope_id", "type", "begin").to_dicts()}
    scopes = {s for s, _, _ in stored}
    start = datetime(2026, 1, 1, tzinfo=UTC)
    every = {(s, t, start + i * HOUR) for s in scopes for t in types for i in range(72)}
    return every, stored


def test_empty_cells_are_those_storage_has_no_point_of_after_a_period_that_had(copy, capsys):
    status, gaps = _gaps(copy, capsys, *DEMO)
    every, stored = _cells(copy)
    assert status == 1 and gaps
    assert {g["gap"] for g in gaps} == {"empty"}
    found = {(g["scope"], g["type"], datetime.fromisoformat(g["period"])) for g in gaps}
    assert found == {(s, t, p) for s, t, p in every - stored if (s, t, p - HOUR) in stored}


def test_a_fully_rated_window_has_no_gap_and_exits_0(copy, capsys):
    every, stored = _cells(copy)
    types = load_config(copy).metrics.rating_types
    full = sorted({(s, p) for s, _, p in stored if all((s, t, p) in stored for t in types)})
    scope, period = full[0]
    window = ["--from", period.isoformat(), "--to", (period + HOUR).isoformat(), "--scope", scope]
    assert main(["gaps", "-c", str(copy), *window]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"(0 gap(s) in 1 scope(s) x {len(types)} metric(s) x 1 period(s))"


def test_periods_after_the_state_are_not_rated(copy, capsys):
    window = ["--from", "2026-01-03T23:00:00Z", "--to", "2026-01-04T02:00:00Z", "--scope", "acme-web",
              "--scope", "nosuch"]
    status, gaps = _gaps(copy, capsys, *window)
    assert status == 1
    later = [g for g in gaps if g["gap"] == "not_rated"]
    types = load_config(copy).metrics.rating_types
    assert {(g["scope"], g["period"]) for g in later if g["scope"] == "acme-web"} == {
        ("acme-web", f"2026-01-04T0{h}:00:00+00:00") for h in range(2)}
    assert all(g["detail"] == "state at 2026-01-03T23:00:00+00:00" for g in later if g["scope"] == "acme-web")
    assert len([g for g in later if g["scope"] == "nosuch"]) == 3 * len(types)  # no state: never rated
    assert {g["detail"] for g in later if g["scope"] == "nosuch"} == {"the scope has no state: never rated"}


def test_failed_frames_are_gaps_naming_their_dead_letter(tmp_path, capsys):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    break_rules_of(config)
    assert run_cycle(config).returncode == 1
    assert main(["failures", "list", "-c", str(config), "--format", "json"]) == 0
    letters = {datetime.fromisoformat(d["period"]): d["id"] for d in json.loads(capsys.readouterr().out)}
    status, gaps = _gaps(config, capsys, *DEMO, "--scope", "globex")
    assert status == 1
    failed = [g for g in gaps if g["gap"] == "failed"]
    assert {datetime.fromisoformat(g["period"]) for g in failed} == set(letters)
    assert all(g["detail"].startswith(f"dead letter {letters[datetime.fromisoformat(g['period'])]} [rate]")
               for g in failed)
    # globex's state stopped before its first failed frame: what comes after is not rated (yet)
    first = min(letters)
    assert all(g["gap"] == "not_rated" for g in gaps if datetime.fromisoformat(g["period"]) > first
               and datetime.fromisoformat(g["period"]) not in letters)


def test_help_documents_the_exit_status(capsys):
    with pytest.raises(SystemExit):
        main(["gaps", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit status: 0 no gap listed, 1 gaps listed (EXIT_GAPS: alert on it), 2 bad input." in text


def test_csv_output_and_bad_windows(copy, capsys):
    status, text = _gaps(copy, capsys, *DEMO, fmt="csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert status == 1 and rows and list(rows[0]) == ["scope", "type", "period", "gap", "detail"]
    assert main(["gaps", "-c", str(copy), "--from", "2026-01-01T00:30:00Z", "--to", "2026-01-02"]) == 2
    assert "--from: not on a period boundary (period: 3600 s): '2026-01-01T00:30:00+00:00'" in capsys.readouterr().err
    assert main(["gaps", "-c", str(copy), "--from", "2026-01-02", "--to", "2026-01-01"]) == 2
    assert "--from: must be before --to (2026-01-01T00:00:00+00:00)" in capsys.readouterr().err
