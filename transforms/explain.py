"""Why a point costs what it costs: each group's flat, rates and threshold, and the arithmetic.

``ratebeam report explain`` (stored points) and ``ratebeam rate --explain`` (a usage file) print
this.  The traces come from the kernel itself (``transforms.hashmap.point_traces``), so an
explanation cannot disagree with the price the kernel computes from the same rules; the arithmetic
is CloudKitty's group formula (`cloudkitty/rating/hash/__init__.py:159-176`), written out with each rule's id and value.

A stored point carries the lineage it was rated with (the ``RULES`` column) when its backend keeps
it; the explanation re-derives the contributions from the rules valid at the period's begin and says
whether they name the same rules and give the stored price (rules changed since, another rating
module, or a backend without lineage are then visible).
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import polars as pl

from ratebeam.transforms.hashmap import point_traces
from ratebeam.transforms.hashmap_resolve import EXACT, ROUNDING, Contribution, GroupTrace
from ratebeam.transforms.rules import RuleSet
from ratebeam.transforms.schema import BEGIN, END, PRICE, PRICE_SCALE, QTY, RULES, SCOPE, TYPE

_PRICE_QUANTUM = Decimal(1).scaleb(-PRICE_SCALE)


@dataclass(frozen=True)
class PointExplanation:
    """One point, how its groups price it, and (for a stored point) what was stored."""

    scope_id: str | None
    type: str
    begin: datetime
    end: datetime
    qty: Decimal
    input_price: Decimal
    groups: tuple[GroupTrace, ...]
    #: the field whose value CloudKitty cannot compare with its thresholds (the frame fails)
    failed_field: str | None = None
    has_service: bool = True
    stored_price: Decimal | None = None
    #: the lineage stored with the point; None when the backend keeps none
    stored_rules: tuple[str, ...] | None = None
    #: the stored price is exact (False: a float64, as CloudKitty's HTTP backends store it)
    exact: bool = True

    @property
    def price(self) -> Decimal | None:
        """Input price + every group's ``res``, rounded half-even at the price scale as the kernel does."""
        if self.failed_field is not None:
            return None
        total = self.input_price
        for g in self.groups:
            total = EXACT.add(total, group_res(g, self.qty))
        return total.quantize(_PRICE_QUANTUM, rounding=decimal.ROUND_HALF_EVEN, context=ROUNDING)

    @property
    def price_matches(self) -> bool:
        """The explained price is the stored one (to float64 where the backend stores floats)."""
        price, stored = self.price, self.stored_price
        if price is None or stored is None:
            return False
        return price == stored if self.exact else float(price) == float(stored)

    @property
    def rules(self) -> tuple[str, ...]:
        """The re-derived lineage: ids of the rules the groups used, in order."""
        return tuple(dict.fromkeys(i for g in self.groups for i in g.rule_ids))


def explain(points: pl.DataFrame, rules: RuleSet, *, stored: bool = False, exact: bool = True
            ) -> list[PointExplanation]:
    """The explanation of every row of ``points`` (a usage or rated frame), in row order.

    ``stored``: the rows are stored points: their price is the stored price (compared with the
    explanation, whose input price is then 0, as collected points start) and their ``RULES``
    column, if any, the stored lineage; ``exact``: the backend stores exact prices.
    """
    traces = point_traces(points, rules)
    lineage = points.get_column(RULES).to_list() if stored and RULES in points.columns else None
    out = []
    rows = points.select(SCOPE, TYPE, BEGIN, END, QTY, PRICE).iter_rows()
    for i, ((scope, type_, begin, end, qty, price), trace) in enumerate(zip(rows, traces, strict=True)):
        stored_rules = None
        if lineage is not None:
            stored_rules = tuple(lineage[i].split(",")) if lineage[i] else ()
        out.append(PointExplanation(
            scope_id=scope, type=type_, begin=begin, end=end, qty=qty,
            input_price=Decimal(0) if stored else price,
            groups=tuple(trace) if isinstance(trace, list) else (),
            failed_field=trace if isinstance(trace, str) else None,
            has_service=trace is not None,
            stored_price=price if stored else None,
            stored_rules=stored_rules,
            exact=exact,
        ))
    return out


def group_res(g: GroupTrace, qty: Decimal) -> Decimal:
    """The group's ``res`` for ``qty``: coefficient × qty + constant (exact)."""
    return EXACT.add(EXACT.multiply(g.coefficient, qty), g.constant)


def number(value: Decimal) -> str:
    """A decimal as plain text, without exponent or trailing zeros."""
    if not value:
        return "0"
    return format(value.normalize(EXACT), "f")


def _term(c: Contribution) -> str:
    name = c.kind if c.kind != "threshold" else f"threshold {c.type}"
    where = f" ≥ {number(c.level)}" if c.level is not None else ""
    return f"{name} {number(c.cost)} [{c.rule_id or 'no id'}{where}]"


def group_arithmetic(g: GroupTrace, qty: Decimal) -> str:
    """CloudKitty's formula for one group (`cloudkitty/rating/hash/__init__.py:159-176`) with its terms, ``= res``."""
    flat = _term(g.flat) if g.flat is not None else "flat 0"
    factors = [_term(r) for r in g.rates]
    t = g.threshold
    if t is not None and t.scope == "field":
        if t.type == "flat":
            flat = f"({flat} + {_term(t)})"
        else:
            factors.append(_term(t))
    text = " × ".join([flat, *factors, f"qty {number(qty)}"])
    if t is not None and t.scope == "service":
        text = f"{text} + {_term(t)}" if t.type == "flat" else f"({text}) × {_term(t)}"
    return f"{text} = {number(group_res(g, qty))}"


def point_arithmetic(e: PointExplanation) -> str:
    """``price = input + group res + ... = total`` (or why there is no price)."""
    if e.failed_field is not None:
        return f"field {e.failed_field!r} is not a number but has thresholds: CloudKitty fails the frame"
    if not e.has_service:
        return f"no service {e.type!r}: the price stays {number(e.input_price)}"
    terms = [f"input {number(e.input_price)}", *(f"{g.name} {number(group_res(g, e.qty))}" for g in e.groups)]
    assert e.price is not None  # not failed
    return " + ".join(terms) + f" = {number(e.price)}"


def _contribution(c: Contribution | None) -> dict[str, Any] | None:
    if c is None:
        return None
    out: dict[str, Any] = {"id": c.rule_id, "type": c.type, "cost": number(c.cost)}
    if c.level is not None:
        out |= {"level": number(c.level), "scope": c.scope}
    return out


def to_json(e: PointExplanation) -> dict[str, Any]:
    """The explanation as JSON values (decimals as exact strings): ``--format json``."""
    price = e.price
    out: dict[str, Any] = {
        "scope_id": e.scope_id, "type": e.type, "begin": e.begin.isoformat(), "end": e.end.isoformat(),
        "qty": number(e.qty), "input_price": number(e.input_price),
        "groups": [{"group": g.name, "flat": _contribution(g.flat), "rates": [_contribution(r) for r in g.rates],
                    "threshold": _contribution(g.threshold), "res": number(group_res(g, e.qty)),
                    "arithmetic": group_arithmetic(g, e.qty)} for g in e.groups],
        "price": None if price is None else number(price),
        "arithmetic": point_arithmetic(e),
        "rules": list(e.rules),
    }
    if e.stored_price is not None:
        out["stored_price"] = number(e.stored_price)
        out["price_matches"] = e.price_matches
        out["lineage"] = "stored" if e.stored_rules is not None else "re-derived"
        out["stored_rules"] = None if e.stored_rules is None else list(e.stored_rules)
        out["rules_match"] = None if e.stored_rules is None else e.stored_rules == e.rules
    return out


def to_text(e: PointExplanation) -> list[str]:
    """The explanation as lines of text: ``--format table``."""
    lines = [f"{e.scope_id} {e.type} {e.begin.isoformat()} qty {number(e.qty)}"]
    lines += [f"  {g.name}: {group_arithmetic(g, e.qty)}" for g in e.groups]
    lines.append(f"  price: {point_arithmetic(e)}")
    if e.stored_price is not None:
        same = "matches" if e.price_matches else "DIFFERS (rules changed since, or another rating module)"
        lines.append(f"  stored price {number(e.stored_price)}: {same}")
        if e.stored_rules is None:
            lines.append("  lineage: not stored by this backend, re-derived from the rules valid at the period's begin")
        elif e.stored_rules != e.rules:
            lines.append(f"  stored lineage {', '.join(e.stored_rules) or '(none)'}: DIFFERS from the current rules")
        else:
            lines.append("  stored lineage: the same rules")
    return lines
