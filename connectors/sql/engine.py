"""Engines for the ratebeam database, and the translation of driver errors into connector errors.

SQLite (a file, the embedded default) and PostgreSQL (production) behave differently under
concurrency, so this module makes them behave alike for the rest of the package:

* SQLite runs in WAL mode with a busy timeout, so two processes can share one file (readers never
  block the writer, writers wait for each other instead of failing at once), with foreign keys on
  (CloudKitty's cascades), and with real transactions: the driver's implicit transaction handling
  is switched off and SQLAlchemy's ``begin`` emits ``BEGIN`` itself — ``BEGIN IMMEDIATE`` for the
  transactions opened with :func:`write_transaction`, so a read-then-write transaction takes the
  write lock first and can never fail half-way with "database is locked".
* PostgreSQL uses psycopg 3 (``postgresql://`` is read as ``postgresql+psycopg://``), with
  pre-ping so a pooled connection that died is replaced instead of failing a run.

Every public function of the repositories runs inside :func:`database_errors`, which turns what the
driver says into the taxonomy of :mod:`ratebeam.connectors.errors`: an unreachable server or a
missing schema is fatal (with the command that fixes it), a lock timeout or a serialization
failure is retriable.
"""

from __future__ import annotations

import importlib.util
import random
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import ConnectionPoolEntry

from ratebeam.connectors.errors import FatalConnectorError, RetriableConnectorError
from ratebeam.connectors.extras import missing_package

#: How long a SQLite writer waits for another one before giving up (milliseconds).
SQLITE_BUSY_TIMEOUT_MS = 30_000

_WRITE_OPTION = "ratebeam_write"
UPGRADE_HINT = "run `ratebeam db upgrade`"
#: The password of a URL, hidden when one is shown (``//user:***@host``).
CREDENTIALS = re.compile(r"(//[^/:@]*:)[^@/]*@")


class UnusableDatabaseURL(ValueError):
    """Why ratebeam cannot use a database URL (the message names no file: the caller knows where it was)."""


def usable_url(url: str | URL) -> URL:
    """``url`` parsed, or ``UnusableDatabaseURL`` when ratebeam cannot use it.

    Checked when ``ratebeam.yaml`` is loaded, so the mistake is named like every other one
    (``ratebeam.yaml: database_url: ...``), and again by ``make_engine`` for a URL from elsewhere:
    a dialect SQLAlchemy does not know, one ratebeam does not support (its SQL is written for
    SQLite and PostgreSQL), a SQLite driver other than Python's own, or PostgreSQL without psycopg.
    ``postgresql://`` with any other driver is read as ``postgresql+psycopg://`` (``make_engine``).
    """
    try:
        parsed = make_url(url)
    except (sa_exc.ArgumentError, ValueError):
        raise UnusableDatabaseURL("not a database URL") from None
    try:
        parsed.get_dialect()
    except sa_exc.NoSuchModuleError:
        raise UnusableDatabaseURL(f"unknown database dialect {parsed.drivername!r}") from None
    except ImportError:  # a known dialect whose driver is absent: refused below, or read as psycopg
        pass
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    if backend == "sqlite" and driver != "pysqlite":
        raise UnusableDatabaseURL(f"unsupported SQLite driver {driver!r} (ratebeam uses sqlite:///<file>)")
    if backend not in ("sqlite", "postgresql"):
        raise UnusableDatabaseURL(
            f"unsupported database {backend!r} (ratebeam uses sqlite:///<file> or postgresql+psycopg://...)")
    if backend == "postgresql" and importlib.util.find_spec("psycopg") is None:
        raise UnusableDatabaseURL("needs psycopg, which is not installed: "
                                  "pip install 'ratebeam[postgresql]'")
    return parsed


def make_engine(url: str | URL) -> Engine:
    """An engine for ``url`` set up for concurrent use by several processes (see the module doc).

    Creating it does not connect; :func:`ratebeam.connectors.sql.migrations.check_schema` does,
    and raises :class:`FatalConnectorError` when the database is unreachable or not upgraded.
    """
    try:
        parsed = usable_url(url)
    except UnusableDatabaseURL as err:
        shown = url.render_as_string() if isinstance(url, URL) else CREDENTIALS.sub(r"\1***@", url)
        raise FatalConnectorError(f"database url: {err}: {shown!r}") from None
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed)
    if parsed.get_driver_name() != "psycopg":
        parsed = parsed.set(drivername="postgresql+psycopg")
    query = dict(parsed.query)
    query.setdefault("connect_timeout", "10")
    try:
        return create_engine(parsed.set(query=query), pool_pre_ping=True)
    except ImportError as err:  # psycopg importable but broken (a dependency of it missing)
        raise missing_package(f"database url: {parsed.render_as_string()}", err) from None


def _sqlite_engine(url: URL) -> Engine:
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
    in_memory = url.database in (None, "", ":memory:")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
        # Let SQLAlchemy's "begin" event, not the driver, open transactions.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if not in_memory:
                _use_wal(cursor)
                cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(_WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _use_wal(cursor: sqlite3.Cursor) -> None:
    """Put the database file in WAL mode (it stays so), waiting while another connection switches it.

    Switching the journal mode needs an exclusive lock, and SQLite answers "database is locked" at
    once, without its busy handler, when another process opens the new file at the same moment (two
    ``db upgrade`` at once: 1 in 5 lost the race here).  So the mode is read first (a file already in
    WAL mode needs no lock) and the switch tried again, with jitter, up to the busy timeout.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.01, 0.1))


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that will write: on SQLite it takes the write lock at ``BEGIN``.

    Use it whenever a transaction reads before it writes (validations, read-modify-write), so that
    concurrent writers queue on the busy timeout instead of failing on a stale snapshot.
    """
    with engine.execution_options(**{_WRITE_OPTION: True}).begin() as conn:
        yield conn


def dialect_insert(engine: Engine) -> Callable[..., sqlite.Insert | postgresql.Insert]:
    """The dialect's ``insert`` construct, which has ``on_conflict_do_nothing/do_update``."""
    return postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert


def describe(engine: Engine) -> str:
    """The engine's url without its password, for error messages and logs."""
    return engine.url.render_as_string(hide_password=True)


@contextmanager
def database_errors(engine: Engine, doing: str) -> Iterator[None]:
    """Re-raise driver errors met while ``doing`` something as connector errors (module doc)."""
    try:
        yield
    except sa_exc.DBAPIError as err:
        translated = _translate(engine, doing, err)
        if translated is err:
            raise
        raise translated from err


_RETRIABLE_SQLSTATES = ("40001", "40P01", "55P03")  # serialization failure, deadlock, lock timeout
_SCHEMA_SQLSTATES = ("42P01", "42703")  # undefined table, undefined column
_UNREACHABLE_SQLSTATE_CLASSES = ("08", "28", "3D")  # connection, authorization, unknown database


def _translate(engine: Engine, doing: str, err: sa_exc.DBAPIError) -> Exception:
    orig = err.orig
    sqlstate = getattr(orig, "sqlstate", None) or ""
    text = str(orig).strip()
    message = text.splitlines()[0] if text else type(orig).__name__
    lower = message.lower()
    where = describe(engine)
    if sqlstate in _RETRIABLE_SQLSTATES or "database is locked" in lower or "table is locked" in lower:
        return RetriableConnectorError(f"{doing}: database busy at {where}: {message}")
    if sqlstate in _SCHEMA_SQLSTATES or lower.startswith(("no such table", "no such column")):
        return FatalConnectorError(
            f"{doing}: the ratebeam schema is missing or outdated at {where} ({message}): {UPGRADE_HINT}"
        )
    unreachable = (
        err.connection_invalidated
        or sqlstate[:2] in _UNREACHABLE_SQLSTATE_CLASSES
        or "unable to open database" in lower
        # psycopg reports a failed connection attempt as an OperationalError without SQLSTATE
        or (isinstance(err, sa_exc.OperationalError) and engine.dialect.name != "sqlite" and not sqlstate)
    )
    if unreachable:
        return FatalConnectorError(f"{doing}: cannot reach the database at {where}: {message}")
    return err
