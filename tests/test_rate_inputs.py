"""``ratebeam rate`` (the quote): usage as CSV, Parquet or ``report dataframes`` JSON prices exactly as its
JSONL, and ``-c`` rates with the database's whole module chain (rules, module states, scripts)."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_support import NOW, workspace

from ratebeam.pipelines.cli import main
from ratebeam.pipelines.rate_command import run_rate

DATA = Path(__file__).parent / "data"
CASES = [("rules_basic.json", "usage_basic.jsonl"), ("rules_groups.json", "usage_groups.jsonl"),
         ("rules_groups.json", "usage_groups_with_error.jsonl")]


def quote(rules, usage, **options) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = run_rate(rules, usage, out, err, **options)
    return status, out.getvalue(), err.getvalue()


def points(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def flat_rows(path: Path, *, prefixed: bool = True) -> list[dict]:
    """The points as table rows: point columns, then ``groupby.K`` / ``metadata.K`` (or bare label) columns."""
    rows = []
    for point in points(path):
        row = {k: v for k, v in point.items() if k not in ("groupby", "metadata")}
        for section in ("groupby", "metadata"):
            for key, value in point.get(section, {}).items():
                # bare columns: rules read metadata overlaid by groupby, so groupby's value is the one kept
                row.setdefault(f"{section}.{key}" if prefixed else key, value)
        rows.append(row)
    return rows


def write_csv(rows: list[dict], path: Path) -> Path:
    columns = list(dict.fromkeys(c for row in rows for c in row))
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_parquet(rows: list[dict], path: Path) -> Path:
    """Typed columns, as a user's Parquet has them: exact decimal qty, UTC timestamps, string labels."""
    columns = list(dict.fromkeys(c for row in rows for c in row))
    arrays = {}
    for column in columns:
        values = [row.get(column) for row in rows]
        if column == "qty":
            arrays[column] = pa.array([Decimal(v) for v in values], pa.decimal128(38, 18))
        elif column in ("begin", "end"):
            arrays[column] = pa.array([datetime.fromisoformat(v) for v in values], pa.timestamp("us", tz="UTC"))
        else:
            arrays[column] = pa.array(values, pa.string())
    pq.write_table(pa.table(arrays), path)
    return path


@pytest.mark.parametrize(("rules", "usage"), CASES)
def test_csv_and_parquet_price_as_the_jsonl(tmp_path, rules, usage):
    expected = quote(DATA / rules, DATA / usage)
    assert expected[0] in (0, 3) and '"summary"' in expected[1]
    rows = flat_rows(DATA / usage)
    assert quote(DATA / rules, write_parquet(rows, tmp_path / "usage.parquet")) == expected
    csv_files = (write_csv(rows, tmp_path / "usage.csv"),
                 write_csv(flat_rows(DATA / usage, prefixed=False), tmp_path / "bare.csv"))
    for path in csv_files:
        if "error" in usage:  # its failing point has the label n = "": in CSV an empty cell is no label
            status, out, _ = quote(DATA / rules, path)
            assert status == 0 and '"error"' not in out
        else:
            assert quote(DATA / rules, path) == expected, path.name
    named = tmp_path / "usage.txt"  # a suffix that says nothing: --usage-format says it
    named.write_bytes(csv_files[0].read_bytes())
    assert quote(DATA / rules, named, usage_format="csv") == quote(DATA / rules, csv_files[0])


def test_dataframes_json_prices_as_the_jsonl(tmp_path):
    """CloudKitty's dataframes shape; its rating.price is the old price, not added to."""
    frames: dict[tuple, dict] = {}
    for point in points(DATA / "usage_basic.jsonl"):
        frame = frames.setdefault((point["begin"], point["end"]), {
            "period": {"begin": point["begin"], "end": point["end"]}, "usage": {}})
        frame["usage"].setdefault(point["type"], []).append({
            "vol": {"unit": "undefined", "qty": point["qty"]}, "rating": {"price": "123"},
            "groupby": point["groupby"], "metadata": point["metadata"]})
    path = tmp_path / "dataframes.json"
    path.write_text(json.dumps({"total": 15, "dataframes": list(frames.values())}))
    regrouped = tmp_path / "regrouped.jsonl"  # the same points in the dataframes' order
    regrouped.write_text("".join(
        json.dumps({"type": t, "qty": p["vol"]["qty"], "begin": f["period"]["begin"], "end": f["period"]["end"],
                    "groupby": p["groupby"], "metadata": p["metadata"]}) + "\n"
        for f in frames.values() for t, ps in f["usage"].items() for p in ps))
    status, out, err = quote(DATA / "rules_basic.json", path)
    assert (status, out, err) == quote(DATA / "rules_basic.json", regrouped)
    assert json.loads(out.splitlines()[-1])["summary"]["total"] == "58.8"  # CloudKitty's worked example A


@pytest.fixture
def database(db_url, tmp_path, capsys):
    """A workspace on ``db_url`` with example A's rules imported; returns ``(config, cli)``."""
    config = workspace(tmp_path / "ws", database_url=db_url)

    def cli(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = main(list(args))
        return (status, *capsys.readouterr())

    for args in (("db", "upgrade"), ("rules", "import", str(DATA / "rules_basic.json"))):
        assert cli(*args, "-c", str(config))[0] == 0
    return config, cli


def test_rules_from_the_database_price_as_the_rules_file(database, tmp_path):
    config, _ = database
    expected = quote(DATA / "rules_basic.json", DATA / "usage_basic.jsonl")
    assert quote(None, DATA / "usage_basic.jsonl", config_path=config) == expected
    rows = flat_rows(DATA / "usage_basic.jsonl")
    assert quote(None, write_parquet(rows, tmp_path / "u.parquet"), config_path=config) == expected


def test_the_database_module_chain_runs_scripts_and_module_states(database, tmp_path):
    config, cli = database
    c = str(config)
    script = tmp_path / "fee.json"
    script.write_text(json.dumps({"name": "windows-fee", "steps": [
        {"set": "price", "expr": "price + 0.01 * qty",
         "where": "type = 'instance' AND \"metadata.os_distro\" = 'windows'"}]}))
    assert cli("scripts", "add", "-c", c, str(script), "--start", "2024-01-01T00:00:00Z")[0] == 0
    assert cli("modules", "enable", "-c", c, "scripted")[0] == 0
    hashmap_only = _prices(quote(DATA / "rules_basic.json", DATA / "usage_basic.jsonl")[1])
    windows = [p["groupby"]["id"] for p in points(DATA / "usage_basic.jsonl")
               if p["metadata"].get("os_distro") == "windows" and p["type"] == "instance"]
    assert windows
    status, out, err = quote(None, DATA / "usage_basic.jsonl", config_path=config)
    assert status == 0, err
    chained = _prices(out)
    for i, point in enumerate(points(DATA / "usage_basic.jsonl")):
        fee = Decimal("0.01") * Decimal(point["qty"]) if point["groupby"].get("id") in windows \
            and point["type"] == "instance" else 0
        assert chained[i] == hashmap_only[i] + fee, point

    # A script valid only later does not apply to these 2024 periods.
    assert cli("scripts", "add", "-c", c, str(script), "--start", "2030-01-01T00:00:00Z")[0] == 0
    assert _prices(quote(None, DATA / "usage_basic.jsonl", config_path=config)[1]) == hashmap_only

    assert cli("modules", "disable", "-c", c, "hashmap")[0] == 0
    assert cli("modules", "disable", "-c", c, "scripted")[0] == 0
    status, out, err = quote(None, DATA / "usage_basic.jsonl", config_path=config)
    assert status == 0 and set(_prices(out)) == {Decimal(0)}
    assert "warning: no rating module is enabled" in err


def test_report_dataframes_output_rates_back_to_the_stored_prices(copy, capsys):
    """What `run` stored, read back with `report dataframes --format json`, quotes to the same prices."""
    capsys.readouterr()
    window = ["--begin", "2026-01-01T00:00:00Z", "--end", NOW]
    assert main(["report", "dataframes", "-c", str(copy), "--format", "json", "--limit", "100000", *window]) == 0
    document = json.loads(capsys.readouterr().out)
    stored = [p["rating"]["price"] for f in document["dataframes"] for ps in f["usage"].values() for p in ps]
    assert len(stored) > 50
    path = copy.parent / "dataframes.json"
    path.write_text(json.dumps(document))
    status, out, err = quote(None, path, config_path=copy)
    assert status == 0, err
    assert _prices(out) == [Decimal(p) for p in stored]
    lines = [json.loads(line) for line in out.splitlines()[:-1]]
    assert {line["scope"] for line in lines} <= {"acme-web", "acme-data", "globex", "initech"}


def _prices(out: str) -> list[Decimal]:
    return [Decimal(json.loads(line)["price"]) for line in out.splitlines()[:-1]]


@pytest.mark.parametrize(("name", "text", "says"), [
    ("u.csv", "type,qty,begin,end\ninstance,1,2024-01-01T00:00:00Z,2024-01-01T01:00:00Z\n"
              "instance,x,2024-01-01T00:00:00Z,2024-01-01T01:00:00Z\n", "u.csv: line 3.qty: not a decimal: 'x'"),
    ("u.csv", "type,qty,begin\ninstance,1,2024-01-01T00:00:00Z\n", "u.csv: columns: missing the column 'end'"),
    ("u.csv", "type,qty,begin,end\ninstance,1,2024-01-01,2024-01-01T01:00:00Z,extra\n",
     "u.csv: line 2: more cells than the 4 columns"),
    ("u.csv", "metric,timestamp,value,project_id\ncpu,2024-01-01T00:00:00Z,1,p\n",
     "these are collector samples (metric, timestamp, value)"),
    ("u.csv", "type,qty,begin,end\ninstance,1,yesterday,2024-01-01T01:00:00Z\n", "u.csv: line 2.begin: not an ISO-8601"),
    ("u.parquet", "not parquet", "u.parquet: cannot read as Parquet"),
    ("df.json", json.dumps({"dataframes": [{"period": {"begin": "2024-01-01T00:00:00Z",
                                                       "end": "2024-01-01T01:00:00Z"},
                                            "usage": {"instance": [{"vol": {"qty": "abc"}}]}}]}),
     "df.json: dataframes[0].usage.instance[0].qty: not a decimal: 'abc'"),
    ("df.json", json.dumps({"dataframes": [{"period": {"begin": "2024-01-01T00:00:00Z"}, "usage": {}}]}),
     "df.json: dataframes[0].period.end: missing"),
])
def test_bad_usage_is_one_line_naming_file_and_place(tmp_path, name, text, says):
    path = tmp_path / name
    path.write_text(text)
    status, out, err = quote(DATA / "rules_basic.json", path)
    assert status == 2 and out == ""
    assert err.startswith(f"ratebeam rate: {tmp_path}/") and says in err, err
    assert len(err.strip().splitlines()) == 1


def test_rules_from_a_file_or_the_database_not_both_nor_neither(database, capsys):
    config, _ = database
    status, _, err = quote(DATA / "rules_basic.json", DATA / "usage_basic.jsonl", config_path=config)
    assert status == 2 and "not both" in err
    assert main(["rate", "--usage", str(DATA / "usage_basic.jsonl")]) == 2
    assert "--rules: required: a rules file, or -c ratebeam.yaml" in capsys.readouterr().err
