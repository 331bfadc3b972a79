"""The scripted module's sandbox: a script's text can name no file, run no table function and
leak no file content, whatever the quoting; any text either compiles or is one ScriptError; and
the arithmetic it compiles is the exact decimal arithmetic of the documented scale rules."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_EVEN, Context, Decimal
from fractions import Fraction
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_support import workspace

from ratebeam.pipelines.cli import main
from ratebeam.pipelines.interchange import parse_usage
from ratebeam.transforms.scripted import ScriptError, load_script

SECRET = "s3cr3t-line-7f1d"
TABLE_FUNCTIONS = ("read_csv", "read_parquet", "read_json", "read_ndjson", "read_ipc", "read_delta",
                   "read_iceberg", "read_excel", "scan_csv", "scan_parquet", "scan_ndjson", "scan_ipc",
                   "scan_delta", "scan_iceberg")


def script(expr: str, where: str | None = None) -> str:
    step = {"set": "price", "expr": expr} | ({"where": where} if where is not None else {})
    return json.dumps({"name": "s", "steps": [step]})


def unicode_escaped(name: str) -> str:
    return "".join(f"\\{ord(c):04x}" for c in name)


def payloads(function: str, path: str) -> list[str]:
    """``function`` reading ``path`` in every quoting and hiding form SQL dialects know."""
    return [
        f"{function}('{path}')",
        f"{function.upper()}('{path}')",
        f'{function}("{path}")',
        f"{function}($${path}$$)",
        f"{function}($tag${path}$tag$)",
        f"{function}(E'{path}')",
        f"{function}(e'{path}')",
        f"{function}(N'{path}')",
        f"{function}(U&'{unicode_escaped(path)}')",
        f'U&"{unicode_escaped(function)}"(\'{path}\')',
        f"((({function}((('{path}'))))))",
        f"{function}/**/('{path}')",
        f"{function} ('{path}') -- comment",
        f"qty + 0 * {function}('{path}')",
        f"(SELECT * FROM {function}('{path}'))",
        f"qty IN (SELECT 1 FROM {function}('{path}'))",
        f"0 * (SELECT nonexistent FROM {function}('{path}')) + qty",
        f"WITH t AS (SELECT * FROM {function}('{path}')) SELECT 1",
        f"1; SELECT * FROM {function}('{path}')",
        f"CASE WHEN $$'$$ = '' THEN 1 ELSE 0 END + 0*(SELECT nonexistent FROM {function}('{path}')) + 0*LENGTH('')",
        f"CASE WHEN $a$'$a$ = '' THEN 1 END + 0*(SELECT x FROM {function}('{path}'))",
        f"'x' || (SELECT * FROM {function}('{path}'))",
        f"EXISTS (SELECT 1 FROM {function}('{path}'))",
    ]


@pytest.fixture()
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "private.csv"
    path.write_text(f"{SECRET}\n1\n")
    return path


@pytest.mark.parametrize("function", TABLE_FUNCTIONS)
def test_table_functions_are_refused_in_every_quoting_form(function: str, secret_file: Path) -> None:
    for text in payloads(function, str(secret_file)):
        for document in (script(text), script("1", where=text)):
            with pytest.raises(ScriptError) as info:
                load_script(document)
            assert info.value.location in ("steps[0].expr", "steps[0].where"), text
            assert "at column " in info.value.message, text
            assert SECRET not in str(info.value), text


@pytest.mark.parametrize(("text", "fragment"), [
    ("$$x$$", "dollar-quoted"), ("qty + $1", "dollar-quoted"), ("E'x'", "prefixed strings"),
    ("qty -- note", "comments"), ("qty /* note */", "comments"), ("qty; qty", "';'"),
    ("read_csv('a')", "table functions are refused"), ("(SELECT 1)", "sub-queries"),
    ("qty FROM t", "sub-queries"), ("WITH x AS (SELECT 1) SELECT 2", "sub-queries"),
    ("SUM(qty)", "only row-wise"), ("POWER(qty, 2)", "unsupported function 'POWER'"),
    ("'unterminated", "unterminated string"), ('"groupby.x', "unterminated quoted"),
    ("qty @ 2", "unexpected character '@'"), ("(" * 80 + "qty" + ")" * 80, "nested more than"),
    (" + ".join(["qty"] * 100), "nested more than"),
])
def test_refusals_name_the_cause_and_the_column(text: str, fragment: str) -> None:
    with pytest.raises(ScriptError) as info:
        load_script(script(text))
    assert info.value.location == "steps[0].expr"
    assert fragment in info.value.message and "at column " in info.value.message


def test_a_refused_position_is_the_offending_column() -> None:
    with pytest.raises(ScriptError, match="at column 7$"):
        load_script(script("qty + $$x$$"))


def test_strings_and_quoted_labels_may_hold_any_of_those_characters() -> None:
    frame = parse_usage(json.dumps({"type": "$$select read_csv('x') -- ;", "qty": "1", "scope": "p",
                                    "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z"}), "u.jsonl")
    out = load_script(script("7", where="type = '$$select read_csv(''x'') -- ;' AND \"groupby.$$\" IS NULL")).apply(frame)
    assert out["price"].to_list() == [Decimal(7)]


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out + err


def test_scripts_add_never_shows_a_file_content(tmp_path: Path, secret_file: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                caplog: pytest.LogCaptureFixture) -> None:
    config = str(workspace(tmp_path / "ws"))
    assert _cli(capsys, "db", "upgrade", "-c", config)[0] == 0
    texts = [text for function in ("read_csv", "scan_csv", "read_ndjson") for text in payloads(function, str(secret_file))]
    for i, text in enumerate(texts):
        path = tmp_path / f"evil{i}.json"
        path.write_text(script(text))
        status, output = _cli(capsys, "scripts", "add", "-c", config, str(path))
        assert status == 2, (text, output)
        assert f"evil{i}.json: steps[0].expr" in output and "Traceback" not in output
        assert SECRET not in output and SECRET not in caplog.text, text
    fee = tmp_path / "fee.json"  # the same command accepts a valid script: the refusals are the grammar's
    fee.write_text(script("price + 0.01 * qty", where="type = 'instance'"))
    status, output = _cli(capsys, "scripts", "add", "-c", config, str(fee))
    assert status == 0 and "saved (1 step(s))" in output
    status, output = _cli(capsys, "scripts", "list", "-c", config)
    assert status == 0 and [line.split()[0] for line in output.splitlines()[2:]] == ["s"]


@pytest.mark.parametrize(("document", "location", "fragment"), [
    ({"name": "n", "steps": [{"set": "price", "expr": "1", "when": "x"}]}, "steps[0].when", "unknown key"),
    ({"name": "n", "steps": [{"set": "price", "expr": 1}]}, "steps[0].expr", "non-empty SQL expression"),
    ({"name": "n", "steps": [{"set": "price", "expr": "1", "where": True}]}, "steps[0].where", "non-empty SQL"),
    ({"name": "n", "steps": [{"set": "price", "expr": "   "}]}, "steps[0].expr", "non-empty SQL expression"),
    ({"name": "n", "steps": [{"expr": "1"}]}, "steps[0].set", "not None"),
    ({"name": "n", "steps": [{"set": "PRICE", "expr": "1"}]}, "steps[0].set", "not 'PRICE'"),
    ({"name": "n", "steps": ["price = 1"]}, "steps[0]", "must be a JSON object"),
    ({"name": "n", "steps": {"set": "price"}}, "steps", "non-empty list"),
    ({"name": 3, "steps": [{"set": "price", "expr": "1"}]}, "name", "non-empty string"),
    ({"steps": [{"set": "price", "expr": "1"}]}, "name", "non-empty string"),
    ({"name": "n", "steps": [{"set": "price", "expr": "1"}, {"set": "qty", "expr": "1", "x": 1}]},
     "steps[1].x", "expected one of expr, set, where"),
])
def test_the_document_is_validated_with_todays_locations(document: dict, location: str, fragment: str) -> None:
    with pytest.raises(ScriptError) as info:
        load_script(json.dumps(document))
    assert info.value.location == location
    assert fragment in info.value.message


# ---- property-based: any text, and exact arithmetic ----

_VOCABULARY = ["qty", "price", "type", "unit", "begin", "end", '"groupby.a"', '"metadata.b"', "foo", "1", "2.5",
               "0.000001", "1e3", "99999999999999999999999999999999999999999", "'a'", "'%'", "''", "NULL", "TRUE",
               "+", "-", "*", "/", "%", "=", "<>", "<", ">=", "::", "(", ")", ",", "AND", "OR", "NOT", "IN",
               "BETWEEN", "LIKE", "ILIKE", "IS", "CASE", "WHEN", "THEN", "ELSE", "END", "CAST", "AS", "DECIMAL(10,2)",
               "INT", "EXTRACT", "FROM", "SELECT", "ROUND", "SUBSTR", "COALESCE", "SPLIT_PART", "STRPOS", "IF",
               "$$", "$", "'", '"', "--", "/*", ";", "E'", "U&", "read_csv", "\\", "\n", "é", "\x00"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_VOCABULARY), max_size=14), st.lists(st.sampled_from(["", " "]), max_size=14),
       st.text(max_size=12))
def test_any_text_compiles_or_is_one_script_error(words: list[str], spaces: list[str], noise: str) -> None:
    text = "".join(w + (spaces[i] if i < len(spaces) else " ") for i, w in enumerate(words)) + noise
    for document in (script(text), script("1", where=text)):
        try:
            load_script(document)
        except ScriptError as err:
            assert err.location.startswith("steps[0].")


_WIDE = Context(prec=120)


class _Refused(Exception):
    """The reference refuses at load time (scale above 38, a divisor with more decimals)."""


class _Overflow(Exception):
    """The reference overflows decimal(38, s)."""


def _scale(value: Decimal) -> int:
    return max(0, -int(value.as_tuple().exponent))


def _fits(value: Decimal, scale: int) -> Decimal:
    if abs(value) >= Decimal(10) ** (38 - scale):
        raise _Overflow
    return value


def _half_even(value: Fraction, scale: int) -> Decimal:
    scaled = value * 10**scale
    floor = scaled.numerator // scaled.denominator
    rest = scaled - floor
    up = rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2 == 1)
    return Decimal(floor + up).scaleb(-scale, context=_WIDE)


def _reference(tree: tuple, row: dict[str, Decimal]) -> tuple[Decimal, int]:
    """The documented semantics: ``+ -`` exact at the larger scale, ``*`` exact at the sum of the
    scales, ``/`` half-even at ``max(s1, min(s1 + 6, 12))`` decimals."""
    kind = tree[0]
    if kind == "lit":
        return tree[1], _scale(tree[1])
    if kind == "col":
        return row[tree[1]], 18 if tree[1] == "qty" else 20
    if kind == "neg":
        value, scale = _reference(tree[1], row)
        return value.copy_negate(), scale
    (a, sa), (b, sb) = _reference(tree[1], row), _reference(tree[2], row)
    if kind == "*":
        if sa + sb > 38:
            raise _Refused
        return _fits(_WIDE.multiply(a, b), sa + sb), sa + sb
    if kind == "/":
        scale = max(sa, min(sa + 6, 12))
        if sb > scale:
            raise _Refused
        if b == 0:
            raise _Overflow
        return _fits(_half_even(Fraction(a) / Fraction(b), scale), scale), scale
    return _fits(_WIDE.add(a, b) if kind == "+" else _WIDE.subtract(a, b), max(sa, sb)), max(sa, sb)


def _text(tree: tuple) -> str:
    kind = tree[0]
    if kind in ("lit", "col"):
        return str(tree[1]) if kind == "col" else f"{tree[1]:f}"
    if kind == "neg":
        return f"-({_text(tree[1])})"
    return f"({_text(tree[1])} {kind} {_text(tree[2])})"


def _literal() -> st.SearchStrategy[tuple]:
    return st.integers(0, 8).flatmap(lambda places: st.decimals(
        min_value=-(10**6), max_value=10**6, places=places, allow_nan=False, allow_infinity=False)
        .map(lambda d: ("lit", d if "." in f"{d:f}" else Decimal(f"{d:f}.0"))))


_trees = st.recursive(
    st.one_of(_literal(), st.sampled_from([("col", "qty"), ("col", "price")])),
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["+", "-", "*"]), inner, inner),
        st.tuples(st.just("/"), inner, _literal().filter(lambda t: t[1] != 0)),
        st.tuples(st.just("neg"), inner)),
    max_leaves=6)
_rows = st.lists(st.fixed_dictionaries({
    "qty": st.decimals(min_value=-(10**9), max_value=10**9, places=18, allow_nan=False, allow_infinity=False),
    "price": st.decimals(min_value=-(10**9), max_value=10**9, places=20, allow_nan=False, allow_infinity=False),
}), min_size=1, max_size=4)


def _frame(rows: list[dict[str, Decimal]]) -> pl.DataFrame:
    lines = [json.dumps({"type": "t", "qty": f"{r['qty']:f}", "price": f"{r['price']:f}", "scope": "p",
                         "begin": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00Z"}) for r in rows]
    return parse_usage("\n".join(lines), "usage.jsonl")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_trees, _rows)
def test_arithmetic_is_the_exact_decimal_reference(tree: tuple, rows: list[dict[str, Decimal]]) -> None:
    frame = _frame(rows)
    row_values = [dict(zip(("qty", "price"), values, strict=True))
                  for values in zip(frame["qty"].to_list(), frame["price"].to_list(), strict=True)]
    try:
        expected = [_fits(v.quantize(Decimal(1).scaleb(-20), rounding=ROUND_HALF_EVEN, context=_WIDE), 20)
                    for v, _ in (_reference(tree, r) for r in row_values)]
    except _Refused:
        with pytest.raises(ScriptError):
            load_script(script(_text(tree)))
        return
    except _Overflow:  # literal-only overflow is refused at load time, any other fails the frame
        with pytest.raises((ScriptError, pl.exceptions.PolarsError)):
            load_script(script(_text(tree))).apply(frame)
        return
    assert load_script(script(_text(tree))).apply(frame)["price"].to_list() == expected
