"""Schema, column types, migrations and engine behaviour of the SQL layer, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
import sqlalchemy as sa
from cloudkitty_tables import cloudkitty_metadata
from sqlalchemy import exc as sa_exc

from ratebeam.connectors.errors import FatalConnectorError
from ratebeam.connectors.sql.migrations import (
    REVISIONS,
    SCHEMA_VERSION,
    VERSION_TABLE,
    check_schema,
    current_version,
    make_engine,
    upgrade,
)
from ratebeam.connectors.sql.models import (
    HashMapMapping,
    HashMapService,
    HashMapThreshold,
    Script,
    StorageState,
)
from ratebeam.connectors.sql.rules_repository import load_rules
from ratebeam.connectors.sql.state_store import StateStore

NOW = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)

# CloudKitty 25.0.0's columns (its models and alembic migrations), which ratebeam must keep.
CLOUDKITTY_COLUMNS = {
    "hashmap_services": {"id", "service_id", "name"},
    "hashmap_fields": {"id", "field_id", "name", "service_id"},
    "hashmap_groups": {"id", "group_id", "name"},
    "hashmap_mappings": {"id", "mapping_id", "value", "cost", "map_type", "service_id", "field_id", "group_id",
                         "tenant_id", "created_at", "start", "end", "name", "description", "deleted",
                         "created_by", "updated_by", "deleted_by"},
    "hashmap_thresholds": {"id", "threshold_id", "level", "cost", "map_type", "service_id", "field_id",
                           "group_id", "tenant_id"},
    "cloudkitty_storage_states": {"id", "identifier", "scope_key", "fetcher", "collector",
                                  "last_processed_timestamp", "scope_activation_toggle_date", "active"},
    "storage_scope_reprocessing_schedule": {"id", "reason", "identifier", "start_reprocess_time",
                                            "end_reprocess_time", "current_reprocess_time"},
    "modules_state": {"name", "state", "priority"},
}


def _insert_service(conn, name: str = "cpu") -> int:
    return conn.execute(
        sa.insert(HashMapService).values(service_id=f"{name:0>36}"[:36], name=name).returning(HashMapService.id)
    ).scalar_one()


def _mapping_values(service_id: int, cost) -> dict:
    return {"mapping_id": "m" * 36, "cost": cost, "map_type": "flat", "service_id": service_id,
            "created_at": NOW, "start": NOW, "name": "n", "created_by": "test"}


def test_tables_have_cloudkitty_names_columns_and_constraints(engine):
    inspector = sa.inspect(engine)
    for table, columns in CLOUDKITTY_COLUMNS.items():
        assert columns <= {c["name"] for c in inspector.get_columns(table)}, table
    # leases live in ratebeam's own table, not in CloudKitty's state rows
    assert not {"lease_owner", "lease_expires_at"} & {c["name"] for c in inspector.get_columns("cloudkitty_storage_states")}
    assert {"owner", "heartbeat_at", "expires_at"} <= {c["name"] for c in inspector.get_columns("ratebeam_scope_leases")}
    uniques = {u["name"]: u["column_names"] for u in inspector.get_unique_constraints("hashmap_thresholds")}
    assert sorted(uniques["uniq_field_threshold"]) == ["field_id", "level", "tenant_id"]
    assert sorted(uniques["uniq_service_threshold"]) == ["level", "service_id", "tenant_id"]
    state_uniques = {u["name"]: sorted(u["column_names"])
                     for u in inspector.get_unique_constraints("cloudkitty_storage_states")}
    assert state_uniques["uq_cloudkitty_storage_states_identifier"] == [
        "collector", "fetcher", "identifier", "scope_key"]
    # mapping uniqueness is the application's job since CloudKitty's migration 8a591f85865f
    assert not [u for u in inspector.get_unique_constraints("hashmap_mappings") if "value" in u["column_names"]]
    assert {c["name"] for c in inspector.get_columns("ratebeam_scripts")} >= {
        "name", "data", "start", "end", "deleted", "created_at"}


def test_uuid_columns_are_36_characters(engine):
    inspector = sa.inspect(engine)
    for table, column in [("hashmap_services", "service_id"), ("hashmap_fields", "field_id"),
                          ("hashmap_groups", "group_id"), ("hashmap_mappings", "mapping_id"),
                          ("hashmap_thresholds", "threshold_id")]:
        [info] = [c for c in inspector.get_columns(table) if c["name"] == column]
        assert info["type"].length == 36 and not info["nullable"], (table, column)


def test_decimal_point_one_reads_back_exactly(engine):
    with engine.begin() as conn:
        service = _insert_service(conn)
        conn.execute(sa.insert(HashMapMapping).values(**_mapping_values(service, Decimal("0.1"))))
    with engine.connect() as conn:
        cost = conn.execute(sa.select(HashMapMapping.cost)).scalar_one()
        if engine.dialect.name == "sqlite":  # stored as text, never as a REAL
            assert conn.exec_driver_sql("SELECT typeof(cost) FROM hashmap_mappings").scalar_one() == "text"
    assert type(cost) is Decimal
    assert cost == Decimal("0.1")
    assert str(cost) == "0.1"
    assert cost != Decimal(0.1)  # the float's binary expansion


def test_decimal_is_rounded_to_the_column_scale_like_numeric(engine):
    long_cost = Decimal("1." + "0" * 27 + "15")  # 29 decimals: rounds half away from zero at 28
    with engine.begin() as conn:
        service = _insert_service(conn)
        conn.execute(sa.insert(HashMapMapping).values(**_mapping_values(service, long_cost)))
        conn.execute(sa.insert(HashMapThreshold).values(
            threshold_id="t" * 36, level=Decimal("2.123456785"), cost=Decimal("-3"), map_type="rate",
            service_id=service))
    with engine.connect() as conn:
        assert conn.execute(sa.select(HashMapMapping.cost)).scalar_one() == Decimal("1." + "0" * 27 + "2")
        level, cost = conn.execute(sa.select(HashMapThreshold.level, HashMapThreshold.cost)).one()
    assert level == Decimal("2.12345679")
    assert cost == Decimal("-3") and str(cost) == "-3"


@pytest.mark.parametrize("bad", [0.1, Decimal("NaN"), Decimal("1E+13")])
def test_decimal_column_refuses_floats_nans_and_overflow(engine, bad):
    with pytest.raises(sa_exc.StatementError) as info, engine.begin() as conn:
        service = _insert_service(conn)
        conn.execute(sa.insert(HashMapMapping).values(**_mapping_values(service, bad)))
    assert isinstance(info.value.orig, TypeError | ValueError)


def test_datetimes_are_aware_in_python_and_naive_utc_in_the_database(engine):
    paris = datetime(2026, 3, 1, 10, 30, tzinfo=timezone(timedelta(hours=2)))
    with engine.begin() as conn:
        conn.execute(sa.insert(Script).values(script_id="s" * 36, name="s", data="{}", start=paris,
                                              created_at=NOW))
    with engine.connect() as conn:
        start = conn.execute(sa.select(Script.start)).scalar_one()
        raw = conn.execute(sa.text("SELECT start FROM ratebeam_scripts")).scalar_one()
    assert start == paris and start.tzinfo is UTC and start.hour == 8
    raw = datetime.fromisoformat(raw) if isinstance(raw, str) else raw
    assert raw == datetime(2026, 3, 1, 8, 30)  # noqa: DTZ001 (naive UTC, as CloudKitty stores it)


def test_naive_datetimes_are_refused(engine):
    with pytest.raises(sa_exc.StatementError, match="naive datetime"), engine.begin() as conn:
        conn.execute(sa.insert(Script).values(script_id="s" * 36, name="s", data="{}",
                                              start=datetime(2026, 1, 1), created_at=NOW))  # noqa: DTZ001


def test_upgrade_is_idempotent_and_recorded(empty_engine):
    assert current_version(empty_engine) is None
    applied = upgrade(empty_engine)
    assert len(applied) == len(REVISIONS) and applied[0].startswith("0001: ")
    assert upgrade(empty_engine) == []
    assert check_schema(empty_engine) == SCHEMA_VERSION
    with empty_engine.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").scalars().all() == [SCHEMA_VERSION]


def test_concurrent_upgrades_apply_each_step_once(empty_engine):
    results, errors = [], []

    def run() -> None:
        try:
            results.append(upgrade(empty_engine))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(len(r) for r in results) == [0, 0, len(REVISIONS)]


def test_missing_schema_is_a_fatal_error_telling_to_upgrade(empty_engine):
    with pytest.raises(FatalConnectorError, match="ratebeam db upgrade"):
        check_schema(empty_engine)
    with pytest.raises(FatalConnectorError, match="ratebeam db upgrade"):
        load_rules(empty_engine)
    with pytest.raises(FatalConnectorError, match="ratebeam db upgrade"):
        StateStore(empty_engine, "project_id", "source", "file").acquire("p1", "me", 60, NOW)


def test_outdated_schema_is_a_fatal_error(engine):
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM {VERSION_TABLE}")
    with pytest.raises(FatalConnectorError, match="ratebeam db upgrade"):
        check_schema(engine)


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://postgres@127.0.0.1:1/ratebeam?connect_timeout=2",
    "sqlite:////nonexistent-dir/ratebeam.db",
])
def test_unreachable_database_is_a_fatal_error(url):
    engine = make_engine(url)
    with pytest.raises(FatalConnectorError, match="cannot reach the database"):
        check_schema(engine)


def test_unsupported_url_is_a_fatal_error():
    with pytest.raises(FatalConnectorError, match="unsupported database"):
        make_engine("mysql://localhost/x")


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() >= 5000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1


def test_upgrade_keeps_an_existing_cloudkitty_state_table(empty_engine):
    """A CloudKitty database: NOT NULL timestamp, no lease columns, rows to keep."""
    legacy = cloudkitty_metadata().tables["cloudkitty_storage_states"]
    with empty_engine.begin() as conn:
        legacy.create(conn)
        conn.execute(sa.insert(legacy).values(
            identifier="p1", scope_key="project_id", fetcher="keystone", collector="gnocchi",
            last_processed_timestamp=datetime(2026, 1, 1, 5), active=True))  # noqa: DTZ001 (CloudKitty: naive)
    upgrade(empty_engine)
    columns = {c["name"]: c for c in sa.inspect(empty_engine).get_columns("cloudkitty_storage_states")}
    assert not {"lease_owner", "lease_expires_at"} & set(columns)
    assert not columns["last_processed_timestamp"]["nullable"]  # CloudKitty's schema is kept as it is
    store = StateStore(empty_engine, "project_id", "keystone", "gnocchi")
    lease = store.acquire("p1", "me", 60, NOW)
    assert lease is not None and lease.last_processed == datetime(2026, 1, 1, 5, tzinfo=UTC)
    assert store.acquire("p2", "me", 60, NOW).last_processed is None
    with empty_engine.connect() as conn:  # a lease adds no state row CloudKitty would have to read
        assert conn.execute(sa.select(sa.func.count()).select_from(StorageState)).scalar_one() == 1


def test_a_missing_server_skips_locally_and_fails_under_ci(monkeypatch):
    from servers import unavailable

    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no server"):
        unavailable("no server")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no server"):
        unavailable("no server")
