"""The storage contract's selection and grouping, evaluated over Polars frames.

Backends that cannot answer a query exactly on the server (Parquet always; InfluxDB for label
filters and ordering) fetch candidate points and finish here, so every backend selects, orders and
groups the same way — which the conformance suite checks.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import polars as pl

from ratebeam.connectors.storage.base import TIME, Selection
from ratebeam.transforms.schema import (
    BEGIN,
    END,
    GROUPBY_PREFIX,
    METADATA_PREFIX,
    PRICE,
    QTY,
    SCOPE,
    TYPE,
    UNIT,
    groupby_column,
    metadata_column,
)


def labels_match(columns: Iterable[str], selection: Selection) -> pl.Expr:
    """True where every label filter holds on the groupby or the metadata label."""
    columns = set(columns)
    expr = pl.lit(True)
    for key, values in selection.labels.items():
        tests = [
            pl.col(c).is_in(sorted(values))
            for c in (groupby_column(key), metadata_column(key))
            if c in columns
        ]
        expr = expr & (pl.any_horizontal(tests).fill_null(False) if tests else pl.lit(False))
    return expr


def predicate(columns: list[str], selection: Selection, begin: datetime, end: datetime) -> pl.Expr:
    """The whole retrieve/total selection: time window, labels, types and scopes."""
    expr = (pl.col(BEGIN) >= begin) & (pl.col(END) <= end) & labels_match(columns, selection)
    if selection.types is not None:
        expr = expr & pl.col(TYPE).is_in(sorted(selection.types))
    if selection.scopes is not None:
        expr = expr & pl.col(SCOPE).is_in(sorted(selection.scopes))
    return expr


def retrieve_order(columns: list[str]) -> list[str]:
    """Sort keys of retrieve: begin, scope, type, groupby labels, metadata labels, then the rest."""
    labels = sorted(c for c in columns if c.startswith(GROUPBY_PREFIX))
    labels += sorted(c for c in columns if c.startswith(METADATA_PREFIX))
    return [BEGIN, SCOPE, TYPE, *labels, END, QTY, PRICE, UNIT]


def group_aliases(keys: tuple[str, ...]) -> dict[str, str]:
    """Internal column names for the group keys (labels may be called ``qty``, ``rate``...)."""
    names = [n for k in keys for n in ((BEGIN, END) if k == TIME else (k,))]
    return {name: f"__g{i}" for i, name in enumerate(names)}


def group_exprs(keys: tuple[str, ...], aliases: dict[str, str], columns: list[str]) -> list[pl.Expr]:
    """One expression per group column; a missing groupby label groups as ''."""
    exprs = []
    for key in keys:
        if key == TIME:
            exprs += [pl.col(BEGIN).alias(aliases[BEGIN]), pl.col(END).alias(aliases[END])]
        elif key == TYPE:
            exprs.append(pl.col(TYPE).alias(aliases[key]))
        elif groupby_column(key) in columns:
            exprs.append(pl.col(groupby_column(key)).fill_null("").alias(aliases[key]))
        else:
            exprs.append(pl.lit("", dtype=pl.String).alias(aliases[key]))
    return exprs


def total_rows(rows: Iterable[dict[str, Any]], keys: tuple[str, ...], aliases: dict[str, str],
               values: list[str], begin: datetime, end: datetime) -> list[dict[str, Any]]:
    """Aggregated rows as the contract's results: ``{begin, end, <values>, <group keys>}``."""
    results = []
    for row in rows:
        result: dict[str, Any] = {"begin": begin, "end": end, **{name: row[name] for name in values}}
        for key in keys:
            if key == TIME:
                result["begin"], result["end"] = row[aliases[BEGIN]], row[aliases[END]]
            else:
                result[key] = row[aliases[key]]
        results.append(result)
    return results
