"""CloudKitty's hashmap rating (`cloudkitty/rating/hash/__init__.py:117-276`) over a whole usage batch: vectorized and exact.

Why this shape: a batch mixes many scopes and periods, and CloudKitty's per-point loop is far too
slow for it, but a point's price only depends on a handful of facts that Polars computes for all
points at once: its service, which mapping validity window its period begin falls in, whether its
scope has tenant rules, how many service-threshold levels its qty reaches, which mapping value each
field carries and how many field-threshold levels that value reaches.  Those facts form a small
integer *combination key* (``transforms.hashmap_resolve``); each distinct key is priced once in
Python by replaying CloudKitty's algorithm on its resolved tables (tenant rules replacing global ones
per key, validity ``[start, end)`` at the period begin, thresholds without validity), which yields
``price = input price + K * qty + C`` for every point of that key.  Polars then joins ``K`` and ``C``
back and does the one per-point multiplication.

Field-threshold values are parsed with Python ``Decimal(str)`` once per distinct value: a value
CloudKitty cannot compare (non-numeric, ``''``, NaN) fails the whole (scope, begin, end) frame
(`cloudkitty/rating/hash/__init__.py:193-199`), reported as a failed ``FrameOutcome``; its rows are left out of ``RatingOutcome.rated``.

Decimal policy: ratebeam's price is exact.  ``K`` and ``C`` are computed in an exact ``Decimal``
context (``hashmap_resolve.EXACT``); ``price + K * qty + C`` is computed exactly in Polars at a scale
``S >= scale(K) + 18`` chosen per batch (Polars multiplies exactly and rounds half-even to the larger
operand scale, so nothing rounds there), then rounded half-even once to the price scale 20
(``transforms.schema``).  Combinations whose exact result does not fit 38 digits at such a scale
(costs with very many decimals) are computed per point in Python instead, with the same result; a
price that does not fit ``decimal(38, 20)`` fails its frame.  CloudKitty computes with 28
significant digits: its results equal ratebeam's whenever its context does not round.

A point whose exact quantity has more than qty's 18 decimals carries ``qty_remainder``
(``transforms.schema``), and is priced from ``qty + qty_remainder``: the service-threshold levels
it reaches are those of the exact quantity, and its price is ``round20(X + K * remainder)`` with
``X = price + K * qty + C`` exact at ``S``.  That sum does not fit 38 digits at scale 38, so it is
rounded as ``A + round20(D)``: ``A`` is ``round20(X)`` made an even number of 1e-20 (1e-20 taken
off when odd), ``D`` what is left (below 1e-20 in size, plus ``K * remainder``, at scale 38).
Half-even rounding is unchanged by adding an even number of quanta, so this is the rounding of the
exact sum (``K * remainder`` is itself rounded at the 38th decimal when it has more).

Speed (2 cores, 1M points, 3 services, a 20-value field with tenant overrides, thresholds, 3 groups):
about 0.35-0.6 s per million points, i.e. 1.6-3 M points/s, with Polars' in-memory engine (the
streaming and default engines were not faster here); two collects over the batch, a few thousand
distinct keys priced in Python once per rule set.

Why one module of ~430 lines: encoding the keys, pricing them, the exact slow path, the frame
failures and the lineage join are the stages of one pass over one batch and share its working
columns (``_P``) and key layout; the pieces that stand alone already live apart (resolving the
tables in ``hashmap_resolve``, the traces printed by ``explain``).
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Final

import polars as pl

from ratebeam.transforms.frames import RATE_STAGE, FrameOutcome
from ratebeam.transforms.hashmap_resolve import (
    ABSENT,
    EXACT,
    ROUNDING,
    Combination,
    CompiledRules,
    GroupTrace,
)
from ratebeam.transforms.rules import RuleSet
from ratebeam.transforms.schema import (
    BEGIN,
    END,
    PRICE,
    PRICE_POLARS,
    PRICE_SCALE,
    QTY,
    QTY_POLARS,
    QTY_REMAINDER,
    QTY_REMAINDER_POLARS,
    QTY_SCALE,
    RULES,
    SCOPE,
    TYPE,
    groupby_column,
    metadata_column,
)

_MAX_DIGITS = 38
#: Polars engine of every collect (measured: see the module docstring).
_ENGINE: Final = "in-memory"
_P = "__rb_"  # prefix of the kernel's working columns
_ROW = _P + "row"
_SERVICE = _P + "svc"
_COEF = _P + "k"
_CONST = _P + "c"
_FAIL = _P + "fail"
_SLOW = _P + "slow"
_SLOW_PRICE = _P + "slow_price"
_OVERFLOW = -1  # _FAIL code: the exact price does not fit decimal(38, 20)
_PRICE_QUANTUM = Decimal(1).scaleb(-PRICE_SCALE)
_PRICE_LIMIT = Decimal(10) ** (_MAX_DIGITS - PRICE_SCALE)
_QTY_QUANTUM = Decimal(1).scaleb(-QTY_SCALE)
_QTY_LIMIT = Decimal(10) ** (_MAX_DIGITS - QTY_SCALE) - _QTY_QUANTUM
_INT64_MAX = 2**63 - 1
#: Prefix of the optional ``decimal_column`` of a label column.
DECIMAL_PREFIX = "decimal:"


@dataclass(frozen=True)
class RatingOutcome:
    """What the hashmap made of a batch: the rated rows and the frames that failed.

    ``rated`` holds the rows of the frames that succeeded (same columns, price = input price +
    hashmap price); the rows of the ``failures`` frames are not in it.
    """

    rated: pl.DataFrame
    failures: list[FrameOutcome]


class _CompiledCache:
    """The kernel's view of a rule set, cached per rule set (equal rule sets share their prices).

    The rule ids are part of the cache key: equal rule sets whose ids differ differ in lineage.
    """

    def __init__(self) -> None:
        self._compile = lru_cache(maxsize=8)(lambda rules, _ids: CompiledRules(rules))

    def __call__(self, rules: RuleSet) -> CompiledRules:
        return self._compile(rules, rules.rule_ids())

    def cache_clear(self) -> None:
        """Forget every compiled rule set (benchmarks time compilation)."""
        self._compile.cache_clear()


compile_rules: Final = _CompiledCache()


def rate(usage: pl.DataFrame, rules: RuleSet, *, lineage: bool = False) -> RatingOutcome:
    """Rate a usage batch (columns of ``transforms.schema``, any extra columns carried through).

    Rules apply per (scope_id, begin): a null scope_id sees the global rules only.  A failure fails
    its (scope_id, begin, end) frame.  Points whose type has no service keep their price.
    ``lineage``: the result also has the ``RULES`` column (replacing any input one): the ids of the
    rules that priced each point, comma-separated, null when none did (``docs/lineage.md``).
    """
    compiled = compile_rules(rules)
    columns = usage.columns
    if lineage:
        usage = usage.drop(RULES, strict=False)
        columns = [*usage.columns, RULES]
    if usage.is_empty() or not compiled.services:
        return RatingOutcome(usage.with_columns(pl.lit(None, pl.String).alias(RULES)) if lineage else usage, [])
    layout = _layout(compiled)
    coded = _encode(usage, compiled, layout)
    distinct = coded.lazy().select(layout.words).unique().drop_nulls().collect(engine=_ENGINE)
    combos = {words: layout.price(words) for words in distinct.iter_rows()}
    max_qty, max_price = coded.select(pl.col(QTY).abs().max(), pl.col(PRICE).abs().max()).row(0)
    table = _price_table(layout.words, combos, max_qty or Decimal(0), max_price or Decimal(0), lineage)
    priced = (
        coded.lazy()
        .join(table.lazy(), on=layout.words, how="left", maintain_order="left")
        .with_columns(
            pl.when(pl.col(_COEF).is_not_null())
            .then(_price_expr(_has_remainders(usage)))
            .otherwise(pl.col(PRICE))
            .alias(PRICE)
        )
        .collect(engine=_ENGINE)
    )
    if priced.get_column(_SLOW).any():
        priced = _price_slow_rows(priced, layout.words, combos)
    if not priced.get_column(_FAIL).is_not_null().any():
        return RatingOutcome(priced.select(columns), [])
    firsts = _first_failures(priced, compiled)
    rated = priced.join(firsts.select(SCOPE, BEGIN, END), on=[SCOPE, BEGIN, END], how="anti", nulls_equal=True,
                        maintain_order="left")
    return RatingOutcome(rated.select(columns), _failures(firsts, compiled))


def _has_remainders(usage: pl.DataFrame) -> bool:
    """Whether some point's exact quantity has more decimals than its qty (``qty_remainder``)."""
    return QTY_REMAINDER in usage.columns and usage.get_column(QTY_REMAINDER).null_count() < usage.height


#: One quantum of the price (1e-20), at the remainder's scale, and zero.
_QUANTUM_38 = pl.lit(_PRICE_QUANTUM, dtype=QTY_REMAINDER_POLARS)
_ZERO_38 = pl.lit(Decimal(0), dtype=QTY_REMAINDER_POLARS)


def _price_expr(remainders: bool) -> pl.Expr:
    """``price + K * qty + C`` rounded half-even to the price scale once.

    With ``remainders``, of the exact quantity ``qty + qty_remainder`` (the module docstring says how).
    """
    exact = pl.col(PRICE) + pl.col(_COEF) * pl.col(QTY) + pl.col(_CONST)  # exact at the batch scale S
    rounded = exact.cast(PRICE_POLARS)
    if not remainders:
        return rounded
    odd = pl.when(rounded.to_physical() % 2 != 0).then(_QUANTUM_38).otherwise(_ZERO_38)
    left = ((exact - rounded).cast(QTY_REMAINDER_POLARS) + odd
            + pl.col(_COEF) * pl.col(QTY_REMAINDER).fill_null(_ZERO_38))
    return rounded - odd.cast(PRICE_POLARS) + left.cast(PRICE_POLARS)


def point_traces(usage: pl.DataFrame, rules: RuleSet) -> list[list[GroupTrace] | str | None]:
    """Per row of ``usage``, how the hashmap prices it (``ratebeam report explain``, ``rate --explain``).

    Each item is the row's group traces (insertion order, as CloudKitty sums them), the name of the
    field whose value CloudKitty cannot compare with its thresholds (the frame fails), or None when
    no service has the row's type.  The same encoding as ``rate``: what it explains is what it prices.
    """
    compiled = compile_rules(rules)
    if usage.is_empty() or not compiled.services:
        return [None] * usage.height
    layout = _layout(compiled)
    out: list[list[GroupTrace] | str | None] = []
    for words in _encode(usage, compiled, layout).select(layout.words).iter_rows():
        if words[0] is None:
            out.append(None)
            continue
        traced = compiled.explain(layout.key(words))
        out.append(compiled.labels[traced].name if isinstance(traced, int) else traced)
    return out


class _KeyLayout:
    """Packs a combination key (small non-negative codes) into as few Int64 columns as fit.

    Joins and distincts on one integer column are several times faster than on a dozen code columns.
    """

    def __init__(self, compiled: CompiledRules) -> None:
        self.compiled = compiled
        self.radices = radices = compiled.key_radices
        self._prices: dict[tuple[int, ...], Combination] = {}
        self.slots: list[tuple[int, int]] = []  # per key position: (word, multiplier)
        word, multiplier = 0, 1
        for radix in radices:
            if multiplier * radix > _INT64_MAX:
                word, multiplier = word + 1, 1
            self.slots.append((word, multiplier))
            multiplier *= radix
        self.words = [_P + f"key{w}" for w in range(word + 1)]

    def pack(self, codes: dict[int, pl.Expr | None]) -> list[pl.Expr]:
        """Word expressions from the codes of some key positions (the others, or None, count as 0)."""
        terms: list[list[pl.Expr]] = [[] for _ in self.words]
        for position, code in codes.items():
            if code is not None:
                word, multiplier = self.slots[position]
                terms[word].append(code.cast(pl.Int64) * multiplier)
        return [pl.sum_horizontal(t) if t else pl.lit(0, dtype=pl.Int64) for t in terms]

    def key(self, words: tuple[int, ...]) -> tuple[int, ...]:
        """The combination key packed in ``words``."""
        return tuple((words[w] // m) % r for (w, m), r in zip(self.slots, self.radices, strict=True))

    def price(self, words: tuple[int, ...]) -> Combination:
        """The combination of packed ``words``.

        Cached: a batch has few distinct keys, a run many batches.
        """
        combination = self._prices.get(words)
        if combination is None:
            combination = self._prices[words] = self.compiled.price(self.key(words))
        return combination


@lru_cache(maxsize=8)
def _layout(compiled: CompiledRules) -> _KeyLayout:
    return _KeyLayout(compiled)


def _raw_value_column(label: int) -> str:
    return _P + f"v{label}"


def _encode(usage: pl.DataFrame, compiled: CompiledRules, layout: _KeyLayout) -> pl.DataFrame:
    """The usage batch plus every point's packed combination key (null when its type has no service).

    One pass over the batch, then the field-threshold codes from each field's distinct values,
    parsed in Python.
    """
    service = pl.col(_SERVICE)

    def restricted(code: pl.Expr, services: list[int]) -> pl.Expr | None:
        """``code`` on the rows of these services, 0 elsewhere (fewer distinct keys)."""
        if not services:
            return None
        return pl.when(service.is_in(services)).then(code).otherwise(0)

    codes: dict[int, pl.Expr | None] = {
        0: service,
        1: restricted(pl.lit(pl.Series(compiled.breakpoints, dtype=usage.schema[BEGIN]))
                      .search_sorted(pl.col(BEGIN), side="right"),
                      [s.code for s in compiled.services if s.has_windows]),
        2: restricted(_enum_code(pl.col(SCOPE), compiled.tenants),
                      [s.code for s in compiled.services if s.has_tenant_rules]),
        3: restricted(_levels_reached(compiled.levels, _has_remainders(usage)),
                      [s.code for s in compiled.services if s.has_levels]),
    }
    for position, i in enumerate(compiled.mapping_labels, start=4):
        label = compiled.labels[i]
        value = _label_value(label.name, usage.columns)
        if value is not None:
            codes[position] = restricted(_enum_code(value, label.values), list(label.mapping_services))
    raw_values = []
    for i in compiled.threshold_labels:
        label = compiled.labels[i]
        value = _label_value(label.name, usage.columns, for_thresholds=True)
        raw = pl.lit(None, dtype=pl.String) if value is None else (
            pl.when(service.is_in(label.threshold_services)).then(value))
        raw_values.append(raw.alias(_raw_value_column(i)))
    services = [s.name for s in compiled.services]
    coded = (
        usage.lazy()
        .with_row_index(_ROW)
        .with_columns(pl.col(TYPE).cast(pl.String).cast(pl.Enum(services), strict=False).to_physical()
                      .cast(pl.Int32).alias(_SERVICE))
        .with_columns(*raw_values, *(
            pl.when(service.is_not_null()).then(word).alias(name)
            for name, word in zip(layout.words, layout.pack(codes), strict=True)))
        .collect(engine=_ENGINE)
    )
    threshold_codes: dict[int, pl.Expr | None] = {}
    for position, i in enumerate(compiled.threshold_labels, start=4 + len(compiled.mapping_labels)):
        label = compiled.labels[i]
        values = coded.get_column(_raw_value_column(i)).drop_nulls().unique().to_list()
        threshold_codes[position] = pl.col(_raw_value_column(i)).replace_strict(
            values, [label.threshold_code(v) for v in values], default=ABSENT, return_dtype=pl.Int32)
    if not threshold_codes:
        return coded
    return coded.with_columns(
        (pl.col(name) + term).alias(name)
        for name, term in zip(layout.words, layout.pack(threshold_codes), strict=True))


def _enum_code(value: pl.Expr, categories: tuple[str, ...]) -> pl.Expr:
    """1 + the index of ``value`` in ``categories``, 0 when absent or not one of them.

    An Enum cast: a hash lookup, about twice as fast as ``replace_strict`` here.
    """
    if not categories:
        return pl.lit(0, dtype=pl.Int32)
    return (value.cast(pl.String).cast(pl.Enum(list(categories)), strict=False).to_physical()
            .cast(pl.Int32) + 1).fill_null(0)


def _levels_reached(levels: tuple[Decimal, ...], remainders: bool) -> pl.Expr:
    """How many service-threshold levels each point's quantity reaches (``qty >= level``).

    With ``remainders``, of the exact quantity: a qty rounded up onto a level (its remainder is
    negative) is just below it.
    """
    series = _qty_levels(levels)
    reached = pl.lit(series).search_sorted(pl.col(QTY), side="right")
    if not remainders:
        return reached
    below = pl.col(QTY).is_in(series) & (pl.col(QTY_REMAINDER) < 0)
    return pl.when(below.fill_null(False)).then(reached - 1).otherwise(reached)


def _qty_levels(levels: tuple[Decimal, ...]) -> pl.Series:
    """Service-threshold levels as qty-scale decimals that preserve ``qty >= level``.

    A qty is a multiple of 1e-18, so ``qty >= L`` iff ``qty >= ceil(L, 1e-18)``; levels below the
    qty range are clamped to its minimum and levels above it (never reached) are dropped.
    """
    out = []
    for level in levels:
        ceiled = level.quantize(_QTY_QUANTUM, rounding=decimal.ROUND_CEILING, context=ROUNDING)
        if ceiled > _QTY_LIMIT:
            break
        out.append(max(ceiled, -_QTY_LIMIT))
    return pl.Series(out, dtype=QTY_POLARS)


def decimal_column(label_column: str) -> str:
    """Name of the optional column with the value CloudKitty's ``Decimal(value)`` sees for a label.

    It is set where that value differs from the label's text, for field thresholds: a JSON number
    or boolean label of an interchange file is matched as ``str(value)`` but compared as
    ``Decimal(value)`` (``Decimal(True)`` is 1,
    ``Decimal(0.3)`` the float's binary value).  Null where the label text is the value.
    """
    return DECIMAL_PREFIX + label_column


def _label_value(name: str, columns: list[str], for_thresholds: bool = False) -> pl.Expr | None:
    """``desc[name]``: metadata overlaid by groupby (groupby wins); None when no point has it.

    ``for_thresholds``: the text ``Decimal()`` parses, from ``decimal_column`` where present.
    """
    parts = []
    for column in (groupby_column(name), metadata_column(name)):
        if column in columns:
            text = pl.col(column).cast(pl.String)
            typed = decimal_column(column)
            parts.append(pl.coalesce(pl.col(typed).cast(pl.String), text)
                         if for_thresholds and typed in columns else text)
    return pl.coalesce(parts) if parts else None


def _price_table(keys: list[str], combos: dict[tuple[int, ...], Combination],
                 max_qty: Decimal, max_price: Decimal, lineage: bool = False) -> pl.DataFrame:
    """Per combination key: K and C at one exact scale for the batch, or the slow / failed flag.

    With ``lineage``, also the ``RULES`` of each key: one small string per key, joined to the points
    with K and C (Polars' string views make that join copy no characters).

    A combination is computed in Polars when ``price + K * qty + C`` is exact at the batch scale
    ``S`` (at least its own ``scale``) and every operand and result fits 38 digits at ``S``, for the
    batch's largest qty and price.
    """
    ok = [c for c in combos.values() if c.failed_label is None]
    max_k = max((abs(c.coefficient) for c in ok), default=Decimal(0))
    max_c = max((abs(c.constant) for c in ok), default=Decimal(0))
    bound = max(EXACT.add(EXACT.add(max_price, max_c), EXACT.multiply(max_k, max_qty)), max_k, max_c)
    cap = _MAX_DIGITS - (bound.adjusted() + 1 if bound >= 1 else 0)
    values = list(combos.values())
    fast = [c.failed_label is None and PRICE_SCALE <= c.scale <= cap for c in values]
    scale = max((c.scale for c, f in zip(values, fast, strict=True) if f), default=PRICE_SCALE)
    columns: dict[str, list] = {k: [key[j] for key in combos] for j, k in enumerate(keys)}
    columns[_COEF] = [c.coefficient if f else None for c, f in zip(values, fast, strict=True)]
    columns[_CONST] = [c.constant if f else None for c, f in zip(values, fast, strict=True)]
    columns[_FAIL] = [c.failed_label for c in values]
    columns[_SLOW] = [c.failed_label is None and not f for c, f in zip(values, fast, strict=True)]
    schema: dict[str, pl.DataType] = {k: pl.Int64() for k in keys}
    schema |= {_COEF: pl.Decimal(_MAX_DIGITS, scale), _CONST: pl.Decimal(_MAX_DIGITS, scale),
               _FAIL: pl.Int32(), _SLOW: pl.Boolean()}
    if lineage:
        columns[RULES] = [",".join(c.rules) or None for c in values]
        schema[RULES] = pl.String()
    return pl.DataFrame(columns, schema=schema)


def _price_slow_rows(priced: pl.DataFrame, keys: list[str],
                     combos: dict[tuple[int, ...], Combination]) -> pl.DataFrame:
    """Exact prices of the rows whose combination does not fit the vectorized path.

    Rare (costs with very many decimals): one Python ``Decimal`` computation per point.
    """
    remainder = pl.col(QTY_REMAINDER) if QTY_REMAINDER in priced.columns else pl.lit(None, QTY_REMAINDER_POLARS)
    slow = priced.filter(pl.col(_SLOW)).select(_ROW, QTY, PRICE, remainder.alias(QTY_REMAINDER), *keys)
    prices: list[Decimal | None] = []
    for row in slow.iter_rows():
        combo = combos[row[4:]]
        qty = row[1] if row[3] is None else EXACT.add(row[1], row[3])  # the exact quantity
        exact = EXACT.add(EXACT.add(row[2], EXACT.multiply(combo.coefficient, qty)), combo.constant)
        price = exact.quantize(_PRICE_QUANTUM, rounding=decimal.ROUND_HALF_EVEN, context=ROUNDING)
        prices.append(price if abs(price) < _PRICE_LIMIT else None)
    fixed = pl.DataFrame({_ROW: slow.get_column(_ROW), _SLOW_PRICE: pl.Series(prices, dtype=PRICE_POLARS)})
    return (
        priced.join(fixed, on=_ROW, how="left", maintain_order="left")
        .with_columns(
            pl.coalesce(_SLOW_PRICE, PRICE).alias(PRICE),
            pl.when(pl.col(_SLOW) & pl.col(_SLOW_PRICE).is_null()).then(pl.lit(_OVERFLOW, dtype=pl.Int32))
            .otherwise(pl.col(_FAIL)).alias(_FAIL),
        )
        .drop(_SLOW_PRICE)
    )


def _first_failures(priced: pl.DataFrame, compiled: CompiledRules) -> pl.DataFrame:
    """Each failed (scope, begin, end) with the type, failure code and raw values of its first failing point."""
    raw = [_raw_value_column(i) for i in compiled.threshold_labels]
    return (
        priced.lazy()
        .filter(pl.col(_FAIL).is_not_null())
        .group_by(SCOPE, BEGIN, END, maintain_order=True)
        .agg(pl.col(TYPE, _FAIL, *raw).first())
        .collect(engine=_ENGINE)
    )


def _failures(firsts: pl.DataFrame, compiled: CompiledRules) -> list[FrameOutcome]:
    """One failed ``FrameOutcome`` per row of ``_first_failures``, with CloudKitty's reason."""
    out = []
    for row in firsts.iter_rows(named=True):
        code = row[_FAIL]
        if code == _OVERFLOW:
            reason = f"type {row[TYPE]!r}: the price does not fit decimal(38, {PRICE_SCALE})"
        else:
            label = compiled.labels[code]
            reason = (f"service {row[TYPE]!r}: field {label.name!r} has thresholds but its value "
                      f"{row[_raw_value_column(code)]!r} is not a number (CloudKitty fails the frame)")
        out.append(FrameOutcome(row[SCOPE], row[BEGIN], False, RATE_STAGE, reason, end=row[END]))
    return out
