"""CloudKitty hashmap, state, schedule and module tables; ratebeam scripts and scope leases

Revision ID: 0001
Revises: (none)

Works on an empty database and on an existing CloudKitty 25.0.0 one: each table is created only
when it is missing, with CloudKitty's columns, types and constraint names.  A table that exists is
never altered: CloudKitty's own code reads and migrates its tables, and a column or constraint it
does not expect breaks it (a NULL ``last_processed_timestamp`` fails its ``GET /v2/scope``).  Only
a state table this revision creates gets ratebeam's extras: the ``lease_owner`` /
``lease_expires_at`` columns (moved to ``ratebeam_scope_leases`` by 0003) and a nullable
``last_processed_timestamp`` (a never-rated scope that was deactivated).  Earlier versions of this
revision also added them to a CloudKitty-made table (rebuilding it on SQLite); 0003 drops the
lease columns wherever they are.  A database made by the hand-written migrations at version 1 or
more is stamped with this revision instead (``migrations.py``).

Money columns are ``NUMERIC(p, s)``, but TEXT on SQLite, which would store a NUMERIC as a float
(see ``ExactDecimal`` in ``models.py``); datetimes are naive UTC ``DATETIME``, as CloudKitty's.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

COST = sa.Numeric(40, 28).with_variant(sa.Text(), "sqlite")
LEVEL = sa.Numeric(20, 8).with_variant(sa.Text(), "sqlite")
STATES = "cloudkitty_storage_states"


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), nullable=False)


def _pk(table: str, column: str = "id") -> sa.PrimaryKeyConstraint:
    return sa.PrimaryKeyConstraint(column, name=op.f(f"pk_{table}"))


def _unique(table: str, column: str) -> sa.UniqueConstraint:
    return sa.UniqueConstraint(column, name=op.f(f"uq_{table}_{column}"))


def _fk(table: str, column: str, parent: str, ondelete: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{parent}.id"], name=op.f(f"fk_{table}_{column}_{parent}"), ondelete=ondelete
    )


def _uuid_and_name(table: str, uuid: str) -> list[sa.schema.SchemaItem]:
    """A hashmap service or group: an id, a unique UUID and a unique name."""
    return [
        _id(),
        sa.Column(uuid, sa.String(36), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        _pk(table),
        _unique(table, uuid),
        _unique(table, "name"),
    ]


def _parents() -> list[sa.Column]:
    """A mapping's or threshold's service, field, group and tenant."""
    return [
        sa.Column("service_id", sa.Integer(), nullable=True),
        sa.Column("field_id", sa.Integer(), nullable=True),
        sa.Column("group_id", sa.Integer(), nullable=True),
        sa.Column("tenant_id", sa.String(255), nullable=True),
    ]


def _parent_keys(table: str) -> list[sa.ForeignKeyConstraint]:
    """The keys of :func:`_parents`: deleting a service or field cascades, deleting a group detaches."""
    return [
        _fk(table, "service_id", "hashmap_services", "CASCADE"),
        _fk(table, "field_id", "hashmap_fields", "CASCADE"),
        _fk(table, "group_id", "hashmap_groups", "SET NULL"),
    ]


def _map_type(enum: str) -> sa.Column:
    """CloudKitty's flat/rate enum: a native type on PostgreSQL, VARCHAR(4) elsewhere."""
    return sa.Column("map_type", sa.Enum("flat", "rate", name=enum), nullable=False)


def _map_type_check(table: str, enum: str) -> sa.CheckConstraint:
    """The CHECK that keeps :func:`_map_type` to flat/rate where the enum is not native (SQLite)."""
    return sa.CheckConstraint("map_type IN ('flat', 'rate')", name=op.f(f"ck_{table}_{enum}")).ddl_if(
        dialect="sqlite"
    )


def _lease_columns() -> list[sa.Column]:
    return [
        sa.Column("lease_owner", sa.String(255), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
    ]


def _tables() -> dict[str, list[sa.schema.SchemaItem]]:
    """Every table of this revision, in creation order (parents before children)."""
    return {
        "hashmap_services": _uuid_and_name("hashmap_services", "service_id"),
        "hashmap_fields": [
            _id(),
            sa.Column("field_id", sa.String(36), nullable=False),
            sa.Column("name", sa.String(255), nullable=False),
            sa.Column("service_id", sa.Integer(), nullable=False),
            _pk("hashmap_fields"),
            sa.UniqueConstraint("service_id", "name", name=op.f("uniq_field_per_service")),
            _unique("hashmap_fields", "field_id"),
            _fk("hashmap_fields", "service_id", "hashmap_services", "CASCADE"),
        ],
        "hashmap_groups": _uuid_and_name("hashmap_groups", "group_id"),
        # No unique constraint on (value, parent, tenant): CloudKitty's 8a591f85865f dropped them.
        "hashmap_mappings": [
            _id(),
            sa.Column("mapping_id", sa.String(36), nullable=False),
            sa.Column("value", sa.String(255), nullable=True),
            sa.Column("cost", COST, nullable=False),
            _map_type("enum_map_type"),
            *_parents(),
            sa.Column("created_at", sa.DateTime(), nullable=False),
            sa.Column("start", sa.DateTime(), nullable=False),
            sa.Column("end", sa.DateTime(), nullable=True),
            sa.Column("name", sa.String(32), nullable=False),
            sa.Column("description", sa.String(256), nullable=True),
            sa.Column("deleted", sa.DateTime(), nullable=True),
            sa.Column("created_by", sa.String(32), nullable=False),
            sa.Column("updated_by", sa.String(32), nullable=True),
            sa.Column("deleted_by", sa.String(32), nullable=True),
            _pk("hashmap_mappings"),
            _unique("hashmap_mappings", "mapping_id"),
            _map_type_check("hashmap_mappings", "enum_map_type"),
            *_parent_keys("hashmap_mappings"),
        ],
        "hashmap_thresholds": [
            _id(),
            sa.Column("threshold_id", sa.String(36), nullable=False),
            sa.Column("level", LEVEL, nullable=True),
            sa.Column("cost", COST, nullable=False),
            _map_type("enum_hashmap_type"),
            *_parents(),
            _pk("hashmap_thresholds"),
            sa.UniqueConstraint("level", "field_id", "tenant_id", name=op.f("uniq_field_threshold")),
            sa.UniqueConstraint("level", "service_id", "tenant_id", name=op.f("uniq_service_threshold")),
            _unique("hashmap_thresholds", "threshold_id"),
            _map_type_check("hashmap_thresholds", "enum_hashmap_type"),
            *_parent_keys("hashmap_thresholds"),
        ],
        STATES: [
            _id(),
            sa.Column("identifier", sa.String(256), nullable=False),
            sa.Column("scope_key", sa.String(40), nullable=True),
            sa.Column("fetcher", sa.String(40), nullable=True),
            sa.Column("collector", sa.String(40), nullable=True),
            sa.Column("last_processed_timestamp", sa.DateTime(), nullable=True),
            sa.Column("scope_activation_toggle_date", sa.DateTime(), nullable=False,
                      server_default=sa.func.now()),
            sa.Column("active", sa.Boolean(), nullable=False),
            *_lease_columns(),
            _pk(STATES),
            sa.UniqueConstraint("identifier", "scope_key", "collector", "fetcher",
                                name=op.f("uq_cloudkitty_storage_states_identifier")),
        ],
        "storage_scope_reprocessing_schedule": [
            _id(),
            sa.Column("reason", sa.Text(), nullable=False),
            sa.Column("identifier", sa.String(256), nullable=False),
            sa.Column("start_reprocess_time", sa.DateTime(), nullable=False),
            sa.Column("end_reprocess_time", sa.DateTime(), nullable=False),
            sa.Column("current_reprocess_time", sa.DateTime(), nullable=True),
            _pk("storage_scope_reprocessing_schedule"),
        ],
        "modules_state": [
            sa.Column("name", sa.String(255), nullable=False),
            sa.Column("state", sa.Boolean(), nullable=False),
            sa.Column("priority", sa.Integer(), nullable=True),
            _pk("modules_state", "name"),
        ],
        "ratebeam_scripts": [
            _id(),
            sa.Column("script_id", sa.String(36), nullable=False),
            sa.Column("name", sa.String(255), nullable=False),
            sa.Column("data", sa.Text(), nullable=False),
            sa.Column("start", sa.DateTime(), nullable=False),
            sa.Column("end", sa.DateTime(), nullable=True),
            sa.Column("deleted", sa.DateTime(), nullable=True),
            sa.Column("created_at", sa.DateTime(), nullable=False),
            _pk("ratebeam_scripts"),
            _unique("ratebeam_scripts", "script_id"),
            _unique("ratebeam_scripts", "name"),
        ],
    }


def upgrade() -> None:
    """Create the missing tables; leave every existing one (CloudKitty's) exactly as it is."""
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    for name, elements in _tables().items():
        if name not in existing:
            op.create_table(name, *elements)
