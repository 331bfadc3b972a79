"""Hashmap rules, rating scripts and rating-module states, read and written in bulk.

CloudKitty reloads the hashmap per scope and per period with ~250 statements per frame; ratebeam
loads *every* rule of the database once — all tenants, all validity windows — in a handful of
bulk selects (:func:`load_rules`), and the kernel resolves them per (scope, period begin) in
bulk.  :func:`count_statements` lets tests and the benchmark hold that promise.

Order is data here: services, fields, mappings and thresholds come back in DB id order, which is
CloudKitty's load order (a field's position breaks threshold ties; among several rules with the
same key the last loaded wins).  :func:`replace_rules` (``rules_import``, re-exported here) writes
a :class:`RuleSet` in its order, keeping the uuids of unchanged rows, so a round trip gives the
same rule set.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine.interfaces import DBAPICursor, ExecutionContext

from ratebeam.connectors.sql.engine import database_errors, dialect_insert
from ratebeam.connectors.sql.models import (
    HashMapField,
    HashMapGroup,
    HashMapMapping,
    HashMapService,
    HashMapThreshold,
    ModuleState,
    Script,
)
from ratebeam.connectors.sql.rules_import import (
    replace_rules as replace_rules,  # re-exported: callers import it here
)
from ratebeam.transforms.periods import require_aware
from ratebeam.transforms.rules import MappingRule, RuleSet, ThresholdRule

#: ``start`` written for a mapping valid "since always" (as CloudKitty's own migration 8a591f85865f
#: does for old mappings); read back as ``None``.
ALWAYS = datetime(1970, 1, 1, tzinfo=UTC)
#: CloudKitty's rating modules; ``noop`` is always enabled with priority 1 (`cloudkitty/orchestrator.py:257-265`).
CLOUDKITTY_MODULES = ("hashmap", "noop", "pyscripts")
ALWAYS_ENABLED = "noop"


# --- statement counting ----------------------------------------------------------------------------


@dataclass
class StatementCounter:
    """What :func:`count_statements` saw: the number of statements and their SQL text."""

    statements: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        """How many statements were sent."""
        return len(self.statements)


@contextmanager
def count_statements(engine: Engine) -> Iterator[StatementCounter]:
    """Count the statements sent to ``engine``'s database inside the ``with`` block.

    Every cursor execution counts, ``BEGIN`` emitted by ratebeam on SQLite included; an
    ``executemany`` of N rows counts once per batch the driver sends.
    """
    counter = StatementCounter()

    def _count(
        _conn: Connection, _cursor: DBAPICursor, statement: str, _parameters: object,
        _context: ExecutionContext | None, _executemany: bool,
    ) -> None:
        counter.statements.append(statement)

    event.listen(engine, "before_cursor_execute", _count)
    try:
        yield counter
    finally:
        event.remove(engine, "before_cursor_execute", _count)


# --- hashmap rules ---------------------------------------------------------------------------------


def load_rules(engine: Engine) -> RuleSet:
    """Every hashmap rule of the database (soft-deleted mappings excluded), in five selects.

    One consistent snapshot (a repeatable-read transaction); names of services, fields and groups
    are resolved here, so the kernel never sees a database id.  A mapping's ``start`` of 1970-01-01
    or earlier reads as ``None`` (valid since always).
    """
    with database_errors(engine, "loading the hashmap rules"), _snapshot(engine) as conn:
        services = {row.id: row.name for row in conn.execute(
            sa.select(HashMapService.id, HashMapService.name).order_by(HashMapService.id))}
        fields = {row.id: (services[row.service_id], row.name) for row in conn.execute(
            sa.select(HashMapField.id, HashMapField.service_id, HashMapField.name).order_by(HashMapField.id))}
        groups = {row.id: row.name for row in conn.execute(
            sa.select(HashMapGroup.id, HashMapGroup.name).order_by(HashMapGroup.id))}
        mapping_rows = conn.execute(
            sa.select(HashMapMapping.mapping_id, HashMapMapping.service_id, HashMapMapping.field_id,
                      HashMapMapping.group_id, HashMapMapping.value, HashMapMapping.map_type,
                      HashMapMapping.cost, HashMapMapping.tenant_id, HashMapMapping.start,
                      HashMapMapping.end)
            .where(HashMapMapping.deleted.is_(None))
            .order_by(HashMapMapping.id)
        ).all()
        threshold_rows = conn.execute(
            sa.select(HashMapThreshold.threshold_id, HashMapThreshold.service_id, HashMapThreshold.field_id,
                      HashMapThreshold.group_id, HashMapThreshold.level, HashMapThreshold.map_type,
                      HashMapThreshold.cost, HashMapThreshold.tenant_id)
            .order_by(HashMapThreshold.id)
        ).all()
    mappings = []
    for row in mapping_rows:
        service, field_name = _parent(services, fields, "mapping", row.mapping_id, row.service_id, row.field_id)
        mappings.append(MappingRule(
            service=service, field=field_name, value=row.value, type=row.map_type, cost=row.cost,
            group=groups.get(row.group_id), tenant_id=row.tenant_id,
            start=None if row.start <= ALWAYS else row.start, end=row.end, id=row.mapping_id,
        ))
    thresholds = []
    for threshold in threshold_rows:
        service, field_name = _parent(services, fields, "threshold", threshold.threshold_id,
                                      threshold.service_id, threshold.field_id)
        thresholds.append(ThresholdRule(
            service=service, field=field_name, level=threshold.level, type=threshold.map_type,
            cost=threshold.cost, group=groups.get(threshold.group_id), tenant_id=threshold.tenant_id,
            id=threshold.threshold_id,
        ))
    return RuleSet(
        services=tuple(services.values()),
        fields=tuple(fields.values()),
        mappings=tuple(mappings),
        thresholds=tuple(thresholds),
        groups=tuple(groups.values()),
    )


@contextmanager
def _snapshot(engine: Engine) -> Iterator[Connection]:
    """A read transaction that sees one state of the database across several selects."""
    options = {"isolation_level": "REPEATABLE READ"} if engine.dialect.name == "postgresql" else {}
    with engine.connect().execution_options(**options) as conn, conn.begin():
        yield conn


def _parent(services: Mapping[int, str], fields: Mapping[int, tuple[str, str]], what: str, uid: str,
            service_id: int | None, field_id: int | None) -> tuple[str, str | None]:
    """(service name, field name or None) of a mapping or threshold; exactly one parent is set."""
    if (service_id is None) == (field_id is None):
        raise ValueError(f"hashmap {what} {uid}: must have exactly one of service_id, field_id")
    if field_id is not None:
        return fields[field_id]
    assert service_id is not None  # exactly one of the two is set (checked above)
    return services[service_id], None


# --- rating scripts --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredScript:
    """A ratebeam script as stored: ``data`` is its JSON text, valid on ``[start, end)``."""

    name: str
    data: str
    start: datetime
    end: datetime | None

    def is_active(self, at: datetime) -> bool:
        """CloudKitty's validity filter at one instant (the period begin): ``start <= at < end``."""
        return self.start <= at and (self.end is None or at < self.end)


def load_scripts(engine: Engine) -> tuple[StoredScript, ...]:
    """Every script that is not deleted, in DB order (the order they run in), in one select."""
    with database_errors(engine, "loading the rating scripts"), engine.connect() as conn:
        rows = conn.execute(
            sa.select(Script.name, Script.data, Script.start, Script.end)
            .where(Script.deleted.is_(None))
            .order_by(Script.id)
        )
        return tuple(StoredScript(row.name, row.data, row.start, row.end) for row in rows)


def save_script(engine: Engine, name: str, data: str, *, start: datetime | None = None,
                end: datetime | None = None, now: datetime | None = None) -> datetime:
    """Create the script ``name``, or replace its data and window (undeleting it); returns its start.

    Without ``start`` a new script is valid since 1970-01-01, like a rule without one (``ALWAYS``),
    and a replaced script keeps its start: re-adding a script must not silently stop it applying
    to the past.  ``end`` is replaced (open by default).  ``data`` is stored as given; parsing it
    is the scripts module's job.
    """
    if not name or not name.strip():
        raise ValueError("script name: must not be empty")
    created_at = require_aware(now, "now") if now is not None else datetime.now(UTC)
    with database_errors(engine, f"saving script {name!r}"), engine.begin() as conn:
        if start is None:
            start = conn.execute(sa.select(Script.start).where(Script.name == name)).scalar() or ALWAYS
        start = require_aware(start, "start")
        if end is not None and require_aware(end, "end") <= start:
            raise ValueError(f"script {name!r}: end {end.isoformat()} is not after start {start.isoformat()}")
        values = {"script_id": str(uuid.uuid4()), "name": name, "data": data, "start": start, "end": end,
                  "deleted": None, "created_at": created_at}
        conn.execute(_upsert(engine, Script, values, ["name"], ["data", "start", "end", "deleted"]))
    return start


def delete_script(engine: Engine, name: str, *, now: datetime | None = None) -> bool:
    """Soft-delete the script ``name`` (CloudKitty deletes scripts and mappings softly)."""
    deleted = require_aware(now, "now") if now is not None else datetime.now(UTC)
    with database_errors(engine, f"deleting script {name!r}"), engine.begin() as conn:
        result = conn.execute(
            sa.update(Script).where(Script.name == name, Script.deleted.is_(None)).values(deleted=deleted)
        )
        return result.rowcount == 1


# --- rating module states --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModuleInfo:
    """Whether a rating module runs, and its priority: modules run by priority, highest first."""

    name: str
    enabled: bool
    priority: int


def module_states(engine: Engine, names: Iterable[str] = CLOUDKITTY_MODULES) -> dict[str, ModuleInfo]:
    """The state of each module in ``names`` with CloudKitty's defaults (`cloudkitty/orchestrator.py:257-265`), in one select.

    No row means disabled (``noop`` is always enabled, priority 1); a missing or 0 priority reads
    as 1.  Stored rows of modules not in ``names`` are returned too.
    """
    with database_errors(engine, "reading the rating module states"), engine.connect() as conn:
        rows = {row.name: row for row in conn.execute(sa.select(ModuleState))}
    result = {}
    for name in dict.fromkeys([*names, *rows]):
        row = rows.get(name)
        if name == ALWAYS_ENABLED:
            result[name] = ModuleInfo(name, True, 1)
        else:
            result[name] = ModuleInfo(name, bool(row and row.state), (row and row.priority) or 1)
    return result


def set_module_state(engine: Engine, name: str, *, enabled: bool | None = None,
                     priority: int | None = None) -> None:
    """Enable/disable a module and/or set its priority, creating its row as CloudKitty does."""
    if enabled is None and priority is None:
        raise ValueError(f"module {name!r}: nothing to set (give enabled and/or priority)")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ValueError(f"module {name!r}: priority must be an integer, got {priority!r}")
    changes = {key: value for key, value in (("state", enabled), ("priority", priority)) if value is not None}
    values = {"name": name, "state": False, "priority": 1, **changes}
    statement = _upsert(engine, ModuleState, values, ["name"], list(changes))
    with database_errors(engine, f"setting the state of module {name!r}"), engine.begin() as conn:
        conn.execute(statement)


def _upsert(engine: Engine, model: type, values: dict, keys: list[str], update: list[str]) -> sa.Executable:
    """``INSERT ... ON CONFLICT (keys) DO UPDATE`` (SQLite and PostgreSQL)."""
    statement = dialect_insert(engine)(model).values(**values)
    return statement.on_conflict_do_update(
        index_elements=keys, set_={column: statement.excluded[column] for column in update}
    )
