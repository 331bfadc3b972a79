"""The closed grammar of trigger criteria (seed 002): time expressions, ranges and trait comparisons.

A value in a criterion is one of::

    condition  := 'is' ['not'] 'NULL'                     # the trait is absent / present
                | op operand                              # op: > < >= <= == != (= is ==)
                | time ['to' time]                        # equal to / within [begin, end)
    operand    := number | 'quoted text' | time           # text may be an ISO datetime
    time       := ('first' | 'last') ['@' HH:MM[:SS]] (('+' | '-') duration)*
    duration   := (integer ('s' | 'm' | 'h' | 'd' | 'w'))+    # 2h, 1h30m, 90s

``first`` / ``last`` are the earliest / latest event of the trigger instance; ``@HH:MM`` moves
to that time of their UTC day (``first@00:00``: midnight of the first event's day).  Any other
YAML text is a plain equality with that text (``state: active``), a YAML number an equality with
that number.  Nothing is evaluated as Python: a hand-written tokenizer over a fixed token set and
a parser of this grammar (keywords case-insensitive), with one error naming the column.

Comparisons are typed: numbers with int/float traits (exactly, as decimals), text with text
traits, times and ISO texts with datetime traits; a comparison between different kinds, or with
an absent trait, is false (``!=`` too).  Only ``is NULL`` is true for an absent trait.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from ratebeam.transforms.events.model import TraitValue, parse_instant

#: Longest expression accepted: criteria are short, and a hostile file must not cost time.
MAX_LENGTH = 200
#: Longest duration (about ten years): an instant stays far inside the datetime range.
MAX_DURATION = 3660 * 86400
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_TOKEN = re.compile(
    r"""\s*(?:
      (?P<clock>[0-9]{1,2}:[0-9]{2}(?::[0-9]{2})?)
    | (?P<duration>[0-9]+[smhdw])(?![A-Za-z_])
    | (?P<number>[0-9]+(?:\.[0-9]+)?)(?![A-Za-z0-9_:])
    | (?P<text>'[^']*'|"[^"]*")
    | (?P<op>>=|<=|==|!=|=|>|<|\+|-|@)
    | (?P<word>[A-Za-z]+)(?![A-Za-z0-9_])
    )""",
    re.VERBOSE | re.ASCII,
)
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le, "==": operator.eq,
    "=": operator.eq, "!=": operator.ne,
}
#: Text that starts like an expression is parsed as one; any other text is a plain equality.
_EXPRESSION_START = re.compile(r"\s*(?:[<>=!]|(?:is|first|last)(?![A-Za-z0-9_]))", re.IGNORECASE | re.ASCII)


class ConditionError(ValueError):
    """Not in the grammar: ``reason`` says what and where (1-based column)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class TimeExpr:
    """``first|last [@clock] ±offset``: an instant relative to a trigger instance's events."""

    anchor: str
    clock: timedelta | None
    offset: timedelta

    def at(self, first: datetime, last: datetime) -> datetime:
        """The instant for an instance whose earliest event is ``first`` and latest ``last``."""
        base = first if self.anchor == "first" else last
        if self.clock is not None:
            base = base.replace(hour=0, minute=0, second=0, microsecond=0) + self.clock
        return base + self.offset


@dataclass(frozen=True)
class Number:
    """A number operand, exact."""

    value: Decimal


@dataclass(frozen=True)
class Text:
    """A text operand; ``instant`` is its datetime when it is an ISO-8601 text."""

    value: str
    instant: datetime | None


Operand = Number | Text | TimeExpr


@dataclass(frozen=True)
class Condition:
    """One condition on a value: ``op`` is a comparison, ``'null'`` / ``'not null'`` or ``'in'`` (a range)."""

    op: str
    operand: Operand | None = None
    end: TimeExpr | None = None

    def __call__(self, value: TraitValue, first: datetime, last: datetime) -> bool:
        """Whether ``value`` (``None``: absent) meets the condition for an instance spanning first..last."""
        if self.op in ("null", "not null"):
            return (value is None) == (self.op == "null")
        if value is None or isinstance(value, bool):
            return False
        if self.op == "in":
            assert isinstance(self.operand, TimeExpr) and self.end is not None
            return isinstance(value, datetime) and self.operand.at(first, last) <= value < self.end.at(first, last)
        assert self.operand is not None
        pair = _comparable(value, self.operand, first, last)
        return pair is not None and _COMPARE[self.op](*pair)


def _comparable(value: TraitValue, operand: Operand, first: datetime, last: datetime) -> tuple[Any, Any] | None:
    """``value`` and ``operand`` as two values of one kind, or ``None`` when their kinds differ."""
    if isinstance(value, datetime):
        if isinstance(operand, TimeExpr):
            return value, operand.at(first, last)
        if isinstance(operand, Text) and operand.instant is not None:
            return value, operand.instant
        return None
    if isinstance(value, int | float) and isinstance(operand, Number):
        return Decimal(repr(value)) if isinstance(value, float) else Decimal(value), operand.value
    if isinstance(value, str) and isinstance(operand, Text):
        return value, operand.value
    return None


def literal(value: object) -> Condition:
    """The condition of a YAML value in a criterion's ``traits`` (see the module docstring).

    Raises ``ConditionError`` for an expression outside the grammar or a value of no usable kind.
    """
    if isinstance(value, bool) or value is None or not isinstance(value, str | int | float):
        raise ConditionError("expected text, a number or an expression (`> 10`, `is NULL`, `last-1h to last`)")
    if isinstance(value, str):
        if _EXPRESSION_START.match(value):
            try:
                return parse(value)
            except ConditionError as exc:
                if not value.lstrip()[:1].isalpha():
                    raise
                raise ConditionError(f"{exc.reason} (a text that starts like an expression is written "
                                     f"== 'text')") from None
        return Condition("==", _text(value))
    if isinstance(value, float) and not math.isfinite(value):
        raise ConditionError("not a finite number")
    return Condition("==", Number(Decimal(repr(value)) if isinstance(value, float) else Decimal(value)))


def parse(text: str) -> Condition:
    """The condition an expression text says (raises ``ConditionError``)."""
    return _Parser(text).condition()


def parse_time(text: str) -> TimeExpr:
    """A time expression alone (``expiration``); raises ``ConditionError``."""
    parser = _Parser(text)
    expr = parser.time()
    parser.end()
    return expr


def _text(value: str) -> Text:
    try:
        instant: datetime | None = parse_instant(value)
    except (ValueError, OverflowError):
        instant = None
    return Text(value, instant)


class _Parser:
    """Tokens of one expression and a cursor: the recursive descent of the grammar above."""

    def __init__(self, text: str) -> None:
        if len(text) > MAX_LENGTH:
            raise ConditionError(f"longer than {MAX_LENGTH} characters")
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            match = _TOKEN.match(text, pos)
            if match is None or match.lastgroup is None:
                column = pos + 1 + len(text[pos:]) - len(text[pos:].lstrip())
                raise ConditionError(f"unexpected {text[column - 1]!r} at column {column}")
            kind = match.lastgroup
            value = match.group(kind)
            self.tokens.append((kind, value.lower() if kind == "word" else value, match.start(kind) + 1))
            pos = match.end()
        self.at = 0

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.at] if self.at < len(self.tokens) else ("end", "", 0)

    def take(self, kind: str, value: str | None = None) -> str | None:
        token_kind, token_value, _ = self.peek()
        if token_kind == kind and (value is None or token_value == value):
            self.at += 1
            return token_value
        return None

    def fail(self, expected: str) -> ConditionError:
        kind, value, column = self.peek()
        found = "the end" if kind == "end" else f"{value!r} at column {column}"
        return ConditionError(f"expected {expected}, found {found}")

    def end(self) -> None:
        if self.peek()[0] != "end":
            raise self.fail("the end")

    def condition(self) -> Condition:
        if self.take("word", "is"):
            negated = self.take("word", "not") is not None
            if not self.take("word", "null"):
                raise self.fail("NULL")
            self.end()
            return Condition("not null" if negated else "null")
        kind, value, _ = self.peek()
        if kind == "op" and value in _COMPARE:
            self.at += 1
            found = self.operand()
            self.end()
            return Condition(value, found)
        begin = self.time()
        if self.take("word", "to"):
            finish = self.time()
            self.end()
            return Condition("in", begin, finish)
        self.end()
        return Condition("==", begin)

    def operand(self) -> Operand:
        sign = self.take("op", "-") or self.take("op", "+") or ""
        number = self.take("number")
        if number is not None:
            return Number(Decimal(sign + number))
        if sign:
            raise self.fail("a number")
        quoted = self.take("text")
        if quoted is not None:
            return _text(quoted[1:-1])
        return self.time()

    def time(self) -> TimeExpr:
        anchor = self.take("word", "first") or self.take("word", "last")
        if anchor is None:
            raise self.fail("a number, a quoted text or a time (first, last)")
        clock = None
        if self.take("op", "@"):
            text = self.take("clock")
            if text is None:
                raise self.fail("a time of day HH:MM after @")
            parts = [int(p) for p in text.split(":")] + [0]
            if parts[0] > 23 or parts[1] > 59 or parts[2] > 59:
                raise ConditionError(f"not a time of day: {text!r}")
            clock = timedelta(hours=parts[0], minutes=parts[1], seconds=parts[2])
        offset = timedelta(0)
        while (sign := self.take("op", "+") or self.take("op", "-")) is not None:
            step = self.duration()
            offset = offset + step if sign == "+" else offset - step
        return TimeExpr(anchor, clock, offset)

    def duration(self) -> timedelta:
        parts = []
        while (part := self.take("duration")) is not None:
            parts.append(part)
        if not parts:
            raise self.fail("a duration (90s, 30m, 2h, 1d, 1w)")
        seconds = sum(int(p[:-1]) * _UNITS[p[-1]] for p in parts)
        if seconds > MAX_DURATION:
            raise ConditionError(f"duration longer than {MAX_DURATION // 86400} days")
        return timedelta(seconds=seconds)


def duration_seconds(text: str) -> int:
    """A duration text (``90s``, ``1h30m``) or integer seconds as seconds (``fire_delay``)."""
    parser = _Parser(text)
    whole = "expected whole seconds (>= 0) or a duration (90s, 30m, 2h)"
    if parser.peek()[1] in ("-", "+"):
        raise ConditionError(whole)
    number = parser.take("number")
    if number is not None:
        if "." in number:
            raise ConditionError(whole)
        parser.end()
        if int(number) > MAX_DURATION:
            raise ConditionError(f"duration longer than {MAX_DURATION // 86400} days")
        return int(number)
    seconds = int(parser.duration().total_seconds())
    parser.end()
    return seconds
