"""Alembic migrations of the ratebeam schema, on SQLite and PostgreSQL.

The head revision must build exactly the models' schema (the test that keeps models and
migrations from drifting apart), from every starting point ratebeam meets: an empty database, a
CloudKitty database (its tables and its own version tables, which ratebeam never touches), a
database made by the hand-written migrations of earlier ratebeams, and two upgrades at once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from cloudkitty_tables import VERSIONS, cloudkitty_metadata
from servers import cloudkitty_python
from servers.cloudkitty_api import cloudkitty_database
from sqlalchemy.schema import CreateTable

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
from ratebeam.connectors.sql.models import Base, Script
from ratebeam.connectors.sql.state_store import StateStore

NOW = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
LEGACY_TABLE = "ratebeam_schema_version"


def _drift(engine: sa.Engine, *, model_tables_only: bool = False) -> list:
    """What Alembic's autogenerate would change to make the database match the models ([] = none)."""

    def include_name(name, type_, _parent) -> bool:
        return not model_tables_only or type_ != "table" or name in Base.metadata.tables

    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={
            "version_table": VERSION_TABLE, "compare_type": True, "compare_server_default": True,
            "include_name": include_name})
        return compare_metadata(context, Base.metadata)


def _version_rows(engine: sa.Engine, table: str) -> list[str]:
    with engine.connect() as conn:
        return conn.exec_driver_sql(f"SELECT version_num FROM {table}").scalars().all()


def test_head_builds_exactly_the_models_schema(empty_engine):
    upgrade(empty_engine)
    assert _drift(empty_engine) == []
    # What autogenerate does not compare: primary key names and CHECK constraints (SQLite's enums).
    with empty_engine.connect() as conn:
        inspector = sa.inspect(conn)
        for table in Base.metadata.sorted_tables:
            assert inspector.get_pk_constraint(table.name)["name"] == table.primary_key.name, table.name
            model_checks = re.findall(r"CONSTRAINT (\w+) CHECK", str(CreateTable(table).compile(dialect=conn.dialect)))
            assert sorted(c["name"] for c in inspector.get_check_constraints(table.name)) == sorted(model_checks)


def test_upgrade_of_an_empty_database_applies_every_revision_once(empty_engine):
    assert current_version(empty_engine) is None
    assert [step.split(":")[0] for step in upgrade(empty_engine)] == list(REVISIONS)
    assert upgrade(empty_engine) == []
    assert _version_rows(empty_engine, VERSION_TABLE) == [SCHEMA_VERSION]
    assert not sa.inspect(empty_engine).has_table("alembic_version")  # Alembic's default: left to others


def _make_cloudkitty_database(engine: sa.Engine) -> None:
    """CloudKitty's tables (some of them), its version tables, and a row in each table."""
    metadata = cloudkitty_metadata()
    naive = datetime(2026, 1, 1, 5)  # noqa: DTZ001 (CloudKitty stores naive UTC)
    with engine.begin() as conn:
        metadata.create_all(conn)
        for name, revision in VERSIONS.items():
            conn.execute(sa.insert(metadata.tables[name]).values(version_num=revision))
        conn.execute(sa.insert(metadata.tables["states"]).values(name="x", state=1))
        conn.execute(sa.insert(metadata.tables["modules_state"]).values(name="hashmap", state=True, priority=3))
        conn.execute(sa.insert(metadata.tables["hashmap_services"]).values(service_id="s" * 36, name="cpu"))
        conn.execute(sa.insert(metadata.tables["cloudkitty_storage_states"]).values(
            identifier="p1", scope_key="project_id", fetcher="keystone", collector="gnocchi",
            last_processed_timestamp=naive, active=True))
        conn.execute(sa.insert(metadata.tables["storage_scope_reprocessing_schedule"]).values(
            identifier="p1", start_reprocess_time=naive, end_reprocess_time=naive, reason="r"))


def _cloudkitty_timestamp_not_null(diff) -> bool:
    """CloudKitty's ``last_processed_timestamp`` NOT NULL, which ratebeam keeps (the model allows NULL)."""
    return isinstance(diff, list) and len(diff) == 1 and diff[0][0] == "modify_nullable" \
        and diff[0][2:4] == ("cloudkitty_storage_states", "last_processed_timestamp") and diff[0][5:] == (False, True)


def _assert_cloudkitty_kept(engine: sa.Engine, versions: dict[str, str],
                            own_types: frozenset[str] = frozenset()) -> None:
    """CloudKitty's version rows and state kept; the tables match the models but for CloudKitty's NOT
    NULL timestamp and the ``own_types`` tables (CloudKitty's own column types, read as they are)."""
    for table, revision in versions.items():
        assert _version_rows(engine, table) == [revision], table
    lease = StateStore(engine, "project_id", "keystone", "gnocchi").acquire("p1", "me", 60, NOW)
    assert lease is not None and lease.last_processed == datetime(2026, 1, 1, 5, tzinfo=UTC)
    # The one difference from the models is CloudKitty's own NOT NULL, which ratebeam leaves in place.
    drift = [d for d in _drift(engine, model_tables_only=True)
             if not (isinstance(d, list) and d[0][0].startswith("modify_") and d[0][2] in own_types)]
    assert [d for d in drift if not _cloudkitty_timestamp_not_null(d)] == []
    states = {c["name"]: c for c in sa.inspect(engine).get_columns("cloudkitty_storage_states")}
    assert states["last_processed_timestamp"]["nullable"] is False and "lease_owner" not in states


def test_upgrade_of_a_cloudkitty_database_adds_only_what_is_missing(empty_engine):
    _make_cloudkitty_database(empty_engine)
    cloudkitty_tables = set(cloudkitty_metadata().tables)
    before = _schema(empty_engine, cloudkitty_tables)
    assert [step.split(":")[0] for step in upgrade(empty_engine)] == list(REVISIONS)
    assert _schema(empty_engine, cloudkitty_tables) == before
    assert upgrade(empty_engine) == []
    _assert_cloudkitty_kept(empty_engine, VERSIONS)
    with empty_engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT name, state FROM states").all() == [("x", 1)]
        assert conn.exec_driver_sql("SELECT priority FROM modules_state").scalar_one() == 3
        assert conn.exec_driver_sql("SELECT name FROM hashmap_services").scalar_one() == "cpu"
        assert conn.exec_driver_sql("SELECT reason FROM storage_scope_reprocessing_schedule").scalar_one() == "r"
    assert check_schema(empty_engine) == SCHEMA_VERSION


def _upgrade_to(engine: sa.Engine, revision: str) -> None:
    """The schema of an older ratebeam: every revision up to ``revision``."""
    from alembic import command

    from ratebeam.connectors.sql.migrations import alembic_config

    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), revision)


def _make_legacy_database(engine: sa.Engine, version: int) -> None:
    """The schema the hand-written migrations left at ``version``, with one of their rows per version."""
    _upgrade_to(engine, "0002")
    legacy = sa.Table(LEGACY_TABLE, sa.MetaData(), sa.Column("version", sa.Integer, primary_key=True),
                      sa.Column("description", sa.String(255), nullable=False),
                      sa.Column("applied_at", sa.DateTime, nullable=False))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")
        if version < 2:
            conn.exec_driver_sql("DROP TABLE ratebeam_dead_letters")
        legacy.create(conn)
        for number in range(1, version + 1):
            conn.execute(sa.insert(legacy).values(version=number, description=f"step {number}",
                                                  applied_at=datetime(2026, 1, number)))  # noqa: DTZ001
        conn.execute(sa.insert(Script).values(script_id="s" * 36, name="kept", data="{}", start=NOW,
                                              created_at=NOW))


@pytest.mark.parametrize(("version", "runs"), [(2, ["0003", "0004", "0005", "0006", "0007", "0008", "0009", "0010"]),
                                                 (1, ["0002", "0003", "0004", "0005", "0006", "0007",
                                                      "0008", "0009", "0010"])])
def test_a_legacy_database_is_stamped_without_running_its_ddl(empty_engine, version, runs):
    _make_legacy_database(empty_engine, version)
    with pytest.raises(FatalConnectorError, match="before ratebeam used Alembic.*ratebeam db upgrade"):
        check_schema(empty_engine)
    # Revision 0002 creates its table unconditionally: running it on a version-2 database would fail.
    assert [step.split(":")[0] for step in upgrade(empty_engine)] == runs
    assert upgrade(empty_engine) == []
    assert check_schema(empty_engine) == SCHEMA_VERSION
    assert not sa.inspect(empty_engine).has_table(LEGACY_TABLE)
    assert _drift(empty_engine) == []
    with empty_engine.connect() as conn:
        assert conn.execute(sa.select(Script.name)).scalar_one() == "kept"


def test_a_legacy_version_no_ratebeam_wrote_is_refused_and_nothing_changes(empty_engine):
    _make_legacy_database(empty_engine, 2)
    with empty_engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO {LEGACY_TABLE} VALUES (3, 'x', '2026-01-03 00:00:00')")
    with pytest.raises(FatalConnectorError, match=f"{LEGACY_TABLE} .* records version 3"):
        upgrade(empty_engine)
    inspector = sa.inspect(empty_engine)
    assert inspector.has_table(LEGACY_TABLE) and not inspector.has_table(VERSION_TABLE)


def test_a_schema_behind_this_ratebeam_asks_to_upgrade(empty_engine):
    _upgrade_to(empty_engine, "0001")
    with pytest.raises(FatalConnectorError, match="at revision 0001, this ratebeam needs 0010: run `ratebeam db"):
        check_schema(empty_engine)
    assert upgrade(empty_engine) == ["0002: ratebeam dead letters", "0003: scope leases in ratebeam's own table",
                                     "0004: ratebeam backfills",
                                     "0005: dead letters per frame; points per rated cell",
                                     "0006: ratebeam run tallies",
                                     "0007: event stream inbox, stored frames, message dead letters",
                                     "0008: event stream discrepancies", "0009: event inbox scope",
                                     "0010: event stream consumers"]
    assert check_schema(empty_engine) == SCHEMA_VERSION


def test_0003_moves_leases_out_of_cloudkitty_rows_and_keeps_every_readable_row(empty_engine):
    """The rows an older ratebeam left: a rated scope (kept), a lease-only row of a never-rated
    active scope (deleted: no row means the same), a deactivated never-rated scope (kept)."""
    _upgrade_to(empty_engine, "0002")
    with empty_engine.begin() as conn:
        for scope, last, active, owner in (("rated", "2026-01-01 05:00:00", True, "old-run"),
                                           ("lease-only", None, True, "old-run"),
                                           ("off", None, False, None)):
            conn.execute(sa.text(
                "INSERT INTO cloudkitty_storage_states (identifier, scope_key, fetcher, collector, "
                "last_processed_timestamp, scope_activation_toggle_date, active, lease_owner) "
                "VALUES (:s, 'project_id', 'keystone', 'gnocchi', :last, '2026-01-01 00:00:00', :active, :owner)"),
                {"s": scope, "last": last, "active": active, "owner": owner})
    assert upgrade(empty_engine) == ["0003: scope leases in ratebeam's own table", "0004: ratebeam backfills",
                                     "0005: dead letters per frame; points per rated cell",
                                     "0006: ratebeam run tallies",
                                     "0007: event stream inbox, stored frames, message dead letters",
                                     "0008: event stream discrepancies", "0009: event inbox scope",
                                     "0010: event stream consumers"]
    assert _drift(empty_engine) == []
    store = StateStore(empty_engine, "project_id", "keystone", "gnocchi")
    assert [(s.scope, s.last_processed, s.active) for s in store.list_states()] == [
        ("off", None, False), ("rated", datetime(2026, 1, 1, 5, tzinfo=UTC), True)]
    assert store.leases() == []  # the old run's lease is gone with its column


def test_a_revision_from_a_newer_ratebeam_is_refused(engine):
    with engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    for call in (check_schema, upgrade):
        with pytest.raises(FatalConnectorError, match="revision 9999, unknown to this ratebeam.*upgrade ratebeam"):
            call(engine)
    assert _version_rows(engine, VERSION_TABLE) == ["9999"]


_UPGRADE_WHEN_TOLD = """
import json, sys
from ratebeam.connectors.sql.migrations import make_engine, upgrade
engine = make_engine(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps(upgrade(engine)))
"""


def test_two_processes_upgrading_at_once_apply_each_revision_once(db_url, empty_engine):
    processes = [subprocess.Popen([sys.executable, "-c", _UPGRADE_WHEN_TOLD, db_url], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for process in processes:  # both imported and connected: start them together
        assert process.stdout.readline() == "ready\n"
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()
    outputs = [process.communicate(timeout=120) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], [err for _, err in outputs]
    applied = sorted((json.loads(out) for out, _ in outputs), key=len)
    assert applied[0] == [] and [step.split(":")[0] for step in applied[1]] == list(REVISIONS)
    assert _version_rows(empty_engine, VERSION_TABLE) == [SCHEMA_VERSION]


def _schema(engine: sa.Engine, tables: set[str]) -> dict[str, dict]:
    """Everything the inspector reports about ``tables``, and on SQLite the stored DDL itself."""
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        ddl = dict(conn.exec_driver_sql("SELECT name, sql FROM sqlite_master").all()) \
            if conn.dialect.name == "sqlite" else {}
        return {table: {
            "columns": [{**c, "type": str(c["type"])} for c in inspector.get_columns(table)],
            "pk": inspector.get_pk_constraint(table),
            "fks": inspector.get_foreign_keys(table),
            "uniques": sorted(inspector.get_unique_constraints(table), key=str),
            "indexes": sorted(inspector.get_indexes(table), key=str),
            "checks": sorted(inspector.get_check_constraints(table), key=str),
            "ddl": ddl.get(table),
        } for table in sorted(tables)}


@pytest.mark.cloudkitty
def test_upgrade_of_a_database_made_by_cloudkitty_itself(db_url):
    """CloudKitty's own migrations (``cloudkitty-dbsync upgrade`` and the storage-state tree) build
    the database; ``ratebeam db upgrade`` then changes none of its tables, only adds ratebeam's."""
    python = cloudkitty_python()
    url, env = cloudkitty_database(db_url)
    done = subprocess.run([python, Path(__file__).parent / "cloudkitty" / "ck_dbsync.py", url], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO cloudkitty_storage_states (identifier, scope_key, fetcher, collector, "
                             "last_processed_timestamp, active) VALUES ('p1', 'project_id', 'keystone', "
                             "'gnocchi', '2026-01-01 05:00:00', true)")
    cloudkitty_tables = set(sa.inspect(engine).get_table_names())
    assert {"modules_state", "cloudkitty_storage_states", "storage_scope_reprocessing_schedule"} <= cloudkitty_tables
    if db_url.startswith("sqlite"):  # CloudKitty's rating-module migrations fail on PostgreSQL (ck_dbsync.py)
        assert {"hashmap_mappings", "pyscripts_scripts"} <= cloudkitty_tables
    before = _schema(engine, cloudkitty_tables)
    versions = {table: _version_rows(engine, table)[0] for table in ("cloudkitty_alembic", "storage_states_alembic")}
    assert [step.split(":")[0] for step in upgrade(engine)] == list(REVISIONS)
    assert _schema(engine, cloudkitty_tables) == before
    added = set(sa.inspect(engine).get_table_names()) - cloudkitty_tables
    assert added - set(Base.metadata.tables) == {VERSION_TABLE}  # ratebeam's own, and missing CloudKitty ones
    # Its hashmap tables keep CloudKitty's NUMERIC money (a float on SQLite) and server defaults.
    _assert_cloudkitty_kept(engine, versions, own_types=frozenset({"hashmap_mappings", "hashmap_thresholds"}))
    engine.dispose()


def test_a_never_rated_scope_cannot_be_deactivated_into_cloudkittys_not_null_table(empty_engine):
    """CloudKitty's table keeps its NOT NULL timestamp: ratebeam refuses clearly, writes no row."""
    _make_cloudkitty_database(empty_engine)
    upgrade(empty_engine)
    store = StateStore(empty_engine, "project_id", "keystone", "gnocchi")
    with pytest.raises(FatalConnectorError, match="scope 'new' was never rated.*state reset new --from"):
        store.set_active("new", False, create=True)
    assert store.get("new") is None


def test_0005_merges_dead_letters_per_frame(empty_engine):
    """A stuck scope left one row per run: 0005 keeps one per frame, with the count and both instants."""
    _upgrade_to(empty_engine, "0004")
    with empty_engine.begin() as conn:
        for run, scope, begin, created in (("r1", "p1", "2026-01-01 05:00:00", "2026-01-02 00:00:00"),
                                           ("r2", "p1", "2026-01-01 05:00:00", "2026-01-03 00:00:00"),
                                           ("r3", "p1", "2026-01-01 05:00:00", "2026-01-04 00:00:00"),
                                           ("r3", "p2", "2026-01-01 05:00:00", "2026-01-04 00:00:00")):
            conn.execute(sa.text(
                "INSERT INTO ratebeam_dead_letters (run_id, scope, period_begin, stage, reason, created_at) "
                "VALUES (:run, :scope, :begin, 'rate', :reason, :created)"),
                {"run": run, "scope": scope, "begin": begin, "reason": f"why {run}", "created": created})
    assert upgrade(empty_engine) == ["0005: dead letters per frame; points per rated cell",
                                     "0006: ratebeam run tallies",
                                     "0007: event stream inbox, stored frames, message dead letters",
                                     "0008: event stream discrepancies", "0009: event inbox scope",
                                     "0010: event stream consumers"]
    assert _drift(empty_engine) == []
    from ratebeam.connectors.sql.models import DeadLetter

    with empty_engine.connect() as conn:
        rows = conn.execute(sa.select(DeadLetter).order_by(DeadLetter.scope)).all()
    assert [(r.scope, r.run_id, r.reason, r.failures, r.created_at.day, r.last_seen_at.day, r.resolved_at)
            for r in rows] == [("p1", "r3", "why r3", 3, 2, 4, None), ("p2", "r3", "why r3", 1, 4, 4, None)]
