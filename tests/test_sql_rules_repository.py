"""The rules repository: bulk load, import, scripts and module states, on SQLite and PostgreSQL."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa

from ratebeam.connectors.sql.models import HashMapField, HashMapMapping, HashMapService
from ratebeam.connectors.sql.rules_repository import (
    ModuleInfo,
    count_statements,
    delete_script,
    load_rules,
    load_scripts,
    module_states,
    replace_rules,
    save_script,
    set_module_state,
)
from ratebeam.transforms.rules import MappingRule, RuleSet, ThresholdRule

NOW = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)


def generated_rules(seed: int, n_services: int, n_fields: int, n_mappings: int, n_thresholds: int) -> RuleSet:
    """A random CloudKitty-valid rule set: tenants, groups, windows, both map types, odd decimals."""
    rng = random.Random(seed)
    services = tuple(f"svc_{rng.randrange(10**6)}_{i}" for i in range(n_services))
    fields = tuple((services[i % n_services], f"field_{i}") for i in range(n_fields))
    groups = ("_DEFAULT_", "instance", "volume_extra")

    def cost() -> Decimal:
        return Decimal(rng.randrange(-10**12, 10**12)).scaleb(-rng.randrange(0, 28))

    def window() -> tuple[datetime | None, datetime | None]:
        start = None if rng.random() < 0.5 else NOW + timedelta(hours=rng.randrange(-1000, 1000))
        end = None if rng.random() < 0.6 else (start or NOW) + timedelta(hours=rng.randrange(1, 500))
        return start, end

    mappings = []
    for i in range(n_mappings):
        start, end = window()
        common = dict(type=rng.choice(["flat", "rate"]), cost=cost(), group=rng.choice([None, *groups]),
                      tenant_id=rng.choice([None, None, "tenant-a", "tenant-b"]), start=start, end=end)
        if i % 10 == 0:
            mappings.append(MappingRule(service=rng.choice(services), field=None, value=None, **common))
        else:
            service, field = rng.choice(fields)
            mappings.append(MappingRule(service=service, field=field, value=f"v{rng.randrange(50)}", **common))
    thresholds = []
    for i in range(n_thresholds):
        service, field = rng.choice(fields)
        thresholds.append(ThresholdRule(
            service=service, field=None if i % 3 == 0 else field, level=Decimal(i).scaleb(-3),
            type=rng.choice(["flat", "rate"]), cost=cost(), group=rng.choice([None, *groups]),
            tenant_id=rng.choice([None, "tenant-a"])))
    return RuleSet(services=services, fields=fields, mappings=tuple(mappings), thresholds=tuple(thresholds),
                   groups=groups)


def test_round_trip_of_a_large_rule_set_in_at_most_10_statements(engine):
    rules = generated_rules(seed=7, n_services=3, n_fields=50, n_mappings=2000, n_thresholds=200)
    replace_rules(engine, rules)
    with count_statements(engine) as counter:
        loaded = load_rules(engine)
    assert counter.count <= 10, counter.statements
    assert loaded == rules
    assert loaded.version_key() == rules.version_key()


def test_load_keeps_db_order_not_name_order(engine):
    rules = RuleSet(
        services=("zeta", "alpha"),
        fields=(("alpha", "z_field"), ("zeta", "b"), ("alpha", "a_field")),
        mappings=(MappingRule("alpha", "z_field", "x", "rate", Decimal("2")),
                  MappingRule("zeta", None, None, "flat", Decimal("1"), group="g2"),
                  MappingRule("alpha", "a_field", "y", "flat", Decimal("3"), group="g1")),
        groups=("g2", "g1"),
    )
    replace_rules(engine, rules)
    loaded = load_rules(engine)
    assert loaded.services == ("zeta", "alpha")
    assert loaded.fields == (("alpha", "z_field"), ("zeta", "b"), ("alpha", "a_field"))
    assert loaded.groups == ("g2", "g1")
    assert loaded == rules


def test_unlisted_services_fields_and_groups_are_created(engine):
    rules = RuleSet(mappings=(MappingRule("cpu", "flavor", "m1.small", "flat", Decimal("1"), group="g"),),
                    thresholds=(ThresholdRule("disk", None, Decimal("10"), "rate", Decimal("0.5")),))
    replace_rules(engine, rules)
    loaded = load_rules(engine)
    assert loaded.services == ("cpu", "disk")
    assert loaded.fields == (("cpu", "flavor"),)
    assert loaded.groups == ("g",)
    assert loaded.mappings == rules.mappings and loaded.thresholds == rules.thresholds


def test_soft_deleted_mappings_are_not_loaded(engine):
    rules = RuleSet(services=("cpu",), mappings=(
        MappingRule("cpu", None, None, "flat", Decimal("1")),
        MappingRule("cpu", None, None, "flat", Decimal("2"), tenant_id="t"),
    ))
    replace_rules(engine, rules)
    with engine.begin() as conn:
        conn.execute(sa.update(HashMapMapping).where(HashMapMapping.tenant_id == "t").values(deleted=NOW))
    assert load_rules(engine).mappings == rules.mappings[:1]


def test_replace_rules_replaces_everything(engine):
    replace_rules(engine, generated_rules(seed=1, n_services=2, n_fields=5, n_mappings=40, n_thresholds=10))
    smaller = generated_rules(seed=2, n_services=1, n_fields=2, n_mappings=5, n_thresholds=2)
    replace_rules(engine, smaller)
    assert load_rules(engine) == smaller
    replace_rules(engine, RuleSet())
    assert load_rules(engine) == RuleSet()


def test_replace_rules_is_one_transaction(engine):
    before = generated_rules(seed=3, n_services=2, n_fields=4, n_mappings=30, n_thresholds=5)
    replace_rules(engine, before)

    def fail_on_thresholds(_conn, _cursor, statement, *_args) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO HASHMAP_THRESHOLDS"):
            raise RuntimeError("simulated failure half-way through the import")

    sa.event.listen(engine, "before_cursor_execute", fail_on_thresholds)
    try:
        with pytest.raises(RuntimeError, match="half-way"):
            replace_rules(engine, generated_rules(seed=4, n_services=3, n_fields=9, n_mappings=50, n_thresholds=5))
    finally:
        sa.event.remove(engine, "before_cursor_execute", fail_on_thresholds)
    assert load_rules(engine) == before


def test_imported_rows_look_like_cloudkitty_rows(engine):
    replace_rules(engine, RuleSet(mappings=(MappingRule("cpu", "flavor", "m1", "rate", Decimal("1.5")),)),
                  now=NOW)
    with engine.connect() as conn:
        mapping = conn.execute(sa.select(HashMapMapping)).one()
        service = conn.execute(sa.select(HashMapService)).one()
        field = conn.execute(sa.select(HashMapField)).one()
    assert len(mapping.mapping_id) == len(service.service_id) == len(field.field_id) == 36
    assert len(mapping.name) == 32 and mapping.created_by == "ratebeam" and mapping.created_at == NOW
    assert mapping.start == datetime(1970, 1, 1, tzinfo=UTC) and mapping.end is None
    assert mapping.field_id == field.id and mapping.service_id is None and field.service_id == service.id


@pytest.mark.parametrize(("rule", "message"), [
    (MappingRule("cpu", None, "x", "flat", Decimal(1)), "service mapping cannot have a value"),
    (MappingRule("cpu", "flavor", "", "flat", Decimal(1)), "field mapping needs a non-empty value"),
    (MappingRule("cpu", None, None, "flat", 0.5), "money is never a float"),
    (MappingRule("cpu", None, None, "bogus", Decimal(1)), "type must be 'flat' or 'rate'"),
    (MappingRule("cpu", None, None, "flat", Decimal(1), start=NOW, end=NOW - timedelta(hours=1)), "before start"),
    (MappingRule("cpu", None, None, "flat", Decimal(1), start=datetime(2026, 1, 1)), "timezone-aware"),  # noqa: DTZ001
    (MappingRule("cpu", None, None, "flat", Decimal("1E+13")), "does not fit NUMERIC"),
])
def test_replace_rules_refuses_what_cloudkitty_cannot_hold(engine, rule, message):
    with pytest.raises(ValueError, match=message) as info:
        replace_rules(engine, RuleSet(mappings=(rule,)))
    assert "mappings[0] (cpu." in str(info.value)
    assert load_rules(engine) == RuleSet()


def test_replace_rules_refuses_two_tenant_thresholds_at_one_level(engine):
    twice = ThresholdRule("cpu", None, Decimal("1"), "flat", Decimal("1"), tenant_id="t")
    with pytest.raises(ValueError, match=r"thresholds\[1\].*one per parent, level and tenant"):
        replace_rules(engine, RuleSet(thresholds=(twice, twice)))


def test_load_refuses_a_mapping_without_parent(engine):
    with engine.begin() as conn:
        conn.execute(sa.insert(HashMapMapping).values(
            mapping_id="x" * 36, cost=Decimal(1), map_type="flat", created_at=NOW, start=NOW, name="orphan",
            created_by="test"))
    with pytest.raises(ValueError, match="exactly one of service_id, field_id"):
        load_rules(engine)


# --- scripts ---------------------------------------------------------------------------------------


def test_scripts_are_saved_replaced_deleted_and_loaded_in_db_order(engine):
    save_script(engine, "second-name-first-row", '{"a": 1}', start=NOW, now=NOW)
    save_script(engine, "another", '{"b": 2}', start=NOW, end=NOW + timedelta(days=1), now=NOW)
    scripts = load_scripts(engine)
    assert [s.name for s in scripts] == ["second-name-first-row", "another"]
    assert scripts[1].data == '{"b": 2}' and scripts[1].end == NOW + timedelta(days=1)

    save_script(engine, "second-name-first-row", '{"a": 3}', start=NOW - timedelta(days=1), now=NOW)
    first = load_scripts(engine)[0]
    assert first.data == '{"a": 3}' and first.start == NOW - timedelta(days=1)

    assert delete_script(engine, "another", now=NOW)
    assert not delete_script(engine, "another", now=NOW)
    assert [s.name for s in load_scripts(engine)] == ["second-name-first-row"]
    save_script(engine, "another", '{"b": 4}', now=NOW)  # saving again brings it back
    assert [s.data for s in load_scripts(engine)] == ['{"a": 3}', '{"b": 4}']


def test_script_validity_window_is_start_inclusive_end_exclusive(engine):
    save_script(engine, "s", "{}", start=NOW, end=NOW + timedelta(hours=1), now=NOW)
    [script] = load_scripts(engine)
    assert not script.is_active(NOW - timedelta(microseconds=1))
    assert script.is_active(NOW)
    assert not script.is_active(NOW + timedelta(hours=1))


def test_script_window_must_not_be_empty(engine):
    with pytest.raises(ValueError, match="not after start"):
        save_script(engine, "s", "{}", start=NOW, end=NOW)


# --- module states ---------------------------------------------------------------------------------


def test_module_defaults_without_rows(engine):
    assert module_states(engine) == {
        "hashmap": ModuleInfo("hashmap", False, 1),
        "noop": ModuleInfo("noop", True, 1),
        "pyscripts": ModuleInfo("pyscripts", False, 1),
    }


def test_module_state_and_priority(engine):
    set_module_state(engine, "hashmap", enabled=True)
    set_module_state(engine, "hashmap", priority=5)
    set_module_state(engine, "pyscripts", priority=0)  # a row with priority only: disabled, reads 1
    set_module_state(engine, "scripts", enabled=True, priority=3)
    set_module_state(engine, "noop", enabled=False, priority=9)  # noop ignores its row
    states = module_states(engine)
    assert states["hashmap"] == ModuleInfo("hashmap", True, 5)
    assert states["pyscripts"] == ModuleInfo("pyscripts", False, 1)
    assert states["scripts"] == ModuleInfo("scripts", True, 3)
    assert states["noop"] == ModuleInfo("noop", True, 1)
    set_module_state(engine, "hashmap", enabled=False)
    assert module_states(engine, ["hashmap"])["hashmap"] == ModuleInfo("hashmap", False, 5)


def test_module_state_needs_something_to_set(engine):
    with pytest.raises(ValueError, match="nothing to set"):
        set_module_state(engine, "hashmap")
