r"""``skip_datapoints_expression`` as a small, safe language compiled to a Polars expression.

CloudKitty ``eval``s this Python expression once per rated point with the point bound to
``datapoint`` (`cloudkitty/orchestrator.py:445-507`).  ratebeam never evaluates configuration text: the expression is parsed
here by a recursive-descent parser into a small syntax tree, checked, and compiled into one
vectorized Polars expression that is ``True`` for the points to drop.

Grammar (whitespace is free; keywords are case-sensitive, as in Python)::

    expression  := or_test
    or_test     := and_test ( "or" and_test )*
    and_test    := not_test ( "and" not_test )*
    not_test    := "not" not_test | atom
    atom        := "True" | "False" | "(" or_test ")" | comparison
    comparison  := value ( compare_op value )+             # chains like 0 < qty <= 10 mean "and"
                 | value [ "not" ] "in" list
    compare_op  := "==" | "!=" | "<" | "<=" | ">" | ">="
    list        := ( "(" | "[" ) [ literal ( "," literal )* [ "," ] ] ( ")" | "]" )
    value       := operand | literal
    operand     := "qty" | "price" | "unit" | "type" | "groupby." NAME | "metadata." NAME
                 | datapoint
    datapoint   := "datapoint" section field            # CloudKitty-style aliases, see below
    section     := "[" STRING "]" | ".get(" STRING [ "," "{" "}" ] ")"
    field       := "[" STRING "]" | ".get(" STRING [ "," ( literal | "None" ) ] ")"
    literal     := NUMBER | STRING
    NUMBER      := [+-] digits [ "." digits ] [ ("e"|"E") [+-] digits ]   (also ".5", "5.")
    STRING      := '...' or "..." (escapes: \\, \' and \" only)
    NAME        := [A-Za-z_][A-Za-z0-9_]*

CloudKitty aliases: ``datapoint['vol']['qty']`` = ``qty``, ``datapoint['vol']['unit']`` = ``unit``,
``datapoint['rating']['price']`` = ``price``, ``datapoint['groupby']['k']`` = ``groupby.k``,
``datapoint['metadata']['k']`` = ``metadata.k``; each ``[...]`` may be written ``.get(...)`` as in
CloudKitty's documented example ``datapoint.get("vol", {}).get("qty", 0) == 0``; a label's
``.get("k", "x")`` default replaces a missing label.  Nothing else is accepted: no other names,
attributes, calls, subscripts or arithmetic, so ``__import__('os')`` is a configuration error.

Semantics:

* ``qty`` and ``price`` are numbers and compare as exact decimals with number literals (no float).
  ``unit``, ``type`` and the labels are strings and compare with string literals (code-point
  order for ``<``/``>``).  Comparing a number with a string is refused at compile time.
* A label the point does not have is null; a comparison with null is null, ``and``/``or``/``not``
  follow three-valued (Kleene) logic, and a null result does **not** drop the point.  Difference
  with CloudKitty: there ``datapoint['groupby']['k']`` raises ``KeyError`` for a missing key and
  ``.get('k') != 'x'`` is ``True``; here both leave the point in place.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

import polars as pl

from ratebeam.transforms.skip_syntax import (
    COMPARE_OPS,
    LABEL_SECTIONS,
    NUMERIC_FIELDS,
    STRING_FIELDS,
    BoolOp,
    Compare,
    Const,
    Field,
    In,
    Literal,
    Node,
    Not,
    SkipExpression,
    SkipExpressionError,
    Value,
)

__all__ = ["SkipExpression", "SkipExpressionError", "compile_skip", "parse_skip"]


def parse_skip(text: str) -> SkipExpression:
    """Parse and check ``text``; raises ``SkipExpressionError`` naming the offending token."""
    if not isinstance(text, str) or not text.strip():
        raise SkipExpressionError(str(text), "empty expression")
    return SkipExpression(text, _Parser(text).parse())


def compile_skip(text: str) -> pl.Expr:
    """The Polars expression that is ``True`` for the points ``text`` drops (see the module doc)."""
    return parse_skip(text).to_polars()


# ---- numbers ----


def _number(text: str) -> Decimal | None:
    """The exact decimal of a NUMBER token, or None if it does not fit a 38-digit decimal."""
    try:
        value = Decimal(text)
    except InvalidOperation:  # pragma: no cover - the tokenizer only yields valid numbers
        return None
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    integer_digits = max(len(digits) + exponent, 0)
    if integer_digits + max(0, -exponent) > 38:
        return None
    return value


# ---- tokenizer ----

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
    | (?P<number>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)
    | (?P<string>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op>==|!=|<=|>=|<|>|\(|\)|\[|\]|,|\.|\{|\})
    """,
    re.VERBOSE,
)
_ESCAPE_RE = re.compile(r"\\(.)")
#: Limits of a text: the parser and the compiled Polars expression recurse over the tree, so a
#: hostile ``((((...))))`` or ``not not ...`` is refused at the limit, never a ``RecursionError``;
#: an expression is a short filter, so a longer text is refused before it is parsed.
MAX_DEPTH = 64
MAX_TOKENS = 1000
_KEYWORDS = frozenset({"and", "or", "not", "in", "True", "False", "None"})


@dataclass(frozen=True)
class _Token:
    kind: str  # number | string | name | op | end
    text: str
    column: int  # 1-based

    def describe(self) -> str:
        if self.kind == "end":
            return "end of expression"
        kind = {"number": "number", "string": "string", "name": "name", "op": "symbol"}[self.kind]
        return f"{kind} {self.text!r} at column {self.column}"


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            char = text[pos]
            what = "unterminated string" if char in "'\"" else f"unexpected character {char!r}"
            raise SkipExpressionError(text, f"{what} at column {pos + 1}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "ws":
            tokens.append(_Token(kind, match.group(), pos + 1))
        pos = match.end()
        if len(tokens) > MAX_TOKENS:
            raise SkipExpressionError(text, f"more than {MAX_TOKENS} tokens at column {pos}")
    tokens.append(_Token("end", "", len(text) + 1))
    return tokens


def _unquote(text: str, token: _Token) -> str:
    body = token.text[1:-1]
    for escape in _ESCAPE_RE.finditer(body):
        if escape.group(1) not in "\\'\"":
            raise SkipExpressionError(
                text, f"unsupported escape {escape.group()!r} in {token.describe()} (only \\\\, \\' and \\\")"
            )
    return _ESCAPE_RE.sub(r"\1", body)


# ---- parser ----

_TYPES_HINT = "qty and price are numbers; unit, type and labels are strings"
_OPERANDS_HINT = (
    "expected qty, price, unit, type, groupby.<key>, metadata.<key>, datapoint[...], "
    "a number, a string, True, False, not or '('"
)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.pos = 0
        self.depth = 0  # open parentheses and ``not`` around the current token

    # -- helpers --
    @property
    def tok(self) -> _Token:
        return self.tokens[self.pos]

    def error(self, reason: str) -> SkipExpressionError:
        return SkipExpressionError(self.text, reason)

    def unexpected(self, expected: str) -> SkipExpressionError:
        return self.error(f"unexpected {self.tok.describe()} ({expected})")

    def at(self, kind: str, text: str | None = None) -> bool:
        return self.tok.kind == kind and (text is None or self.tok.text == text)

    def take(self, kind: str, text: str | None = None) -> _Token | None:
        if self.at(kind, text):
            token = self.tok
            self.pos += 1
            return token
        return None

    def expect(self, kind: str, text: str, expected: str) -> _Token:
        token = self.take(kind, text)
        if token is None:
            raise self.unexpected(expected)
        return token

    # -- grammar --
    def parse(self) -> Node:
        node = self.or_test()
        if not self.at("end"):
            raise self.unexpected("expected 'and', 'or' or the end of the expression")
        return node

    def or_test(self) -> Node:
        operands = [self.and_test()]
        while self.take("name", "or"):
            operands.append(self.and_test())
        return operands[0] if len(operands) == 1 else BoolOp("or", tuple(operands))

    def and_test(self) -> Node:
        operands = [self.not_test()]
        while self.take("name", "and"):
            operands.append(self.not_test())
        return operands[0] if len(operands) == 1 else BoolOp("and", tuple(operands))

    def not_test(self) -> Node:
        if self.take("name", "not"):
            return Not(self.nested(self.not_test))
        return self.atom()

    def nested(self, rule: Callable[[], Node]) -> Node:
        """``rule()`` one level deeper; refused past ``MAX_DEPTH`` levels (naming the column)."""
        if self.depth >= MAX_DEPTH:
            raise self.error(f"nested more than {MAX_DEPTH} levels deep at column {self.tok.column}")
        self.depth += 1
        try:
            return rule()
        finally:
            self.depth -= 1

    def atom(self) -> Node:
        if self.take("name", "True"):
            return Const(True)
        if self.take("name", "False"):
            return Const(False)
        if self.take("op", "("):
            node = self.nested(self.or_test)
            self.expect("op", ")", "expected ')'")
            return node
        return self.comparison()

    def comparison(self) -> Node:
        left = self.value()
        if self.at("name", "in") or self.at("name", "not"):
            negated = self.take("name", "not") is not None
            self.expect("name", "in", "expected 'in' after 'not'")
            return self.membership(left, negated)
        pairs: list[Compare] = []
        while self.tok.kind == "op" and self.tok.text in COMPARE_OPS:
            op_token = self.take("op")
            assert op_token is not None
            right = self.value()
            pairs.append(self.compare(op_token, left, right))
            left = right
        if not pairs:
            raise self.unexpected(f"expected a comparison (==, !=, <, <=, >, >=, in) after {left.describe()}")
        return pairs[0] if len(pairs) == 1 else BoolOp("and", tuple(pairs))

    def compare(self, op_token: _Token, left: Value, right: Value) -> Compare:
        if left.is_number != right.is_number:
            raise self.error(
                f"cannot compare {left.describe()} with {right.describe()} at column {op_token.column}"
                f" ({_TYPES_HINT})"
            )
        return Compare(op_token.text, left, right)

    def membership(self, value: Value, negated: bool) -> Node:
        opening = self.take("op", "(") or self.take("op", "[")
        if opening is None:
            raise self.unexpected("expected a list '(...)' or '[...]' after 'in'")
        closing = ")" if opening.text == "(" else "]"
        items: list[Literal] = []
        while not self.at("op", closing):
            token = self.tok
            item = self.literal()
            if item is None:
                raise self.unexpected("expected a number or a string in the list")
            if item.is_number != value.is_number:
                raise self.error(
                    f"cannot compare {value.describe()} with {item.describe()} at column {token.column}"
                    f" ({_TYPES_HINT})"
                )
            items.append(item)
            if not self.take("op", ","):
                break
        self.expect("op", closing, f"expected ',' or '{closing}'")
        return In(value, tuple(items), negated)

    def value(self) -> Value:
        literal = self.literal()
        if literal is not None:
            return literal
        token = self.tok
        if token.kind != "name" or token.text in _KEYWORDS:
            raise self.unexpected(_OPERANDS_HINT)
        self.pos += 1
        if token.text in NUMERIC_FIELDS or token.text in STRING_FIELDS:
            return Field(token.text)
        if token.text in LABEL_SECTIONS:
            self.expect("op", ".", f"expected '.<key>' after {token.text!r}")
            key = self.take("name")
            if key is None:
                raise self.unexpected(f"expected a label name after '{token.text}.'")
            return Field(token.text, key.text)
        if token.text == "datapoint":
            return self.datapoint()
        raise self.error(f"unknown name {token.text!r} at column {token.column} ({_OPERANDS_HINT})")

    def literal(self) -> Literal | None:
        token = self.tok
        if token.kind == "number":
            number = _number(token.text)
            if number is None:
                raise self.error(f"{token.describe()} has more than 38 digits")
            self.pos += 1
            return Literal(number)
        if token.kind == "string":
            self.pos += 1
            return Literal(_unquote(self.text, token))
        return None

    def datapoint(self) -> Field:
        section_token = self.tok
        section, _ = self.accessor(first=True)
        if section not in ("vol", "rating", *LABEL_SECTIONS):
            raise self.error(
                f"unknown datapoint section {section!r} at column {section_token.column} "
                "(expected 'vol', 'rating', 'groupby' or 'metadata')"
            )
        key_token = self.tok
        key, default = self.accessor(first=False)
        if section in LABEL_SECTIONS:
            if default is not None and not isinstance(default, str):
                raise self.error(f"the default of a label must be a string, at column {key_token.column}")
            return Field(section, key, default)
        allowed = {"vol": {"qty": "qty", "unit": "unit"}, "rating": {"price": "price"}}[section]
        if key not in allowed:
            raise self.error(
                f"unknown datapoint field {section!r}/{key!r} at column {key_token.column} "
                f"(expected {' or '.join(repr(k) for k in allowed)})"
            )
        return Field(allowed[key])

    def accessor(self, first: bool) -> tuple[str, Decimal | str | None]:
        """``['key']`` or ``.get('key'[, default])``; the first level's default must be ``{}``."""
        if self.take("op", "["):
            key = self.key_string()
            self.expect("op", "]", "expected ']'")
            return key, None
        if self.take("op", "."):
            self.expect("name", "get", "expected 'get' (only datapoint[...] and .get(...) are allowed)")
            self.expect("op", "(", "expected '('")
            key = self.key_string()
            default: Decimal | str | None = None
            if self.take("op", ","):
                if first:
                    self.expect("op", "{", "expected '{}'")
                    self.expect("op", "}", "expected '}'")
                elif not self.take("name", "None"):
                    literal = self.literal()
                    if literal is None:
                        raise self.unexpected("expected a number, a string or None as default")
                    default = literal.value
            self.expect("op", ")", "expected ')'")
            return key, default
        raise self.unexpected("expected ['...'] or .get('...') after datapoint")

    def key_string(self) -> str:
        token = self.take("string")
        if token is None:
            raise self.unexpected("expected a quoted key")
        return _unquote(self.text, token)
