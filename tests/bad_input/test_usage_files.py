"""Usage files: points for ``rate`` (usage JSONL) and samples for the file collector (``run``)."""

from __future__ import annotations

import io
import json

import polars as pl
import pytest

from bad_input.harness import Case, both, check_refused, nested, params, replace, set_yaml, write
from ratebeam.pipelines.demo import DEMO_NOW

RATE = ("rate", "--rules", "{ws}/rules.json", "--usage", "{ws}/usage.jsonl")
RUN = ("run", "-c", "{c}", "--now", DEMO_NOW.isoformat())
POINT = {"type": "instance", "qty": "1", "begin": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z",
         "groupby": {"project_id": "acme", "id": "vm-1"}, "metadata": {"flavor_name": "m1.tiny"}}


def _points(*points: dict | str) -> object:
    """Setup: usage.jsonl holding a good point, then ``points`` (dicts as JSON lines, or raw lines)."""
    lines = [json.dumps(POINT)] + [p if isinstance(p, str) else json.dumps(p) for p in points]
    return write("usage.jsonl", "\n".join(lines) + "\n")


def _with(key: str, value: object) -> dict:
    return {**POINT, key: value}


def _without(key: str) -> dict:
    return {k: v for k, v in POINT.items() if k != key}


POINT_VALUES = {
    "qty": {"letters": "x", "empty": "", "null": None, "list": [1], "nan": "NaN", "bool": True,
            "too-wide": "1e40", "huge": "9" * 60},
    "price": {"letters": "x", "list": [], "nan": "nan"},
    "begin": {"garbage": "yesterday", "number": 1735689600, "empty": "", "overflow": "9999-12-31T23:59:59-23:59",
              "month-13": "2026-13-01T00:00:00Z", "null": None},
    "end": {"garbage": "tomorrow", "list": ["2026-01-01"], "overflow": "9999-12-31T23:59:59-12:00"},
    "type": {"empty": "", "number": 3, "null": None, "list": ["instance"]},
    "groupby": {"list": ["a"], "string": "project_id=acme", "number": 1},
    "metadata": {"list": [1], "string": "m1.tiny"},
    "unit": {"number": 1, "list": ["h"]},
    "scope": {"empty": "", "number": 1},
}


def _point_cases() -> list[Case]:
    cases = [Case(f"point-{key}-{name}", _points(_with(key, value)), RATE, names=("usage.jsonl", "line 2", key))
             for key, values in POINT_VALUES.items() for name, value in values.items()]
    cases += [Case(f"point-missing-{key}", _points(_without(key)), RATE, names=("usage.jsonl", "line 2", key))
              for key in ("type", "qty", "begin", "end")]
    cases += [
        # Both were priced (exit 0)
        Case("point-end-before-begin", _points(_with("end", "2025-12-31T23:00:00Z")), RATE,
             names=("usage.jsonl: line 2.end: must be after begin (2026-01-01T00:00:00+00:00): "
                    "'2025-12-31T23:00:00+00:00'",)),
        Case("point-end-is-begin", _points(_with("end", POINT["begin"])), RATE,
             names=("usage.jsonl: line 2.end: must be after begin",)),
        Case("point-groupby-object", _points(_with("groupby", {"project_id": "acme", "id": {"x": 1}})), RATE,
             names=("usage.jsonl: line 2.groupby.id: must be a string or a number, not an object",)),
        Case("point-metadata-value-list", _points(_with("metadata", {"flavor_name": ["m1.tiny"]})), RATE,
             names=("usage.jsonl: line 2.metadata.flavor_name: must be a string or a number, not a list",)),
        Case("csv-point-end-before-begin", write("usage.csv", "type,qty,begin,end,project_id\ninstance,1,"
                                                 "2026-01-01T01:00:00Z,2026-01-01T00:00:00Z,acme\n"),
             ("rate", "--rules", "{ws}/rules.json", "--usage", "{ws}/usage.csv"),
             names=("usage.csv: line 2.end: must be after begin",)),
        Case("point-unknown-key", _points(_with("colour", "red")), RATE, names=("usage.jsonl", "line 2", "colour")),
        Case("line-not-json", _points("{type: instance}"), RATE, names=("usage.jsonl", "line 2")),
        Case("line-truncated", _points('{"type": "instance", "qty": '), RATE, names=("usage.jsonl", "line 2")),
        Case("line-array", _points("[1, 2]"), RATE, names=("usage.jsonl", "line 2")),
        Case("line-number", _points("42"), RATE, names=("usage.jsonl", "line 2")),
        Case("line-nan", _points(json.dumps(POINT).replace('"1"', "NaN")), RATE, names=("usage.jsonl", "line 2")),
        Case("line-duplicate-key", _points(json.dumps(POINT)[:-1] + ', "qty": "2"}'), RATE,
             names=("usage.jsonl", "line 2", "duplicate")),
        Case("line-deep", _points('{"type": ' + nested(100000) + "}"), RATE,
             names=("usage.jsonl", "nested too deeply")),
        Case("line-long-integer", _points(json.dumps(POINT).replace('"1"', "9" * 5000)), RATE,
             names=("usage.jsonl: line 2 column 29: qty: a number has more than 4300 digits",)),
        Case("line-long-label", _points(json.dumps(_with("groupby", {"id": 1, "n": int("7" * 4000)}))
                                        .replace("7" * 4000, "7" * 4400)), RATE,
             names=("usage.jsonl: line 2 column 124: groupby.n: a number has more than 4300 digits",)),
        Case("list-long-integer", write("usage.jsonl", json.dumps([POINT, POINT]).replace('"1"', "9" * 4500)), RATE,
             names=("usage.jsonl: line 1 column 30: [0].qty: a number has more than 4300 digits",)),
        Case("label-surrogate", _points(json.dumps(_with("metadata", {"x": "\ud800"}))), RATE,
             names=("usage.jsonl", "line 2", "surrogate")),
        Case("key-surrogate", _points('{"type": "instance", "\\udc00": 1}'), RATE,
             names=("usage.jsonl", "line 2", "surrogate")),
        Case("list-of-strings", write("usage.jsonl", '["a", "b"]'), RATE, names=("usage.jsonl", "[0]")),
        Case("points-not-list", write("usage.jsonl", '{"points": {"a": 1}}'), RATE, names=("usage.jsonl", "points")),
        Case("points-bad-item", write("usage.jsonl", json.dumps({"points": [POINT, _with("qty", "x")]})), RATE,
             names=("usage.jsonl", "points[1]", "qty")),
        Case("not-utf8", write("usage.jsonl", b'{"type": "\xff"}\n'), RATE, names=("usage.jsonl", "cannot read")),
        Case("missing-file", None, ("rate", "--rules", "{ws}/rules.json", "--usage", "{ws}/nope.jsonl"),
             names=("nope.jsonl",)),
        Case("usage-is-directory", None, ("rate", "--rules", "{ws}/rules.json", "--usage", "{ws}"),
             names=("{ws}",)),
    ]
    return cases


HEADER = "metric,timestamp,value,project_id,id,flavor_name,os_distro,volume_type\n"
ROW = "openstack_nova_server_status,2026-01-01T00:30:00Z,1,acme-web,vm-1,m1.small,ubuntu,\n"


def _csv(text: str | bytes) -> object:
    return write("usage.csv", text)


def _collector_file(name: str, data: str | bytes) -> object:
    """Setup: the collector reads ``name`` (its format from the extension), holding ``data``."""
    def edit(ws):
        write(name, data)(ws)
        set_yaml("ratebeam.yaml", ["collector", "url"], name)(ws)

    return edit


def _jsonl(**cells: object) -> str:
    """A JSONL sample line: a good sample of the demo's first scope with ``cells`` changed."""
    sample = {"metric": "openstack_nova_server_status", "timestamp": "2026-01-01T00:30:00Z", "value": 1,
              "project_id": "acme-web", "id": None}
    return json.dumps({**sample, **cells}) + "\n"


def _parquet(**columns: list) -> bytes:
    """A Parquet file of two good samples with ``columns`` replaced."""
    sample = {"metric": ["openstack_nova_server_status"] * 2, "timestamp": ["2026-01-01T00:30:00Z"] * 2,
              "value": [1, 2], "project_id": ["acme-web"] * 2, "id": ["vm-1", "vm-2"]}
    buffer = io.BytesIO()
    pl.DataFrame({**sample, **columns}).write_parquet(buffer)
    return buffer.getvalue()


#: Cells holding a list or an object where a sample has single values (the file and the cell named).
NESTED_CASES = [
    Case("jsonl-value-list", _collector_file("usage.jsonl", _jsonl(value=None) + _jsonl(value=[1])), RUN,
         names=("usage.jsonl", "row 2", "value", "a list or an object")),
    Case("jsonl-metric-list", _collector_file("usage.jsonl", _jsonl(metric=["openstack_nova_server_status"])),
         RUN, names=("usage.jsonl", "row 1", "metric", "a list or an object")),
    Case("jsonl-timestamp-list", _collector_file("usage.jsonl", _jsonl(timestamp=["2026-01-01T00:30:00Z"])),
         RUN, names=("usage.jsonl", "row 1", "timestamp")),
    Case("jsonl-scope-list", _collector_file("usage.jsonl", _jsonl(project_id=["acme-web"])), RUN,
         names=("usage.jsonl", "row 1", "project_id", "a list or an object")),
    # the row `rate` refuses as a point, refused by the file collector as a sample
    Case("jsonl-label-object", _collector_file("usage.jsonl", _jsonl() + _jsonl(id={"x": 1})), RUN,
         names=("usage.jsonl", "row 2", "id", "a list or an object")),
    Case("jsonl-value-object", _collector_file("usage.jsonl", _jsonl(value={"a": 1})), RUN,
         names=("usage.jsonl", "row 1", "value", "a list or an object")),
    Case("parquet-value-list", _collector_file("usage.parquet", _parquet(value=[[1], [2]])), RUN,
         names=("usage.parquet", "row 1", "value", "a list or an object")),
    Case("parquet-label-struct", _collector_file("usage.parquet", _parquet(id=[None, {"a": 1}])), RUN,
         names=("usage.parquet", "row 2", "id", "a list or an object")),
]

SAMPLE_CASES = NESTED_CASES + [
    Case("csv-empty", _csv(""), RUN, names=("usage.csv", "empty CSV")),
    Case("csv-not-utf8", _csv(HEADER.encode() + b"openstack_nova_server_status,\xff\xfe,1,a,b,c,d,\n"), RUN,
         names=("usage.csv", "utf-8")),
    Case("csv-no-metric-column", _csv("timestamp,value,project_id\n2026-01-01T00:00:00Z,1,a\n"), RUN,
         names=("usage.csv", "metric")),
    Case("csv-no-value-column", _csv("metric,timestamp,project_id\nm,2026-01-01T00:00:00Z,a\n"), RUN,
         names=("usage.csv", "value")),
    Case("csv-bad-timestamp", _csv(HEADER + ROW.replace("2026-01-01T00:30:00Z", "noon")), RUN,
         names=("usage.csv", "timestamp")),
    Case("csv-timestamp-overflow", _csv(HEADER + ROW.replace("2026-01-01T00:30:00Z", "9999-12-31T23:59:59-23:59")),
         RUN, names=("usage.csv", "timestamp", "9999-12-31T23:59:59-23:59")),
    Case("csv-bad-value", _csv(HEADER + ROW.replace(",1,acme", ",lots,acme")), RUN, names=("usage.csv", "value")),
    Case("csv-unbalanced-quote", _csv(HEADER + '"openstack_nova_server_status,2026\n'), RUN, names=("usage.csv",)),
    Case("csv-no-scope-column", _csv("metric,timestamp,value\nm,2026-01-01T00:00:00Z,1\n"), RUN,
         names=("usage.csv", "project_id")),
    Case("jsonl-long-integer", _collector_file("usage.jsonl", _jsonl() + _jsonl(value=7).replace(
        '"value": 7', '"value": ' + "9" * 5000)), RUN,
         names=("usage.jsonl: line 2 column 90: value: a number has more than 4300 digits",)),
    Case("parquet-corrupt", _collector_file("usage.parquet", b"PAR1 not really PAR1"), RUN,
         names=("usage.parquet", "parquet")),
    Case("parquet-empty-file", _collector_file("usage.parquet", b""), RUN, names=("usage.parquet",)),
    Case("parquet-is-csv", _collector_file("usage.parquet", HEADER + ROW), RUN, names=("usage.parquet",)),
    Case("jsonl-syntax", _collector_file("usage.jsonl", '{"metric": "m"\n'), RUN, names=("usage.jsonl",)),
    Case("jsonl-not-utf8", _collector_file("usage.jsonl", b'{"metric": "\xff"}\n'), RUN, names=("usage.jsonl",)),
    Case("unknown-extension", _collector_file("usage.xlsx", "x"), RUN, names=("usage.xlsx", "format")),
    Case("collector-missing-file", set_yaml("ratebeam.yaml", ["collector", "url"], "nope.csv"), RUN, names=("nope.csv",)),
    Case("empty-directory", _collector_file("samples/README", "no usage here"), RUN, names=("samples",)),
    Case("directory-without-usage", both(write("samples/README", "no usage here"), write("samples/.u.csv", ROW),
                                         set_yaml("ratebeam.yaml", ["collector", "url"], "samples")), RUN,
         names=("no usage file under", "samples", "(2 file(s) not read, e.g. ", ".u.csv: not read: '.u.csv' begins "
                "with '.'")),
    Case("csv-in-directory-broken", _collector_file("samples/a.csv", ""), RUN, names=("a.csv", "empty CSV")),
    Case("csv-bad-exponent", _csv(HEADER + ROW.replace(",1,", ",1e,")), RUN, names=("usage.csv", "value")),
    Case("csv-value-5000-digits", _csv(HEADER + ROW.replace(",1,", "," + "9" * 5000 + ",")), RUN,
         names=("usage.csv", "value", "...")),
    Case("csv-crlf-bad-value", _csv((HEADER + ROW.replace(",1,", ",x,")).replace("\n", "\r\n")), RUN,
         names=("usage.csv", "value")),
]


@pytest.mark.parametrize("case", params(_point_cases() + SAMPLE_CASES))
def test_refused(case, workspace_for):
    done = check_refused(case, workspace_for(case))
    assert not done.out, "a refused rate printed rated points"


def test_naive_and_aware_timestamps_in_one_file_are_both_utc(workspace_for):
    """Naive means UTC: a file mixing both forms is read, each sample in its own period."""
    from ratebeam.connectors.collectors.file.collector import FileCollector

    ws = workspace_for(Case("mixed", None, ()))
    replace("usage.csv", "2026-01-01T00:30:00Z", "2026-01-01T00:30:00")(ws)
    replace("usage.csv", "2026-01-01T01:30:00Z", "2026-01-01 01:30:00+00:00")(ws)
    collector = FileCollector(str(ws.parent / "usage.csv"))
    samples = collector._loaded().of_metric("openstack_nova_server_status")
    stamps = samples.filter(samples["id"] == "vm-acme-web-1")["timestamp"].head(3).to_list()
    assert [s.isoformat() for s in stamps] == ["2026-01-01T00:30:00+00:00", "2026-01-01T01:30:00+00:00",
                                               "2026-01-01T02:30:00+00:00"]
