"""The columns of usage and rated batches, and the decimal policy they carry.

Every stage (collectors, the rating kernel, storage backends) exchanges Arrow record batches with
these columns, so one module owns their names and types.

Decimal policy (why these numbers):
- ``qty`` is ``decimal128(38, 18)``: 20 integer digits (petabytes counted in bytes fit) and 18
  decimals, which holds Prometheus' 9-significant-digit quantities exactly for any value >= 1e-9
  and any fraction-of-a-unit factor output to 1e-18.  Quantities with more decimals (``factor:
  1/1073741824`` on a byte count has 30; Gnocchi's binary float expansions have more) are stored
  rounded half-even at 1e-18, but priced from the exact quantity: until rating, such a point
  carries ``qty_remainder`` (exact quantity - qty, ``decimal128(38, 38)``: exact up to 38
  decimals), which the rating stage drops (CloudKitty prices from its 28 significant digits).
- ``price`` is ``decimal128(38, 20)``: 18 integer digits and 20 decimals.  The kernel computes the
  exact product of cost and quantity (costs are NUMERIC(40,28) but stored normalised) and rounds
  half-even at 1e-20 only when the exact price has more than 20 decimals.
- Costs and levels never enter Polars with their raw scale-28 representation: the kernel folds
  them in Python ``Decimal`` per distinct rule combination (see ``transforms.hashmap``).
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Context, Decimal

import polars as pl
import pyarrow as pa

QTY_SCALE = 18
PRICE_SCALE = 20
QTY_ARROW = pa.decimal128(38, QTY_SCALE)
PRICE_ARROW = pa.decimal128(38, PRICE_SCALE)
QTY_POLARS = pl.Decimal(38, QTY_SCALE)
PRICE_POLARS = pl.Decimal(38, PRICE_SCALE)
TIME_ARROW = pa.timestamp("us", tz="UTC")
TIME_POLARS = pl.Datetime("us", "UTC")

SCOPE = "scope_id"
TYPE = "type"
BEGIN = "begin"
END = "end"
QTY = "qty"
PRICE = "price"
UNIT = "unit"
POINT_ID = "point_id"
#: What a point's exact quantity has beyond ``qty``: exact - qty, |remainder| <= 5e-19; absent or
#: null when ``qty`` is exact.  Made by the conversion, read by the rating kernel, never stored.
QTY_REMAINDER = "qty_remainder"
QTY_REMAINDER_SCALE = 38
QTY_REMAINDER_POLARS = pl.Decimal(38, QTY_REMAINDER_SCALE)
#: Lineage: the ids of the hashmap rules that priced a point, comma-separated (``docs/lineage.md``).
RULES = "rating_rules"

GROUPBY_PREFIX = "groupby."
METADATA_PREFIX = "metadata."

#: Columns every usage batch has, in this order, before the label columns.
CORE_COLUMNS: tuple[str, ...] = (SCOPE, TYPE, BEGIN, END, QTY, PRICE, UNIT)

#: The four time keys CloudKitty adds to every point's groupby (`cloudkitty/collector/__init__.py:285-309`).
TIME_KEYS: tuple[str, ...] = ("week_of_the_year", "day_of_the_year", "month", "year")

#: decimal128's 38 digits: any value that fits quantizes, a wider one raises InvalidOperation
#: (instead of tripping Python's default 28-digit context on values >= 1e10).
_WIDE = Context(prec=38)
_QTY_QUANTUM = Decimal(1).scaleb(-QTY_SCALE)
_PRICE_QUANTUM = Decimal(1).scaleb(-PRICE_SCALE)
_REMAINDER_QUANTUM = Decimal(1).scaleb(-QTY_REMAINDER_SCALE)
#: Enough digits for a quantity's exact expansion (the subtraction then never rounds before quantize).
_EXACT_SUM = Context(prec=1000)


def groupby_column(key: str) -> str:
    """Column holding the groupby label ``key``; a null cell means the point has no such key."""
    return GROUPBY_PREFIX + key


def metadata_column(key: str) -> str:
    """Column holding the metadata label ``key``; a null cell means the point has no such key."""
    return METADATA_PREFIX + key


def label_keys(columns: list[str] | tuple[str, ...], prefix: str) -> list[str]:
    """The label keys (without prefix) of the columns starting with ``prefix``, in column order."""
    return [c[len(prefix):] for c in columns if c.startswith(prefix)]


def quantize_qty(value: Decimal) -> Decimal:
    """Round a quantity to the batch scale (half-even), the one place quantities lose digits."""
    return value.quantize(_QTY_QUANTUM, rounding=ROUND_HALF_EVEN, context=_WIDE)


def qty_from_micros(totals: list[int | Decimal], seconds_per_unit: int) -> pa.Array:
    """The quantities of active microseconds ``totals`` (× a qty trait) in ``seconds_per_unit``, rounded at qty's scale.

    Hand-built because it is hot (every lifecycle bill of a period end, ``transforms.events.lifecycle``): whole microseconds in seconds (the
    default unit, no qty trait) are their unscaled value times 10**12 exactly, written straight into
    the Arrow decimal's 16-byte words; anything else is ``quantize_qty`` of the exact quotient.
    Converting each row through a ``Decimal`` was a third of a bill's cost.
    """
    shift = 10 ** (QTY_SCALE - 6)
    units = [q * shift if type(q) is int and seconds_per_unit == 1
             else int(quantize_qty(Decimal(q).scaleb(-6) / seconds_per_unit).scaleb(QTY_SCALE))
             for q in totals]
    words = b"".join(u.to_bytes(16, "little", signed=True) for u in units)
    return pa.Array.from_buffers(QTY_ARROW, len(units), [None, pa.py_buffer(words)])


def qty_remainder(exact: Decimal, qty: Decimal) -> Decimal | None:
    """``exact - qty`` rounded half-even at 1e-38 (exact up to 38 decimals), None when it is 0."""
    remainder = (exact - qty).quantize(_REMAINDER_QUANTUM, rounding=ROUND_HALF_EVEN, context=_EXACT_SUM)
    return remainder or None


def quantize_price(value: Decimal) -> Decimal:
    """Round a price to the batch scale (half-even)."""
    return value.quantize(_PRICE_QUANTUM, rounding=ROUND_HALF_EVEN, context=_WIDE)


def usage_schema(groupby: list[str] | tuple[str, ...], metadata: list[str] | tuple[str, ...]) -> pa.Schema:
    """The Arrow schema of a usage batch whose points carry these groupby and metadata keys."""
    fields = [
        pa.field(SCOPE, pa.string(), nullable=False),
        pa.field(TYPE, pa.string(), nullable=False),
        pa.field(BEGIN, TIME_ARROW, nullable=False),
        pa.field(END, TIME_ARROW, nullable=False),
        pa.field(QTY, QTY_ARROW, nullable=False),
        pa.field(PRICE, PRICE_ARROW, nullable=False),
        pa.field(UNIT, pa.string(), nullable=False),
    ]
    fields += [pa.field(groupby_column(k), pa.string()) for k in groupby]
    fields += [pa.field(metadata_column(k), pa.string()) for k in metadata]
    return pa.schema(fields)


def polars_core_schema() -> dict[str, pl.DataType]:
    """Polars dtypes of the core columns (label columns are all ``pl.String``)."""
    return {
        SCOPE: pl.String(),
        TYPE: pl.String(),
        BEGIN: TIME_POLARS,
        END: TIME_POLARS,
        QTY: QTY_POLARS,
        PRICE: PRICE_POLARS,
        UNIT: pl.String(),
    }
