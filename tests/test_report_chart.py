"""``report chart`` and ``report monthly``: the chart is drawn from the same figures as ``report summary``."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from PIL import Image

from ratebeam.pipelines.cli import main
from ratebeam.pipelines.commands.chart import cost_report
from ratebeam.pipelines.config import load_config

WINDOW = ["--from", "2026-01-01", "--to", "2026-01-05"]
BEGIN, END = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 5, tzinfo=UTC)


def summary(capsys, copy, groupby: str, *extra: str) -> list[dict]:
    assert main(["report", "summary", "-c", str(copy), "--begin", "2026-01-01", "--end", "2026-01-05",
                 "--groupby", groupby, "--format", "json", *extra]) == 0
    return cost_per_group(json.loads(capsys.readouterr().out)["results"])


def cost_per_group(rows: list[dict]) -> list[dict]:
    """Rows without ``type`` come per unit (qty is never summed across units): their costs summed per group."""
    merged: dict[tuple, dict] = {}
    for row in rows:
        if "unit" not in row:
            return rows
        key = tuple((k, v) for k, v in row.items() if k not in ("unit", "qty", "rate"))
        if key in merged:
            merged[key]["rate"] = str(Decimal(merged[key]["rate"]) + Decimal(row["rate"]))
        else:
            merged[key] = {k: v for k, v in row.items() if k not in ("unit", "qty")}
    return list(merged.values())


def _figures(rows, keys, figures=("qty", "rate")) -> set[tuple]:
    """Rows as comparable tuples: the keys as text, the figures (qty and rate) as exact decimals."""
    return {(*(str(r[k]) for k in keys), *(Decimal(str(r[f])) for f in figures)) for r in rows}


def test_the_png_has_the_asked_size(copy, tmp_path, capsys):
    png = tmp_path / "costs.png"
    assert main(["report", "chart", "-c", str(copy), *WINDOW, "--output", str(png), "--size", "900x450"]) == 0
    assert f"wrote {png}" in capsys.readouterr().out
    with Image.open(png) as image:
        assert image.format == "PNG"
        assert image.size == (900, 450)


@pytest.mark.parametrize("scopes", [[], ["globex", "initech"]])
def test_the_charted_data_equals_report_summary(copy, capsys, scopes):
    config = load_config(str(copy), metrics=False)
    report = cost_report(config, BEGIN, END, {"scope_id": scopes} if scopes else {}, top=3)
    filters = [f"--filter=scope_id={s}" for s in scopes]
    keys = ("year", "day_of_the_year", "type")
    daily = summary(capsys, copy, "time-y,time-d,type", *filters)
    assert daily, "the demo has rated days in the window"
    assert _figures(report.daily.to_dicts(), keys) == _figures(daily, keys)
    assert {str(d) for d in report.daily["day"]} == {"2026-01-01", "2026-01-02", "2026-01-03"}
    per_scope = sorted(summary(capsys, copy, "project_id", *filters), key=lambda r: Decimal(r["rate"]), reverse=True)
    assert _figures(report.scopes.to_dicts(), ("project_id",), ("rate",)) == _figures(per_scope[:3], ("project_id",),
                                                                                     ("rate",))
    assert report.scopes["project_id"].to_list() == [r["project_id"] for r in per_scope[:3]]  # dearest first
    if scopes:
        assert set(report.scopes["project_id"]) == set(scopes)


def test_the_html_page_is_self_contained_and_shows_the_figures(copy, tmp_path, capsys):
    page = tmp_path / "costs.html"
    assert main(["report", "chart", "-c", str(copy), *WINDOW, "--output", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # nothing fetched
    assert "<script" not in text and "<link" not in text
    capsys.readouterr()
    for row in summary(capsys, copy, "time-y,time-d,type"):
        assert f"<td class=n>{row['rate']}</td>" in text  # the exact figure, as the summary prints it


def test_monthly_csv_is_the_summary_per_month_scope_and_type(copy, capsys):
    assert main(["report", "monthly", "-c", str(copy), "--from", "2026-01-01", "--to", "2026-02-01",
                 "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert list(rows[0]) == ["year", "month", "project_id", "type", "qty", "rate"]
    keys = ("year", "month", "project_id", "type")
    assert main(["report", "summary", "-c", str(copy), "--begin", "2026-01-01", "--end", "2026-02-01",
                 "--groupby", "time-y,time-m,project_id,type", "--format", "json"]) == 0
    assert _figures(rows, keys) == _figures(json.loads(capsys.readouterr().out)["results"], keys)
    assert main(["report", "summary", "-c", str(copy), "--begin", "2026-01-01", "--end", "2026-02-01",
                 "--format", "json"]) == 0
    grand = sum(Decimal(r["rate"]) for r in json.loads(capsys.readouterr().out)["results"])  # one row per unit
    assert sum(Decimal(r["rate"]) for r in rows) == Decimal(grand)  # exact: no float on the way


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--output", "costs.pdf"], "--output: must end in .png or .html: 'costs.pdf'"),
        (["--output", "c.png", "--size", "big"], "--size: expected WIDTHxHEIGHT in pixels"),
        (["--output", "c.png", "--top", "0"], "--top: must be positive"),
    ],
)
def test_bad_chart_arguments_are_one_clear_line(copy, capsys, extra, message):
    assert main(["report", "chart", "-c", str(copy), *WINDOW, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_top_scopes_table_shows_the_cost_only(copy, tmp_path, capsys):
    """A scope's qty summed its instance-hours, GiB-hours and IP-hours: a number without a unit."""
    page = tmp_path / "costs.html"
    assert main(["report", "chart", "-c", str(copy), *WINDOW, "--output", str(page)]) == 0
    table = page.read_text().split("<h2>Top scopes</h2>")[1].split("</table>")[0]
    rows = [re.findall(r"<t[hd][^>]*>([^<]*)</t[hd]>", row) for row in table.split("<tr>")[1:]]
    assert rows[0] == ["project_id", "rate"]
    capsys.readouterr()
    per_scope = sorted(summary(capsys, copy, "project_id"), key=lambda r: Decimal(r["rate"]), reverse=True)
    assert rows[1:] == [[r["project_id"], r["rate"]] for r in per_scope[:10]]
