"""CloudKitty's worked hashmap examples (checked against its own module) through ``ratebeam rate`` (``run_rate``).

The example files live in ``tests/data`` (the rules JSON and usage JSONL of ``docs/formats.md``).
"""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path

from ratebeam.pipelines.rate_command import run_rate

DATA = Path(__file__).parent / "data"

#: Example A, in the order of usage_basic.jsonl (the table of `cloudkitty/rating/hash/__init__.py:159-276`).
EXAMPLE_A = ("1.5", "5.3", "4.1", "10.2", "0", "0.5", "1.8", "32", "0.1", "0.3", "1.25", "1.75", "0", "0", "0")
#: Example B, in the order of usage_groups.jsonl.
EXAMPLE_B = ("4", "6", "12", "12", "124", "36", "9")


def _rate(rules: str, usage: str) -> tuple[int, list[dict], dict]:
    out = io.StringIO()
    status = run_rate(DATA / rules, DATA / usage, out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    return status, lines[:-1], lines[-1]["summary"]


def test_example_a_prices_and_total() -> None:
    status, points, summary = _rate("rules_basic.json", "usage_basic.jsonl")
    assert status == 0
    assert [p["i"] for p in points] == list(range(15))
    assert [Decimal(p["price"]) for p in points] == [Decimal(v) for v in EXAMPLE_A]
    assert summary == {"count": 15, "frames": 3, "errors": 0, "total": "58.8"}


def test_example_a_lines_have_the_interchange_shape() -> None:
    _, points, _ = _rate("rules_basic.json", "usage_basic.jsonl")
    assert points[3] == {"i": 3, "type": "instance", "scope": "t-a", "begin": "2024-01-01T00:00:00+00:00",
                         "end": "2024-01-01T01:00:00+00:00", "qty": "2", "price": "10.2"}
    assert points[2]["scope"] == "t-special"  # the tenant override: 3 * 1.2 + 0.5
    assert points[2]["price"] == "4.1"


def test_example_b_prices() -> None:
    status, points, summary = _rate("rules_groups.json", "usage_groups.jsonl")
    assert status == 0
    assert [Decimal(p["price"]) for p in points] == [Decimal(v) for v in EXAMPLE_B]
    assert summary["count"] == 7 and summary["errors"] == 0
    assert Decimal(summary["total"]) == sum(Decimal(v) for v in EXAMPLE_B)


def test_example_b_non_numeric_field_value_fails_the_whole_frame() -> None:
    status, points, summary = _rate("rules_groups.json", "usage_groups_with_error.jsonl")
    assert status == 3
    assert len(points) == 8
    assert all(p["price"] is None for p in points)
    assert all("'n'" in p["error"] and "''" in p["error"] for p in points)
    assert summary == {"count": 8, "frames": 1, "errors": 1, "total": "0"}
