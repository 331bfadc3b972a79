"""One bad value in a usage file neither crashes the run nor vanishes.

* A NaN or infinite sample (CSV text, or a Parquet float) used to panic inside Polars — a
  ``BaseException`` that ``except Exception`` misses, so the run died holding its leases.  The rule
  documented for Prometheus holds for files too: a NaN or infinite sample is no sample; the run goes
  on and its summary counts every such sample.
* A sample without a value, timestamp, metric or scope id used to be dropped silently and the period
  committed as if it had no usage.  For billing that is lost revenue nobody hears about: the run is
  refused before any lease is taken (exit 2), with one line naming the file, the line (CSV) or row
  and the column; the database and the stored data are unchanged.
* ``usage/more.CSV`` (an upper-case extension) used to be ignored; it is read.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hardening_support import copied, one_line, prepared, query, snapshot
from hardening_support import run as run_at
from pipeline_support import stored_rows

NOW = "2026-01-01T04:00:00Z"
HEADER = "metric,timestamp,value,project_id,id,flavor_name,os_distro\n"
VM = "openstack_nova_server_status"


def row(value: str = "1", timestamp: str = "2026-01-01T00:30:00Z", scope: str = "p1", metric: str = VM,
        vm: str = "vm-1") -> str:
    return f"{metric},{timestamp},{value},{scope},{vm},m1.small,ubuntu\n"


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A workspace reading the files of ``usage/`` for the scopes p1 and p2."""
    root = tmp_path_factory.mktemp("usage") / "ws"
    prepared(root, fetcher={"backend": "source", "scopes": ["p1", "p2"]},
             collector={"backend": "file", "url": "usage/"})
    (root / "usage").mkdir()
    return root


@pytest.fixture
def ws(template, tmp_path) -> Path:
    return copied(template, tmp_path)


def run(ws: Path, capsys) -> tuple[int, str]:
    return run_at(ws, capsys, NOW)


def stored(ws: Path) -> pl.DataFrame:
    return stored_rows(ws / "ratebeam.yaml") if (ws / "rated").exists() else pl.DataFrame()


# ---- NaN / Inf: no sample, counted in the summary ----


@pytest.mark.parametrize("bad", ["NaN", "nan", "+Inf", "-inf", "Infinity"])
def test_a_non_finite_sample_in_csv_is_no_sample_and_is_counted(ws, capsys, bad):
    (ws / "usage" / "u.csv").write_text(HEADER + row("1") + row(bad, vm="vm-2") + row("1", scope="p2"))
    status, err = run(ws, capsys)
    assert status == 0, err
    assert "Traceback" not in err and "panicked" not in err
    assert "1 NaN/Inf sample(s) dropped" in err, err
    rated = stored(ws)
    assert sorted(rated["groupby.id"].to_list()) == ["vm-1", "vm-1"]  # p1's vm-1 and p2's vm-1, never vm-2


def test_a_nan_float_in_parquet_is_no_sample_and_is_counted(ws, capsys):
    pl.DataFrame({
        "metric": [VM, VM, VM], "timestamp": ["2026-01-01T00:30:00Z"] * 3, "value": [1.0, float("nan"), float("inf")],
        "project_id": ["p1", "p1", "p2"], "id": ["vm-1", "vm-2", "vm-3"],
    }).write_parquet(ws / "usage" / "u.parquet")
    status, err = run(ws, capsys)
    assert status == 0, err
    assert "2 NaN/Inf sample(s) dropped" in err, err
    assert stored(ws)["groupby.id"].to_list() == ["vm-1"]


def test_a_nan_sample_does_not_kill_the_run_in_a_fresh_process(ws):
    """The original crash: a Polars panic in a subprocess run (what a user runs)."""
    from pipeline_support import ratebeam

    (ws / "usage" / "u.csv").write_text(HEADER + row("NaN"))
    done = ratebeam("run", "-c", str(ws / "ratebeam.yaml"), "--now", NOW)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PanicException" not in done.stderr and "1 NaN/Inf sample(s) dropped" in done.stdout
    assert query(ws, "SELECT count(*) FROM ratebeam_scope_leases") == [(0,)]


# ---- a sample missing a field: the run is refused, nothing changes ----

CSV_CASES = {
    "empty value": (row(""), "line 3: value: empty"),
    "empty timestamp": (row(timestamp=""), "line 3: timestamp: empty"),
    "empty scope id": (row(scope=""), "line 3: project_id: empty (the scope key)"),
    "empty metric": (row(metric=""), "line 3: metric: empty"),
}


@pytest.mark.parametrize("case", CSV_CASES)
def test_a_csv_sample_missing_a_field_refuses_the_run(ws, capsys, case):
    bad, where = CSV_CASES[case]
    (ws / "usage" / "u.csv").write_text(HEADER + row() + bad + row(scope="p2"))
    before = snapshot(ws)
    status, err = run(ws, capsys)
    assert status == 2, err
    assert one_line(err) == f"ratebeam: file collector: {ws / 'usage' / 'u.csv'}: {where}"
    assert snapshot(ws) == before


JSONL_CASES = {
    "null value": ('"value": null', "row 2: value: empty"),
    "empty string value": ('"value": ""', "row 2: value: empty"),
    "null timestamp": ('"timestamp": null', "row 2: timestamp: empty"),
    "null metric": ('"metric": null', "row 2: metric: empty"),
    "null scope id": ('"project_id": null', "row 2: project_id: empty (the scope key)"),
}


@pytest.mark.parametrize("case", JSONL_CASES)
def test_a_jsonl_sample_with_a_null_field_refuses_the_run(ws, capsys, case):
    override, where = JSONL_CASES[case]
    good = {"metric": f'"{VM}"', "timestamp": '"2026-01-01T00:30:00Z"', "value": "1", "project_id": '"p1"',
            "id": '"vm-1"'}
    key = override.split(":")[0].strip('"')
    bad = {**good, key: override.split(": ", 1)[1]}
    text = "".join("{" + ", ".join(f'"{k}": {v}' for k, v in r.items()) + "}\n" for r in (good, bad))
    (ws / "usage" / "u.jsonl").write_text(text)
    before = snapshot(ws)
    status, err = run(ws, capsys)
    assert status == 2, err
    assert one_line(err) == f"ratebeam: file collector: {ws / 'usage' / 'u.jsonl'}: {where}"
    assert snapshot(ws) == before


BAD_TIMESTAMPS = {
    "a word after good rows": ([row(), row(vm="vm-2"), row(timestamp="noon")], "line 4: timestamp: not an "
                               "ISO-8601 instant: 'noon'"),
    "a word first": ([row(timestamp="yesterday"), row()], "line 2: timestamp: not an ISO-8601 instant: 'yesterday'"),
    "naive then a bad month": ([row(timestamp="2026-01-01T00:30:00"), row(timestamp="2026-13-01T00:30:00")],
                               "line 3: timestamp: not an ISO-8601 instant: '2026-13-01T00:30:00'"),
    "past 9999": ([row(), row(timestamp="9999-12-31T23:59:59-01:00")],
                  "line 3: timestamp: after 9999-12-31 once in UTC: '9999-12-31T23:59:59-01:00'"),
}


@pytest.mark.parametrize("case", BAD_TIMESTAMPS)
def test_a_csv_timestamp_that_is_no_instant_is_named_by_line_and_value(ws, capsys, case):
    """The message was Polars' hint ("could not find an appropriate format to parse
    dates, please define a format"), without the row or the value."""
    rows, where = BAD_TIMESTAMPS[case]
    (ws / "usage" / "u.csv").write_text(HEADER + "".join(rows))
    before = snapshot(ws)
    status, err = run(ws, capsys)
    assert status == 2, err
    assert one_line(err) == f"ratebeam: file collector: {ws / 'usage' / 'u.csv'}: {where}"
    assert snapshot(ws) == before


def test_a_jsonl_timestamp_that_is_no_instant_is_named_by_row_and_value(ws, capsys):
    lines = [f'{{"metric": "{VM}", "timestamp": "{stamp}", "value": 1, "project_id": "p1"}}\n'
             for stamp in ("2026-01-01T00:30:00Z", "2026-01-01T01:30:00Z", "at noon")]
    (ws / "usage" / "u.jsonl").write_text("".join(lines))
    status, err = run(ws, capsys)
    assert status == 2, err
    assert one_line(err) == (f"ratebeam: file collector: {ws / 'usage' / 'u.jsonl'}: row 3: timestamp: not an "
                             "ISO-8601 instant: 'at noon'")


def test_a_parquet_null_value_refuses_the_run(ws, capsys):
    pl.DataFrame({
        "metric": [VM, VM], "timestamp": ["2026-01-01T00:30:00Z"] * 2, "value": [1, None],
        "project_id": ["p1", "p1"], "id": ["vm-1", "vm-2"],
    }).write_parquet(ws / "usage" / "u.parquet")
    before = snapshot(ws)
    status, err = run(ws, capsys)
    assert status == 2, err
    assert one_line(err) == f"ratebeam: file collector: {ws / 'usage' / 'u.parquet'}: row 2: value: empty"
    assert snapshot(ws) == before


@pytest.mark.parametrize(("column", "arrow_type"), [("value", "decimal256(76, 2)"), ("id", "decimal256(40, 0)")])
def test_a_parquet_column_of_a_type_no_sample_holds_is_named_with_the_types_accepted(ws, capsys, column,
                                                                                       arrow_type):
    """A ``decimal256`` column said only "precision must be between 1 and 38, got 76"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    precision, scale = (int(n) for n in arrow_type.removeprefix("decimal256(").rstrip(")").split(", "))
    columns = {"metric": pa.array([VM]), "timestamp": pa.array(["2026-01-01T00:30:00Z"]), "value": pa.array([1]),
               "project_id": pa.array(["p1"]), "id": pa.array(["vm-1"])}
    from decimal import Decimal
    columns[column] = pa.array([Decimal(1)], type=pa.decimal256(precision, scale))
    pq.write_table(pa.table(columns), ws / "usage" / "u.parquet")
    before = snapshot(ws)
    status, err = run(ws, capsys)
    assert status == 2, err
    accepted = {"value": "an integer, a float, a decimal of at most 38 digits or a number's text",
                "id": "text, an integer, a float, a boolean, a date or a decimal of at most 38 digits"}[column]
    assert one_line(err) == (f"ratebeam: file collector: {ws / 'usage' / 'u.parquet'}: column {column}: type "
                             f"{arrow_type} is not read (accepted: {accepted})")
    assert snapshot(ws) == before


# ---- file names ----


def test_an_upper_case_extension_is_read(ws, capsys):
    (ws / "usage" / "u.csv").write_text(HEADER + row())
    (ws / "usage" / "more.CSV").write_text(HEADER + row(scope="p2", vm="vm-upper"))
    status, err = run(ws, capsys)
    assert status == 0, err
    assert sorted(stored(ws)["groupby.id"].to_list()) == ["vm-1", "vm-upper"]


#: What a usage directory may hold besides usage, and why the collector leaves each.
EXTENSIONS = "read: .parquet, .csv, .jsonl, .ndjson, .json, in any case"
NOT_READ = {
    "old.csv.gz": f"not read: unknown extension '.gz' ({EXTENSIONS})",
    "README": f"not read: no extension ({EXTENSIONS})",
    "notes.txt": f"not read: unknown extension '.txt' ({EXTENSIONS})",
    "._u.csv": "not read: '._u.csv' begins with '.' (hidden files, and markers such as _SUCCESS, are not usage)",
    "_SUCCESS": "not read: '_SUCCESS' begins with '_' (hidden files, and markers such as _SUCCESS, are not usage)",
    ".cache/x.csv": "not read: '.cache' begins with '.' (hidden files, and markers such as _SUCCESS, are not usage)",
}


def test_every_file_the_collector_does_not_read_is_listed_in_the_summary_the_log_and_gaps(ws, capsys, caplog):
    """Files were skipped without a word (an upper-case extension once, half the usage): the run now
    lists each file it leaves, and why, in its summary (text and JSON), its log and ``ratebeam gaps``."""
    import json

    from ratebeam.pipelines.cli import main

    usage = ws / "usage"
    (usage / "u.csv").write_text(HEADER + row())
    (usage / "more.CSV").write_text(HEADER + row(scope="p2", vm="vm-upper"))
    (usage / "sub").mkdir()
    (usage / "sub" / "deep.csv").write_text(HEADER + row(vm="vm-deep"))
    (usage / ".cache").mkdir()
    for name in NOT_READ:
        (usage / name).write_text(HEADER + row(vm=f"vm-{name}"))  # usage, were it read
    status, printed = run(ws, capsys)
    assert status == 0, printed
    assert sorted(stored(ws)["groupby.id"].to_list()) == ["vm-1", "vm-deep", "vm-upper"]
    listed = [f"  {usage / name}: {why}" for name, why in sorted(NOT_READ.items(), key=lambda i: str(usage / i[0]))]
    lines = printed.splitlines()
    start = lines.index(f"{len(NOT_READ)} usage file(s) not read by the collector:")
    assert lines[start + 1:start + 1 + len(NOT_READ)] == listed, printed
    logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "not read" in r.getMessage()]
    assert sorted(logged) == sorted(f"file collector: {line.strip()}" for line in listed)

    assert main(["gaps", "-c", str(ws / "ratebeam.yaml"), "--from", "2026-01-01T00:00:00Z",
                 "--to", "2026-01-01T02:00:00Z", "--format", "json"]) == 1  # a file not read is a gap
    gaps = json.loads(capsys.readouterr().out)
    assert [g["detail"] for g in gaps if g["gap"] == "not_read"] == [line.strip() for line in listed]

    assert main(["run", "-c", str(ws / "ratebeam.yaml"), "--now", NOW, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["files_not_read"] == [{"path": str(usage / name), "reason": why}
                                         for name, why in sorted(NOT_READ.items(), key=lambda i: str(usage / i[0]))]
