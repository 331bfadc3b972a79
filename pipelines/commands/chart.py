"""``report chart`` and ``report monthly``: costs to look at rather than read.

Both are ``report summary`` queries, so a chart never shows a figure the summary would not give:
:func:`cost_report` runs the summary of cost per day by type (``--groupby time-y,time-d,type``)
and per scope (``--groupby <scope_key>``) and keeps the rows as data frames of exact decimals;
the chart is drawn from those frames (floats only at the drawing), a test compares them with the
summary.  ``chart`` writes a PNG (matplotlib, the ``ratebeam[chart]`` extra) or one self-contained
HTML page (the chart as inline SVG and the figures as tables, nothing fetched); ``monthly`` is the
cost per month, scope and type as a listing (``--format csv`` for a spreadsheet).
"""

from __future__ import annotations

import argparse
import html
import io
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ratebeam.pipelines.commands.common import CommandError, integer
from ratebeam.pipelines.commands.grammar import add_time_range
from ratebeam.pipelines.commands.output import add_format_argument, cell, write_rows
from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_OK

if TYPE_CHECKING:
    import polars as pl

    from ratebeam.pipelines.config import RatebeamConfig

#: Summary rows one chart or monthly report may read (its groups, not points); more is an error.
MAX_ROWS = 100_000
DAILY_GROUPBY = ("time-y", "time-d", "type")


@dataclass(frozen=True)
class CostReport:
    """What a chart shows, rates as exact decimals (when the storage keeps them so).

    ``daily``: day, year, day_of_the_year, type, qty, rate; ``scopes``: the scope key and rate, the
    dearest first — no qty: a scope's would add instance-hours, GiB-hours and IP-hours together.
    """

    daily: pl.DataFrame
    scopes: pl.DataFrame
    scope_key: str


def add_commands(group: argparse._SubParsersAction, command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``report chart`` and ``report monthly`` (``command`` is the CLI's sub-command maker)."""
    chart = command(group, "chart", cmd_report_chart, "a cost chart (per day by type, top scopes) as PNG or HTML")
    monthly = command(group, "monthly", cmd_report_monthly, "cost per month, scope and type")
    for parser in (chart, monthly):
        add_time_range(parser, from_help="ISO-8601 (default: start of the current month)",
                       to_help="ISO-8601, excluded (default: start of next month)")
        parser.add_argument("--scope", action="append", default=[], help="only this scope (repeatable)")
    chart.add_argument("--output", required=True, help="the chart file: FILE.png or FILE.html (self-contained)")
    chart.add_argument("--top", type=integer, default=10, help="how many of the dearest scopes to show")
    chart.add_argument("--size", default="1200x600", help="the PNG's size in pixels, WIDTHxHEIGHT")
    add_format_argument(monthly)


def cmd_report_chart(args: argparse.Namespace) -> int:
    """Write the chart of ``cost_report`` to ``--output``."""
    output = Path(args.output)
    if output.suffix.lower() not in (".png", ".html"):
        raise InputError("command line", "--output", "must end in .png or .html", args.output)
    width, height = _size(args.size)
    if args.top <= 0:
        raise InputError("command line", "--top", "must be positive", str(args.top))
    _figure_class()  # matplotlib is there, before the storage is read
    config, begin, end, filters = _window(args)
    report = cost_report(config, begin, end, filters, top=args.top)
    figure = draw(report, width, height)
    try:
        if output.suffix.lower() == ".png":
            figure.savefig(output, format="png", dpi=_DPI)
        else:
            output.write_text(page(report, figure, f"ratebeam costs {begin.date()} to {end.date()}"),
                              encoding="utf-8")
    except OSError as exc:
        raise InputError(args.output, "", f"cannot write: {exc.strerror}") from None
    print(f"wrote {output} ({report.daily.height} day/type row(s), {report.scopes.height} scope(s))")
    return EXIT_OK


def cmd_report_monthly(args: argparse.Namespace) -> int:
    """Cost per month, scope and type, as a table, JSON or CSV."""
    config, begin, end, filters = _window(args)
    key = config.scope_key
    rows = _totals(config, begin, end, filters, ("time-y", "time-m", key, "type"))
    write_rows(rows, ["year", "month", key, "type", "qty", "rate"], args.format, footer=f"({len(rows)} row(s))")
    return EXIT_OK


def cost_report(config: RatebeamConfig, begin: Any, end: Any, filters: dict, *, top: int = 10) -> CostReport:
    """The data a chart is drawn from: two ``report summary`` queries over [begin, end)."""
    daily_rows = [{**row, "day": _day(row["year"], row["day_of_the_year"])}
                  for row in _totals(config, begin, end, filters, DAILY_GROUPBY)]
    columns = ["day", "year", "day_of_the_year", "type", "qty", "rate"]
    daily = _frame(daily_rows, columns)
    key = config.scope_key
    scope_rows = sorted(_totals(config, begin, end, filters, (key,)), key=lambda r: r["rate"], reverse=True)
    return CostReport(daily.sort("day", "type"), _frame(scope_rows[:top], [key, "rate"]), key)


def _frame(rows: list[dict], columns: list[str]) -> pl.DataFrame:
    """``rows`` reduced to ``columns``; qty and rate keep the type the backend gives (Decimal if exact)."""
    import polars as pl

    if not rows:
        return pl.DataFrame(schema={c: pl.Date if c == "day" else pl.String for c in columns})
    return pl.DataFrame([{c: row[c] for c in columns} for row in rows])


def _window(args: argparse.Namespace) -> tuple[RatebeamConfig, Any, Any, dict]:
    """``report summary``'s window and filters (``--scope`` is a ``scope_id`` filter there too)."""
    from ratebeam.pipelines.commands.report import _query

    args.filter = []
    return _query(args, metrics=False)


def _totals(config: RatebeamConfig, begin: Any, end: Any, filters: dict, groupby: tuple[str, ...]) -> list[dict]:
    from ratebeam.connectors.storage.base import TotalQuery
    from ratebeam.pipelines.commands.report import read_totals

    result = read_totals(config, TotalQuery(groupby=groupby, begin=begin, end=end, filters=filters, limit=MAX_ROWS))
    if result.total > len(result.results):
        raise CommandError(f"{result.total} summary rows in the window, more than {MAX_ROWS}: choose a shorter "
                           "window (--from/--to) or fewer scopes (--scope)", EXIT_BAD_INPUT)
    return result.results


def _day(year: str, day_of_the_year: str) -> date:
    return date(int(year), 1, 1) + timedelta(days=int(day_of_the_year) - 1)


#: Largest side of a chart, in pixels: matplotlib allocates width x height x 4 bytes at once
#: (8000 x 8000 is 256 MB; 100000 x 100000 died of ``std::bad_alloc``).
MAX_SIDE = 8000


def _size(text: str) -> tuple[int, int]:
    width, sep, height = text.lower().partition("x")
    # ASCII digits only: ``'²'.isdigit()`` is true, yet ``int('²')`` fails; 4 digits bound ``int()`` too
    if not (sep and all(side.isascii() and side.isdigit() and len(side) <= 4 and 0 < int(side) <= MAX_SIDE
                        for side in (width, height))):
        raise InputError("command line", "--size", f"expected WIDTHxHEIGHT in pixels, each from 1 to {MAX_SIDE}, "
                         "e.g. 1200x600", text)
    return int(width), int(height)


#: Pixels per inch of the figure: the PNG is exactly ``--size`` pixels.
_DPI = 100


def draw(report: CostReport, width: int, height: int) -> Any:
    """A matplotlib ``Figure`` of ``width`` x ``height`` pixels: cost per day stacked by type, top scopes."""
    figure = _figure_class()(figsize=(width / _DPI, height / _DPI), dpi=_DPI, layout="constrained")
    per_day, per_scope = figure.subplots(1, 2, width_ratios=(2, 1))
    days = sorted(set(report.daily["day"].to_list()))
    bottom = [0.0] * len(days)
    for rating_type in sorted(set(report.daily["type"].to_list())):
        rows = report.daily.filter(report.daily["type"] == rating_type).iter_rows(named=True)
        costs = {row["day"]: row["rate"] for row in rows}
        heights = [float(costs.get(day, 0)) for day in days]  # floats only to draw
        per_day.bar(range(len(days)), heights, bottom=bottom, label=rating_type)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    per_day.set_title("Cost per day by type")
    per_day.set_ylabel("cost")
    if days:
        per_day.legend(fontsize="small")
    per_day.set_xticks(range(len(days)), [day.isoformat() for day in days], rotation=45)
    scopes = report.scopes
    per_scope.barh(scopes[report.scope_key].to_list()[::-1], [float(r) for r in scopes["rate"].to_list()[::-1]])
    per_scope.set_title(f"Top {scopes.height} scope(s)")
    per_scope.set_xlabel("cost")
    return figure


def _figure_class() -> Any:
    """The ``Figure`` of matplotlib (the ``chart`` extra): no pyplot, no global state, no display needed."""
    from ratebeam.connectors.extras import require_extra

    return require_extra("chart", "report chart", "matplotlib.figure").Figure


def page(report: CostReport, figure: Any, title: str) -> str:
    """One HTML page that needs nothing else: the chart as inline SVG, then its figures as tables."""
    svg = io.StringIO()
    figure.savefig(svg, format="svg")
    chart = svg.getvalue()
    chart = chart[chart.index("<svg"):]  # inline: without the XML prolog and doctype
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>\n"
            "<style>body{font-family:sans-serif} table{border-collapse:collapse} "
            "td,th{border:1px solid #ccc;padding:2px 6px} td.n{text-align:right}</style></head><body>\n"
            f"<h1>{html.escape(title)}</h1>\n{chart}\n"
            f"<h2>Cost per day by type</h2>\n{_table(report.daily, ['day', 'type', 'qty', 'rate'])}\n"
            f"<h2>Top scopes</h2>\n{_table(report.scopes, [report.scope_key, 'rate'])}\n"
            "</body></html>\n")


def _table(frame: pl.DataFrame, columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=n' if c in ('qty', 'rate') else ''}>{html.escape(cell(row[c]))}</td>"
                         for c in columns) + "</tr>\n"
        for row in frame.iter_rows(named=True))
    return f"<table><tr>{head}</tr>\n{body}</table>"
