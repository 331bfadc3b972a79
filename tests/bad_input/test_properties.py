"""Any input to the expression languages and the interchange readers: the reference result or an InputError.

Hypothesis writes the inputs: skip expressions from their grammar (checked against a reference
evaluator written here, in Python with exact decimals and Kleene logic), texts of random tokens
and characters for both expression languages, and rules / usage documents with one value
replaced by a random JSON value.  Whatever the input, the reader either gives the reference result
(a rule set that round-trips through ``rules_to_json``, points that keep their values) or refuses
it with its one error type — never another exception.
"""

from __future__ import annotations

import json
import os
from decimal import Decimal
from importlib import resources
from typing import Any

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.interchange import parse_rules, parse_usage, rules_to_json
from ratebeam.transforms.schema import PRICE, QTY, TYPE, UNIT, groupby_column
from ratebeam.transforms.script_parser import parse as parse_script
from ratebeam.transforms.script_syntax import ExpressionError, Node
from ratebeam.transforms.skip_expression import SkipExpressionError, parse_skip

PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "bad-input"))

# ---- skip_datapoints_expression: grammar-built texts against a reference evaluator ----

_NUMBERS = st.decimals(min_value=-1000, max_value=1000, places=2, allow_nan=False, allow_infinity=False)
_WORDS = st.sampled_from(["", "h", "GiB", "instance", "a'b", 'q"', "ü"])
_NUMERIC = st.sampled_from(["qty", "price", "datapoint['vol']['qty']", "datapoint.get('rating', {}).get('price')"])
_STRING = st.sampled_from(["unit", "type", "groupby.id", "datapoint['groupby']['id']", "metadata.flavor"])
_FIELDS = {"qty": "qty", "price": "price", "datapoint['vol']['qty']": "qty",
           "datapoint.get('rating', {}).get('price')": "price", "unit": "unit", "type": "type",
           "groupby.id": "id", "datapoint['groupby']['id']": "id", "metadata.flavor": "flavor"}
_OPS = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@st.composite
def _comparison(draw) -> tuple[str, tuple]:
    if draw(st.booleans()):
        field, literal = draw(_NUMERIC), draw(_NUMBERS)
        text_literal = str(literal)
    else:
        field, literal = draw(_STRING), draw(_WORDS)
        text_literal = _quote(literal)
    if draw(st.integers(0, 4)) == 0:
        values = draw(st.lists(st.just(literal), min_size=1, max_size=3))
        negated = draw(st.booleans())
        text = f"{field} {'not in' if negated else 'in'} [{', '.join([text_literal] * len(values))}]"
        return text, ("in", _FIELDS[field], literal, negated)
    op = draw(_OPS)
    return f"{field} {op} {text_literal}", ("cmp", _FIELDS[field], op, literal)


_EXPRESSIONS = st.recursive(
    _comparison(),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["and", "or"]), inner).map(
            lambda t: (f"({t[0][0]}) {t[1]} ({t[2][0]})", (t[1], t[0][1], t[2][1]))),
        inner.map(lambda t: (f"not ({t[0]})", ("not", t[1]))),
    ),
    max_leaves=8,
)

_ROWS = st.lists(st.fixed_dictionaries({
    "qty": _NUMBERS, "price": _NUMBERS, "unit": _WORDS, "type": _WORDS,
    "id": st.one_of(st.none(), _WORDS), "flavor": st.one_of(st.none(), _WORDS),
}), min_size=1, max_size=6)


def _reference(tree: tuple, row: dict) -> bool | None:
    """Kleene logic over exact values; a comparison with a missing label is unknown (None)."""
    kind = tree[0]
    if kind == "cmp":
        _, field, op, literal = tree
        value = row[field]
        if value is None:
            return None
        return {"==": value == literal, "!=": value != literal, "<": value < literal, "<=": value <= literal,
                ">": value > literal, ">=": value >= literal}[op]
    if kind == "in":
        _, field, literal, negated = tree
        if row[field] is None:
            return None
        return (row[field] == literal) != negated
    if kind == "not":
        inner = _reference(tree[1], row)
        return None if inner is None else not inner
    left, right = _reference(tree[1], row), _reference(tree[2], row)
    if kind == "and":
        if left is False or right is False:
            return False
        return None if None in (left, right) else True
    if left is True or right is True:
        return True
    return None if None in (left, right) else False


def _frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame({
        QTY: [r["qty"] for r in rows], PRICE: [r["price"] for r in rows], UNIT: [r["unit"] for r in rows],
        TYPE: [r["type"] for r in rows], groupby_column("id"): [r["id"] for r in rows],
        "metadata.flavor": [r["flavor"] for r in rows],
    }, schema={QTY: pl.Decimal(38, 2), PRICE: pl.Decimal(38, 2), UNIT: pl.String, TYPE: pl.String,
               groupby_column("id"): pl.String, "metadata.flavor": pl.String})


@PROFILE
@given(_EXPRESSIONS, _ROWS)
def test_skip_expression_drops_what_the_reference_drops(expression, rows):
    text, tree = expression
    skip = parse_skip(text)
    dropped = _frame(rows).select(skip.to_polars())["skip"].to_list()
    assert dropped == [_reference(tree, row) is True for row in rows], text


_SKIP_VOCABULARY = ["qty", "price", "unit", "type", "groupby.id", "metadata.x", "datapoint", "['vol']", "['qty']",
                    ".get(", "'k'", ")", "(", "[", "]", "{", "}", ",", "and", "or", "not", "in", "True", "False",
                    "None", "==", "!=", "<", ">=", "1", "-2.5", "1e400", "'s'", '"d"', "'\\x'", "__import__", "."]


@PROFILE
@given(st.lists(st.sampled_from(_SKIP_VOCABULARY), max_size=16), st.text(max_size=4))
def test_any_skip_text_parses_or_is_one_skip_error(words, noise):
    text = " ".join(words) + noise
    try:
        skip = parse_skip(text)
    except SkipExpressionError:
        return
    labels = {f"{section}.{key}" for section, key in skip.labels()}
    frame = _frame([{"qty": Decimal(1), "price": Decimal(0), "unit": "h", "type": "t", "id": None,
                     "flavor": None}]).with_columns(pl.lit(None, dtype=pl.String).alias(c) for c in labels)
    assert frame.select(skip.to_polars())["skip"].dtype == pl.Boolean


@PROFILE
@given(st.text(max_size=40))
def test_any_script_text_parses_or_is_one_expression_error(text):
    try:
        tree = parse_script(text)
    except ExpressionError as error:
        assert 1 <= error.column <= len(text) + 1, (error, text)  # the column it names is in the text
    else:
        assert isinstance(tree, Node)


# ---- rules and usage readers: one value replaced anywhere, then read ----

_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=6),
              st.sampled_from(["0", "1.5", "-1", "abc", "", "NaN", "1e999", "flat", "rate", "compute",
                               "2026-01-01T00:00:00Z", "9999-12-31T23:59:59-23:59"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6,
)


def _paths(document: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a JSON document (the root included)."""
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += _paths(value, (*prefix, index))
    return found


def _replaced(document: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(document))
    node = copy
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return copy


_DEMO_RULES = json.loads((resources.files("ratebeam.pipelines") / "demo_data" / "rules.json").read_text())
_RULE_PATHS = _paths(_DEMO_RULES)


@PROFILE
@given(st.sampled_from(_RULE_PATHS), _JSON)
def test_rules_with_any_value_replaced_round_trip_or_are_one_input_error(path, value):
    text = json.dumps(_replaced(_DEMO_RULES, path, value))
    try:
        rules = parse_rules(text, "rules.json")
    except InputError as error:
        assert str(error).startswith("rules.json")
        return
    assert parse_rules(json.dumps(rules_to_json(rules)), "again.json") == rules


@PROFILE
@given(st.text(max_size=60))
def test_any_rules_text_is_rules_or_one_input_error(text):
    try:
        rules = parse_rules(text, "rules.json")
    except InputError as error:
        assert str(error).startswith("rules.json")
    else:
        assert parse_rules(json.dumps(rules_to_json(rules)), "again.json") == rules


_POINT = {"type": "instance", "qty": "1.5", "begin": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z",
          "groupby": {"project_id": "acme", "id": "vm-1"}, "metadata": {"flavor_name": "m1.tiny"}, "unit": "h"}
_POINT_PATHS = _paths(_POINT)


@PROFILE
@given(st.sampled_from(_POINT_PATHS), _JSON, st.sampled_from(["jsonl", "list", "points"]))
def test_usage_with_any_value_replaced_keeps_its_values_or_is_one_input_error(path, value, shape):
    point = _replaced(_POINT, path, value)
    text = {"jsonl": json.dumps(_POINT) + "\n" + json.dumps(point), "list": json.dumps([_POINT, point]),
            "points": json.dumps({"points": [_POINT, point]})}[shape]
    try:
        frame = parse_usage(text, "usage.jsonl")
    except InputError as error:
        assert str(error).startswith("usage.jsonl")
        return
    assert frame.height == 2
    second = frame.row(1, named=True)
    if isinstance(point, dict) and isinstance(point.get("qty"), str):
        assert second[QTY] == Decimal(point["qty"])
    if isinstance(point, dict) and isinstance(point.get("type"), str):
        assert second[TYPE] == point["type"]


@PROFILE
@given(st.text(max_size=60))
def test_any_usage_text_is_points_or_one_input_error(text):
    try:
        frame = parse_usage(text, "usage.jsonl")
    except InputError as error:
        assert str(error).startswith("usage.jsonl")
    else:
        assert frame.height == len(frame[QTY].drop_nulls())  # every point has its quantity
