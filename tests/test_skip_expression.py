"""skip_datapoints_expression: a safe language compiled to Polars (`cloudkitty/orchestrator.py:445-507`), never eval."""

from __future__ import annotations

import pickle
from decimal import Decimal

import polars as pl
import pytest

from ratebeam.transforms.schema import PRICE_POLARS, QTY_POLARS
from ratebeam.transforms.skip_expression import SkipExpressionError, compile_skip, parse_skip

D = Decimal

FRAME = pl.DataFrame(
    {
        "type": ["instance", "instance", "volume", "instance", "volume"],
        "qty": [D("0"), D("1"), D("0.100000000000000001"), D("250"), D("-3.5")],
        "price": [D("0"), D("0.5"), D("0.00000000000000000001"), D("12.25"), D("0")],
        "unit": ["instance", "instance", "GiB", "instance", "GiB"],
        "groupby.flavor": ["m1.tiny", None, "", "m1.large", "m1.tiny"],
        "groupby.odd-key": ["a", "b", None, "a", "b"],
        "metadata.os": ["linux", "windows", None, None, "linux"],
    },
    schema_overrides={"qty": QTY_POLARS, "price": PRICE_POLARS},
)


def skipped(text: str) -> list[int]:
    """Row numbers the expression drops."""
    mask = FRAME.select(compile_skip(text))["skip"].to_list()
    assert None not in mask
    return [i for i, drop in enumerate(mask) if drop]


@pytest.mark.parametrize(
    ("text", "rows"),
    [
        ("True", [0, 1, 2, 3, 4]),
        ("False", []),
        ("qty == 0", [0]),
        ("qty != 0", [1, 2, 3, 4]),
        ("qty < 0", [4]),
        ("qty >= 250", [3]),
        ("qty <= -3.5", [4]),
        ("qty > 1e2", [3]),
        ("0 < qty <= 1", [1, 2]),
        ("price > 0", [1, 2, 3]),
        ("price == 0.5 or price == 12.250", [1, 3]),
        ("qty > price", [1, 2, 3]),
        ("unit == 'GiB'", [2, 4]),
        ('type != "instance"', [2, 4]),
        ("groupby.flavor == 'm1.tiny'", [0, 4]),
        ("groupby.flavor in ('m1.tiny', 'm1.large')", [0, 3, 4]),
        ("groupby.flavor in ['m1.large',]", [3]),
        ("groupby.flavor not in ('m1.tiny',)", [2, 3]),
        ("groupby.flavor == ''", [2]),
        ("groupby.flavor < 'm1.t'", [2, 3]),
        ("qty in (0, 250.0, -3.50)", [0, 3, 4]),
        ("qty in ()", []),
        ("metadata.os == 'linux' and qty == 0", [0]),
        ("metadata.os == 'linux' or unit == 'GiB'", [0, 2, 4]),
        ("not (qty == 0 or qty == 1)", [2, 3, 4]),
        ("not not qty == 0", [0]),
        ("(qty == 0 or qty == 1) and not type == 'volume'", [0, 1]),
        ("qty == 0 or qty == 1 and unit == 'GiB'", [0]),  # and binds tighter than or
    ],
)
def test_semantics(text, rows):
    assert skipped(text) == rows


def test_numbers_compare_as_exact_decimals():
    assert skipped("qty > 0.1") == [1, 2, 3]  # 0.100000000000000001 > 0.1 exactly
    assert skipped("qty == 0.100000000000000001") == [2]
    assert skipped("qty > 0.1000000000000000011") == [1, 3]  # more decimals than the column
    assert skipped("price == 0.00000000000000000001") == [2]
    assert skipped("price > 0.000000000000000000005") == [1, 2, 3]


def test_missing_labels_are_null_and_never_drop_the_point():
    # row 1 has no flavor, rows 3 and 4 have no os: none of these are dropped because of it
    assert skipped("groupby.flavor != 'm1.tiny'") == [2, 3]
    assert skipped("not groupby.flavor == 'm1.tiny'") == [2, 3]
    assert skipped("metadata.os != 'linux'") == [1]
    assert skipped("metadata.os != 'linux' or qty == 250") == [1, 3]  # null or True is True
    assert skipped("datapoint['groupby'].get('flavor', 'none') == 'none'") == [1]  # a default fills it


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("datapoint['vol']['qty'] == 0", "qty == 0"),
        ('datapoint.get("vol", {}).get("qty", 0) == 0', "qty == 0"),  # CloudKitty's documented example
        ("datapoint['vol']['unit'] == 'GiB'", "unit == 'GiB'"),
        ("datapoint['rating']['price'] > 1", "price > 1"),
        ("datapoint.get('rating').get('price') > 1", "price > 1"),
        ("datapoint['groupby']['flavor'] == 'x'", "groupby.flavor == 'x'"),
        ('datapoint.get("metadata", {}).get("os") == "linux"', "metadata.os == 'linux'"),
        ("datapoint['metadata'].get('os', None) == 'linux'", "metadata.os == 'linux'"),
    ],
)
def test_cloudkitty_aliases(alias, canonical):
    assert parse_skip(alias).tree == parse_skip(canonical).tree


def test_aliases_reach_keys_that_are_not_names():
    assert skipped("datapoint['groupby']['odd-key'] == 'a'") == [0, 3]
    assert parse_skip("datapoint['groupby']['odd-key'] == 'a'").labels() == {("groupby", "odd-key")}


def test_string_escapes():
    frame = pl.DataFrame({"unit": ["it's", 'say "hi"', "a\\b"]})
    mask = frame.select(compile_skip(r"unit in ('it\'s', " + r'"say \"hi\"", ' + r"'a\\b')"))["skip"]
    assert mask.to_list() == [True, True, True]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("__import__('os')", "unknown name '__import__' at column 1"),
        ("__import__('os').system('true') == 0", "unknown name '__import__' at column 1"),
        ("open('/etc/passwd')", "unknown name 'open' at column 1"),
        ("len(unit) > 0", "unknown name 'len' at column 1"),
        ("qty.__class__ == 1", "unexpected symbol '.' at column 4"),
        ("datapoint.__class__ == 1", "unexpected name '__class__' at column 11"),
        ("datapoint.keys() == 1", "unexpected name 'keys' at column 11"),
        ("datapoint['vol']['qty'].real > 0", "unexpected symbol '.' at column 24"),
        ("datapoint['vol'].get('qty')() > 0", "unexpected symbol '(' at column 28"),
        ("datapoint['vol']['price'] > 0", "unknown datapoint field 'vol'/'price' at column 17"),
        ("datapoint['desc']['x'] == 'a'", "unknown datapoint section 'desc' at column 10"),
        ("datapoint['groupby'].get('x', 1) == 'a'", "the default of a label must be a string"),
        ("datapoint == 1", "unexpected symbol '==' at column 11"),
        ("qty", "unexpected end of expression"),
        ("qty = 0", "unexpected character '=' at column 5"),
        ("qty + 1 > 2", "unexpected character '+' at column 5"),
        ("qty == 0 qty", "unexpected name 'qty' at column 10"),
        ("(qty == 0", "unexpected end of expression (expected ')')"),
        ("qty == '1'", "cannot compare qty with the string '1' at column 5"),
        ("groupby.vcpus > 4", "cannot compare groupby.vcpus with the number 4 at column 15"),
        ("unit in ('a', 2)", "cannot compare unit with the number 2 at column 15"),
        ("qty in 1", "unexpected number '1' at column 8"),
        ("qty not == 1", "unexpected symbol '==' at column 9"),
        ("groupby == 'a'", "unexpected symbol '==' at column 9"),
        ("groupby.1 == 'a'", "unexpected number '.1' at column 8"),
        ("unit == 'a", "unterminated string at column 9"),
        ("unit == 'a\\n'", "unsupported escape '\\\\n'"),
        ("qty == 1e40", "number '1e40' at column 8 has more than 38 digits"),
        ("lambda: True", "unexpected character ':' at column 7"),
        ("True if qty else False", "unexpected name 'if' at column 6"),
        ("qty == None", "unexpected name 'None' at column 8"),
        ("   ", "empty expression"),
    ],
)
def test_anything_else_is_refused_naming_the_token(text, reason):
    with pytest.raises(SkipExpressionError) as info:
        parse_skip(text)
    assert reason in info.value.reason
    assert str(info.value).endswith(f"in skip_datapoints_expression {text!r}")


def test_parsed_expression_is_a_picklable_value():
    expr = parse_skip("qty == 0 and groupby.flavor in ('a', 'b') or not metadata.os == 'x'")
    copy = pickle.loads(pickle.dumps(expr))
    assert copy == expr and hash(copy) == hash(expr)
    assert FRAME.select(copy.to_polars()).equals(FRAME.select(expr.to_polars()))
    assert expr.labels() == {("groupby", "flavor"), ("metadata", "os")}


def test_lazy_filtering_with_the_compiled_expression():
    kept = FRAME.lazy().filter(~compile_skip("qty == 0 or unit == 'GiB'")).collect()
    assert kept["qty"].to_list() == [D(1), D(250)]
