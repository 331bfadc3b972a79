"""Rated JSONL (interchange.md), the output of ``ratebeam rate``: one line per point, then a summary."""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TextIO

import polars as pl

from ratebeam.pipelines.interchange.document import WIDE
from ratebeam.pipelines.interchange.usage import INDEX
from ratebeam.transforms.hashmap import RatingOutcome
from ratebeam.transforms.schema import BEGIN, END, PRICE, QTY, SCOPE, TYPE


def plain_decimal(value: Decimal) -> str:
    """A decimal as plain text without exponent or trailing zeros (``Decimal('10.20')`` -> ``10.2``)."""
    if not value:
        return "0"
    return format(value.normalize(WIDE), "f")


@dataclass(frozen=True)
class RatedSummary:
    """The summary line of a rated JSONL file."""

    count: int
    frames: int
    errors: int
    total: Decimal


def write_rated(usage: pl.DataFrame, outcome: RatingOutcome, out: TextIO) -> RatedSummary:
    """Write one rated line per usage point in input order, then the summary line (interchange.md).

    A point of a failed frame gets ``"price": null`` and the frame's ``"error"``.
    """
    reasons = {(f.scope_id, f.begin, f.end): f.reason for f in outcome.failures}
    prices = dict(zip(outcome.rated.get_column(INDEX).to_list(), outcome.rated.get_column(PRICE).to_list(),
                      strict=True))
    frames: set[tuple] = set()
    failed: set[tuple] = set()
    total = Decimal(0)
    rows = usage.select(INDEX, TYPE, SCOPE, BEGIN, END, QTY).iter_rows()
    for index, type_, scope, begin, end, qty in rows:
        frames.add((scope, begin, end))
        line: dict[str, Any] = {"i": index, "type": type_, "scope": scope, "begin": begin.isoformat(),
                                "end": end.isoformat(), "qty": plain_decimal(qty)}
        price = prices.get(index)
        if price is None:
            failed.add((scope, begin, end))
            line["price"] = None
            line["error"] = reasons.get((scope, begin, end), "not rated")
        else:
            total = WIDE.add(total, price)
            line["price"] = plain_decimal(price)
        out.write(json.dumps(line) + "\n")
    summary = RatedSummary(count=usage.height, frames=len(frames), errors=len(failed), total=total)
    out.write(json.dumps({"summary": {"count": summary.count, "frames": summary.frames,
                                      "errors": summary.errors, "total": plain_decimal(summary.total)}}) + "\n")
    return summary
