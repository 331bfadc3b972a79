"""Scripted rating: the JSON grammar, row-wise Polars SQL steps, exact results, and every refusal
happening when the script is loaded (never running user code, never reading a file)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from ratebeam.pipelines.interchange import parse_usage
from ratebeam.transforms.schema import PRICE_POLARS, QTY_POLARS
from ratebeam.transforms.scripted import ScriptError, apply_scripts, load_script, script_from_json


def batch() -> pl.DataFrame:
    points = [
        {"type": "instance", "qty": "2", "price": "1", "scope": "p1", "begin": "2024-01-01T00:00:00Z",
         "end": "2024-01-01T01:00:00Z", "groupby": {"flavor_name": "m1.large"}, "metadata": {"os": "windows"}},
        {"type": "instance", "qty": "3", "scope": "p2", "begin": "2024-01-01T00:00:00Z",
         "end": "2024-01-01T01:00:00Z", "groupby": {"flavor_name": "m1.tiny"}, "metadata": {}},
        {"type": "volume", "qty": "10", "price": "0.5", "scope": "p1", "begin": "2024-01-01T00:00:00Z",
         "end": "2024-01-01T01:00:00Z"},
    ]
    return parse_usage("\n".join(json.dumps(p) for p in points), "usage.jsonl")


def script(*steps: dict, name: str = "s") -> str:
    return json.dumps({"name": name, "steps": list(steps)})


def run(*steps: dict, frame: pl.DataFrame | None = None) -> pl.DataFrame:
    return load_script(script(*steps)).apply(batch() if frame is None else frame)


def test_set_price_where_a_label_matches() -> None:
    out = run({"set": "price", "expr": "price + qty * 0.25", "where": "\"groupby.flavor_name\" LIKE 'm1.l%'"})
    assert out["price"].to_list() == [Decimal("1.5"), Decimal(0), Decimal("0.5")]
    assert out.columns == batch().columns and out.schema["price"] == PRICE_POLARS


def test_steps_run_in_order_and_see_earlier_results() -> None:
    out = run({"set": "qty", "expr": "qty * 2", "where": "type = 'volume'"},
              {"set": "price", "expr": "CASE WHEN qty >= 20 THEN price + 1 ELSE price END"})
    assert out["qty"].to_list() == [Decimal(2), Decimal(3), Decimal(20)]
    assert out["price"].to_list() == [Decimal(1), Decimal(0), Decimal("1.5")]
    assert out.schema["qty"] == QTY_POLARS


def test_a_null_condition_keeps_the_value() -> None:
    out = run({"set": "price", "expr": "100", "where": "\"metadata.os\" = 'windows'"})
    assert out["price"].to_list() == [Decimal(100), Decimal(0), Decimal("0.5")]  # NULL os: unchanged


def test_a_label_column_the_batch_lacks_reads_as_null() -> None:
    out = run({"set": "price", "expr": "7", "where": "\"metadata.gpu\" IS NULL"})
    assert out["price"].to_list() == [Decimal(7)] * 3
    assert "metadata.gpu" not in out.columns


def test_results_are_exact_and_rounded_half_even_to_the_batch_scale() -> None:
    out = run({"set": "price", "expr": "CAST(qty AS DECIMAL(38, 0)) * 0.0000000000000000000125"})
    # exact 2.5e-20 and 3.75e-20 (22 decimals), rounded half-even at 20 decimals
    assert out["price"].to_list()[:2] == [Decimal("2E-20"), Decimal("4E-20")]


def test_a_result_scale_beyond_38_digits_is_refused_at_load_time() -> None:
    # Polars SQL multiplies decimals at the sum of the scales: 18 + 21 > 38
    with pytest.raises(ScriptError, match="scale 39 exceeds 38"):
        load_script(script({"set": "price", "expr": "qty * 0.000000000000000000125"}))


def test_scripts_apply_in_order() -> None:
    first = load_script(script({"set": "price", "expr": "price * 2"}))
    second = load_script(script({"set": "price", "expr": "price + 1"}))
    assert apply_scripts(batch(), (first, second))["price"].to_list() == [Decimal(3), Decimal(1), Decimal(2)]
    assert apply_scripts(batch(), (second, first))["price"].to_list() == [Decimal(4), Decimal(2), Decimal(3)]


def test_results_do_not_depend_on_batching() -> None:
    steps = ({"set": "price", "expr": "price + qty * 1.1", "where": "scope_id = 'p1'"},)
    whole = run(*steps)
    parts = pl.concat([run(*steps, frame=batch()[i:i + 1]) for i in range(3)])
    assert whole.equals(parts)


@pytest.mark.parametrize(("steps", "location", "fragment"), [
    ([{"set": "price", "expr": "SUM(qty)"}], "steps[0].expr", "only row-wise"),
    ([{"set": "price", "expr": "SUM(qty) OVER (PARTITION BY type)"}], "steps[0].expr", "only row-wise"),
    ([{"set": "price", "expr": "ROW_NUMBER() OVER (ORDER BY qty)"}], "steps[0].expr", "only row-wise"),
    ([{"set": "price", "expr": "COUNT(*)"}], "steps[0].expr", "only row-wise"),
    ([{"set": "price", "expr": "qty * 1.5e0"}], "steps[0].expr", "not Float64"),
    ([{"set": "price", "expr": "unit"}], "steps[0].expr", "not String"),
    ([{"set": "price", "expr": "qty +"}], "steps[0].expr", "not a supported SQL expression"),
    ([{"set": "price", "expr": "foo * 2"}], "steps[0].expr", "unknown column 'foo'"),
    ([{"set": "price", "expr": "i * 2"}], "steps[0].expr", "unknown column 'i'"),
    ([{"set": "unit", "expr": "'x'"}], "steps[0].set", "can only set 'price' or 'qty'"),
    ([{"set": "price", "expr": "1", "where": "qty"}], "steps[0].where", "must be a boolean"),
    ([{"set": "price", "expr": "1", "when": "TRUE"}], "steps[0].when", "unknown key"),
    ([{"set": "price"}], "steps[0].expr", "non-empty SQL expression"),
    ([], "steps", "non-empty list"),
    ([{"set": "price", "expr": "1"}, {"set": "price", "expr": "'a' + 1"}], "steps[1].expr", ""),
])
def test_unsupported_scripts_are_refused_at_load_time(steps: list, location: str, fragment: str) -> None:
    with pytest.raises(ScriptError) as info:
        load_script(json.dumps({"name": "s", "steps": steps}))
    assert info.value.location == location
    assert fragment in info.value.message


def test_sub_queries_and_table_functions_are_refused_before_polars_sees_them(tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    for expr in (f"qty IN (SELECT * FROM read_csv('{secret}'))", f"qty IN (select 1 from read_csv('{secret}'))"):
        with pytest.raises(ScriptError, match="sub-queries and table functions are refused"):
            load_script(script({"set": "price", "expr": expr}))
    # a literal or a quoted label may contain the word
    out = run({"set": "price", "expr": "1", "where": "type <> 'select' AND \"groupby.select\" IS NULL"})
    assert out["price"].to_list() == [Decimal(1)] * 3


def test_script_document_shape() -> None:
    with pytest.raises(ScriptError, match="must be a JSON object"):
        script_from_json([1])
    with pytest.raises(ScriptError, match="name: must be a non-empty string"):
        script_from_json({"name": "", "steps": [{"set": "price", "expr": "1"}]})
    with pytest.raises(ScriptError, match="unknown key"):
        script_from_json({"name": "n", "steps": [{"set": "price", "expr": "1"}], "code": "import os"})
    with pytest.raises(ScriptError, match="invalid JSON"):
        load_script("{")
    assert load_script(script({"set": "price", "expr": "1"}, name="fees")).name == "fees"
