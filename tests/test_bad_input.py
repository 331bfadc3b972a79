"""Bad files get one clear line naming the file, the key and the value, exit status 2, nothing written."""

from __future__ import annotations

import json

import pytest
from pipeline_support import ratebeam, setup_database, stored_rows, workspace


def _assert_refused(done, *expected: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for fragment in expected:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def ws(tmp_path):
    config = workspace(tmp_path / "ws")
    setup_database(config)
    return config


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: t.replace("period: 3600", "period: an hour"), ("ratebeam.yaml", "period", "'an hour'")),
        (lambda t: t + "colector: {}\n", ("ratebeam.yaml", "colector")),
        (lambda t: t.replace("url: rated", "url: 'htp:/x'"), ("ratebeam.yaml", "storage.backends[0].url")),
        (lambda t: t.replace("wait_periods: 2", "wait_periods: -1"), ("ratebeam.yaml", "wait_periods", "-1")),
    ],
)
def test_malformed_ratebeam_yaml(ws, edit, expected):
    ws.write_text(edit(ws.read_text()))
    _assert_refused(ratebeam("run", "-c", str(ws), "--now", "2026-01-04T02:00:00Z"), *expected)
    rated = ws.parent / "rated"  # the config cannot be read back: nothing written is what counts
    assert not rated.exists() or not any(p.is_file() for p in rated.rglob("*"))


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: t.replace("factor: 1/1073741824", "factor: 1/0"), ("metrics.yml", "factor", "1/0")),
        (lambda t: t.replace("factor: 1/1073741824", "factor: a/b"), ("metrics.yml", "factor", "a/b")),
        (lambda t: t.replace("mutate: NUMBOOL", "mutate: ROUND", 1), ("metrics.yml", "mutate", "ROUND")),
        (lambda t: t.replace("unit: ip", "unit: [ip]"), ("metrics.yml", "unit")),
        (lambda t: t.replace("alt_name: ip.floating", "alt_name: ip.floating\n    colour: red"),
         ("metrics.yml", "colour")),
    ],
)
def test_malformed_metrics_yml(ws, edit, expected):
    metrics = ws.parent / "metrics.yml"
    metrics.write_text(edit(metrics.read_text()))
    _assert_refused(ratebeam("run", "-c", str(ws), "--now", "2026-01-04T02:00:00Z"), *expected)
    assert stored_rows(ws).is_empty()


def _rules(ws):
    return json.loads((ws.parent / "rules.json").read_text())


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda r: r["services"][1]["mappings"][0].update(cost="abc"), ("services[1].mappings[0].cost", "abc")),
        (lambda r: r["services"][0]["fields"][0]["mappings"].append(
            {"value": "m1.tiny", "type": "flat", "cost": "1", "group": "compute"}),
         ("services[0].fields[0].mappings[6]",)),
        # CloudKitty's unique constraint exempts global thresholds (a NULL tenant): a tenant's level repeats.
        (lambda r: r["services"][1]["thresholds"].extend(
            [{"level": "1000", "type": "flat", "cost": "1", "group": "storage", "tenant_id": "t-1"}] * 2),
         ("services[1].thresholds[2]",)),
        (lambda r: r["services"][2]["mappings"][0].update(type="percent"), ("services[2].mappings[0].type",)),
        (lambda r: r["services"][2].update(colour="red"), ("services[2]", "colour")),
    ],
)
def test_malformed_rules_json(ws, edit, expected):
    from ratebeam.connectors.sql.engine import make_engine
    from ratebeam.connectors.sql.rules_repository import load_rules
    from ratebeam.pipelines.config import load_config

    engine = make_engine(load_config(ws).database_url)
    before = load_rules(engine)
    rules = _rules(ws)
    edit(rules)
    bad = ws.parent / "bad-rules.json"
    bad.write_text(json.dumps(rules))
    _assert_refused(ratebeam("rules", "import", "-c", str(ws), str(bad)), "bad-rules.json", *expected)
    assert load_rules(engine) == before  # nothing written


def test_missing_config_file(tmp_path):
    _assert_refused(ratebeam("run", "-c", str(tmp_path / "nope.yaml")), "nope.yaml")


def test_bad_now_argument(ws):
    _assert_refused(ratebeam("run", "-c", str(ws), "--now", "yesterday"), "--now", "yesterday")
