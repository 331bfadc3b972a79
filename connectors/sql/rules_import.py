"""Rules imports that keep ids: a rule that did not change keeps its uuid (``rules import [--merge]``).

An import used to regenerate every uuid, breaking whatever refers to them (CloudKitty's API and
client name rules by uuid, and so do ``ratebeam hashmap ...`` commands and people's notes).  Rows
are now matched by their natural key and keep their uuid (and a mapping its name and audit
columns):

* service: its name; field: (service, name); group: its name;
* mapping: (service, field, value, tenant, group, start) — cost, type and end may change;
* threshold: (service, field, level, tenant, group) — cost and type may change.

The rule set is written back in its own order, because order is data (CloudKitty's load order; a
field's position breaks threshold ties): every row is deleted and inserted again in one
transaction, with the kept uuids.  Soft-deleted mappings go as before (``hashmap mapping delete``
keeps them only until the next import).  :func:`merge_rules` gives the rule set of ``--merge``:
the database's rules with the file's added or updated in place, nothing removed.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from ratebeam.connectors.sql.engine import database_errors, write_transaction
from ratebeam.connectors.sql.hashmap_admin import AUTHOR, rule_rows
from ratebeam.connectors.sql.models import (
    COST,
    LEVEL,
    ExactDecimal,
    HashMapField,
    HashMapGroup,
    HashMapMapping,
    HashMapService,
    HashMapThreshold,
)
from ratebeam.transforms.periods import require_aware
from ratebeam.transforms.rules import ALWAYS, MappingRule, RuleSet, ThresholdRule

Rule = TypeVar("Rule", MappingRule, ThresholdRule)


def mapping_key(rule: MappingRule) -> tuple[Hashable, ...]:
    """What makes a mapping the same mapping across imports (its cost, type and end may change)."""
    return (rule.service, rule.field, rule.value, rule.tenant_id, rule.group, rule.start)


def threshold_key(rule: ThresholdRule) -> tuple[Hashable, ...]:
    """What makes a threshold the same threshold across imports (its cost and type may change)."""
    return (rule.service, rule.field, rule.level, rule.tenant_id, rule.group)


def merge_rules(existing: RuleSet, new: RuleSet) -> RuleSet:
    """``existing`` with ``new``'s rules added, or replacing the rule of the same natural key in place."""
    return RuleSet(
        services=tuple(dict.fromkeys([*existing.services, *new.services])),
        fields=tuple(dict.fromkeys([*existing.fields, *new.fields])),
        mappings=_merged(existing.mappings, new.mappings, mapping_key),
        thresholds=_merged(existing.thresholds, new.thresholds, threshold_key),
        groups=tuple(dict.fromkeys([*existing.groups, *new.groups])),
    )


def _merged(existing: Sequence[Rule], new: Sequence[Rule], key: Callable[[Rule], Hashable]) -> tuple[Rule, ...]:
    out = list(existing)
    positions = defaultdict(list)
    for index, rule in enumerate(out):
        positions[key(rule)].append(index)
    for rule in new:
        free = positions.get(key(rule))
        if free:  # the first rule of that key takes its place; more of the same key are added
            out[free.pop(0)] = rule
        else:
            out.append(rule)
    return tuple(out)


def replace_rules(engine: Engine, rules: RuleSet, *, now: datetime | None = None) -> None:
    """Replace ALL hashmap rules of the database by ``rules``, in one transaction (an import).

    Services, fields and groups used by a rule but not listed are added after the listed ones.
    Rows matching an existing row's natural key keep its uuid (module doc); new rows get fresh
    uuids, generated names and ``created_by = 'ratebeam'``, and a changed mapping
    ``updated_by = 'ratebeam'``.  A mapping without ``start`` is stored as valid since 1970-01-01.
    Rules CloudKitty could not hold are refused with a ``ValueError`` naming the rule.
    """
    created_at = require_aware(now, "now") if now is not None else datetime.now(UTC)
    services, fields, groups = _collect_names(rules)
    with database_errors(engine, "replacing the hashmap rules"), write_transaction(engine) as conn:
        kept = _Kept(conn)
        for model in (HashMapMapping, HashMapThreshold, HashMapField, HashMapService, HashMapGroup):
            conn.execute(sa.delete(model))
        service_ids = _insert_named(conn, HashMapService, "service_id", services, kept.services)
        group_ids = _insert_named(conn, HashMapGroup, "group_id", groups, kept.groups)
        if fields:
            conn.execute(sa.insert(HashMapField), [
                {"field_id": kept.fields.get(key) or _uuid(), "service_id": service_ids[key[0]], "name": key[1]}
                for key in fields
            ])
        field_ids = {
            (row.service_name, row.name): row.id
            for row in conn.execute(
                sa.select(HashMapField.id, HashMapField.name, HashMapService.name.label("service_name"))
                .join(HashMapService, HashMapField.service_id == HashMapService.id)
            )
        }

        def links(rule: MappingRule | ThresholdRule) -> dict[str, int | None]:
            group = None if rule.group is None else group_ids.get(rule.group)
            if rule.field is None:
                return {"service_id": service_ids[rule.service], "field_id": None, "group_id": group}
            return {"service_id": None, "field_id": field_ids[(rule.service, rule.field)], "group_id": group}

        if rules.mappings:
            conn.execute(sa.insert(HashMapMapping), [
                {"value": m.value, "cost": m.cost, "map_type": m.type, **links(m), "tenant_id": m.tenant_id,
                 "start": m.start or ALWAYS, "end": m.end, "deleted": None, "deleted_by": None,
                 **kept.mapping(m, created_at)}
                for m in rules.mappings
            ])
        if rules.thresholds:
            conn.execute(sa.insert(HashMapThreshold), [
                {"threshold_id": kept.threshold(t), "level": t.level, "cost": t.cost, "map_type": t.type,
                 **links(t), "tenant_id": t.tenant_id}
                for t in rules.thresholds
            ])


class _Kept:
    """The uuids (and a mapping's name and audit columns) of the rows there were, by natural key."""

    def __init__(self, conn: Connection) -> None:
        self.services = {r.name: r.service_id for r in conn.execute(sa.select(HashMapService.name,
                                                                              HashMapService.service_id))}
        self.groups = {r.name: r.group_id for r in conn.execute(sa.select(HashMapGroup.name, HashMapGroup.group_id))}
        self.fields = {(r.service, r.name): r.field_id for r in conn.execute(
            sa.select(HashMapField.field_id, HashMapField.name, HashMapService.name.label("service"))
            .join(HashMapService, HashMapField.service_id == HashMapService.id))}
        self._mappings: dict[Hashable, list[dict[str, Any]]] = defaultdict(list)
        for row in rule_rows(conn, HashMapMapping, [HashMapMapping.deleted.is_(None)]):
            start = None if row["start"] <= ALWAYS else row["start"]
            key = (row["service"], row["field"], row["value"], row["tenant_id"], row["group"], start)
            self._mappings[key].append(row)
        self._thresholds: dict[Hashable, list[str]] = defaultdict(list)
        for row in rule_rows(conn, HashMapThreshold, []):
            level_key = (row["service"], row["field"], row["level"], row["tenant_id"], row["group"])
            self._thresholds[level_key].append(row["threshold_id"])

    def mapping(self, rule: MappingRule, created_at: datetime) -> dict[str, Any]:
        """The identity and audit columns of the row written for ``rule``."""
        rows = self._mappings.get(mapping_key(rule))
        if not rows:
            return {"mapping_id": _uuid(), "name": uuid.uuid4().hex, "description": None, "created_at": created_at,
                    "created_by": AUTHOR, "updated_by": None}
        old = rows.pop(0)
        same = (old["cost"], old["type"], old["end"]) == (COST.coerce(rule.cost), rule.type, rule.end)
        return {key: old[key] for key in ("mapping_id", "name", "description", "created_at", "created_by")} | {
            "updated_by": old["updated_by"] if same else AUTHOR}

    def threshold(self, rule: ThresholdRule) -> str:
        """The uuid of the row written for ``rule``."""
        rows = self._thresholds.get(threshold_key(rule))
        return rows.pop(0) if rows else _uuid()


def _collect_names(rules: RuleSet) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """Services, fields and groups to create, in order, after validating every rule."""
    services = list(dict.fromkeys(rules.services))
    fields = list(dict.fromkeys(rules.fields))
    groups = list(dict.fromkeys(rules.groups))
    for service, _ in fields:
        if service not in services:
            services.append(service)
    for index, mapping in enumerate(rules.mappings):
        where = f"mappings[{index}] ({mapping.service}.{mapping.field or '*'})"
        if mapping.field is None and mapping.value is not None:
            raise ValueError(f"{where}: a service mapping cannot have a value, got {mapping.value!r}")
        if mapping.field is not None and not mapping.value:
            raise ValueError(f"{where}: a field mapping needs a non-empty value")
        start = require_aware(mapping.start, f"{where}: start") if mapping.start else None
        end = require_aware(mapping.end, f"{where}: end") if mapping.end else None
        if start is not None and end is not None and end < start:
            raise ValueError(f"{where}: end {end.isoformat()} is before start {start.isoformat()}")
        _check_rule(where, mapping, services, fields, groups)
    levels: set[tuple] = set()
    for index, threshold in enumerate(rules.thresholds):
        where = f"thresholds[{index}] ({threshold.service}.{threshold.field or '*'})"
        level = _stored(LEVEL, threshold.level, f"{where}: level")
        key = (threshold.service, threshold.field, level, threshold.tenant_id)
        if threshold.tenant_id is not None and key in levels:
            raise ValueError(f"{where}: a second threshold at level {level} for tenant "
                             f"{threshold.tenant_id!r} (CloudKitty allows one per parent, level and tenant)")
        levels.add(key)
        _check_rule(where, threshold, services, fields, groups)
    return services, fields, groups


def _check_rule(where: str, rule: MappingRule | ThresholdRule, services: list[str],
                fields: list[tuple[str, str]], groups: list[str]) -> None:
    """Check what mappings and thresholds share; add their service, field and group if unlisted."""
    if rule.type not in ("flat", "rate"):
        raise ValueError(f"{where}: type must be 'flat' or 'rate', got {rule.type!r}")
    _stored(COST, rule.cost, f"{where}: cost")
    if rule.service not in services:
        services.append(rule.service)
    if rule.field is not None and (rule.service, rule.field) not in fields:
        fields.append((rule.service, rule.field))
    if rule.group is not None and rule.group not in groups:
        groups.append(rule.group)


def _stored(column: ExactDecimal, value: Decimal, where: str) -> Decimal:
    try:
        return column.coerce(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from err


def _insert_named(conn: Connection, model: type[HashMapService] | type[HashMapGroup], uuid_column: str,
                  names: list[str], kept: dict[str, str]) -> dict[str, int]:
    """Insert rows by unique name (in list order, so ids follow it) and return their ids by name."""
    if not names:
        return {}
    conn.execute(sa.insert(model), [{uuid_column: kept.get(name) or _uuid(), "name": name} for name in names])
    return {row.name: row.id for row in conn.execute(sa.select(model.id, model.name))}


def _uuid() -> str:
    return str(uuid.uuid4())
