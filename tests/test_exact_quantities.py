"""A quantity with more than 18 decimals is priced exactly, against CloudKitty 25.0.0's own code.

CloudKitty's default metrics.yml converts ``image.size`` with ``factor: 1/1048576`` and
``radosgw.objects.size`` with ``1/1073741824``: a byte count then has up to 20 or 30 decimals.
ratebeam stores qty as ``decimal(38, 18)`` and used to price that rounded qty, so its price differed
from CloudKitty's from about the 18th decimal on.  Here the same byte counts go through
``ratebeam run`` (file collector -> embedded store) and through CloudKitty's ``convert_unit`` and
``HashMap`` (in its own venv, ``tests/cloudkitty/ck_rate.py``): each stored qty must be CloudKitty's
qty rounded to 18 decimals and each stored price CloudKitty's price rounded to 20, half-even; the
stored columns keep their types (no remainder column reaches the store).
"""

from __future__ import annotations

import json
import subprocess
from decimal import ROUND_HALF_EVEN, Context, Decimal
from pathlib import Path

import polars as pl
import pytest
import yaml
from hardening_support import configure, prepared, run
from test_differential_cloudkitty import CK_PYTHON, REPO, _require_cloudkitty

from ratebeam.pipelines.cli import main
from ratebeam.transforms.schema import PRICE, PRICE_ARROW, QTY, QTY_ARROW, QTY_REMAINDER

pytestmark = pytest.mark.cloudkitty

NOW = "2026-01-01T03:00:00Z"
BEGIN, END = "2026-01-01T00:00:00+00:00", "2026-01-01T01:00:00+00:00"
METRICS = {"image.size": ("MiB", "1/1048576"), "radosgw.objects.size": ("GiB", "1/1073741824")}
#: Byte counts: none a whole number of MiB, a few with every one of the factor's decimals.
BYTES = [1079815062, 1, 3, 1048577, 123456789012, 987654321987, 2**40 - 1, 5368709119, 777]
RULES = {
    "groups": ["storage"],
    "services": [
        {"name": "image.size", "mappings": [{"type": "rate", "cost": "0.8768901234567", "group": "storage"}]},
        {"name": "radosgw.objects.size", "mappings": [{"type": "flat", "cost": "0.5", "group": "storage"}],
         "thresholds": [{"level": "1", "type": "rate", "cost": "0.0123456789", "group": "storage"},
                        {"level": "100", "type": "rate", "cost": "0.0099999991", "group": "storage"}]},
    ],
}
#: In CloudKitty's venv: its ``convert_unit`` of each sample (as its Gnocchi collector calls it, the
#: factor a ``Fraction`` as its metrics.yml schema makes it), then its HashMap (``ck_rate.run_case``).
CK_SCRIPT = """
import json, sys
from fractions import Fraction
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import ck_rate
from cloudkitty import utils as ck_utils
work = Path(sys.argv[2])
points = json.loads((work / "samples.json").read_text())
with (work / "usage.jsonl").open("w") as out:
    for p in points:
        qty = ck_utils.convert_unit(float(p.pop("value")), Fraction(p.pop("factor")), 0)
        out.write(json.dumps({**p, "qty": str(qty)}) + "\\n")
lines, _ = ck_rate.run_case(work / "rules.json", work / "usage.jsonl")
print("\\n".join(lines))
"""
_WIDE = Context(prec=100)


def _rounded(value: str, places: int) -> Decimal:
    return Decimal(value).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN, context=_WIDE)


def samples() -> list[dict]:
    return [{"metric": metric, "value": value, "id": f"{metric}-{i}"}
            for metric in METRICS for i, value in enumerate(BYTES)]


def cloudkitty(work: Path) -> dict[str, dict]:
    """CloudKitty's qty and price per point id."""
    (work / "rules.json").write_text(json.dumps(RULES))
    points = [{"type": s["metric"], "value": s["value"], "factor": METRICS[s["metric"]][1], "scope": "p1",
               "begin": BEGIN, "end": END, "unit": METRICS[s["metric"]][0],
               "groupby": {"project_id": "p1", "id": s["id"]}, "metadata": {}} for s in samples()]
    (work / "samples.json").write_text(json.dumps(points))
    done = subprocess.run([str(CK_PYTHON), "-c", CK_SCRIPT, str(REPO / "tests" / "cloudkitty"), str(work)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rated = [json.loads(line) for line in done.stdout.splitlines() if line.strip()][:-1]
    return {points[r["i"]]["groupby"]["id"]: r for r in rated}


def ratebeam(ws: Path, capsys) -> pl.DataFrame:
    """``ratebeam run`` on the same samples; the stored points, as the store holds them."""
    (ws / "metrics.yml").write_text(yaml.safe_dump({"metrics": {
        metric: {"unit": unit, "factor": factor, "groupby": ["id", "project_id"]}
        for metric, (unit, factor) in METRICS.items()}}))
    (ws / "rules.json").write_text(json.dumps(RULES))
    assert main(["rules", "import", "-c", str(ws / "ratebeam.yaml"), str(ws / "rules.json")]) == 0
    lines = ["metric,timestamp,value,project_id,id"]
    lines += [f"{s['metric']},2026-01-01T00:30:00Z,{s['value']},p1,{s['id']}" for s in samples()]
    (ws / "usage.csv").write_text("\n".join(lines) + "\n")
    status, err = run(ws, capsys, NOW)
    assert status == 0, err[-3000:]
    return pl.read_delta(str(ws / "rated"))


def test_prices_of_quantities_beyond_18_decimals_equal_cloudkittys(tmp_path, capsys):
    _require_cloudkitty()
    ws = tmp_path / "ws"
    prepared(ws, fetcher={"backend": "source", "scopes": ["p1"]})
    configure(ws, storage={"backends": [{"backend": "delta", "url": "rated"}]})
    stored = ratebeam(ws, capsys)
    reference = cloudkitty(tmp_path)
    assert QTY_REMAINDER not in stored.columns
    assert stored.schema[QTY] == pl.Decimal(QTY_ARROW.precision, QTY_ARROW.scale)
    assert stored.schema[PRICE] == pl.Decimal(PRICE_ARROW.precision, PRICE_ARROW.scale)
    assert stored.height == len(reference) == len(samples())
    more_decimals = 0
    for row in stored.iter_rows(named=True):
        ck = reference[row["groupby.id"]]
        assert row[QTY] == _rounded(ck["qty"], 18), (row, ck)
        assert row[PRICE] == _rounded(ck["price"], 20), (row, ck)
        more_decimals += Decimal(ck["qty"]) != row[QTY]
    assert more_decimals >= len(samples()) - 2  # the case this is about: nearly every qty was rounded
