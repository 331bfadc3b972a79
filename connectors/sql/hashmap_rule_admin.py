"""Mappings and thresholds one at a time, with CloudKitty's validations (see ``hashmap_admin``).

A mapping has exactly one parent (a service, or a field); a field mapping needs a value and a
service mapping must not have one; a second non-deleted mapping with the same name, or with the
same parent, value, tenant and group and an overlapping validity, is refused
(``create_mapping`` of CloudKitty's DB API, its exact date filter); deleting a mapping is a soft
delete.  A threshold has one parent too, and one level per parent and tenant (CloudKitty's unique
constraints, which let global thresholds repeat a level since NULL tenants never collide); deleting
it is a hard delete.  Costs and levels are exact decimals at the columns' scale.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from ratebeam.connectors.sql.hashmap_admin import (
    AUTHOR,
    RuleError,
    exact,
    group_pk,
    map_type,
    now_utc,
    parents,
    reading,
    rule_rows,
    tenant,
    writing,
)
from ratebeam.connectors.sql.models import COST, LEVEL, HashMapMapping, HashMapThreshold
from ratebeam.transforms.hashmap_constraints import (
    MappingSlot,
    ThresholdSlot,
    end_before_start,
    mapping_clash,
    threshold_clash,
)
from ratebeam.transforms.rules import ALWAYS

#: "No filter" for the optional filters of the listings (None filters on NULL).
ANY: Any = object()
#: What an update may change, per kind (parents are fixed, as in CloudKitty).
MAPPING_CHANGES = ("cost", "type", "value", "group", "tenant_id", "start", "end", "description")
THRESHOLD_CHANGES = ("cost", "type", "level", "group", "tenant_id")


def list_mappings(engine: Engine, *, service: str | None = None, field: str | None = None,
                  group: str | None = None, no_group: bool = False, tenant_id: Any = ANY,
                  deleted: bool = False) -> list[dict[str, Any]]:
    """Mappings filtered as CloudKitty's ``GET /v1/rating/module_config/hashmap/mappings``."""
    with reading(engine) as conn:
        where = _filters(conn, HashMapMapping, service, field, group, no_group, tenant_id)
        if not deleted:
            where.append(HashMapMapping.deleted.is_(None))
        return rule_rows(conn, HashMapMapping, where)


def get_mapping(engine: Engine, ref: str) -> dict[str, Any]:
    """The mapping whose uuid is ``ref`` (soft-deleted ones included, as CloudKitty shows them)."""
    with reading(engine) as conn:
        return _one(conn, HashMapMapping, ref)


def create_mapping(engine: Engine, *, cost: Decimal | str, type: str = "flat", value: str | None = None,
                   service: str | None = None, field: str | None = None, group: str | None = None,
                   tenant_id: str | None = None, start: datetime | None = None, end: datetime | None = None,
                   name: str | None = None, description: str | None = None,
                   now: datetime | None = None) -> dict[str, Any]:
    """A new mapping (``start`` defaults to 1970-01-01, see ``hashmap_admin``); returns it."""
    name = name or uuid.uuid4().hex
    if len(name) > 32:
        raise RuleError("name", "longer than 32 characters (CloudKitty's column)", name)
    values: dict[str, Any] = {"cost": exact(COST, cost, "cost"), "map_type": map_type(type),
                              "value": _fits(value, "value"), "tenant_id": tenant(tenant_id), "start": start or ALWAYS,
                              "end": end, "name": name, "description": _fits(description, "description")}
    with writing(engine, "creating a hashmap mapping") as conn:
        service_pk, field_pk = parents(conn, service, field)
        values.update(service_id=service_pk, field_id=field_pk, group_id=group_pk(conn, group))
        _check_mapping(conn, values, exclude=None)
        mapping_id = str(uuid.uuid4())
        conn.execute(sa.insert(HashMapMapping).values(
            mapping_id=mapping_id, created_at=now_utc(now), deleted=None, created_by=AUTHOR,
            updated_by=None, deleted_by=None, **values))
        return _one(conn, HashMapMapping, mapping_id)


def update_mapping(engine: Engine, ref: str, changes: dict[str, Any], *, force: bool = False,
                   now: datetime | None = None) -> dict[str, Any]:
    """Change a mapping's ``changes`` (keys of ``MAPPING_CHANGES``; ``group`` is a uuid or name).

    As CloudKitty: a mapping that has started may only get a new ``end`` (not in the past), and one
    that has started and has an end cannot change; ``force`` lifts both (the history it changes
    is then re-rated with ``state reset``).
    """
    at = now_utc(now)
    with writing(engine, "updating a hashmap mapping") as conn:
        current = _one(conn, HashMapMapping, ref, deleted=False)
        values = _changes(conn, changes, MAPPING_CHANGES)
        raw = current["raw"]
        changed = {k: v for k, v in values.items() if raw[k] != v}
        if not force and raw["start"] <= at and changed:
            if raw["end"] is not None:
                raise RuleError("mapping_id", f"started on {raw['start'].isoformat()} and has an end: it "
                                "cannot change (CloudKitty's rule; --force to correct history)", ref)
            others = [k for k in changed if k != "end"]
            if others:
                raise RuleError(_change_key(others[0]), f"the mapping started on {raw['start'].isoformat()}: only "
                                "its end may change (CloudKitty's rule; --force to correct history)",
                                changes[_change_key(others[0])])
            if changed.get("end") is not None and changed["end"] < at:
                raise RuleError("end", "must be in the future for a running mapping", changed["end"].isoformat())
        _check_mapping(conn, {**raw, **values}, exclude=raw["id"], name=False)
        if values:
            conn.execute(sa.update(HashMapMapping).where(HashMapMapping.mapping_id == ref)
                         .values(updated_by=AUTHOR, **values))
        return _one(conn, HashMapMapping, ref)


def delete_mapping(engine: Engine, ref: str, *, now: datetime | None = None) -> dict[str, Any]:
    """Soft-delete a mapping (``deleted`` set, as CloudKitty); returns it as it was."""
    with writing(engine, "deleting a hashmap mapping") as conn:
        row = _one(conn, HashMapMapping, ref, deleted=False)
        conn.execute(sa.update(HashMapMapping).where(HashMapMapping.mapping_id == ref)
                     .values(deleted=now_utc(now), deleted_by=AUTHOR))
        return row


def list_thresholds(engine: Engine, *, service: str | None = None, field: str | None = None,
                    group: str | None = None, no_group: bool = False, tenant_id: Any = ANY) -> list[dict[str, Any]]:
    """Thresholds filtered as CloudKitty's ``GET .../hashmap/thresholds``."""
    with reading(engine) as conn:
        return rule_rows(conn, HashMapThreshold,
                         _filters(conn, HashMapThreshold, service, field, group, no_group, tenant_id))


def get_threshold(engine: Engine, ref: str) -> dict[str, Any]:
    """The threshold whose uuid is ``ref``."""
    with reading(engine) as conn:
        return _one(conn, HashMapThreshold, ref)


def create_threshold(engine: Engine, *, cost: Decimal | str, level: Decimal | str = Decimal(0),
                     type: str = "flat", service: str | None = None, field: str | None = None,
                     group: str | None = None, tenant_id: str | None = None) -> dict[str, Any]:
    """A new threshold (API defaults: level 0, type flat); returns it."""
    values = {"cost": exact(COST, cost, "cost"), "level": exact(LEVEL, level, "level"), "map_type": map_type(type),
              "tenant_id": tenant(tenant_id)}
    with writing(engine, "creating a hashmap threshold") as conn:
        service_pk, field_pk = parents(conn, service, field)
        values.update(service_id=service_pk, field_id=field_pk, group_id=group_pk(conn, group))
        _check_threshold(conn, values, exclude=None)
        threshold_id = str(uuid.uuid4())
        conn.execute(sa.insert(HashMapThreshold).values(threshold_id=threshold_id, **values))
        return _one(conn, HashMapThreshold, threshold_id)


def update_threshold(engine: Engine, ref: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Change a threshold's ``changes`` (keys of ``THRESHOLD_CHANGES``); thresholds have no validity window."""
    with writing(engine, "updating a hashmap threshold") as conn:
        current = _one(conn, HashMapThreshold, ref)
        values = _changes(conn, changes, THRESHOLD_CHANGES)
        _check_threshold(conn, {**current["raw"], **values}, exclude=current["raw"]["id"])
        if values:
            conn.execute(sa.update(HashMapThreshold).where(HashMapThreshold.threshold_id == ref).values(**values))
        return _one(conn, HashMapThreshold, ref)


def delete_threshold(engine: Engine, ref: str) -> dict[str, Any]:
    """Delete a threshold (a hard delete, as CloudKitty); returns it as it was."""
    with writing(engine, "deleting a hashmap threshold") as conn:
        row = _one(conn, HashMapThreshold, ref)
        conn.execute(sa.delete(HashMapThreshold).where(HashMapThreshold.threshold_id == ref))
        return row


# --- validations -----------------------------------------------------------------------------------


def _check_mapping(conn: Connection, values: dict[str, Any], *, exclude: int | None, name: bool = True) -> None:
    """A mapping's value against its parent, its window, CloudKitty's name and duplicate checks.

    The duplicate check is ``transforms.hashmap_constraints``' (the one ``rules import`` makes):
    ``values`` is checked in its place among the mappings of the same key, by id (``exclude``: the
    id of the mapping being updated; a new one comes last).
    """
    if values["service_id"] is not None and values["value"] is not None:
        raise RuleError("value", "a service mapping cannot have a value", values["value"])
    if values["field_id"] is not None and not values["value"]:
        raise RuleError("value", "a field mapping needs a non-empty value", values["value"])
    start, end = values["start"], values["end"]
    if end_before_start(start, end):
        raise RuleError("end", f"before start {start.isoformat()}", end.isoformat())
    if name:
        query = sa.select(HashMapMapping.mapping_id).where(HashMapMapping.deleted.is_(None),
                                                           HashMapMapping.name == values["name"])
        existing = conn.execute(query).first()
        if existing is not None:
            raise RuleError("name", f"mapping {existing.mapping_id} already has this name", values["name"])
    parent = (HashMapMapping.field_id == values["field_id"] if values["field_id"] is not None
              else HashMapMapping.service_id == values["service_id"])
    same = sa.and_(parent, _is(HashMapMapping.value, values["value"]), _is(HashMapMapping.tenant_id, values["tenant_id"]),
                   _is(HashMapMapping.group_id, values["group_id"]))
    rows = conn.execute(sa.select(HashMapMapping.id, HashMapMapping.mapping_id, HashMapMapping.start,
                                  HashMapMapping.end)
                        .where(HashMapMapping.deleted.is_(None), same).order_by(HashMapMapping.id)).all()

    def slot(start: Any, end: Any, name: str) -> MappingSlot:
        return MappingSlot(None, None, None, None, start, end, name)  # the query matched the key already

    slots = [slot(r.start, r.end, r.mapping_id) for r in rows if r.id != exclude]
    index = len(slots) if exclude is None else sum(1 for r in rows if r.id < exclude)
    slots.insert(index, slot(start, end, ""))
    other = mapping_clash(slots, index)
    if other is None:
        return
    clash_text = (f"mapping {other.name} has the same parent, value, tenant and group and an overlapping validity "
                  "(CloudKitty's duplicate check; it allows one)")
    if values["value"] is None:  # a service mapping
        raise RuleError("service_id", clash_text)
    raise RuleError("value", clash_text, values["value"])


def _check_threshold(conn: Connection, values: dict[str, Any], *, exclude: int | None) -> None:
    """One level per parent and tenant (``transforms.hashmap_constraints``; NULL tenants never collide)."""
    if values["tenant_id"] is None:
        return
    parent = (HashMapThreshold.field_id == values["field_id"] if values["field_id"] is not None
              else HashMapThreshold.service_id == values["service_id"])
    rows = conn.execute(sa.select(HashMapThreshold.id, HashMapThreshold.threshold_id, HashMapThreshold.level)
                        .where(parent, HashMapThreshold.tenant_id == values["tenant_id"])).all()
    slots = [ThresholdSlot(None, values["level"], values["tenant_id"]),
             *(ThresholdSlot(None, r.level, values["tenant_id"], r.threshold_id) for r in rows if r.id != exclude)]
    existing = threshold_clash(slots, 0)
    if existing is not None:
        raise RuleError("level", f"threshold {existing.name} has this level for the same parent and tenant "
                        f"{values['tenant_id']!r} (CloudKitty allows one)", format(values["level"].normalize(), "f"))


def _changes(conn: Connection, changes: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    """The column values of an update's changes, validated (unknown keys refused)."""
    values: dict[str, Any] = {}
    for key, value in changes.items():
        if key not in allowed:
            raise RuleError(key, f"cannot be changed (changeable: {', '.join(allowed)})")
        if key == "cost":
            values["cost"] = exact(COST, value, "cost")
        elif key == "level":
            values["level"] = exact(LEVEL, value, "level")
        elif key == "type":
            values["map_type"] = map_type(value)
        elif key == "group":
            values["group_id"] = group_pk(conn, value)
        elif key == "tenant_id":
            values["tenant_id"] = tenant(value)
        elif key in _LENGTHS:
            values[key] = _fits(value, key)
        else:
            values[key] = value
    if not values:
        raise RuleError("update", "nothing to change (no attribute to update)")
    return values


#: CloudKitty's column lengths of a mapping's texts.
_LENGTHS = {"value": 255, "description": 256}


def _fits(text: str | None, key: str) -> str | None:
    if text is not None and len(text) > _LENGTHS[key]:
        raise RuleError(key, f"longer than {_LENGTHS[key]} characters (CloudKitty's column)", text)
    return text


def _change_key(column: str) -> str:
    return {"map_type": "type", "group_id": "group"}.get(column, column)


def _is(column: Any, value: Any) -> Any:
    return column.is_(None) if value is None else column == value


def _filters(conn: Connection, model: type[HashMapMapping] | type[HashMapThreshold], service: str | None,
             field: str | None, group: str | None, no_group: bool, tenant_id: Any) -> list[Any]:
    where: list[Any] = []
    if service is not None:
        where.append(model.service_id == parents(conn, service, None)[0])
    if field is not None:
        where.append(model.field_id == parents(conn, None, field)[1])
    if group is not None:
        where.append(model.group_id == group_pk(conn, group))
    if no_group:
        where.append(model.group_id.is_(None))
    if tenant_id is not ANY:
        where.append(_is(model.tenant_id, tenant_id))
    return where


def _one(conn: Connection, model: type[HashMapMapping] | type[HashMapThreshold], ref: str, *,
         deleted: bool = True) -> dict[str, Any]:
    uuid_column = HashMapMapping.mapping_id if model is HashMapMapping else HashMapThreshold.threshold_id
    where = [uuid_column == ref]
    if not deleted and model is HashMapMapping:
        where.append(HashMapMapping.deleted.is_(None))
    rows = rule_rows(conn, model, where)
    if not rows:
        kind = "mapping" if model is HashMapMapping else "threshold"
        raise RuleError(f"{kind}_id", f"no hashmap {kind} with this id" + ("" if deleted else " (or deleted)"), ref)
    return rows[0]

