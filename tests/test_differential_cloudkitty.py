"""Differential test: ratebeam's hashmap rating against CloudKitty 25.0.0's own hashmap module.

The same files go through both: CloudKitty in its own venv (``tests/cloudkitty/ck_rate.py``, one
subprocess for every case, as importing CloudKitty takes seconds) and ratebeam in-process (the
``ratebeam rate`` code path).  Prices must be equal as exact Decimals point by point, and a frame
CloudKitty fails must fail in ratebeam too.  Random cases come from ``tests/differential/generate.py``
with a seed printed on every run and taken from ``RATEBEAM_DIFF_SEED`` when set (also
``RATEBEAM_DIFF_CASES`` / ``RATEBEAM_DIFF_POINTS``, at least 100 x 200 by default).

Without CloudKitty's venv (``bash tests/cloudkitty/setup_venv.sh``) the tests skip, but fail when
``CI=true``.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
_RC = Path(os.environ.get("RATEBEAM_RC", ".rc"))
CK_VENV = _RC if _RC.is_absolute() else REPO / _RC
CK_PYTHON = CK_VENV / "cloudkitty-venv" / "bin" / "python"
CK_RATE = REPO / "tests" / "cloudkitty" / "ck_rate.py"
EXAMPLES = REPO / "tests" / "data"
CK_TIMEOUT_S = 1800
SHOWN_MISMATCHES = 15

pytestmark = pytest.mark.cloudkitty


def _load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("ratebeam_diff_generate",
                                                  REPO / "tests" / "differential" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


generate = _load_generator()


def _require_cloudkitty() -> None:
    if CK_PYTHON.exists():
        return
    reason = f"CloudKitty 25.0.0 venv missing ({CK_PYTHON}): run bash tests/cloudkitty/setup_venv.sh"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


# --- both sides ----------------------------------------------------------------------------------


def _parse_rated(text: str, source: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    if lines and "case_error" in lines[0]:
        raise AssertionError(f"{source}: CloudKitty refused the case: {lines[0]['case_error']}")
    assert lines and "summary" in lines[-1], f"{source}: no summary line"
    return lines[:-1], lines[-1]["summary"]


def cloudkitty_rate(cases: list[tuple[Path, Path]], workdir: Path) -> list[tuple[list[dict], dict]]:
    """Rate every (rules, usage) case with CloudKitty in ONE subprocess."""
    manifest = workdir / "manifest.jsonl"
    outs = [workdir / f"ck_{n:04d}.jsonl" for n in range(len(cases))]
    manifest.write_text("".join(json.dumps({"rules": str(r), "usage": str(u), "out": str(o)}) + "\n"
                                for (r, u), o in zip(cases, outs, strict=True)))
    proc = subprocess.run([str(CK_PYTHON), str(CK_RATE), "--batch", str(manifest)], capture_output=True,
                          text=True, timeout=CK_TIMEOUT_S, check=False)
    assert proc.returncode in (0, 2), f"ck_rate.py crashed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return [_parse_rated(o.read_text(), str(r)) for (r, _), o in zip(cases, outs, strict=True)]


def ratebeam_rate(rules: Path, usage: Path) -> tuple[list[dict], dict]:
    """Rate one case in-process through ratebeam's ``rate`` command code path."""
    out, err = io.StringIO(), io.StringIO()
    try:
        from ratebeam.pipelines.rate_command import run_rate
    except ImportError:  # the command module is not there yet: same readers, kernel and writer
        from ratebeam.pipelines.interchange import read_rules, read_usage, write_rated
        from ratebeam.transforms.hashmap import rate

        frame = read_usage(usage)
        write_rated(frame, rate(frame, read_rules(rules)), out)
    else:
        status = run_rate(rules, usage, out, err)
        assert status in (0, 3), f"ratebeam rate refused {rules} / {usage} ({status}): {err.getvalue()}"
        lines, summary = _parse_rated(out.getvalue(), f"ratebeam on {rules}")
        assert (status == 3) == bool(summary["errors"]), f"ratebeam rate exit status {status} vs {summary}"
        return lines, summary
    return _parse_rated(out.getvalue(), f"ratebeam on {rules}")


# --- comparison ----------------------------------------------------------------------------------


@dataclass
class Mismatch:
    case: str
    index: int
    what: str
    cloudkitty: Any
    ratebeam: Any

    def describe(self, usage: list[dict[str, Any]]) -> str:
        point = json.dumps(usage[self.index]) if 0 <= self.index < len(usage) else "-"
        return (f"{self.case} point {self.index}: {self.what}: CloudKitty {self.cloudkitty!r} "
                f"vs ratebeam {self.ratebeam!r}\n    point: {point}")


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text)


def compare(case: str, ck: tuple[list[dict], dict], rb: tuple[list[dict], dict]) -> list[Mismatch]:
    """Point-by-point differences: exact prices, failed frames, scope and period of each point."""
    (ck_lines, ck_sum), (rb_lines, rb_sum) = ck, rb
    if len(ck_lines) != len(rb_lines):
        return [Mismatch(case, -1, "number of rated points", len(ck_lines), len(rb_lines))]
    found = []
    for n, (c, r) in enumerate(zip(ck_lines, rb_lines, strict=True)):
        if r.get("i") != n or c["i"] != n:
            found.append(Mismatch(case, n, "point index", c["i"], r.get("i")))
        if c["scope"] != r.get("scope"):
            found.append(Mismatch(case, n, "scope", c["scope"], r.get("scope")))
        if (_instant(c["begin"]), _instant(c["end"])) != (_instant(r["begin"]), _instant(r["end"])):
            found.append(Mismatch(case, n, "period", (c["begin"], c["end"]), (r["begin"], r["end"])))
        cp, rp = c["price"], r.get("price")
        if cp is None or rp is None:
            if (cp is None) != (rp is None):
                found.append(Mismatch(case, n, "frame failure", c.get("error", cp), r.get("error", rp)))
        elif Decimal(cp) != Decimal(rp):
            found.append(Mismatch(case, n, "price", cp, rp))
    if not found:
        for key in ("count", "frames", "errors"):
            if ck_sum[key] != rb_sum.get(key):
                found.append(Mismatch(case, -1, f"summary {key}", ck_sum[key], rb_sum.get(key)))
        if Decimal(ck_sum["total"]) != Decimal(rb_sum["total"]):
            found.append(Mismatch(case, -1, "summary total", ck_sum["total"], rb_sum["total"]))
    return found


def _report(mismatches: list[Mismatch], usages: dict[str, list[dict]], header: str) -> str:
    lines = [f"{header}: {len(mismatches)} mismatches"]
    lines += [m.describe(usages[m.case]) for m in mismatches[:SHOWN_MISMATCHES]]
    if len(mismatches) > SHOWN_MISMATCHES:
        lines.append(f"... and {len(mismatches) - SHOWN_MISMATCHES} more")
    return "\n".join(lines)


def _read_usage_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- tests ---------------------------------------------------------------------------------------

#: The price tables of CloudKitty's worked examples (checked against its own module), in the order of the example usage files.
EXAMPLE_A = ("1.5", "5.3", "4.1", "10.2", "0", "0.5", "1.8", "32", "0.1", "0.3", "1.25", "1.75", "0", "0", "0")
EXAMPLE_B = ("4", "6", "12", "12", "124", "36", "9")


def test_worked_examples_agree_with_the_spec_and_each_other(tmp_path: Path) -> None:
    _require_cloudkitty()
    pairs = {
        "A": (EXAMPLES / "rules_basic.json", EXAMPLES / "usage_basic.jsonl"),
        "B": (EXAMPLES / "rules_groups.json", EXAMPLES / "usage_groups.jsonl"),
        "B with error": (EXAMPLES / "rules_groups.json", EXAMPLES / "usage_groups_with_error.jsonl"),
    }
    ck = dict(zip(pairs, cloudkitty_rate(list(pairs.values()), tmp_path), strict=True))
    # CloudKitty through the harness reproduces the worked examples' tables (the harness is faithful) ...
    assert [Decimal(p["price"]) for p in ck["A"][0]] == [Decimal(v) for v in EXAMPLE_A]
    assert Decimal(ck["A"][1]["total"]) == Decimal("58.8")
    assert [Decimal(p["price"]) for p in ck["B"][0]] == [Decimal(v) for v in EXAMPLE_B]
    assert all(p["price"] is None and "InvalidOperation" in p["error"] for p in ck["B with error"][0])
    assert ck["B with error"][1]["errors"] == 1
    # ... and ratebeam agrees with it point by point.
    mismatches = []
    usages = {}
    for name, (rules, usage) in pairs.items():
        usages[name] = _read_usage_records(usage)
        mismatches += compare(name, ck[name], ratebeam_rate(rules, usage))
    assert not mismatches, _report(mismatches, usages, "worked examples")


def test_cloudkitty_harness_stores_costs_exactly(tmp_path: Path) -> None:
    """On plain SQLite CloudKitty would rate 0.1 x 1 as 0.1000000000000000055511151231 (`cloudkitty/utils/__init__.py:250-292`)."""
    _require_cloudkitty()
    rules = tmp_path / "rules.json"
    usage = tmp_path / "usage.jsonl"
    rules.write_text(json.dumps({"services": [{"name": "s", "mappings": [{"type": "flat", "cost": "0.1"}],
                                               "thresholds": [{"level": "0.12345678", "type": "rate",
                                                               "cost": "0.3"}]}]}))
    usage.write_text("".join(json.dumps({"type": "s", "qty": q, "begin": "2024-01-01T00:00:00Z",
                                         "end": "2024-01-01T01:00:00Z"}) + "\n" for q in ("0.1", "0.12345678")))
    [(lines, _)] = cloudkitty_rate([(rules, usage)], tmp_path)
    assert Decimal(lines[0]["price"]) == Decimal("0.01")  # below the level: 0.1 x 0.1
    assert Decimal(lines[1]["price"]) == Decimal("0.0037037034")  # at the level: 0.1 x 0.12345678 x 0.3


def _run_settings() -> tuple[int, int, int]:
    seed = int(os.environ.get("RATEBEAM_DIFF_SEED") or random.SystemRandom().randrange(1, 10**9))
    cases = int(os.environ.get("RATEBEAM_DIFF_CASES") or 100)
    points = int(os.environ.get("RATEBEAM_DIFF_POINTS") or 200)
    return seed, cases, points


def test_random_cases_agree_point_by_point(tmp_path: Path) -> None:
    _require_cloudkitty()
    seed, count, points = _run_settings()
    print(f"differential run: RATEBEAM_DIFF_SEED={seed} cases={count} points/case={points}")
    cases = generate.generate_cases(seed, count, points)
    missing = generate.ALL_TRAPS - set().union(*(generate.traps_covered(c) for c in cases))
    print(f"`cloudkitty/rating/hash/__init__.py:159-276` traps not covered: {sorted(missing) or 'none'}")
    assert count < 100 or not missing, f"seed {seed}: traps not covered: {sorted(missing)}"
    files = [case.write(tmp_path / "cases") for case in cases]
    ck_results = cloudkitty_rate(files, tmp_path)
    mismatches: list[Mismatch] = []
    failed_frames = 0
    for case, (rules, usage), ck in zip(cases, files, ck_results, strict=True):
        failed_frames += ck[1]["errors"]
        try:
            rb = ratebeam_rate(rules, usage)
        except Exception as exc:  # reported with the case, like a price mismatch
            mismatches.append(Mismatch(case.name, -1, "ratebeam raised", "-", f"{type(exc).__name__}: {exc}"))
            continue
        mismatches += compare(case.name, ck, rb)
    rated = sum(len(c.usage) for c in cases)
    print(f"{rated} points, {failed_frames} failed frames, {len(mismatches)} mismatches")
    assert failed_frames, "the generator produced no failing frame"
    assert not mismatches, _report(mismatches, {c.name: c.usage for c in cases},
                                   f"seed {seed} (cases in {tmp_path / 'cases'})")
