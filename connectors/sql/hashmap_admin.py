"""Rule-by-rule management of the hashmap tables, with CloudKitty's validations (``ratebeam hashmap``).

``rules_repository`` reads and replaces whole rule sets; this module creates, lists, shows,
updates and deletes one service, field, group, mapping or threshold at a time, as CloudKitty's
API does (``rating/hash/controllers``, ``rating/hash/db/sqlalchemy/api.py``,
``rating/common/validations/fields.py``), so that a rule set built here is one CloudKitty would
have accepted, and ``rules export`` / ``import`` round-trip it.  Objects are named by their uuid
(``service_id``, ``field_id``...), as in CloudKitty; services and groups may also be named by
their unique name.  A refused request is a :class:`RuleError` naming the option and the value.

Differences from CloudKitty, on purpose: a mapping without ``start`` is valid since 1970-01-01
(as in a rules file, so a rule applies to the history it is re-rated with) and a ``start`` in the
past is accepted; the update of a rule that has started is limited to its ``end`` as in CloudKitty,
unless ``force`` (a correction that is then re-rated with ``state reset``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from ratebeam.connectors.sql.engine import database_errors, write_transaction
from ratebeam.connectors.sql.models import (
    ExactDecimal,
    HashMapField,
    HashMapGroup,
    HashMapMapping,
    HashMapService,
    HashMapThreshold,
)

#: ``created_by`` / ``updated_by`` / ``deleted_by`` of the rows this module writes.
AUTHOR = "ratebeam"
MAP_TYPES = ("flat", "rate")
_UNSET: Any = object()


class RuleError(ValueError):
    """A refused request: ``key`` is the option (``service_id``, ``cost``...), ``value`` the bad value."""

    def __init__(self, key: str, message: str, value: object = _UNSET) -> None:
        self.key, self.message, self.value = key, message, value
        super().__init__(f"{key}: {message}" + ("" if value is _UNSET else f": {value!r}"))

    @property
    def has_value(self) -> bool:
        """Whether the error names a value."""
        return self.value is not _UNSET


# --- services, fields, groups ---------------------------------------------------------------------


#: The objects known by a unique name: their model and uuid column.
_NAMED: dict[str, tuple[Any, str]] = {"service": (HashMapService, "service_id"), "group": (HashMapGroup, "group_id")}


def _list_named(engine: Engine, kind: str) -> list[dict[str, Any]]:
    model, uuid_column = _NAMED[kind]
    with reading(engine) as conn:
        return [dict(r._mapping) for r in conn.execute(
            sa.select(getattr(model, uuid_column), model.name).order_by(model.id))]


def _create_named(engine: Engine, kind: str, name: str) -> dict[str, Any]:
    model, uuid_column = _NAMED[kind]
    with writing(engine, f"creating a hashmap {kind}") as conn:
        _unique_name(conn, kind, _name(name))
        conn.execute(sa.insert(model).values({uuid_column: _uuid(), "name": name}))
        return _named(conn, kind, name)


def _get_named(engine: Engine, kind: str, ref: str) -> dict[str, Any]:
    with reading(engine) as conn:
        return _named(conn, kind, ref)


def _rename(engine: Engine, kind: str, ref: str, name: str) -> dict[str, Any]:
    model, uuid_column = _NAMED[kind]
    with writing(engine, f"updating a hashmap {kind}") as conn:
        row = _named(conn, kind, ref)
        if name != row["name"]:
            _unique_name(conn, kind, _name(name))
            conn.execute(sa.update(model).where(getattr(model, uuid_column) == row[uuid_column]).values(name=name))
        return _named(conn, kind, row[uuid_column])


def list_services(engine: Engine) -> list[dict[str, Any]]:
    """Every service, in DB order: ``service_id``, ``name``."""
    return _list_named(engine, "service")


def create_service(engine: Engine, name: str) -> dict[str, Any]:
    """A new service rating the metric type ``name`` (unique)."""
    return _create_named(engine, "service", name)


def get_service(engine: Engine, ref: str) -> dict[str, Any]:
    """The service whose uuid or name is ``ref``."""
    return _get_named(engine, "service", ref)


def update_service(engine: Engine, ref: str, name: str) -> dict[str, Any]:
    """Rename a service (it then rates the metric type ``name``)."""
    return _rename(engine, "service", ref, name)


def delete_service(engine: Engine, ref: str) -> dict[str, Any]:
    """Delete a service with its fields, mappings and thresholds (CloudKitty's cascade)."""
    with writing(engine, "deleting a hashmap service") as conn:
        row = _service(conn, ref)
        conn.execute(sa.delete(HashMapService).where(HashMapService.service_id == row["service_id"]))
        return row


def list_fields(engine: Engine, service_ref: str | None = None) -> list[dict[str, Any]]:
    """The fields of one service (or of all), in DB order: ``field_id``, ``name``, ``service_id``, ``service``."""
    with reading(engine) as conn:
        query = _field_query()
        if service_ref is not None:
            query = query.where(HashMapService.service_id == _service(conn, service_ref)["service_id"])
        return [dict(r._mapping) for r in conn.execute(query.order_by(HashMapField.id))]


def create_field(engine: Engine, service_ref: str, name: str) -> dict[str, Any]:
    """A new field ``name`` of a service (unique within the service)."""
    with writing(engine, "creating a hashmap field") as conn:
        service = _service(conn, service_ref)
        service_pk = _pk(conn, HashMapService, HashMapService.service_id, service["service_id"])
        _unique_field(conn, service_pk, _name(name))
        field_id = _uuid()
        conn.execute(sa.insert(HashMapField).values(field_id=field_id, name=name, service_id=service_pk))
        return _field(conn, field_id)


def get_field(engine: Engine, ref: str) -> dict[str, Any]:
    """The field whose uuid is ``ref``."""
    with reading(engine) as conn:
        return _field(conn, ref)


def update_field(engine: Engine, ref: str, name: str) -> dict[str, Any]:
    """Rename a field (it then reads the label ``name``)."""
    with writing(engine, "updating a hashmap field") as conn:
        row = _field(conn, ref)
        if name != row["name"]:
            service_pk = _pk(conn, HashMapService, HashMapService.service_id, row["service_id"])
            _unique_field(conn, service_pk, _name(name))
            conn.execute(sa.update(HashMapField).where(HashMapField.field_id == ref).values(name=name))
        return _field(conn, ref)


def delete_field(engine: Engine, ref: str) -> dict[str, Any]:
    """Delete a field with its mappings and thresholds."""
    with writing(engine, "deleting a hashmap field") as conn:
        row = _field(conn, ref)
        conn.execute(sa.delete(HashMapField).where(HashMapField.field_id == ref))
        return row


def list_groups(engine: Engine) -> list[dict[str, Any]]:
    """Every group, in DB order: ``group_id``, ``name``."""
    return _list_named(engine, "group")


def create_group(engine: Engine, name: str) -> dict[str, Any]:
    """A new group (unique name)."""
    return _create_named(engine, "group", name)


def get_group(engine: Engine, ref: str) -> dict[str, Any]:
    """The group whose uuid or name is ``ref``."""
    return _get_named(engine, "group", ref)


def update_group(engine: Engine, ref: str, name: str) -> dict[str, Any]:
    """Rename a group."""
    return _rename(engine, "group", ref, name)


def delete_group(engine: Engine, ref: str, *, recursive: bool = False) -> dict[str, Any]:
    """Delete a group; its rules become ungrouped, or are deleted too with ``recursive`` (CloudKitty's)."""
    with writing(engine, "deleting a hashmap group") as conn:
        row = _group(conn, ref)
        pk = _pk(conn, HashMapGroup, HashMapGroup.group_id, row["group_id"])
        if recursive:
            conn.execute(sa.delete(HashMapMapping).where(HashMapMapping.group_id == pk))
            conn.execute(sa.delete(HashMapThreshold).where(HashMapThreshold.group_id == pk))
        else:  # ON DELETE SET NULL, explicitly: the result must not depend on the database's FK support
            for model in (HashMapMapping, HashMapThreshold):
                conn.execute(sa.update(model).where(model.group_id == pk).values(group_id=None))
        conn.execute(sa.delete(HashMapGroup).where(HashMapGroup.id == pk))
        return row


# --- lookups ---------------------------------------------------------------------------------------


def _named(conn: Connection, kind: str, ref: str) -> dict[str, Any]:
    """The service or group whose uuid or name is ``ref``."""
    model, uuid_column = _NAMED[kind]
    row = conn.execute(sa.select(getattr(model, uuid_column), model.name).where(
        sa.or_(getattr(model, uuid_column) == ref, model.name == ref))).first()
    if row is None:
        raise RuleError(uuid_column, f"no hashmap {kind} with this id or name", ref)
    return dict(row._mapping)


def _service(conn: Connection, ref: str) -> dict[str, Any]:
    return _named(conn, "service", ref)


def _group(conn: Connection, ref: str) -> dict[str, Any]:
    return _named(conn, "group", ref)


def _field_query() -> sa.Select:
    return (sa.select(HashMapField.field_id, HashMapField.name, HashMapService.service_id,
                      HashMapService.name.label("service"))
            .join(HashMapService, HashMapField.service_id == HashMapService.id))


def _field(conn: Connection, ref: str) -> dict[str, Any]:
    row = conn.execute(_field_query().where(HashMapField.field_id == ref)).first()
    if row is None:
        raise RuleError("field_id", "no hashmap field with this id", ref)
    return dict(row._mapping)


def _pk(conn: Connection, model: type[Any], uuid_column: Any, value: str) -> int:
    """The integer primary key of the row whose uuid is ``value`` (looked up just before)."""
    return conn.execute(sa.select(model.id).where(uuid_column == value)).scalar_one()


def _unique_name(conn: Connection, kind: str, name: str) -> None:
    model, _ = _NAMED[kind]
    if conn.execute(sa.select(model.id).where(model.name == name)).first() is not None:
        raise RuleError("name", f"a hashmap {kind} with this name already exists", name)


def _unique_field(conn: Connection, service_pk: int, name: str) -> None:
    existing = conn.execute(sa.select(HashMapField.id).where(
        HashMapField.service_id == service_pk, HashMapField.name == name)).first()
    if existing is not None:
        raise RuleError("name", "the service already has a field with this name", name)


def _name(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise RuleError("name", "must be a non-empty string", name)
    if len(name) > 255:
        raise RuleError("name", "longer than 255 characters", name)
    return name


def _uuid() -> str:
    return str(uuid.uuid4())


# --- shared by mappings and thresholds -------------------------------------------------------------


def exact(column: ExactDecimal, value: Decimal | str, key: str) -> Decimal:
    """A cost or level as the database stores it; refused when not a finite decimal that fits."""
    try:
        number = value if isinstance(value, Decimal) else Decimal(str(value).strip())
        return column.coerce(number)
    except (ArithmeticError, TypeError, ValueError):
        raise RuleError(key, f"not a decimal that fits NUMERIC({column.precision},{column.scale})",
                        str(value)) from None


def map_type(value: str, key: str = "type") -> str:
    """``flat`` or ``rate``."""
    if value not in MAP_TYPES:
        raise RuleError(key, "must be 'flat' or 'rate'", value)
    return value


def tenant(value: str | None) -> str | None:
    """A tenant (scope) id: None for a global rule, else a non-empty string of up to 255 characters."""
    if value is None:
        return None
    if not value.strip() or len(value) > 255:
        raise RuleError("tenant_id", "must be a non-empty string of at most 255 characters", value)
    return value


def parents(conn: Connection, service_ref: str | None, field_ref: str | None) -> tuple[int | None, int | None]:
    """The (service pk, field pk) of a new rule: exactly one of them (CloudKitty's "one parent")."""
    if service_ref is not None and field_ref is not None:
        raise RuleError("field_id", "give a service_id or a field_id, not both (you can only specify one parent)",
                        field_ref)
    if service_ref is None and field_ref is None:
        raise RuleError("service_id", "give a service_id or a field_id (you must specify one parent)")
    if service_ref is not None:
        service = _service(conn, service_ref)
        return _pk(conn, HashMapService, HashMapService.service_id, service["service_id"]), None
    assert field_ref is not None
    _field(conn, field_ref)
    return None, _pk(conn, HashMapField, HashMapField.field_id, field_ref)


def group_pk(conn: Connection, ref: str | None) -> int | None:
    """The pk of the group named by uuid or name (None: ungrouped)."""
    if ref is None:
        return None
    return _pk(conn, HashMapGroup, HashMapGroup.group_id, _group(conn, ref)["group_id"])


def rule_rows(conn: Connection, model: type[HashMapMapping] | type[HashMapThreshold],
              where: list[Any]) -> list[dict[str, Any]]:
    """Mappings or thresholds with the uuids and names of their parents and group, in DB order.

    Each row shows uuids under CloudKitty's keys (``service_id``, ``field_id``, ``group_id``), the
    names beside them, ``type`` for ``map_type``; ``raw`` holds the stored columns themselves.
    """
    own = sa.orm.aliased(HashMapService)
    via_field = sa.orm.aliased(HashMapService)
    query = (
        sa.select(model.__table__, HashMapField.field_id.label("field_uuid"), HashMapField.name.label("field_name"),
                  sa.func.coalesce(own.service_id, via_field.service_id).label("service_uuid"),
                  sa.func.coalesce(own.name, via_field.name).label("service_name"),
                  HashMapGroup.group_id.label("group_uuid"), HashMapGroup.name.label("group_name"))
        .outerjoin(HashMapField, model.field_id == HashMapField.id)
        .outerjoin(own, model.service_id == own.id)
        .outerjoin(via_field, HashMapField.service_id == via_field.id)
        .outerjoin(HashMapGroup, model.group_id == HashMapGroup.id)
        .where(*where).order_by(model.id)
    )
    hidden = {"id", "service_id", "field_id", "group_id", "map_type"}
    rows = []
    for row in conn.execute(query):
        values = row._mapping
        raw = {c.name: values[c.name] for c in model.__table__.columns}
        rows.append({
            **{k: v for k, v in raw.items() if k not in hidden}, "type": raw["map_type"],
            "service_id": values["service_uuid"], "field_id": values["field_uuid"], "group_id": values["group_uuid"],
            "service": values["service_name"], "field": values["field_name"], "group": values["group_name"],
            "raw": raw,
        })
    return rows


def now_utc(now: datetime | None) -> datetime:
    """``now`` (aware) or the current instant."""
    return now if now is not None else datetime.now(UTC)


@contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """A connection whose driver errors are connector errors."""
    with database_errors(engine, "reading the hashmap rules"), engine.connect() as conn:
        yield conn


@contextmanager
def writing(engine: Engine, doing: str) -> Iterator[Connection]:
    """A write transaction whose driver errors are connector errors naming ``doing``.

    A unique constraint the checks above could not see (a concurrent writer on PostgreSQL got
    there first) is a ``RuleError`` too, not a traceback.
    """
    try:
        with database_errors(engine, doing), write_transaction(engine) as conn:
            yield conn
    except sa_exc.IntegrityError as err:
        reason = str(err.orig).strip().splitlines()[0] if str(err.orig).strip() else type(err.orig).__name__
        raise RuleError("request", f"{doing}: refused by the database (a concurrent change?): {reason}") from None
