"""SQL predicates (delta-rs / DataFusion dialect) naming the rows a write replaces or a delete removes.

delta-rs replaces and deletes rows by a SQL predicate evaluated against every candidate file (its
statistics first), in the same commit as the new files: so the predicate must name exactly the
slices, nothing more.  Values are quoted here, never interpolated raw: a scope or label may hold
any character.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from ratebeam.connectors.storage.base import Selection
from ratebeam.transforms.schema import BEGIN, SCOPE, TYPE, groupby_column, metadata_column


def ident(name: str) -> str:
    """A quoted column name (label columns hold dots: ``"groupby.id"``)."""
    return '"' + name.replace('"', '""') + '"'


def text(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def moment(value: datetime) -> str:
    """A UTC microsecond timestamp literal of the column type (``timestamp[us, UTC]``)."""
    stamp = value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"arrow_cast('{stamp}', 'Timestamp(Microsecond, Some(\"UTC\"))')"


def one_of(column: str, values: Iterable[str]) -> str:
    """``column IN (values)`` (the caller never passes an empty list)."""
    return f"{ident(column)} IN ({', '.join(text(v) for v in sorted(values))})"


def slices(table: pa.Table) -> str:
    """The (scope, type, begin) slices present in ``table``, as few clauses as the slices allow.

    Exactly the slices, no more: each clause is ``type = t AND scope IN (S) AND begin IN (B)``
    for the scopes S whose type-``t`` slices have exactly the begins B, so every (s, t, b) a clause
    names is a slice of the table.  A write of whole frames has one clause per type and set of
    periods (three or so for an hourly run of every scope), where one clause per (scope, type) made
    delta-rs evaluate a disjunction of hundreds of terms on every new row: 4-5x the cost of the
    write itself.  Begins are compared as integer microseconds (``arrow_cast(begin, 'Int64') IN
    (…)``): integer literals parse and hash fast, where timestamp casts cost ~0.1 ms each.  The
    leading conjuncts (scopes, begin window) are what delta-rs tests against each file's min/max
    statistics, so files of other scopes or periods are skipped without being read.
    """
    micros = table[BEGIN].cast(pa.int64())
    keys = pa.table({SCOPE: table[SCOPE], TYPE: table[TYPE], "micros": micros})
    pairs = keys.group_by([SCOPE, TYPE]).aggregate([("micros", "distinct")]).to_pydict()
    scopes_of: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for scope, type_, begins in zip(pairs[SCOPE], pairs[TYPE], pairs["micros_distinct"], strict=True):
        scopes_of.setdefault((type_, tuple(sorted(begins))), []).append(scope)
    as_int = f"arrow_cast({ident(BEGIN)}, 'Int64')"
    clauses = [
        f"({ident(TYPE)} = {text(type_)} AND {one_of(SCOPE, scopes)} AND {as_int} IN ({', '.join(map(str, begins))}))"
        for (type_, begins), scopes in sorted(scopes_of.items())
    ]
    low, high = pc.min_max(table[BEGIN]).values()
    window = f"{ident(BEGIN)} >= {moment(low.as_py())} AND {ident(BEGIN)} <= {moment(high.as_py())}"
    return f"{one_of(SCOPE, set(pairs[SCOPE]))} AND {window} AND ({' OR '.join(clauses)})"


#: How far Delta's timestamp statistics may be from the value (they are kept in milliseconds).
_STATS_PRECISION = timedelta(milliseconds=1)


def may_hold(files: pa.Table, table: pa.Table) -> bool:
    """Whether any data file may hold a row of ``table``'s slices, by the files' own statistics.

    ``files`` is ``DeltaTable.get_add_actions(flatten=True)``: each file's min/max scope and begin.
    They are bounds, not values: delta-rs shortens a long string's max by rounding it up, and Delta
    keeps timestamp statistics in milliseconds (a begin of 00:00:00.000005 has max 00:00:00.000),
    so the begins are compared one millisecond wider on each side.  A file without statistics may
    hold anything.  When no file may, a write replaces nothing and can simply append: an overwrite
    by predicate costs ~1-2 ms per file of the table (delta-rs tests every file), so an hourly write
    into a month of files would slow down as the month fills.
    """
    if files.num_rows == 0:
        return False
    bounds = [f"{side}.{column}" for side in ("min", "max") for column in (SCOPE, BEGIN)]
    if any(name not in files.column_names for name in bounds):
        return True
    low_scope, high_scope = (v.as_py() for v in pc.min_max(table[SCOPE]).values())
    low, high = (v.as_py() for v in pc.min_max(table[BEGIN]).values())
    kind = files[f"min.{BEGIN}"].type
    low_begin, high_begin = pa.scalar(low - _STATS_PRECISION, kind), pa.scalar(high + _STATS_PRECISION, kind)
    overlaps = pc.and_kleene(
        pc.and_kleene(pc.less_equal(files[f"min.{SCOPE}"], high_scope), pc.greater_equal(files[f"max.{SCOPE}"], low_scope)),
        pc.and_kleene(pc.less_equal(files[f"min.{BEGIN}"], high_begin), pc.greater_equal(files[f"max.{BEGIN}"], low_begin)),
    )
    return bool(pc.any(pc.fill_null(overlaps, True)).as_py())


def deletion(begin: datetime | None, end: datetime | None, selection: Selection, columns: set[str]) -> str | None:
    """The rows ``delete`` removes (``begin <= row.begin < end``), or None when none can match."""
    parts = []
    if begin is not None:
        parts.append(f"{ident(BEGIN)} >= {moment(begin)}")
    if end is not None:
        parts.append(f"{ident(BEGIN)} < {moment(end)}")
    if selection.types is not None:
        parts.append(one_of(TYPE, selection.types))
    if selection.scopes is not None:
        parts.append(one_of(SCOPE, selection.scopes))
    for key, values in selection.labels.items():
        tests = [one_of(c, values) for c in (groupby_column(key), metadata_column(key)) if c in columns]
        if not tests:  # no point carries the key: nothing matches
            return None
        # A null label is no match: COALESCE keeps NULL OR FALSE from leaving the row undecided.
        parts.append("(" + " OR ".join(f"COALESCE({t}, FALSE)" for t in tests) + ")")
    return " AND ".join(parts) if parts else "TRUE"
