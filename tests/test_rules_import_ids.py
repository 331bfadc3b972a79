"""``rules import`` keeps the ids of rules that did not change, and ``--merge`` keeps the rules not in the file.

On SQLite and PostgreSQL: the uuids CloudKitty's API (and ``ratebeam hashmap``) name rules by must
survive a re-import, or whatever refers to them breaks.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
import sqlalchemy as sa
from pipeline_support import workspace
from test_sql_rules_repository import generated_rules

from ratebeam.connectors.sql.models import (
    HashMapField,
    HashMapGroup,
    HashMapMapping,
    HashMapService,
    HashMapThreshold,
)
from ratebeam.connectors.sql.rules_import import merge_rules
from ratebeam.connectors.sql.rules_repository import load_rules, replace_rules
from ratebeam.pipelines.cli import main
from ratebeam.transforms.rules import MappingRule, RuleSet, ThresholdRule

_UUIDS = {HashMapService: "service_id", HashMapField: "field_id", HashMapGroup: "group_id",
          HashMapMapping: "mapping_id", HashMapThreshold: "threshold_id"}


def rows(engine) -> dict[str, dict[str, tuple]]:
    """Every row of the five tables by uuid: its columns but the integer keys (which a rewrite renumbers)."""
    out = {}
    with engine.connect() as conn:
        for model, uuid_column in _UUIDS.items():
            skip = {"id", "service_id", "field_id", "group_id"} - {uuid_column}
            columns = [c for c in model.__table__.columns if c.name not in skip]
            out[model.__tablename__] = {
                row._mapping[uuid_column]: tuple(row) for row in conn.execute(sa.select(*columns))}
    return out


def test_importing_twice_keeps_every_id(engine):
    rules = generated_rules(seed=7, n_services=3, n_fields=6, n_mappings=40, n_thresholds=12)
    replace_rules(engine, rules)
    before = rows(engine)
    replace_rules(engine, rules)
    assert rows(engine) == before
    assert load_rules(engine) == rules
    assert sum(len(table) for table in before.values()) == 3 + 6 + 40 + 12 + 3


def test_a_changed_cost_changes_only_that_row(engine):
    rules = generated_rules(seed=8, n_services=2, n_fields=4, n_mappings=20, n_thresholds=6)
    replace_rules(engine, rules)
    before = rows(engine)
    changed = list(rules.mappings)
    changed[5] = MappingRule(**{**_fields(changed[5]), "cost": changed[5].cost + 1})
    thresholds = list(rules.thresholds)
    thresholds[2] = ThresholdRule(**{**_fields(thresholds[2]), "type": "rate" if thresholds[2].type == "flat" else "flat"})
    replace_rules(engine, RuleSet(rules.services, rules.fields, tuple(changed), tuple(thresholds), rules.groups))
    after = rows(engine)
    for table in ("hashmap_services", "hashmap_fields", "hashmap_groups"):
        assert after[table] == before[table]
    for table, n in (("hashmap_mappings", 20), ("hashmap_thresholds", 6)):
        assert after[table].keys() == before[table].keys() and len(after[table]) == n
        differing = [uid for uid in before[table] if before[table][uid] != after[table][uid]]
        assert len(differing) == 1, table
    with engine.connect() as conn:
        updated = conn.execute(sa.select(HashMapMapping.updated_by, sa.func.count()).group_by(HashMapMapping.updated_by)).all()
    assert sorted(updated, key=str) == sorted([(None, 19), ("ratebeam", 1)], key=str)


def test_a_rule_whose_key_changed_is_a_new_rule_and_the_others_stay(engine):
    base = RuleSet(mappings=(MappingRule("cpu", "flavor", "m1", "flat", Decimal(1)),
                             MappingRule("cpu", "flavor", "m2", "flat", Decimal(2))),
                   thresholds=(ThresholdRule("cpu", None, Decimal(10), "flat", Decimal(1)),))
    replace_rules(engine, base)
    before = rows(engine)
    renamed = RuleSet(mappings=(MappingRule("cpu", "flavor", "m1", "flat", Decimal(1)),
                                MappingRule("cpu", "flavor", "m3", "flat", Decimal(2))),
                      thresholds=(ThresholdRule("cpu", None, Decimal("10.0"), "flat", Decimal(1)),))
    replace_rules(engine, renamed)
    after = rows(engine)
    kept = before["hashmap_mappings"].keys() & after["hashmap_mappings"].keys()
    assert len(kept) == 1 and len(after["hashmap_mappings"]) == 2
    assert after["hashmap_thresholds"] == before["hashmap_thresholds"]  # 10 == 10.0: the same level


def test_merge_rules_updates_in_place_and_appends():
    old = RuleSet(services=("a", "b"), mappings=(MappingRule("a", None, None, "flat", Decimal(1)),
                                                 MappingRule("b", None, None, "flat", Decimal(2))))
    new = RuleSet(services=("c", "a"), mappings=(MappingRule("c", None, None, "flat", Decimal(3)),
                                                 MappingRule("a", None, None, "rate", Decimal(4))))
    merged = merge_rules(old, new)
    assert merged.services == ("a", "b", "c")
    assert merged.mappings == (MappingRule("a", None, None, "rate", Decimal(4)),
                               MappingRule("b", None, None, "flat", Decimal(2)),
                               MappingRule("c", None, None, "flat", Decimal(3)))


@pytest.fixture
def cli(db_url, tmp_path, capsys):
    config = workspace(tmp_path / "ws", database_url=db_url)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = main([*args, "-c", str(config)])
        return (status, *capsys.readouterr())

    assert run("db", "upgrade")[0] == 0
    run.dir = config.parent
    return run


def _ids(cli, kind: str) -> dict[tuple, str]:
    status, out, err = cli("hashmap", kind, "list", "--format", "json")
    assert status == 0, err
    key = "value" if kind == "mapping" else "level"
    return {(r["service"], r["field"], r[key], r["tenant_id"]): r[f"{kind}_id"] for r in json.loads(out)}


def test_cli_import_twice_same_ids_and_merge_keeps_the_others(cli):
    demo = cli.dir / "rules.json"
    assert cli("rules", "import", str(demo))[0] == 0
    mappings, thresholds = _ids(cli, "mapping"), _ids(cli, "threshold")
    status, out, _ = cli("rules", "import", str(demo))
    assert status == 0 and out.startswith("imported ")
    assert _ids(cli, "mapping") == mappings and _ids(cli, "threshold") == thresholds

    extra = cli.dir / "extra.json"
    extra.write_text(json.dumps({"services": [
        {"name": "ip.floating", "mappings": [{"type": "flat", "cost": "0.007", "group": "network"}]},
        {"name": "image.size", "mappings": [{"type": "rate", "cost": "0.0001"}]},
    ]}))
    status, out, err = cli("rules", "import", "--merge", str(extra))
    assert status == 0, err
    assert out.startswith("merged 2 service(s)")
    merged = _ids(cli, "mapping")
    assert {k: v for k, v in merged.items() if k[0] != "image.size"} == mappings  # kept, the changed cost too
    assert ("image.size", None, None, None) in merged and _ids(cli, "threshold") == thresholds
    status, out, _ = cli("hashmap", "mapping", "show", mappings[("ip.floating", None, None, None)], "-f", "json")
    assert json.loads(out)["cost"] == "0.007"  # one object, as the client shows one rule

    # Replace (the default) drops what the file does not name, and keeps the ids of what it does.
    assert cli("rules", "import", str(extra))[0] == 0
    assert _ids(cli, "mapping") == {k: v for k, v in merged.items() if k[0] in ("ip.floating", "image.size")}
    assert _ids(cli, "threshold") == {}


def test_cli_merge_that_clashes_with_the_database_is_refused(cli):
    first = cli.dir / "first.json"
    first.write_text(json.dumps({"services": [{"name": "cpu", "thresholds": [
        {"level": "5", "cost": "1", "tenant_id": "t", "group": "a"}]}], "groups": ["a", "b"]}))
    assert cli("rules", "import", str(first))[0] == 0
    clash = cli.dir / "clash.json"
    clash.write_text(json.dumps({"services": [{"name": "cpu", "thresholds": [
        {"level": "5", "cost": "2", "tenant_id": "t", "group": "b"}]}]}))
    status, _, err = cli("rules", "import", "--merge", str(clash))
    assert status == 2
    assert err.startswith(f"ratebeam: {clash} merged into the database's rules: services[0].thresholds[1]")
    assert "Traceback" not in err


def _fields(rule) -> dict:
    return {name: getattr(rule, name) for name in rule.__slots__}
