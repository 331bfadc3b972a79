"""SQLAlchemy models: CloudKitty 25.0.0's tables and columns, plus ratebeam's few additions.

Table, column and constraint names are CloudKitty's (its models, its alembic migrations and its
naming convention), so ratebeam can rate from an existing CloudKitty database and CloudKitty can
read what ratebeam writes.  Differences, all additive:

* ``cloudkitty_storage_states.last_processed_timestamp`` is nullable, for one kind of row only: a
  never-rated scope that was deactivated (``state deactivate``).  ratebeam writes a state row
  otherwise only with a timestamp (a commit, a reset), so CloudKitty can read every other row.
* ``ratebeam_scope_leases`` holds the scope leases (owner run, heartbeat, expiry), outside
  CloudKitty's tables (revision 0003 moved them there from two columns of the state table).
* ``ratebeam_scripts`` holds the safe, JSON-described scripts that replace PyScripts' Python.
* ``ratebeam_dead_letters`` keeps the frames runs could not rate or store, and why (one row per frame).
* ``ratebeam_cell_points`` counts the points of every committed (scope, period, type) cell.
* ``ratebeam_run_tallies`` holds the figures a run's graph counted, until its launcher read them.
* ``ratebeam_event_inbox``, ``ratebeam_event_frames`` and ``ratebeam_message_dead_letters`` hold the
  event stream's durable side (``ratebeam events serve``, ``connectors/notifications``): every
  notification received, the frames it stored, the messages it could not read.
* ``ratebeam_event_discrepancies`` keeps what the stream's lifecycles disagree on with Nova's audit
  (``compute.instance.exists``) or lack (a start never seen): ``ratebeam events discrepancies``.

Why one module of ~490 lines: it is the whole schema, so ``Base.metadata`` is complete wherever it is
imported (Alembic's ``env.py``, the migration test that compares it with the revisions).  Split
into modules, a table would be registered only when its module happened to be imported, and a
comparison that missed it would propose dropping it.

Two column types keep the Python side exact and aware while the stored form stays CloudKitty's:

* :class:`ExactDecimal` — ``NUMERIC(p, s)`` on PostgreSQL; TEXT on SQLite, because SQLite would
  store a NUMERIC as a float (0.1 would read back as 0.1000000000000000055…).  Values are
  rounded to the column's scale on the way in, as PostgreSQL does, and read back without the
  scale's trailing zeros, so both databases return the same Decimal (0.1 reads as ``Decimal('0.1')``).
* :class:`UTCDateTime` — a naive ``DATETIME`` holding UTC, as CloudKitty stores it; Python sees
  aware UTC datetimes only (a naive one is refused).
"""

from __future__ import annotations

import decimal
from datetime import UTC, datetime
from decimal import Decimal
from typing import cast

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

#: CloudKitty's constraint naming convention (``cloudkitty/common/db/models.py``).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class ExactDecimal(TypeDecorator[Decimal]):
    """``NUMERIC(precision, scale)`` that reads back exact :class:`Decimal` on every database."""

    impl = sa.Numeric
    cache_ok = True

    def __init__(self, precision: int, scale: int) -> None:
        super().__init__(precision=precision, scale=scale, asdecimal=True)
        self.precision = precision
        self.scale = scale
        self._quantum = Decimal(1).scaleb(-scale)
        self._context = decimal.Context(prec=precision, rounding=decimal.ROUND_HALF_UP)

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine:
        """TEXT on SQLite (its NUMERIC keeps fractions as floats), ``NUMERIC(precision, scale)`` elsewhere."""
        if dialect.name == "sqlite":
            return dialect.type_descriptor(sa.Text())
        return dialect.type_descriptor(sa.Numeric(self.precision, self.scale, asdecimal=True))

    def coerce(self, value: Decimal | int) -> Decimal:
        """The value as stored, rounded to the column's scale as PostgreSQL's NUMERIC rounds.

        Rounding is half away from zero; ``ValueError`` if the value is not finite or does not fit.
        """
        if isinstance(value, bool) or not isinstance(value, Decimal | int):
            raise TypeError(f"expected a Decimal (money is never a float), got {type(value).__name__} {value!r}")
        value = Decimal(value)
        if not value.is_finite():
            raise ValueError(f"not a finite decimal: {value}")
        try:
            return value.quantize(self._quantum, context=self._context)
        except decimal.InvalidOperation as err:
            raise ValueError(
                f"{value} does not fit NUMERIC({self.precision},{self.scale})"
            ) from err

    def process_bind_param(self, value: Decimal | int | None, dialect: Dialect) -> Decimal | str | None:
        """The coerced value; its decimal text on SQLite."""
        if value is None:
            return None
        exact = self.coerce(value)
        return str(exact) if dialect.name == "sqlite" else exact

    def process_result_value(self, value: object, dialect: Dialect) -> Decimal | None:
        """The stored value as an exact ``Decimal``, trailing zeros of the scale dropped."""
        if value is None:
            return None
        # A CloudKitty-created SQLite file holds REAL/INTEGER here: str() keeps the shortest repr.
        stored = self.coerce(value if isinstance(value, Decimal) else Decimal(str(value)))
        # Drop the scale's trailing zeros (same value; 0.1 reads back as Decimal('0.1'), not with
        # 28 decimals) so that the kernel's decimal columns stay within 38 digits.
        trimmed = stored.normalize(self._context)
        exponent = cast(int, trimmed.as_tuple().exponent)  # an int: ``coerce`` refused NaN and infinities
        return trimmed if exponent <= 0 else trimmed.quantize(Decimal(1), context=self._context)


class UTCDateTime(TypeDecorator[datetime]):
    """A naive UTC ``DATETIME`` in the database, an aware UTC datetime in Python."""

    impl = sa.DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """The value in naive UTC; ``ValueError`` for a naive datetime (its zone is unknown)."""
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()}: ratebeam only stores aware UTC datetimes")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """The stored value as an aware UTC datetime."""
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Base of the ORM models: one metadata whose constraint names follow CloudKitty's."""

    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


COST = ExactDecimal(40, 28)
LEVEL = ExactDecimal(20, 8)


def _map_type(name: str) -> sa.Enum:
    return sa.Enum("flat", "rate", name=name, create_constraint=True)


# --- hashmap (cloudkitty/rating/hash/db/sqlalchemy/models.py) -------------------------------------


class HashMapService(Base):
    """A hashmap service: rates the metric whose rating type is ``name``."""

    __tablename__ = "hashmap_services"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    service_id: Mapped[str] = mapped_column(sa.String(36), nullable=False, unique=True)
    name: Mapped[str] = mapped_column(sa.String(255), nullable=False, unique=True)


class HashMapField(Base):
    """A hashmap field: a metadata / groupby key of a service's points."""

    __tablename__ = "hashmap_fields"
    __table_args__ = (sa.UniqueConstraint("service_id", "name", name="uniq_field_per_service"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    field_id: Mapped[str] = mapped_column(sa.String(36), nullable=False, unique=True)
    name: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    service_id: Mapped[int] = mapped_column(
        sa.Integer, sa.ForeignKey("hashmap_services.id", ondelete="CASCADE"), nullable=False
    )


class HashMapGroup(Base):
    """A hashmap group: mappings and thresholds of one group are summed together."""

    __tablename__ = "hashmap_groups"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    group_id: Mapped[str] = mapped_column(sa.String(36), nullable=False, unique=True)
    name: Mapped[str] = mapped_column(sa.String(255), nullable=False, unique=True)


class HashMapMapping(Base):
    """A service mapping (``service_id``) or field mapping (``field_id`` + ``value``).

    Soft-deleted (``deleted``) and valid on ``[start, end)``; the audit columns are CloudKitty's
    ``VolatileAuditableModel`` (``cloudkitty/rating/common/db/models.py``).  The unique
    constraints on (value, parent, tenant) were dropped by CloudKitty's migration 8a591f85865f.
    """

    __tablename__ = "hashmap_mappings"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    mapping_id: Mapped[str] = mapped_column(sa.String(36), nullable=False, unique=True)
    value: Mapped[str | None] = mapped_column(sa.String(255), nullable=True)
    cost: Mapped[Decimal] = mapped_column(COST, nullable=False)
    map_type: Mapped[str] = mapped_column(_map_type("enum_map_type"), nullable=False)
    service_id: Mapped[int | None] = mapped_column(
        sa.Integer, sa.ForeignKey("hashmap_services.id", ondelete="CASCADE"), nullable=True
    )
    field_id: Mapped[int | None] = mapped_column(
        sa.Integer, sa.ForeignKey("hashmap_fields.id", ondelete="CASCADE"), nullable=True
    )
    group_id: Mapped[int | None] = mapped_column(
        sa.Integer, sa.ForeignKey("hashmap_groups.id", ondelete="SET NULL"), nullable=True
    )
    tenant_id: Mapped[str | None] = mapped_column(sa.String(255), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    start: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    end: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    name: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    description: Mapped[str | None] = mapped_column(sa.String(256), nullable=True)
    deleted: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_by: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    updated_by: Mapped[str | None] = mapped_column(sa.String(32), nullable=True)
    deleted_by: Mapped[str | None] = mapped_column(sa.String(32), nullable=True)


class HashMapThreshold(Base):
    """A threshold on a service (compares qty) or a field (compares the value); no validity window."""

    __tablename__ = "hashmap_thresholds"
    __table_args__ = (
        sa.UniqueConstraint("level", "field_id", "tenant_id", name="uniq_field_threshold"),
        sa.UniqueConstraint("level", "service_id", "tenant_id", name="uniq_service_threshold"),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    threshold_id: Mapped[str] = mapped_column(sa.String(36), nullable=False, unique=True)
    level: Mapped[Decimal | None] = mapped_column(LEVEL, nullable=True)
    cost: Mapped[Decimal] = mapped_column(COST, nullable=False)
    map_type: Mapped[str] = mapped_column(_map_type("enum_hashmap_type"), nullable=False)
    service_id: Mapped[int | None] = mapped_column(
        sa.Integer, sa.ForeignKey("hashmap_services.id", ondelete="CASCADE"), nullable=True
    )
    field_id: Mapped[int | None] = mapped_column(
        sa.Integer, sa.ForeignKey("hashmap_fields.id", ondelete="CASCADE"), nullable=True
    )
    group_id: Mapped[int | None] = mapped_column(
        sa.Integer, sa.ForeignKey("hashmap_groups.id", ondelete="SET NULL"), nullable=True
    )
    tenant_id: Mapped[str | None] = mapped_column(sa.String(255), nullable=True)


# --- scope state and reprocessing (cloudkitty/storage_state/models.py) -----------------------------


class StorageState(Base):
    """Per (scope, scope_key, fetcher, collector): the begin of the last rated period."""

    __tablename__ = "cloudkitty_storage_states"
    __table_args__ = (
        sa.UniqueConstraint(
            "identifier", "scope_key", "collector", "fetcher", name="uq_cloudkitty_storage_states_identifier"
        ),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    identifier: Mapped[str] = mapped_column(sa.String(256), nullable=False)
    scope_key: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    fetcher: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    collector: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    # ratebeam: nullable (a deactivated never-rated scope); NOT NULL in CloudKitty.
    last_processed_timestamp: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    scope_activation_toggle_date: Mapped[datetime] = mapped_column(
        UTCDateTime(), nullable=False, server_default=sa.func.now()
    )
    active: Mapped[bool] = mapped_column(sa.Boolean, nullable=False, default=True)


class ReprocessingSchedule(Base):
    """A request to re-rate ``[start, end]`` (end inclusive) of one scope; ``current`` = progress."""

    __tablename__ = "storage_scope_reprocessing_schedule"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    reason: Mapped[str] = mapped_column(sa.Text, nullable=False)
    identifier: Mapped[str] = mapped_column(sa.String(256), nullable=False)
    start_reprocess_time: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    end_reprocess_time: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    current_reprocess_time: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


# --- rating modules (cloudkitty/db/sqlalchemy/models.py) ------------------------------------------


class ModuleState(Base):
    """Whether a rating module is enabled, and its priority (higher runs first)."""

    __tablename__ = "modules_state"

    name: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    state: Mapped[bool] = mapped_column(sa.Boolean, nullable=False, default=False)
    priority: Mapped[int | None] = mapped_column(sa.Integer, default=1)


# --- ratebeam --------------------------------------------------------------------------------------


class Script(Base):
    """A ratebeam rating script: ``data`` is its JSON text, valid on ``[start, end)`` unless deleted."""

    __tablename__ = "ratebeam_scripts"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    script_id: Mapped[str] = mapped_column(sa.String(36), nullable=False, unique=True)
    name: Mapped[str] = mapped_column(sa.String(255), nullable=False, unique=True)
    data: Mapped[str] = mapped_column(sa.Text, nullable=False)
    start: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    end: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    deleted: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class DeadLetter(Base):
    """A frame (scope × period) runs could not rate or store: one row per frame, however often it failed.

    ``run_id``, ``stage`` and ``reason`` are the last failure's; ``created_at`` the first failure,
    ``last_seen_at`` the last; ``resolved_at`` is set when a later run rated and committed the frame
    (a new failure clears it again).
    """

    __tablename__ = "ratebeam_dead_letters"
    __table_args__ = (sa.UniqueConstraint("scope", "period_begin", name="uq_ratebeam_dead_letters_scope"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(sa.String(255), nullable=False, index=True)
    scope: Mapped[str] = mapped_column(sa.String(256), nullable=False)
    period_begin: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    stage: Mapped[str] = mapped_column(sa.String(40), nullable=False)
    reason: Mapped[str] = mapped_column(sa.Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    failures: Mapped[int] = mapped_column(sa.Integer, nullable=False, server_default="1")
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class CellPoints(Base):
    """How many points a committed (scope, period, metric type) cell stored, 0 included.

    Written when the period is committed (``ratebeam gaps`` reads it to find cells collected empty).
    """

    __tablename__ = "ratebeam_cell_points"
    __table_args__ = (sa.UniqueConstraint("scope", "period_begin", "type", name="uq_ratebeam_cell_points_scope"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    scope: Mapped[str] = mapped_column(sa.String(256), nullable=False)
    period_begin: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    type: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    points: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class RunTally(Base):
    """One figure a run's graph counted (``transforms.tallies``): written by the pipeline, read by its launcher."""

    __tablename__ = "ratebeam_run_tallies"

    run_id: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    value: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)


class Lease(Base):
    """The lease a run holds on a scope (keyed like its state row); the row exists while it is held.

    ``expires_at`` moves forward with every ``heartbeat_at``: a holder that stops beating (it died,
    wherever it ran) loses the lease when ``expires_at`` passes (see ``state_store.py``).
    """

    __tablename__ = "ratebeam_scope_leases"
    __table_args__ = (
        sa.UniqueConstraint(
            "identifier", "scope_key", "fetcher", "collector", name="uq_ratebeam_scope_leases_identifier"
        ),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    identifier: Mapped[str] = mapped_column(sa.String(256), nullable=False)
    scope_key: Mapped[str] = mapped_column(sa.String(40), nullable=False)
    fetcher: Mapped[str] = mapped_column(sa.String(40), nullable=False)
    collector: Mapped[str] = mapped_column(sa.String(40), nullable=False)
    owner: Mapped[str] = mapped_column(sa.String(255), nullable=False, index=True)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class Backfill(Base):
    """A backfill of ``[start, end)`` (end excluded) of one scope; ``current`` = begin of the last period done.

    Keyed like a state row plus the range, so the same ``ratebeam backfill`` run again resumes.
    """

    __tablename__ = "ratebeam_backfills"
    __table_args__ = (
        sa.UniqueConstraint("identifier", "scope_key", "fetcher", "collector", "start", "end",
                            name="uq_ratebeam_backfills_identifier"),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    identifier: Mapped[str] = mapped_column(sa.String(256), nullable=False)
    scope_key: Mapped[str] = mapped_column(sa.String(40), nullable=False)
    fetcher: Mapped[str] = mapped_column(sa.String(40), nullable=False)
    collector: Mapped[str] = mapped_column(sa.String(40), nullable=False)
    start: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    end: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    current: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class EventInbox(Base):
    """A notification received from the bus, kept until the usage it produced is stored.

    Keyed by the envelope's ``message_id``: a redelivered or duplicated message inserts nothing.
    ``emitted_run`` is the streaming job that last read it into Beam (a new job reads every
    unfinished row again: Beam's state is rebuilt from here).  ``finish_scope`` / ``finish_period``
    name the frame whose write finishes it; ``finished_at`` is set once that frame is stored (or at
    once for a notification no trigger wants).  ``late_at`` / ``late_reason``: it came after its
    trigger's ``fire_delay`` and was left out of the usage (for the reprocessing job).  ``scope`` /
    ``scope_hash``: computed when it is recorded (NULL: recorded before revision 0009, computed by the
    next job that reads the inbox).
    """

    __tablename__ = "ratebeam_event_inbox"

    message_id: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    event_type: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    publisher_id: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    priority: Mapped[str] = mapped_column(sa.String(40), nullable=False)
    generated: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    #: ``{"payload": ..., "ctxt": ...}`` as JSON text.
    body: Mapped[str] = mapped_column(sa.Text, nullable=False)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    emitted_run: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)
    finish_scope: Mapped[str | None] = mapped_column(sa.String(256), nullable=True)
    finish_period: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True, index=True)
    late_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    late_reason: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    #: The scope its triggers bill (``''``: none), and its CRC-32: the shard of ``events serve --shard`` that rates it.
    scope: Mapped[str | None] = mapped_column(sa.String(256), nullable=True)
    scope_hash: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)


class EventConsumer(Base):
    """A running sharded event-stream job reading the shared queue: how far it recorded, and its heartbeat.

    ``recorded_through``: the latest ``generated`` time among the notifications it recorded (NULL: none
    yet).  Every message it was delivered and has not recorded yet comes after those in the queue, so
    a shard job's event time waits for the oldest of these (``Inbox.consumers_low``).
    """

    __tablename__ = "ratebeam_event_consumers"

    run_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    #: ``K/N``, for the operator reading the table.
    shard: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    recorded_through: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    heartbeat: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class EventFrame(Base):
    """A frame (scope × period) the event stream stored: a restarted job does not write it again."""

    __tablename__ = "ratebeam_event_frames"

    scope: Mapped[str] = mapped_column(sa.String(256), primary_key=True)
    period_begin: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    points: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    committed_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class MessageDeadLetter(Base):
    """A bus message the event stream could not read (not JSON, no message_id...), and why.

    Keyed by the SHA-256 of the message body, so a redelivered one is recorded once (``failures``
    counts the deliveries).
    """

    __tablename__ = "ratebeam_message_dead_letters"

    digest: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    message_id: Mapped[str | None] = mapped_column(sa.String(255), nullable=True)
    reason: Mapped[str] = mapped_column(sa.Text, nullable=False)
    body: Mapped[str] = mapped_column(sa.Text, nullable=False)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    failures: Mapped[int] = mapped_column(sa.Integer, nullable=False, server_default="1")


class EventDiscrepancy(Base):
    """A difference between the event stream and the audit (``transforms.events.reconcile.Discrepancy``).

    Keyed by (trigger, instance key, kind, message id): the lifecycle is computed again from the
    instance's events at every period close, so the same finding is one row whose ``last_seen_at``
    (with ``detail``, ``run_id`` and the labels) moves; ``first_seen_at`` is when it was first found.
    ``scope`` is ``None`` for a resource without one (kind ``no_scope``).
    """

    __tablename__ = "ratebeam_event_discrepancies"

    trigger: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    instance_key: Mapped[str] = mapped_column(sa.String(1024), primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    message_id: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    resource_id: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    scope: Mapped[str | None] = mapped_column(sa.String(256), nullable=True, index=True)
    detail: Mapped[str] = mapped_column(sa.Text, nullable=False)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    run_id: Mapped[str] = mapped_column(sa.String(255), nullable=False)
