"""Lineage and ``explain``: the rules that priced a point, their ids and values, and the arithmetic.

The explanations are checked by recomputing each point's price from the printed contributions
alone, with CloudKitty's group formula (`cloudkitty/rating/hash/__init__.py:159-176`), against the expected prices of CloudKitty's
worked examples (``tests/test_hashmap_examples.py``) and against prices stored by a real run.
"""

from __future__ import annotations

import io
import json
import shutil
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
import requests
import yaml
from pipeline_support import ratebeam, stored_rows
from servers.search import opensearch_url  # noqa: F401  (session fixture)
from test_cloudkitty_history import _assert_totals, _cloudkitty, _totals
from test_hashmap_examples import DATA, EXAMPLE_A, EXAMPLE_B

from ratebeam.connectors.registry import make_backend
from ratebeam.connectors.sql.engine import make_engine
from ratebeam.connectors.sql.migrations import upgrade
from ratebeam.connectors.sql.rules_repository import load_rules, replace_rules
from ratebeam.connectors.storage.delta.backend import DeltaStorage
from ratebeam.connectors.storage.parquet.backend import ParquetStorage
from ratebeam.pipelines.cli import main
from ratebeam.pipelines.config import load_config
from ratebeam.pipelines.demo import CONFIG
from ratebeam.pipelines.interchange import read_rules
from ratebeam.pipelines.interchange.usage_tables import read_usage_file
from ratebeam.pipelines.rate_command import run_rate
from ratebeam.transforms.hashmap import rate
from ratebeam.transforms.schema import BEGIN, PRICE, RULES, SCOPE, TYPE

DEMO_DATA = Path(__file__).parents[1] / "pipelines" / "demo_data"
EXAMPLES = [("rules_basic.json", "usage_basic.jsonl", EXAMPLE_A), ("rules_groups.json", "usage_groups.jsonl", EXAMPLE_B)]


def recompute(point: dict) -> Decimal:
    """The price from the printed contributions only (`cloudkitty/rating/hash/__init__.py:159-176`), independent of ratebeam."""
    qty, total = Decimal(point["qty"]), Decimal(point["input_price"])
    for group in point["groups"]:
        flat = Decimal(group["flat"]["cost"]) if group["flat"] else Decimal(0)
        rate_ = Decimal(1)
        for r in group["rates"]:
            rate_ *= Decimal(r["cost"])
        threshold = group["threshold"]
        if threshold and threshold["scope"] == "field":
            if threshold["type"] == "flat":
                flat += Decimal(threshold["cost"])
            else:
                rate_ *= Decimal(threshold["cost"])
        res = rate_ * flat * qty
        if threshold and threshold["scope"] == "service":
            res = res + Decimal(threshold["cost"]) if threshold["type"] == "flat" else res * Decimal(threshold["cost"])
        assert Decimal(group["res"]) == res, group
        assert group["arithmetic"].endswith(f"= {group['res']}")
        total += res
    return total


def _explain_file(rules: Path, usage: Path, fmt: str) -> tuple[int, str]:
    out = io.StringIO()
    return run_rate(rules, usage, out, explain=fmt), out.getvalue()


@pytest.mark.parametrize(("rules", "usage", "expected"), EXAMPLES)
def test_rate_explain_contributions_sum_to_the_worked_examples(rules, usage, expected):
    status, out = _explain_file(DATA / rules, DATA / usage, "json")
    assert status == 0
    points = json.loads(out)
    assert [recompute(p) for p in points] == [Decimal(v) for v in expected]
    assert [Decimal(p["price"]) for p in points] == [Decimal(v) for v in expected]
    # every id printed is a rule of the file, named by its place in it
    document = json.loads((DATA / rules).read_text())
    for point in points:
        for rule_id in point["rules"]:
            assert rule_id.startswith("services[")
            node: object = document
            for part in rule_id.replace("]", "").replace("[", ".").split("."):
                node = node[int(part)] if part.isdigit() else node[part]  # type: ignore[index]
            assert isinstance(node, dict) and "cost" in node


def test_rate_explain_table_names_rules_and_arithmetic():
    status, out = _explain_file(DATA / "rules_basic.json", DATA / "usage_basic.jsonl", "table")
    assert status == 0
    # m1.large, rhel, vcpus 16, qty 2: uptime 4·2 = 8; license (0 + 1.0)·1.1·2 = 2.2 (`cloudkitty/rating/hash/__init__.py:159-276`)
    assert ("  license: (flat 0 + threshold flat 1 [services[0].fields[2].thresholds[1] ≥ 16]) × "
            "rate 1.1 [services[0].fields[1].mappings[1]] × qty 2 = 2.2") in out.splitlines()
    assert "  price: input 0 + instance_uptime 8 + license 2.2 = 10.2" in out.splitlines()
    assert "  price: no service 'network.bw': the price stays 0" in out.splitlines()


def test_rate_explain_of_a_failing_frame_says_why_and_exits_3():
    status, out = _explain_file(DATA / "rules_groups.json", DATA / "usage_groups_with_error.jsonl", "json")
    assert status == 3
    failed = [p for p in json.loads(out) if p["price"] is None]
    assert failed and all("'n'" in p["arithmetic"] for p in failed)


def test_kernel_lineage_is_what_explain_names():
    rules = read_rules(DATA / "rules_basic.json")
    usage = read_usage_file(DATA / "usage_basic.jsonl", "auto", "project_id")
    plain = rate(usage, rules)
    traced = rate(usage, rules, lineage=True)
    assert RULES not in plain.rated.columns
    assert traced.rated.drop(RULES).equals(plain.rated)
    _, out = _explain_file(DATA / "rules_basic.json", DATA / "usage_basic.jsonl", "json")
    named = [",".join(p["rules"]) or None for p in json.loads(out)]
    assert traced.rated.get_column(RULES).to_list() == named
    assert named[14] is None and named[3].count(",") == 2  # no service; three rules priced m1.large rhel


def test_equal_rule_sets_with_other_ids_keep_their_own_lineage(tmp_path):
    from_file = read_rules(DATA / "rules_groups.json")
    engine = make_engine(f"sqlite:///{tmp_path / 'ratebeam.db'}")
    upgrade(engine)
    replace_rules(engine, from_file)
    from_db = load_rules(engine)
    engine.dispose()
    assert from_db == from_file  # ids are not part of equality ...
    usage = read_usage_file(DATA / "usage_groups.jsonl", "auto", "project_id")
    by_file = rate(usage, from_file, lineage=True).rated.get_column(RULES).to_list()
    by_db = rate(usage, from_db, lineage=True).rated.get_column(RULES).to_list()
    assert all(r.startswith("services[") for r in by_file)  # ... yet the compiled-rules cache tells them apart
    assert all(len(i) == 36 for r in by_db for i in r.split(","))


def test_capabilities_say_which_backends_keep_lineage():
    from ratebeam.connectors.storage.influxdb.backend import InfluxDBStorage
    from ratebeam.connectors.storage.loki.backend import LokiStorage
    from ratebeam.connectors.storage.search.backend import OpenSearchStorage

    assert ParquetStorage.capabilities.stores_lineage and OpenSearchStorage.capabilities.stores_lineage
    assert DeltaStorage.capabilities.stores_lineage
    assert not InfluxDBStorage.capabilities.stores_lineage and not LokiStorage.capabilities.stores_lineage


# --- report explain on stored points ----------------------------------------------------------------


def _config(folder: Path, scopes: str, backend: str = "parquet") -> Path:
    """The demo's ratebeam.yaml (SQLite, ``backend`` storage under ``rated``) and metrics.yml in ``folder``."""
    shutil.copyfile(DEMO_DATA / "metrics.yml", folder / "metrics.yml")
    config = folder / "ratebeam.yaml"
    text = CONFIG.format(scopes=scopes).replace("- backend: delta\n", f"- backend: {backend}\n")
    assert f"- backend: {backend}\n" in text
    config.write_text(text, encoding="utf-8")
    return config


def _report_explain(capsys, config: Path, scope: str, type_: str, begin: str) -> tuple[int, list[dict]]:
    status = main(["report", "explain", "-c", str(config), "--scope", scope, "--type", type_,
                   "--begin", begin, "--format", "json"])
    return status, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("storage", [ParquetStorage, DeltaStorage], ids=["parquet", "delta"])
def test_report_explain_of_stored_examples_sums_to_the_expected_prices(tmp_path, capsys, storage):
    config = _config(tmp_path, "t-a, t-special, x", storage.capabilities.name)
    engine = make_engine(f"sqlite:///{tmp_path / 'ratebeam.db'}")
    upgrade(engine)
    store = storage(str(tmp_path / "rated"))
    store.init()
    for rules_file, usage_file, prices in EXAMPLES:
        replace_rules(engine, read_rules(DATA / rules_file))
        rules = load_rules(engine)
        ids = {r.id for r in (*rules.mappings, *rules.thresholds)}
        usage = read_usage_file(DATA / usage_file, "auto", "project_id")
        store.write(rate(usage, rules, lineage=True).rated.to_arrow())
        cells = usage.with_columns(pl.Series("expected", [Decimal(p) for p in prices])).group_by(
            SCOPE, TYPE, BEGIN, maintain_order=True).agg(pl.col("expected"))
        for scope, type_, begin, wanted in cells.iter_rows():
            status, points = _report_explain(capsys, config, scope, type_, begin.isoformat())
            assert status == 0
            assert sorted(recompute(p) for p in points) == sorted(wanted)
            for p in points:
                assert p["price_matches"] and Decimal(p["stored_price"]) == recompute(p)
                assert p["lineage"] == "stored" and p["rules_match"] is True
                assert set(p["rules"]) <= ids  # CloudKitty's mapping_id / threshold_id
    engine.dispose()


def test_report_explain_flags_rules_changed_since_rating(tmp_path, capsys):
    config = _config(tmp_path, "x")
    engine = make_engine(f"sqlite:///{tmp_path / 'ratebeam.db'}")
    upgrade(engine)
    replace_rules(engine, read_rules(DATA / "rules_groups.json"))
    usage = read_usage_file(DATA / "usage_groups.jsonl", "auto", "project_id")
    store = ParquetStorage(str(tmp_path / "rated"))
    store.init()
    store.write(rate(usage, load_rules(engine), lineage=True).rated.to_arrow())
    document = json.loads((DATA / "rules_groups.json").read_text())
    document["services"][1]["mappings"][0]["cost"] = "3"  # svc2's flat 2 -> 3: updated in place, same id
    del document["services"][1]["thresholds"][0]  # the level-10 service threshold is gone
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(document))
    replace_rules(engine, read_rules(changed))
    engine.dispose()
    status, points = _report_explain(capsys, config, "x", "svc2", "2024-01-01T00:00:00Z")
    assert status == 0 and len(points) == 3
    by_stored = {Decimal(p["stored_price"]): p for p in points}
    assert sorted(by_stored) == [Decimal(9), Decimal(36), Decimal(124)]
    assert all(not p["price_matches"] for p in points)
    assert [recompute(by_stored[Decimal(v)]) for v in (9, 36, 124)] == [Decimal(12), Decimal(48), Decimal(108)]
    # n=6 now meets the field threshold 5 (rate 3): 3 × 3 × 12; its stored lineage names the deleted rule
    assert by_stored[Decimal(124)]["rules_match"] is False
    gone = set(by_stored[Decimal(124)]["stored_rules"]) - set(by_stored[Decimal(124)]["rules"])
    assert len(gone) == 1 and not gone & {i for p in points for i in p["rules"]}
    assert by_stored[Decimal(36)]["rules_match"] is True  # same ids, a new cost: only the price tells
    main(["report", "explain", "-c", str(config), "--scope", "x", "--type", "svc2", "--begin", "2024-01-01"])
    assert "DIFFERS" in capsys.readouterr().out


def test_report_explain_of_nothing_stored_is_an_error(tmp_path, capsys):
    config = _config(tmp_path, "x")
    engine = make_engine(f"sqlite:///{tmp_path / 'ratebeam.db'}")
    upgrade(engine)
    engine.dispose()
    ParquetStorage(str(tmp_path / "rated")).init()
    assert main(["report", "explain", "-c", str(config), "--scope", "x", "--type", "svc2",
                 "--begin", "2024-01-01"]) == 2  # refused input: it names nothing stored
    err = capsys.readouterr().err
    assert "no stored point in [2024-01-01T00:00:00+00:00" in err and "'x svc2'" in err


# --- a demo run ---------------------------------------------------------------------------------------


def test_a_demo_point_explains_to_its_stored_price(tmp_path, capsys):
    workdir = tmp_path / "demo"
    done = ratebeam("demo", "--dir", str(workdir))
    assert done.returncode == 0, done.stderr
    config = workdir / "ratebeam.yaml"
    rows = stored_rows(config, lineage=True)
    assert rows.get_column(RULES).null_count() < rows.height  # the Parquet store kept the lineage
    priced = rows.filter(pl.col(PRICE) > 0).sort(PRICE, descending=True)
    for scope, type_, begin in priced.select(SCOPE, TYPE, BEGIN).unique(maintain_order=True).head(3).iter_rows():
        status, points = _report_explain(capsys, config, scope, type_, begin.isoformat())
        assert status == 0 and points
        stored = rows.filter((pl.col(SCOPE) == scope) & (pl.col(TYPE) == type_) & (pl.col(BEGIN) == begin))
        assert sorted(Decimal(p["stored_price"]) for p in points) == sorted(stored.get_column(PRICE).to_list())
        for p in points:
            assert recompute(p) == Decimal(p["stored_price"]) and p["price_matches"]
            assert p["rules_match"] is True and p["rules"]


# --- an HTTP backend: CloudKitty's documents with one more field ------------------------------------


@pytest.mark.cloudkitty
def test_opensearch_documents_with_lineage_stay_cloudkitty_readable(opensearch_url, tmp_path, capsys):  # noqa: F811
    """ratebeam writes the lineage as one more top-level field; CloudKitty's driver counts and totals as before."""
    name = f"lineage-{uuid.uuid4().hex[:10]}"
    config = _config(tmp_path, "t-a, t-special")
    document = yaml.safe_load(config.read_text())
    document["storage"] = {"backends": [{"backend": "opensearch", "url": opensearch_url, "index_name": name}]}
    config.write_text(yaml.safe_dump(document))
    engine = make_engine(f"sqlite:///{tmp_path / 'ratebeam.db'}")
    upgrade(engine)
    replace_rules(engine, read_rules(DATA / "rules_basic.json"))
    rules = load_rules(engine)
    engine.dispose()
    usage = read_usage_file(DATA / "usage_basic.jsonl", "auto", "project_id")
    backend = make_backend(load_config(config, metrics=False).storage[0])
    assert backend.capabilities.stores_lineage
    try:
        backend.init()
        rated = rate(usage, rules, lineage=True).rated
        backend.write(rated.to_arrow())
        points = backend.retrieve(begin=datetime(2024, 1, 1, tzinfo=UTC), end=datetime(2024, 8, 1, tzinfo=UTC),
                                  limit=100).points
        assert sorted(points.column(RULES).to_pylist(), key=str) == sorted(rated[RULES].to_list(), key=str)
        # CloudKitty 25.0.0's own OpenSearch driver reads every document and totals them as without it
        ck = {"backend": "opensearch", "options": {"host": opensearch_url, "index_name": name},
              "begin": "2024-01-01T00:00:00+00:00", "end": "2024-08-01T00:00:00+00:00"}
        assert _cloudkitty("count", ck) == {"total": usage.height}
        expected = _totals([{"groupby": {"project_id": project}, "type": type_, "qty": qty, "price": price}
                            for project, type_, qty, price in rated.select("groupby.project_id", TYPE, "qty", PRICE)
                            .iter_rows()])
        _assert_totals(_cloudkitty("total", ck), expected)
        status, explained = _report_explain(capsys, config, "t-a", "instance", "2024-01-01T00:00:00Z")
        assert status == 0 and len(explained) == 4
        assert all(p["lineage"] == "stored" and p["rules_match"] and p["price_matches"] for p in explained)
    finally:
        requests.delete(f"{opensearch_url}/{name}", timeout=30)
        backend.close()
