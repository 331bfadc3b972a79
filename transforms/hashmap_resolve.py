"""The Python half of the hashmap kernel: rule resolution and exact pricing of rule combinations.

``transforms.hashmap`` reduces every point to a small integer *combination key* (service, validity
epoch, tenant, qty bucket, one code per field) with vectorized Polars expressions; this module says
what each code means and prices each distinct key once, replaying CloudKitty's algorithm (`cloudkitty/rating/hash/__init__.py:117-157`,
`cloudkitty/rating/hash/__init__.py:159-276`) on its in-memory tables, in exact ``Decimal`` arithmetic.  The number of distinct keys depends
on the rules, not on the number of points, so this is the only per-combination Python work.

Key codes (all per compiled ``RuleSet``, stable across batches, so prices are cached):

- service: index in ``RuleSet.services``;
- epoch: how many validity breakpoints (distinct mapping ``start`` / ``end``) are ``<= period
  begin``; all begins of one epoch see the same valid mappings (``[start, end)``); 0 for services
  whose mappings have no window;
- tenant: 0 = global rules only, ``i`` = the ``i``-th tenant having rules (0 for services without
  tenant rules);
- qty bucket: how many distinct service-threshold levels are ``<= qty`` (0 for services without
  service thresholds);
- per field name with mappings: 0 = absent or no mapping value, ``i`` = mapping value ``i - 1``;
- per field name with thresholds: ``ABSENT``, ``INVALID`` (``Decimal(value)`` raises or is NaN, so
  CloudKitty fails the frame), or ``FIRST_BUCKET + number of threshold levels <= Decimal(value)``.
"""

from __future__ import annotations

import decimal
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import cast

from ratebeam.transforms.rules import DEFAULT_GROUP, MappingRule, RuleSet, ThresholdRule
from ratebeam.transforms.schema import PRICE_SCALE, QTY_SCALE

ABSENT = 0
INVALID = 1
FIRST_BUCKET = 2

_SERVICE = "service"
_FIELD = "field"
_ZERO = Decimal(0)
_ONE = Decimal(1)
_NO_LEVEL = Decimal(-1)

#: Additions and multiplications in this context are exact (the traps prove it): nothing rounds
#: until the kernel rounds the final price once.
EXACT = decimal.Context(
    prec=decimal.MAX_PREC,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    rounding=decimal.ROUND_HALF_EVEN,
    traps=[decimal.InvalidOperation, decimal.Inexact, decimal.Overflow, decimal.DivisionByZero],
)
#: The same range without the ``Inexact`` trap: for the explicit roundings (``quantize``).
ROUNDING = EXACT.copy()
ROUNDING.traps[decimal.Inexact] = False


def decimal_scale(value: Decimal) -> int:
    """Digits after the point of ``value`` once trailing zeros are stripped (0 for integers)."""
    # The exponent is a letter only for NaN and infinities, which rule costs never are.
    return max(0, -cast(int, value.normalize(EXACT).as_tuple().exponent))


@dataclass(frozen=True, slots=True)
class LabelCodes:
    """How the values of one field name are encoded per point (see the module docstring)."""

    name: str
    values: tuple[str, ...]  # mapping values, code i + 1
    mapping_services: tuple[int, ...]  # service codes with mappings on this field
    levels: tuple[Decimal, ...]  # sorted distinct threshold levels
    threshold_services: tuple[int, ...]  # service codes with thresholds on this field

    def threshold_code(self, raw: str) -> int:
        """Code of a present value for threshold comparison, with Python ``Decimal(str)`` parsing."""
        try:
            number = Decimal(raw)
        except (decimal.InvalidOperation, ValueError, TypeError):
            return INVALID
        if number.is_nan():  # NaN >= level raises InvalidOperation in CloudKitty
            return INVALID
        return FIRST_BUCKET + bisect_right(self.levels, number)


@dataclass(frozen=True, slots=True)
class Combination:
    """Price of every point of one combination key: ``price + coefficient * qty + constant``.

    ``failed_label`` is the index (in ``CompiledRules.labels``) of the field whose value CloudKitty
    cannot compare with its thresholds: the point, hence its frame, fails.
    """

    coefficient: Decimal = _ZERO
    constant: Decimal = _ZERO
    failed_label: int | None = None
    #: decimals of the exact ``price + coefficient * qty + constant`` (batch qty and price scales)
    scale: int = PRICE_SCALE
    #: ids of the rules that priced it (``GroupTrace.rule_ids`` of every group): its lineage
    rules: tuple[str, ...] = ()


#: A rule as the resolved tables hold it: (type, cost, id).
_Cost = tuple[str, Decimal, str | None]


@dataclass(frozen=True, slots=True)
class Contribution:
    """One rule that entered a group's price: what ``ratebeam report explain`` prints."""

    kind: str  # "flat", "rate" (mappings) or "threshold"
    rule_id: str | None
    type: str  # flat | rate
    cost: Decimal
    level: Decimal | None = None  # thresholds
    scope: str | None = None  # thresholds: "service" (after the qty) or "field" (on the flat / rate)


@dataclass(frozen=True, slots=True)
class GroupTrace:
    """How one group of `cloudkitty/rating/hash/__init__.py:159-276` priced a point: ``res = coefficient * qty + constant``."""

    name: str
    flat: Contribution | None
    rates: tuple[Contribution, ...]
    threshold: Contribution | None
    coefficient: Decimal
    constant: Decimal

    @property
    def rule_ids(self) -> tuple[str, ...]:
        """Ids of the rules that entered this group (flat winner, every rate, the kept threshold)."""
        used = (self.flat, *self.rates, self.threshold)
        return tuple(c.rule_id for c in used if c is not None and c.rule_id is not None)


@dataclass(slots=True)
class _Resolved:
    """CloudKitty's in-memory tables of one service for one (epoch, tenant) (`cloudkitty/rating/hash/__init__.py:117-157`)."""

    service_mappings: dict[str, _Cost] = field(default_factory=dict)
    service_thresholds: dict[str, dict[Decimal, _Cost]] = field(default_factory=dict)
    field_mappings: dict[str, dict[str | None, dict[str, _Cost]]] = field(default_factory=dict)
    field_thresholds: dict[str, dict[str, dict[Decimal, _Cost]]] = field(default_factory=dict)


class _GroupAcc:
    """One group's accumulator of `cloudkitty/rating/hash/__init__.py:249-265`, remembering which rule set each part (lineage)."""

    __slots__ = ("flat", "flat_rule", "rate", "rates", "thr_cost", "thr_level", "thr_rule", "thr_scope", "thr_type")

    def __init__(self) -> None:
        self.flat = _ZERO
        self.flat_rule: Contribution | None = None
        self.rate = _ONE
        self.rates: list[Contribution] = []
        self.thr_level = _NO_LEVEL
        self.thr_type = "flat"
        self.thr_cost = _ZERO
        self.thr_scope = _FIELD
        self.thr_rule: Contribution | None = None

    def apply(self, rule: _Cost) -> None:
        map_type, cost, rule_id = rule
        if map_type == "rate":
            self.rate = EXACT.multiply(self.rate, cost)
            self.rates.append(Contribution("rate", rule_id, map_type, cost))
        elif cost > self.flat:
            self.flat, self.flat_rule = cost, Contribution("flat", rule_id, map_type, cost)

    def offer(self, level: Decimal, rule: _Cost, scope: str) -> None:
        if level > self.thr_level:
            map_type, cost, rule_id = rule
            self.thr_level, self.thr_type, self.thr_cost, self.thr_scope = level, map_type, cost, scope
            self.thr_rule = Contribution("threshold", rule_id, map_type, cost, level, scope)

    def trace(self, name: str) -> GroupTrace:
        """The group's contributions and its ``res`` terms."""
        coefficient, constant = self.terms()
        return GroupTrace(name, self.flat_rule, tuple(self.rates), self.thr_rule, coefficient, constant)

    def terms(self) -> tuple[Decimal, Decimal]:
        """(per-unit coefficient, constant) of this group's ``res`` (`cloudkitty/rating/hash/__init__.py:159-176`)."""
        flat, rate = self.flat, self.rate
        if self.thr_scope == _FIELD:
            if self.thr_type == "flat":
                flat = EXACT.add(flat, self.thr_cost)
            else:
                rate = EXACT.multiply(rate, self.thr_cost)
        coefficient = EXACT.multiply(rate, flat)
        if self.thr_scope == _SERVICE:
            if self.thr_type == "flat":
                return coefficient, self.thr_cost
            return EXACT.multiply(coefficient, self.thr_cost), _ZERO
        return coefficient, _ZERO


class ServiceRules:
    """Every rule of one service, and its resolution per (epoch, tenant), cached."""

    def __init__(self, code: int, name: str, fields: tuple[str, ...], mappings: tuple[MappingRule, ...],
                 thresholds: tuple[ThresholdRule, ...], breakpoints: dict[datetime, int],
                 tenants: tuple[str, ...]) -> None:
        self.code = code
        self.name = name
        self.fields = fields
        self.mappings = mappings
        self.thresholds = thresholds
        self._breakpoint_index = breakpoints
        self._tenants = tenants
        #: what the service's points need codes for
        self.has_windows = any(m.start is not None or m.end is not None for m in mappings)
        every_rule: tuple[MappingRule | ThresholdRule, ...] = (*mappings, *thresholds)
        self.has_tenant_rules = any(r.tenant_id is not None for r in every_rule)
        self.has_levels = any(t.field is None for t in thresholds)
        self._resolved: dict[tuple[int, int], _Resolved] = {}

    def resolve(self, epoch: int, tenant: int) -> _Resolved:
        """The tables CloudKitty builds for a scope at a period begin in ``epoch`` (`cloudkitty/rating/hash/__init__.py:117-157`)."""
        key = (epoch, tenant)
        resolved = self._resolved.get(key)
        if resolved is None:
            resolved = self._resolved[key] = self._build(epoch, self._tenants[tenant - 1] if tenant else None)
        return resolved

    def _valid(self, rule: MappingRule, epoch: int) -> bool:
        # start <= begin  <=>  epoch > index(start);  begin < end  <=>  epoch <= index(end)
        return (rule.start is None or self._breakpoint_index[rule.start] < epoch) and (
            rule.end is None or epoch <= self._breakpoint_index[rule.end]
        )

    def _build(self, epoch: int, tenant: str | None) -> _Resolved:
        out = _Resolved()
        # Global rules first, then the tenant's: a tenant rule replaces the global one with the same
        # key (dict update), and within one pass the last loaded wins, as in CloudKitty.
        for owner in (None, tenant) if tenant is not None else (None,):
            for m in self.mappings:
                if m.tenant_id != owner or not self._valid(m, epoch):
                    continue
                group = m.group or DEFAULT_GROUP
                if m.field is None:
                    out.service_mappings[group] = (m.type, m.cost, m.id)
                else:
                    by_value = out.field_mappings.setdefault(m.field, {})
                    by_value.setdefault(m.value, {})[group] = (m.type, m.cost, m.id)
            for t in self.thresholds:
                if t.tenant_id != owner:
                    continue
                group = t.group or DEFAULT_GROUP
                table = (out.service_thresholds if t.field is None
                         else out.field_thresholds.setdefault(t.field, {}))
                table.setdefault(group, {})[t.level] = (t.type, t.cost, t.id)
        return out


class CompiledRules:
    """A ``RuleSet`` prepared for the kernel: codes, breakpoints, levels, and cached prices."""

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules
        service_codes = {name: i for i, name in enumerate(rules.services)}
        fields_of: dict[str, list[str]] = {name: [] for name in rules.services}
        for service, name in rules.fields:
            if service in fields_of and name not in fields_of[service]:
                fields_of[service].append(name)
        mappings = tuple(m for m in rules.mappings if m.service in service_codes)
        thresholds = tuple(t for t in rules.thresholds if t.service in service_codes)
        self.breakpoints: tuple[datetime, ...] = tuple(sorted(
            {m.start for m in mappings if m.start is not None} | {m.end for m in mappings if m.end is not None}))
        every_rule: tuple[MappingRule | ThresholdRule, ...] = (*mappings, *thresholds)
        self.tenants = _first_seen(r.tenant_id for r in every_rule if r.tenant_id is not None)
        self.levels = _sorted_distinct(t.level for t in thresholds if t.field is None)
        breakpoint_index = {b: i for i, b in enumerate(self.breakpoints)}
        self.services = tuple(
            ServiceRules(code, name, tuple(fields_of[name]),
                         tuple(m for m in mappings if m.service == name),
                         tuple(t for t in thresholds if t.service == name),
                         breakpoint_index, self.tenants)
            for name, code in service_codes.items()
        )
        names = _first_seen(f for _, f in rules.fields)
        labels = []
        for name in names:
            maps = [m for m in mappings if m.field == name]
            thrs = [t for t in thresholds if t.field == name]
            labels.append(LabelCodes(
                name=name,
                values=_first_seen(m.value for m in maps if m.value is not None),
                mapping_services=_sorted_codes(service_codes[m.service] for m in maps),
                levels=_sorted_distinct(t.level for t in thrs),
                threshold_services=_sorted_codes(service_codes[t.service] for t in thrs),
            ))
        self.labels = tuple(labels)
        self._label_index = {label.name: i for i, label in enumerate(self.labels)}
        #: labels that get a mapping code / a threshold code column, in key order
        self.mapping_labels = tuple(i for i, label in enumerate(self.labels) if label.values)
        self.threshold_labels = tuple(i for i, label in enumerate(self.labels) if label.levels)
        #: one more than the largest value of each key position (for packing keys into integers)
        self.key_radices: tuple[int, ...] = (
            len(self.services),
            1 + len(self.breakpoints),
            1 + len(self.tenants),
            1 + len(self.levels),
            *(1 + len(self.labels[i].values) for i in self.mapping_labels),
            *(FIRST_BUCKET + 1 + len(self.labels[i].levels) for i in self.threshold_labels),
        )

    def price(self, key: tuple[int, ...]) -> Combination:
        """Price of a combination key (the caller caches it), with the ids of the rules that made it.

        The key is ``(service, epoch, tenant, qty bucket, *mapping codes, *threshold codes)``.
        """
        groups = self.explain(key)
        if isinstance(groups, int):
            return Combination(failed_label=groups)
        coefficient, constant = _ZERO, _ZERO
        for g in groups:
            coefficient = EXACT.add(coefficient, g.coefficient)
            constant = EXACT.add(constant, g.constant)
        coefficient, constant = coefficient.normalize(EXACT), constant.normalize(EXACT)
        scale = max(decimal_scale(coefficient) + QTY_SCALE, decimal_scale(constant), PRICE_SCALE)
        rules = tuple(dict.fromkeys(i for g in groups for i in g.rule_ids))
        return Combination(coefficient, constant, None, scale, rules)

    def explain(self, key: tuple[int, ...]) -> list[GroupTrace] | int:
        """Each touched group's trace (insertion order, as CloudKitty sums them) for a combination key.

        An ``int`` is the index of the label whose value CloudKitty cannot compare: the point fails.
        """
        service_code, epoch, tenant, qty_bucket = key[:4]
        n_maps = len(self.mapping_labels)
        mapping_code = dict(zip(self.mapping_labels, key[4:4 + n_maps], strict=True))
        threshold_code = dict(zip(self.threshold_labels, key[4 + n_maps:], strict=True))
        service = self.services[service_code]
        tables = service.resolve(epoch, tenant)
        acc: dict[str, _GroupAcc] = {}

        def group(name: str) -> _GroupAcc:
            g = acc.get(name)
            if g is None:
                g = acc[name] = _GroupAcc()
            return g

        for name, rule in tables.service_mappings.items():
            group(name).apply(rule)
        reached = frozenset(self.levels[:qty_bucket])
        for name, levels in tables.service_thresholds.items():
            for level, rule in levels.items():
                if level in reached:
                    group(name).offer(level, rule, _SERVICE)
        for field_name in service.fields:
            index = self._label_index[field_name]
            label = self.labels[index]
            code = mapping_code.get(index, 0)
            if code:
                for name, rule in tables.field_mappings.get(field_name, {}).get(
                        label.values[code - 1], {}).items():
                    group(name).apply(rule)
            thresholds = tables.field_thresholds.get(field_name)
            code = threshold_code.get(index, ABSENT)
            if not thresholds or code == ABSENT:
                continue
            if code == INVALID:
                return index
            passed = frozenset(label.levels[:code - FIRST_BUCKET])
            for name, levels in thresholds.items():
                for level, rule in levels.items():
                    if level in passed:
                        group(name).offer(level, rule, _FIELD)
        return [g.trace(name) for name, g in acc.items()]


def _first_seen(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _sorted_distinct(levels: Iterable[Decimal]) -> tuple[Decimal, ...]:
    # Decimal equality merges 8 and 8.00000000, as CloudKitty's dict keys do.
    return tuple(sorted(set(levels)))


def _sorted_codes(codes: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(codes)))
