"""``ratebeam hashmap ...``: rule-by-rule management with CloudKitty's validations, on SQLite and PostgreSQL.

Each test drives the real CLI in-process against a real migrated database; a refused request must
exit 2 with one line naming the option and the value, and leave the rules unchanged.
"""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

import pytest
from pipeline_support import workspace

from ratebeam.pipelines.cli import main


@pytest.fixture
def cli(db_url, tmp_path, capsys):
    """``cli(*args)`` -> (status, stdout, stderr) on a migrated database; ``cli.json(*args)`` parses stdout."""
    config = workspace(tmp_path / "ws", database_url=db_url)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            status = main([*args, "-c", str(config)])
        except SystemExit as exit:  # argparse refusals
            status = exit.code
        out, err = capsys.readouterr()
        return status, out, err

    def as_json(*args: str):
        status, out, err = run(*args, "--format", "json")
        assert status == 0, err
        return json.loads(out)

    assert run("db", "upgrade")[0] == 0
    run.json = as_json
    run.config = config
    return run


def one(cli, *args):
    """The one rule a command prints: an object (show, create, update) or a one-row listing."""
    rows = cli.json(*args)
    if isinstance(rows, dict):
        return rows
    assert len(rows) == 1
    return rows[0]


def refused(cli, *args, option: str, says: str):
    """The request exits 2 with one line naming the option and saying why; nothing changed."""
    before = _export(cli)
    status, out, err = cli(*args)
    assert status == 2, (out, err)
    assert err.startswith(f"ratebeam: command line: {option}: "), err
    assert says in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert _export(cli) == before


def _export(cli):
    status, out, err = cli("rules", "export")
    assert status == 0, err
    return json.loads(out)


@pytest.fixture
def tree(cli):
    """A service ``instance`` with a field ``flavor_name`` and a group ``license``: their ids."""
    service = one(cli, "hashmap", "service", "create", "instance")
    field = one(cli, "hashmap", "field", "create", "instance", "flavor_name")
    group = one(cli, "hashmap", "group", "create", "license")
    return {"service": service["service_id"], "field": field["field_id"], "group": group["group_id"]}


def test_round_trip_ids_shown_and_exported_as_rules(cli, tree):
    tiny = one(cli, "hashmap", "mapping", "create", "--field-id", tree["field"], "--value", "m1.tiny",
               "--cost", "1.5", "-g", "license")
    flat = one(cli, "hashmap", "mapping", "create", "-s", tree["service"], "0.01")  # positional cost, as the client
    tenant = one(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "0.02", "-t", "rate",
                 "-p", "p-0001", "--start", "2024-01-01T00:00:00Z")
    threshold = one(cli, "hashmap", "threshold", "create", "-s", "instance", "--level", "100", "--cost", "0.9",
                    "-t", "rate")
    assert tiny["field_id"] == tree["field"] and tiny["group_id"] == tree["group"] and tiny["service"] == "instance"
    assert flat["type"] == "flat" and flat["value"] is None and flat["service_id"] == tree["service"]
    assert threshold["level"] == "100" and threshold["type"] == "rate"
    listed = cli.json("hashmap", "mapping", "list")
    assert [m["mapping_id"] for m in listed] == [tiny["mapping_id"], flat["mapping_id"], tenant["mapping_id"]]
    assert one(cli, "hashmap", "mapping", "show", tenant["mapping_id"])["tenant_id"] == "p-0001"
    assert [m["mapping_id"] for m in cli.json("hashmap", "mapping", "list", "-p", "p-0001")] == [tenant["mapping_id"]]
    assert [m["mapping_id"] for m in cli.json("hashmap", "mapping", "list", "--no-group")] == [
        flat["mapping_id"], tenant["mapping_id"]]

    exported = _export(cli)
    assert exported["groups"] == ["license"]
    [service] = exported["services"]
    assert service["mappings"] == [
        {"type": "flat", "cost": "0.01", "group": None, "tenant_id": None, "start": None, "end": None},
        {"type": "rate", "cost": "0.02", "group": None, "tenant_id": "p-0001", "start": "2024-01-01T00:00:00Z",
         "end": None}]
    assert service["thresholds"] == [{"level": "100", "type": "rate", "cost": "0.9", "group": None, "tenant_id": None}]
    assert service["fields"][0]["mappings"][0]["value"] == "m1.tiny"

    # The exported file imports back (CloudKitty's validations agree) and the ids stay.
    path = cli.config.parent / "exported.json"
    path.write_text(json.dumps(exported))
    assert cli("rules", "import", str(path))[0] == 0
    assert _export(cli) == exported
    again = cli.json("hashmap", "mapping", "list")  # in the file's order (service mappings first)
    assert sorted(m["mapping_id"] for m in again) == sorted(m["mapping_id"] for m in listed)
    assert [m["threshold_id"] for m in cli.json("hashmap", "threshold", "list")] == [threshold["threshold_id"]]
    assert one(cli, "hashmap", "field", "show", tree["field"])["service_id"] == tree["service"]


def test_costs_are_exact_decimals(cli, tree):
    cost = "0.1000000000000000000000000001"
    mapping = one(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", cost)
    assert Decimal(mapping["cost"]) == Decimal(cost)
    refused(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "abc",
            option="--cost", says="not a decimal")
    refused(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "1e40",
            option="--cost", says="NUMERIC(40,28)")
    refused(cli, "hashmap", "threshold", "create", "-s", "instance", "--level", "x", "--cost", "1",
            option="--level", says="not a decimal")


def test_a_mapping_has_exactly_one_parent_and_the_right_value(cli, tree):
    refused(cli, "hashmap", "mapping", "create", "-s", "instance", "--field-id", tree["field"], "--value", "a",
            "--cost", "1", option="--field-id", says="not both")
    refused(cli, "hashmap", "mapping", "create", "--cost", "1", option="--service-id", says="one parent")
    refused(cli, "hashmap", "mapping", "create", "-s", "instance", "--value", "m1.tiny", "--cost", "1",
            option="--value", says="a service mapping cannot have a value")
    refused(cli, "hashmap", "mapping", "create", "--field-id", tree["field"], "--cost", "1",
            option="--value", says="a field mapping needs a non-empty value")
    refused(cli, "hashmap", "mapping", "create", "--field-id", "nosuch", "--value", "a", "--cost", "1",
            option="--field-id", says="no hashmap field with this id: 'nosuch'")
    refused(cli, "hashmap", "mapping", "create", "-s", "volume", "--cost", "1",
            option="--service-id", says="no hashmap service with this id or name: 'volume'")
    refused(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "1", "-g", "licence",
            option="--group-id", says="'licence'")
    refused(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "1", "--cost", "1", "2",
            option="--cost", says="given twice")
    refused(cli, "hashmap", "mapping", "create", "-s", "instance", option="--cost", says="required")
    refused(cli, "hashmap", "mapping", "create", "--field-id", tree["field"], "--value", "v" * 256, "--cost", "1",
            option="--value", says="longer than 255 characters")
    refused(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "1", "-p", "",
            option="--tenant-id", says="non-empty")
    status, _, err = cli("hashmap", "mapping", "create", "-s", "instance", "--cost", "1", "-t", "percent")
    assert status == 2 and "invalid choice: 'percent'" in err


def test_duplicate_mappings_are_refused_as_cloudkitty_does(cli, tree):
    args = ("hashmap", "mapping", "create", "--field-id", tree["field"], "--value", "m1.tiny", "--cost", "1")
    first = one(cli, *args)
    refused(cli, *args, option="--value", says=f"mapping {first['mapping_id']} has the same parent")
    one(cli, *args, "-g", "license")  # another group: both apply (`cloudkitty/rating/hash/db/sqlalchemy/api.py:311-405`)
    one(cli, *args, "-p", "p-0001")  # a tenant's rule replaces the global one
    refused(cli, "hashmap", "mapping", "create", "--field-id", tree["field"], "--value", "m1.big", "--cost", "1",
            "--name", first["name"], option="--name", says="already has this name")
    one(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "1", "--end", "2025-01-01")
    refused(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "2", "--start", "2024-06-01",
            "--end", "2025-06-01", option="--service-id", says="overlapping validity")
    one(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "2", "--start", "2025-02-01",
        "--end", "2025-06-01")  # disjoint windows: both kept
    refused(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "2", "--start", "2026-02-01",
            "--end", "2026-01-01", option="--end", says="before start")


def test_thresholds_one_level_per_parent_and_tenant(cli, tree):
    args = ("hashmap", "threshold", "create", "-s", "instance", "--level", "10", "--cost", "1", "-p", "p-0001")
    first = one(cli, *args)
    refused(cli, *args, "-g", "license", option="--level", says=f"threshold {first['threshold_id']} has this level")
    refused(cli, "hashmap", "threshold", "create", "-s", "instance", "10.000", "2", "-p", "p-0001",
            option="--level", says="'10'")
    one(cli, "hashmap", "threshold", "create", "-s", "instance", "--level", "10", "--cost", "1")
    one(cli, "hashmap", "threshold", "create", "-s", "instance", "--level", "10", "--cost", "1")  # NULL tenants never collide
    default = one(cli, "hashmap", "threshold", "create", "--field-id", tree["field"], "--cost", "3")
    assert default["level"] == "0" and default["type"] == "flat"  # CloudKitty's API defaults


def test_names_are_unique(cli, tree):
    refused(cli, "hashmap", "service", "create", "instance", option="--name", says="already exists")
    refused(cli, "hashmap", "field", "create", "instance", "flavor_name", option="--name", says="already has a field")
    refused(cli, "hashmap", "group", "create", "license", option="--name", says="already exists")
    refused(cli, "hashmap", "service", "create", " ", option="--name", says="non-empty")
    renamed = one(cli, "hashmap", "group", "update", "license", "--name", "licence")
    assert renamed == {"group_id": tree["group"], "name": "licence"}
    assert one(cli, "hashmap", "field", "update", tree["field"], "--name", "flavor")["name"] == "flavor"
    assert one(cli, "hashmap", "service", "show", tree["service"])["name"] == "instance"


def test_a_running_mapping_may_only_get_an_end_unless_forced(cli, tree):
    running = one(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "1")["mapping_id"]
    refused(cli, "hashmap", "mapping", "update", running, "--cost", "2", option="--cost", says="only its end may change")
    refused(cli, "hashmap", "mapping", "update", running, "--end", "2020-01-01", option="--end", says="future")
    ended = one(cli, "hashmap", "mapping", "update", running, "--end", "2999-01-01")
    assert ended["end"] == "2999-01-01T00:00:00+00:00" and ended["cost"] == "1"
    refused(cli, "hashmap", "mapping", "update", running, "--end", "2998-01-01", option="--mapping-id",
            says="cannot change")
    forced = one(cli, "hashmap", "mapping", "update", running, "--cost", "2.5", "-t", "rate", "--force")
    assert (forced["cost"], forced["type"], forced["mapping_id"]) == ("2.5", "rate", running)
    future = one(cli, "hashmap", "mapping", "create", "--field-id", tree["field"], "--value", "a", "--cost", "1",
                 "--start", "2999-01-01")["mapping_id"]
    changed = one(cli, "hashmap", "mapping", "update", future, "--cost", "3", "--value", "b", "-g", "license")
    assert (changed["cost"], changed["value"], changed["group"]) == ("3", "b", "license")
    refused(cli, "hashmap", "mapping", "update", future, "--value", "", option="--value", says="non-empty value")
    refused(cli, "hashmap", "mapping", "update", future, option="--update", says="nothing to change")
    threshold = one(cli, "hashmap", "threshold", "create", "-s", "instance", "1", "2")["threshold_id"]
    updated = one(cli, "hashmap", "threshold", "update", threshold, "--level", "5", "--cost", "0.5", "-p", "t")
    assert (updated["level"], updated["cost"], updated["tenant_id"]) == ("5", "0.5", "t")


def test_deletes_as_cloudkitty(cli, tree):
    mapping = one(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "1", "-g", "license")["mapping_id"]
    field_mapping = one(cli, "hashmap", "mapping", "create", "--field-id", tree["field"], "--value", "a",
                        "--cost", "1", "-g", "license")["mapping_id"]
    status, out, _ = cli("hashmap", "mapping", "delete", mapping)
    assert status == 0 and out.strip() == f"deleted mapping {mapping}"
    assert [m["mapping_id"] for m in cli.json("hashmap", "mapping", "list")] == [field_mapping]
    [deleted] = [m for m in cli.json("hashmap", "mapping", "list", "--deleted") if m["mapping_id"] == mapping]
    assert deleted["deleted"] is not None and deleted["deleted_by"] == "ratebeam"  # a soft delete
    refused(cli, "hashmap", "mapping", "delete", mapping, option="--mapping-id", says="or deleted")

    threshold = one(cli, "hashmap", "threshold", "create", "-s", "instance", "1", "2", "-g", "license")["threshold_id"]
    assert cli("hashmap", "group", "delete", "license")[0] == 0  # rules stay, ungrouped
    assert one(cli, "hashmap", "mapping", "show", field_mapping)["group_id"] is None
    assert one(cli, "hashmap", "threshold", "show", threshold)["group_id"] is None

    group = one(cli, "hashmap", "group", "create", "g2")["group_id"]
    assert one(cli, "hashmap", "mapping", "update", field_mapping, "-g", group, "--force")["group"] == "g2"
    assert cli("hashmap", "group", "delete", "--recursive", group)[0] == 0
    refused(cli, "hashmap", "mapping", "show", field_mapping, option="--mapping-id", says="no hashmap mapping")
    assert cli.json("hashmap", "group", "list") == []

    assert cli("hashmap", "service", "delete", "instance")[0] == 0  # cascades to fields and thresholds
    assert cli.json("hashmap", "field", "list") == [] and cli.json("hashmap", "threshold", "list") == []


def test_output_formats(cli, tree):
    created = one(cli, "hashmap", "mapping", "create", "-s", "instance", "--cost", "0.50")
    status, out, _ = cli("hashmap", "service", "list", "--format", "value")
    assert status == 0 and out == f"{tree['service']} instance\n"
    status, out, _ = cli("hashmap", "mapping", "list", "-f", "value", "--column", "mapping_id", "--column", "cost")
    assert out == f"{created['mapping_id']} 0.5\n"
    status, out, _ = cli("hashmap", "mapping", "list", "--format", "csv")
    [row] = list(csv.DictReader(io.StringIO(out)))
    assert row["mapping_id"] == created["mapping_id"] and row["cost"] == "0.5" and row["value"] == ""
    status, out, _ = cli("hashmap", "mapping", "list")
    header, rule, line = out.splitlines()
    assert header.split()[:6] == ["mapping_id", "service", "field", "value", "cost", "type"]
    assert line.startswith(created["mapping_id"])
    refused(cli, "hashmap", "mapping", "list", "--column", "price", option="--column", says="unknown column")


def test_a_unique_constraint_the_checks_missed_is_a_rule_error(engine):
    """What a concurrent writer could cause on PostgreSQL: the database's own constraint, one clear error."""
    import sqlalchemy as sa

    from ratebeam.connectors.sql.hashmap_admin import RuleError, writing
    from ratebeam.connectors.sql.models import HashMapService

    with (pytest.raises(RuleError, match="creating a hashmap service: refused by the database") as info,
          writing(engine, "creating a hashmap service") as conn):
        for uid in ("a" * 36, "b" * 36):
            conn.execute(sa.insert(HashMapService).values(service_id=uid, name="instance"))
    assert info.value.key == "request"
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(HashMapService)).scalar() == 0


def _enter_rules(cli, rules: dict) -> None:
    """Every group, service, field, mapping and threshold of a rules file, through the CLI."""
    for group in rules.get("groups", []):
        one(cli, "hashmap", "group", "create", group)
    for service in rules["services"]:
        one(cli, "hashmap", "service", "create", service["name"])
        parents = [(("-s", service["name"]), service)]
        for field in service.get("fields", []):
            field_id = one(cli, "hashmap", "field", "create", service["name"], field["name"])["field_id"]
            parents.append((("--field-id", field_id), field))
        for parent, holder in parents:
            for m in holder.get("mappings", []):
                args = [*parent, "--cost", m["cost"], "-t", m["type"]]
                for key, option in (("value", "--value"), ("group", "-g"), ("tenant_id", "-p"), ("start", "--start")):
                    if m.get(key):
                        args += [option, m[key]]
                one(cli, "hashmap", "mapping", "create", *args)
            for t in holder.get("thresholds", []):
                args = [*parent, "--level", t["level"], "--cost", t["cost"], "-t", t["type"]]
                if t.get("group"):
                    args += ["-g", t["group"]]
                one(cli, "hashmap", "threshold", "create", *args)


@pytest.mark.cloudkitty
def test_rules_entered_by_command_rate_as_cloudkitty_rates_them(cli, tmp_path):
    """Example A entered command by command, exported, loaded into CloudKitty's own hashmap tables
    through its own DB API (its validations) and rated there, prices as ``rate -c`` on our database."""
    from test_differential_cloudkitty import EXAMPLES, _require_cloudkitty, cloudkitty_rate

    from ratebeam.pipelines.rate_command import run_rate

    _require_cloudkitty()
    _enter_rules(cli, json.loads((EXAMPLES / "rules_basic.json").read_text()))
    assert cli("modules", "enable", "hashmap")[0] == 0
    status, exported, err = cli("rules", "export")
    assert status == 0, err
    rules = tmp_path / "entered.json"
    rules.write_text(exported)
    usage = EXAMPLES / "usage_basic.jsonl"

    [(ck_points, ck_summary)] = cloudkitty_rate([(rules, usage)], tmp_path)
    assert "case_error" not in ck_summary, ck_summary  # CloudKitty's own validations accept every rule

    out, err_out = io.StringIO(), io.StringIO()
    assert run_rate(None, usage, out, err_out, config_path=cli.config) == 0, err_out.getvalue()
    ours = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [Decimal(p["price"]) for p in ours[:-1]] == [Decimal(p["price"]) for p in ck_points]
    assert Decimal(ours[-1]["summary"]["total"]) == Decimal("58.8")  # CloudKitty's worked example A
